package engine

import (
	"context"
	"math/rand/v2"
	"slices"
	"sort"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
)

// --- retire ---

func (r *run) opRetire() {
	sids := subset(r.rng, r.m.ids)
	if len(sids) == 0 {
		sids = []string{r.pickSession(1)}
	}
	stopFail := r.failStop()
	res, err := r.o.Retire(r.life, sids)
	r.tracef("retire %v (stop fails %v): stopped %v failed %v err %v", sids, stopFail, res.Stopped, res.Failed, err)
	r.noteStopFault()
	if err != nil && r.injectedNow(fake.OpStop) == 0 {
		r.violate(Unexpected, "retire without a fault failed: %v", err)
		return
	}
	var want []string
	for _, sid := range sids {
		if r.m.sessions[sid].live {
			if _, failed := res.Failed[sid]; !failed {
				want = append(want, sid)
			}
		}
	}
	sort.Strings(want)
	if !slices.Equal(res.Stopped, want) {
		r.violate(LiveState, "retire of %v stopped %v (failed %v), want %v", sids, res.Stopped, res.Failed, want)
		return
	}
	for _, sid := range res.Stopped {
		r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	}
}

// --- release ---

func (r *run) opRelease() {
	all := r.m.checkpointIDs()
	var kept []string
	switch r.rng.IntN(4) {
	case 0: // keep nothing
	case 1:
		kept = all
	default:
		kept = subset(r.rng, all)
	}
	deleteFail := r.chance(FaultDeleteFail)
	crash := r.chance(FaultCrashRelease)
	if deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	if crash {
		// Between the tombstones and the first delete, or after k deletes.
		k := r.rng.IntN(3)
		if k == 0 {
			r.proc.arm(&trigger{op: fake.OpDeleteSnapshot, n: 1})
		} else {
			r.proc.arm(&trigger{op: fake.OpDeleteSnapshot, n: k, after: true})
		}
	}
	r.pendingRelease, r.releasing = kept, true
	var res owner.ReleaseResult
	err, crashed := r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.Release(ctx, kept)
		return err
	})
	r.tracef("release keeping %v of %v (delete fails %v, crash %v): dropped %v deleted %v deferred %v failed %v err %v",
		kept, all, deleteFail, crash, res.Dropped, res.Deleted, res.Deferred, res.Failed, err)
	if crashed {
		if crash {
			r.fire(FaultCrashRelease)
		}
		r.afterCrash()
		return
	}
	r.releasing = false
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	} else if err != nil {
		r.violate(Unexpected, "release without a fault failed: %v", err)
		return
	}
	keep := toSet(kept)
	var drop []string
	for _, id := range all {
		if !keep[id] {
			drop = append(drop, id)
		}
	}
	// A checkpoint whose directory went and that no check dropped yet
	// goes with the release.
	res.Dropped = slices.DeleteFunc(res.Dropped, func(id string) bool {
		if r.m.gone[id] != nil {
			delete(r.m.gone, id)
			return true
		}
		return false
	})
	if !slices.Equal(res.Dropped, drop) {
		r.violate(WholeCheckpoints, "release keeping %v dropped %v, want %v", kept, res.Dropped, drop)
		return
	}
	for _, id := range drop {
		delete(r.m.ckpts, id)
	}
}

// --- time ---

// opAdvance moves logical time forward by less than half a lease, has the
// owner renew the leases due, and lets the backend reap what expired: no
// live session may lose its sandbox.
func (r *run) opAdvance() {
	d := 10*time.Second + time.Duration(r.rng.Int64N(int64(r.ttl/2-20*time.Second)))
	if gone := rand.New(rand.NewPCG(uint64(r.seed), dirGoneStream+uint64(r.step))); r.chanceOn(FaultDirGone, gone) {
		r.deleteDirs(gone)
	}
	if !r.followDirs(r.clk.Now().Add(d)) {
		return
	}
	now := r.clk.Now()
	var due []string
	held := map[string]string{}
	for _, sid := range r.m.live() {
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			continue // the checks report it
		}
		held[sb.Handle.SandboxID] = sid
		if ttl := sb.Spec.TTL(); ttl > 0 && !sb.ExpiresAt.IsZero() && sb.ExpiresAt.Sub(now) <= ttl/2 {
			due = append(due, sb.Handle.SandboxID)
		}
	}
	r.calls.expect(fake.OpRenew, due)
	if err := r.o.Tick(now); err != nil {
		r.violate(Unexpected, "owner.Tick: %v", err)
		return
	}
	if missing := r.waitCalls(30 * time.Second); len(missing) > 0 {
		r.violate(LiveState, "the leases of %v were due at %v but never renewed", missing, now)
		return
	}
	reaped := r.fk.Reap()
	r.tracef("advance %v: renewed %v, reaped %v", d, due, reaped)
	for _, id := range reaped {
		if sid, ok := held[id]; ok {
			r.violate(LiveState, "the lease of live session %s's sandbox %s ran out", sid, id)
		}
	}
}
