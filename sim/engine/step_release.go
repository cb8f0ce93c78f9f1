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

// retirePlan is what one retire chose: the sessions and a failed stop.
type retirePlan struct {
	sids     []string
	stopFail bool
}

// opRetire is a retire in the simulation's one shape: choose, arm, act,
// check.
func (r *run) opRetire() {
	p := r.chooseRetire()
	r.armRetire(p)
	res, err := r.actRetire(p)
	r.checkRetire(p, res, err)
}

func (r *run) chooseRetire() retirePlan {
	sids := subset(r.rng, r.m.ids)
	if len(sids) == 0 {
		sids = []string{r.pickSession(1)}
	}
	return retirePlan{sids: sids, stopFail: r.chance(FaultStopFail)}
}

func (r *run) armRetire(p retirePlan) {
	if p.stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
}

func (r *run) actRetire(p retirePlan) (owner.RetireResult, error) {
	res, err := r.o.Retire(r.life, p.sids)
	r.tracef("retire %v (stop fails %v): stopped %v failed %v err %v", p.sids, p.stopFail, res.Stopped, res.Failed, err)
	return res, err
}

// checkRetire holds a retire to the model: it fails only by an injected
// stop fault, and stops every live session asked for whose stop did not
// fail.
func (r *run) checkRetire(p retirePlan, res owner.RetireResult, err error) {
	r.noteStopFault()
	if err != nil && r.injectedNow(fake.OpStop) == 0 {
		r.violate(Unexpected, "retire without a fault failed: %v", err)
		return
	}
	var want []string
	for _, sid := range p.sids {
		if r.m.sessions[sid].live {
			if _, failed := res.Failed[sid]; !failed {
				want = append(want, sid)
			}
		}
	}
	sort.Strings(want)
	if !slices.Equal(res.Stopped, want) {
		r.violate(LiveState, "retire of %v stopped %v (failed %v), want %v", p.sids, res.Stopped, res.Failed, want)
		return
	}
	for _, sid := range res.Stopped {
		r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	}
}

// --- release ---

// releasePlan is what one release chose: the checkpoints it keeps of
// those there are, a failed delete, and a crash at one of its deletes.
type releasePlan struct {
	all, kept  []string
	deleteFail bool
	// crash crashes the owner at delete crashAt (0: between the
	// tombstones and the first delete, k: after the k-th).
	crash   bool
	crashAt int
}

// opRelease is a release in the simulation's one shape: choose, arm, act,
// check.
func (r *run) opRelease() {
	p := r.chooseRelease()
	r.armRelease(p)
	res, err, crashed := r.actRelease(p)
	if crashed {
		if p.crash {
			r.fire(FaultCrashRelease)
		}
		r.afterCrash()
		return
	}
	r.checkRelease(p, res, err)
}

func (r *run) chooseRelease() releasePlan {
	p := releasePlan{all: r.m.checkpointIDs()}
	switch r.rng.IntN(4) {
	case 0: // keep nothing
	case 1:
		p.kept = p.all
	default:
		p.kept = subset(r.rng, p.all)
	}
	p.deleteFail = r.chance(FaultDeleteFail)
	p.crash = r.chance(FaultCrashRelease)
	if p.crash {
		p.crashAt = r.rng.IntN(3)
	}
	return p
}

func (r *run) armRelease(p releasePlan) {
	if p.deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	if p.crash {
		r.proc.arm(crashTrigger(fake.OpDeleteSnapshot, p.crashAt))
	}
}

// actRelease runs the owner's Release, the checkpoints it keeps pending
// until it answers (a crash in it leaves them for recovery to judge).
func (r *run) actRelease(p releasePlan) (res owner.ReleaseResult, err error, crashed bool) {
	r.pendingRelease, r.releasing = p.kept, true
	err, crashed = r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.Release(ctx, p.kept)
		return err
	})
	r.tracef("release keeping %v of %v (delete fails %v, crash %v): dropped %v deleted %v deferred %v failed %v err %v",
		p.kept, p.all, p.deleteFail, p.crash, res.Dropped, res.Deleted, res.Deferred, res.Failed, err)
	if !crashed {
		r.releasing = false
	}
	return res, err, crashed
}

// checkRelease holds a release the owner answered to the model: it fails
// only by an injected delete fault, and drops exactly the checkpoints not
// kept (and those whose directory went).
func (r *run) checkRelease(p releasePlan, res owner.ReleaseResult, err error) {
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	} else if err != nil {
		r.violate(Unexpected, "release without a fault failed: %v", err)
		return
	}
	keep := toSet(p.kept)
	var drop []string
	for _, id := range p.all {
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
		r.violate(WholeCheckpoints, "release keeping %v dropped %v, want %v", p.kept, res.Dropped, drop)
		return
	}
	for _, id := range drop {
		delete(r.m.ckpts, id)
	}
}

// --- time ---

// advancePlan is what one advance chose: how far time moves, and which
// checkpoint directories the controller deletes first (from the step's
// own stream, so that the fault's rate does not shift the other draws).
type advancePlan struct {
	d    time.Duration
	gone []string
}

// advanced is what an advance saw: the leases due when it ticked, and the
// sandboxes the backend reaped, with the live sessions that held them.
type advanced struct {
	due, reaped []string
	held        map[string]string
}

// opAdvance moves logical time forward by less than half a lease, has the
// owner renew the leases due, and lets the backend reap what expired, in
// the simulation's one shape: choose, arm (the directories deleted), act,
// check (no live session may lose its sandbox).
func (r *run) opAdvance() {
	p := r.chooseAdvance()
	r.deleteDirs(p.gone)
	a, ok := r.actAdvance(p)
	if !ok {
		return
	}
	r.checkAdvance(a)
}

func (r *run) chooseAdvance() advancePlan {
	p := advancePlan{d: 10*time.Second + time.Duration(r.rng.Int64N(int64(r.ttl/2-20*time.Second)))}
	if gone := rand.New(rand.NewPCG(uint64(r.seed), dirGoneStream+uint64(r.step))); r.chanceOn(FaultDirGone, gone) {
		p.gone = r.chooseDirsGone(gone)
	}
	return p
}

// actAdvance moves the clock (running the retention checks due on the
// way), ticks the owner and reaps; ok is false when a violation ended the
// step.
func (r *run) actAdvance(p advancePlan) (a advanced, ok bool) {
	if !r.followDirs(r.clk.Now().Add(p.d)) {
		return a, false
	}
	now := r.clk.Now()
	a.held = map[string]string{}
	for _, sid := range r.m.live() {
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			continue // the checks report it
		}
		a.held[sb.Handle.SandboxID] = sid
		if ttl := sb.Spec.TTL(); ttl > 0 && !sb.ExpiresAt.IsZero() && sb.ExpiresAt.Sub(now) <= ttl/2 {
			a.due = append(a.due, sb.Handle.SandboxID)
		}
	}
	r.calls.expect(fake.OpRenew, a.due)
	if err := r.o.Tick(now); err != nil {
		r.violate(Unexpected, "owner.Tick: %v", err)
		return a, false
	}
	if missing := r.waitCalls(30 * time.Second); len(missing) > 0 {
		r.violate(LiveState, "the leases of %v were due at %v but never renewed", missing, now)
		return a, false
	}
	a.reaped = r.fk.Reap()
	r.tracef("advance %v: renewed %v, reaped %v", p.d, a.due, a.reaped)
	return a, true
}

// checkAdvance holds an advance to the model: no live session's sandbox
// was reaped.
func (r *run) checkAdvance(a advanced) {
	for _, id := range a.reaped {
		if sid, ok := a.held[id]; ok {
			r.violate(LiveState, "the lease of live session %s's sandbox %s ran out", sid, id)
		}
	}
}
