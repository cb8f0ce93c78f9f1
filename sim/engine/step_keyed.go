package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The keyed workload (Config.Keyed): seeds whose setup is a pure function
// of a task key fork the key's template, built once; the owner keeps warm
// pools. Its steps draw only when it is on, so runs without it replay
// exactly as before.

// The keyed workload's invariants, reported only for keyed runs (and for
// any run that broke them).
const (
	// TemplateOnce: a group of seeds of one key runs the key's setup once
	// when it has no template and not at all when it has; a setup that
	// fails fails every seed that waited for it and leaves no template;
	// every seed forks the key's template and holds its data.
	TemplateOnce Invariant = "template once"
	// LentOnce: no sandbox is lent to two sessions, nor goes back to a
	// warm pool once lent.
	LentOnce Invariant = "lent once"
)

// keyedInvariants are the keyed workload's invariants, in report order.
func keyedInvariants() []Invariant { return []Invariant{TemplateOnce, LentOnce} }

// keyedKeys are the task keys keyed seeds draw from: few, so that a key
// often has its template already.
var keyedKeys = []string{"k0", "k1"}

// keyedPoolSize is the owner's warm pool size in the keyed workload.
const keyedPoolSize = 2

func keyedOps() []op {
	return []op{
		{"keyed-seed", 14, (*run).opKeyedSeed},
		{"expire-templates", 3, (*run).opExpireTemplates},
	}
}

// keyedPool is the owner's pools in the keyed workload.
func keyedPool() owner.PoolConfig {
	return owner.PoolConfig{Size: keyedPoolSize, RefillConcurrency: 2}
}

// keyToken is the seed token every session of key holds: its setup's data
// is the key's, not the session's.
func keyToken(key string) string { return "tok-key-" + key }

// keyedSetup writes the key's token and returns it as session data,
// counting its runs; fail makes it fail after the write.
func keyedSetup(key string, fail bool, runs *atomic.Int64) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		runs.Add(1)
		if err := p.WriteFile(ctx, sb.Handle, tokenFile, []byte(keyToken(key))); err != nil {
			return nil, fmt.Errorf("write %s: %w", tokenFile, err)
		}
		if fail {
			return nil, errors.New("keyed setup failed on purpose")
		}
		return json.RawMessage(fmt.Sprintf(`{"seed_token":%q}`, keyToken(key))), nil
	}
}

// --- keyed seed ---

// keyedPlan is what one keyed step chose: a key, the sessions that seed it
// at once, and the faults it arms.
type keyedPlan struct {
	key       string
	sids      []string
	setupFail bool
	// forkFail: a fork (a seed's or a pool's refill) fails after the
	// provider made it.
	forkFail bool
	// crash is where the owner crashes (nil: it does not): at the end of
	// the template's start, of its snapshot, or of a fork.
	crash *trigger
}

// keyedOutcome is what the seeds of a keyed step got.
type keyedOutcome struct {
	sbs    []sandbox.Sandbox
	errs   []error
	setups int64
}

// opKeyedSeed seeds a group of sessions without sandboxes with one key at
// once, in the simulation's one shape: choose, arm, act, check.
func (r *run) opKeyedSeed() {
	p := r.chooseKeyed()
	if len(p.sids) == 0 {
		r.tracef("keyed seed of %s: every session holds a sandbox", p.key)
		return
	}
	r.armKeyed(p)
	before := r.templateOf(p.key)
	out, crashed := r.actKeyed(p)
	if crashed {
		r.fire(FaultCrashSeed)
		r.afterCrash()
		return
	}
	r.checkKeyed(p, before, out)
}

func (r *run) chooseKeyed() keyedPlan {
	p := keyedPlan{key: sample(r.rng, keyedKeys)}
	absent := r.m.absent()
	n := 1 + r.rng.IntN(3)
	for _, i := range r.rng.Perm(len(absent)) {
		if len(p.sids) < n {
			p.sids = append(p.sids, absent[i])
		}
	}
	slices.Sort(p.sids)
	p.setupFail = r.chance(FaultSetupFail)
	p.forkFail = r.chance(FaultForkFailAfter)
	if r.chance(FaultCrashSeed) {
		p.crash = sample(r.rng, []*trigger{
			{op: fake.OpStart, n: 1, after: true},
			{op: fake.OpSnapshot, n: 1, after: true},
			{op: fake.OpFork, n: 1, after: true},
		})
	}
	return p
}

func (r *run) armKeyed(p keyedPlan) {
	if p.forkFail {
		r.fk.FailAfterEffect(fake.OpFork, 1)
	}
	if p.crash != nil {
		r.proc.arm(p.crash)
	}
}

// actKeyed runs the owner's StartKeyedSessionSandbox for every session of
// the plan at once.
func (r *run) actKeyed(p keyedPlan) (out keyedOutcome, crashed bool) {
	n := len(p.sids)
	out.sbs, out.errs = make([]sandbox.Sandbox, n), make([]error, n)
	var runs atomic.Int64
	// A crash abandons the owner (r.o goes nil) while seeds still run.
	o := r.o
	_, crashed = r.guarded(func(ctx context.Context) error {
		var left atomic.Int64
		left.Store(int64(n))
		done := make(chan struct{})
		for i, sid := range p.sids {
			r.rt.Go(func() {
				out.sbs[i], out.errs[i] = o.StartKeyedSessionSandbox(ctx, sid, p.key, r.spec(), keyedSetup(p.key, p.setupFail, &runs), "")
				if left.Add(-1) == 0 {
					close(done)
				}
			})
		}
		r.rt.Await(context.Background(), func() bool { return left.Load() == 0 })
		<-done
		return nil
	})
	out.setups = runs.Load()
	var ids []string
	for i := range p.sids {
		ids = append(ids, fmt.Sprintf("%s:%s/%v", p.sids[i], out.sbs[i].Handle.SandboxID, out.errs[i]))
	}
	r.tracef("keyed seed of %s by %v (setup fails %v, fork fails after %v, crash %v): setups %d, %s", p.key, p.sids, p.setupFail, p.forkFail, p.crash != nil, out.setups, strings.Join(ids, " "))
	return out, crashed
}

// checkKeyed holds a keyed step to the model: the key's setup ran once if
// it had no template (none if it had); a failing setup failed every seed
// and left no template; each other seed holds a sandbox of its own, never
// lent before, forked from the key's template with its data.
func (r *run) checkKeyed(p keyedPlan, before string, out keyedOutcome) {
	// The fork fault may strike a seed's fork or a pool's refill: at most
	// one seed fails of it, and nothing it made may be left (the checks).
	forkFailed := r.injectedNow(fake.OpFork) > 0
	if forkFailed {
		r.fire(FaultForkFailAfter)
	}
	after := r.templateOf(p.key)
	if p.setupFail && before == "" {
		r.fire(FaultSetupFail)
		for i, err := range out.errs {
			if !errors.Is(err, sandbox.ErrSetup) {
				r.violate(TemplateOnce, "seed %s of %s with a failing setup: got %v, want sandbox.ErrSetup", p.sids[i], p.key, err)
			}
		}
		if after != "" || out.setups < 1 {
			r.violate(TemplateOnce, "a failing setup of %s (run %d times) left template %q", p.key, out.setups, after)
		}
		return
	}
	want := int64(1)
	if before != "" {
		want = 0
	}
	if out.setups != want {
		r.violate(TemplateOnce, "%d seeds of %s ran its setup %d times (template before: %q), want %d", len(p.sids), p.key, out.setups, before, want)
		return
	}
	got := map[string]string{}
	for i, sid := range p.sids {
		sb, err := out.sbs[i], out.errs[i]
		if err != nil && forkFailed && errors.Is(err, provider.ErrInjected) {
			forkFailed = false
			continue
		}
		if err != nil {
			r.violate(Unexpected, "keyed seed %s of %s: %v", sid, p.key, err)
			return
		}
		id := sb.Handle.SandboxID
		if other, ok := got[id]; ok {
			r.violate(LentOnce, "sessions %s and %s got the same sandbox %s", other, sid, id)
			return
		}
		if other, ok := r.lent[id]; ok {
			r.violate(LentOnce, "session %s got sandbox %s, which %s held before", sid, id, other)
			return
		}
		got[id] = sid
		if sb.FromSnapshot != after || after == "" || tokenOf(sb.Data) != keyToken(p.key) {
			r.violate(TemplateOnce, "keyed seed %s of %s: forked from %q with token %q, want template %q and token %q", sid, p.key, sb.FromSnapshot, tokenOf(sb.Data), after, keyToken(p.key))
			return
		}
		*r.m.sessions[sid] = sessionState{live: true, token: keyToken(p.key)}
	}
}

// templateOf is the snapshot of key's template in the owner's index ("":
// none).
func (r *run) templateOf(key string) string {
	ts, err := r.o.Index().Templates()
	if err != nil {
		r.violate(Unexpected, "the index's templates: %v", err)
		return ""
	}
	for _, t := range ts {
		if strings.HasPrefix(t.Key, key+"@") {
			return t.SnapshotID
		}
	}
	return ""
}

// --- expire templates ---

// opExpireTemplates drops every template, as the sweep does with those
// unused for its retention: none is left in the index, and each snapshot
// is deleted or, while a fork stands on it or its delete failed,
// tombstoned (the checks hold every snapshot to that).
func (r *run) opExpireTemplates() {
	deleteFail := r.chance(FaultDeleteFail)
	if deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	rep, err := r.o.ExpireTemplates(r.life, r.clk.Now().Add(time.Nanosecond))
	r.tracef("expire templates (delete fails %v): dropped %v deleted %v deferred %v failed %v err %v", deleteFail, rep.Dropped, rep.Deleted, rep.Deferred, rep.Failed, err)
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	}
	if err != nil {
		r.violate(Unexpected, "expire templates: %v", err)
		return
	}
	if rep.Kept != 0 || r.templateOf(keyedKeys[0])+r.templateOf(keyedKeys[1]) != "" {
		r.violate(TemplateOnce, "templates expired before now, yet %d kept", rep.Kept)
	}
}

// --- the keyed checks ---

// keyedHeld waits until the pools make no call of their own, then returns
// the sandboxes they hold ready (labelled by the current owner's pools,
// as many as it reports ready, none lent before) and the snapshots of the
// index's templates. Both are empty without the keyed workload.
func (r *run) keyedHeld(held map[string]string) (pooled, templates map[string]bool) {
	pooled, templates = map[string]bool{}, map[string]bool{}
	if !r.cfg.Keyed {
		return pooled, templates
	}
	if !r.poolsIdle() {
		r.violate(Unexpected, "the warm pools' starts never ended")
		return pooled, templates
	}
	for _, id := range r.fk.LiveSandboxIDs() {
		info, _ := r.fk.Sandbox(id)
		if _, ok := held[id]; ok || info.Metadata[owner.LabelPool] == "" || info.Metadata[owner.LabelIncarnation] != r.o.Incarnation() {
			continue
		}
		if sid, ok := r.lent[id]; ok {
			r.violate(LentOnce, "sandbox %s, lent to %s, is back in a warm pool", id, sid)
		}
		pooled[id] = true
	}
	if st := r.o.PoolStats(); st.Ready != len(pooled) {
		r.violate(NoLeak, "the pools report %d ready, the backend runs %d of theirs", st.Ready, len(pooled))
	}
	return pooled, r.templateSnapshots()
}

// templateSnapshots are the snapshots of the index's templates (none
// without the keyed workload).
func (r *run) templateSnapshots() map[string]bool {
	out := map[string]bool{}
	if !r.cfg.Keyed {
		return out
	}
	ts, err := r.o.Index().Templates()
	if err != nil {
		r.violate(Unexpected, "the index's templates: %v", err)
	}
	for _, t := range ts {
		out[t.SnapshotID] = true
	}
	return out
}

// poolsIdle runs the owner until its pools' starts ended.
func (r *run) poolsIdle() bool {
	idle := func() bool { return r.o.PoolStats().Starting == 0 }
	if r.det != nil {
		return r.until(idle)
	}
	for deadline := time.Now().Add(30 * time.Second); !idle(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// finalKeyed drops every template before the final release, so that
// nothing is kept.
func (r *run) finalKeyed() {
	if !r.cfg.Keyed {
		return
	}
	rep, err := r.o.ExpireTemplates(r.life, r.clk.Now().Add(time.Nanosecond))
	r.tracef("final: expire templates: dropped %v deleted %v deferred %v err %v", rep.Dropped, rep.Deleted, rep.Deferred, err)
	if err != nil {
		r.violate(Unexpected, "final expire templates: %v", err)
	}
}

// afterCloseKeyed: once the owner closed, its pools' sandboxes are gone
// too, and the index on disk keeps no template.
func (r *run) afterCloseKeyed(idx snapshotindex.Store) {
	if !r.cfg.Keyed {
		return
	}
	if sbs := r.fk.LiveSandboxIDs(); len(sbs) > 0 {
		r.violate(NoLeak, "after Close, sandboxes %v run", sbs)
	}
	if ts, _ := idx.Templates(); len(ts) > 0 {
		r.violate(NoLeak, "the index on disk still holds %d templates", len(ts))
	}
}
