package engine

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// --- commit ---

func (r *run) newCheckpointID() string {
	r.nextCkpt++
	return fmt.Sprintf("c%d", r.nextCkpt)
}

// commitPlan is what one commit step chose before it acts: the faults it
// arms and the model's records the commit must export.
type commitPlan struct {
	id                   string
	stop, drift          bool
	snapFault, crash     Fault
	deleteFail, stopFail bool
	live                 []string
	records              map[string]recordState
	// deadline is the round's, set by a latency fault.
	deadline time.Time
}

// opCommit is a commit in the simulation's one shape: choose the faults,
// arm them, act (the owner's Commit), check what it answered against the
// model.
func (r *run) opCommit() {
	p, race := r.chooseCommit()
	if race {
		r.raceCommit()
		return
	}
	ctx, cancel := context.WithCancel(r.life)
	defer cancel()
	disarm := r.armCommit(&p)
	defer disarm()
	res, err, crashed := r.actCommit(ctx, p)
	if crashed {
		if p.crash != "" {
			r.fire(p.crash)
		}
		r.afterCrash()
		return
	}
	r.checkCommit(p, res, err)
}

// chooseCommit draws the commit's faults: at most one snapshot fault, so
// that each fired fault is known by kind, and a crash only without one.
func (r *run) chooseCommit() (p commitPlan, race bool) {
	race = r.chance(FaultRace)
	p.stop = r.rng.IntN(4) == 0
	p.drift = r.chance(FaultDrift)
	for _, f := range []Fault{FaultSnapshotFail, FaultSnapshotFailAfter, FaultLatency} {
		if r.chance(f) && p.snapFault == "" {
			p.snapFault = f
		}
	}
	for _, f := range []Fault{FaultCrashCommit, FaultCrashCommitIndex, FaultCrashPark} {
		if r.chance(f) && p.crash == "" && p.snapFault == "" {
			p.crash = f
		}
	}
	p.deleteFail = r.chance(FaultDeleteFail)
	p.stopFail = r.chance(FaultStopFail)
	if race {
		return p, true
	}
	p.id = r.newCheckpointID()
	p.live = r.m.live()
	p.records = map[string]recordState{}
	for _, sid := range p.live {
		p.records[sid] = r.m.recordOf(sid)
	}
	return p, false
}

// armCommit arms the plan's faults on the fake provider and the crash
// trigger; a crash that cannot happen with these sessions is dropped from
// the plan. The returned func undoes what must not outlive the commit.
func (r *run) armCommit(p *commitPlan) (disarm func()) {
	disarm = func() {}
	switch p.snapFault {
	case FaultSnapshotFail:
		if len(p.live) > 0 && r.rng.IntN(2) == 0 {
			sb, err := r.o.RequireSessionSandbox(r.life, sample(r.rng, p.live))
			if err == nil {
				r.fk.FailNextFor(fake.OpSnapshot, sb.Handle.SandboxID, 1)
			}
		} else {
			r.fk.FailNext(fake.OpSnapshot, 1)
		}
	case FaultSnapshotFailAfter:
		r.fk.FailAfterEffect(fake.OpSnapshot, 1)
	case FaultLatency:
		// The round's deadline is on the logical clock: moved past it once
		// the round has armed it (or the commit ended without a round).
		r.fk.HangNext(fake.OpSnapshot, 1)
		p.deadline = r.clk.Now().Add(50 * time.Millisecond)
		if r.det != nil {
			// Virtual time moves to the deadline once nothing else can run.
			disarm = func() { r.fk.HangNext(fake.OpSnapshot, 0) }
			break
		}
		ended := make(chan struct{})
		moved := make(chan struct{})
		deadline := p.deadline
		go func() {
			defer close(moved)
			if r.clk.(*clock.Manual).WaitPending(1, ended) {
				r.clk.Set(deadline)
			}
		}()
		disarm = func() {
			close(ended)
			<-moved
			// A hang no snapshot reached must not hold up a later commit.
			r.fk.HangNext(fake.OpSnapshot, 0)
		}
	}
	live := p.live
	switch {
	case p.crash == FaultCrashCommit && len(live) > 1:
		k := r.rng.IntN(len(live)) // 0..n-1 snapshots done
		if k == 0 {
			r.proc.arm(&trigger{op: fake.OpSnapshot, n: 1})
		} else {
			r.proc.arm(&trigger{op: fake.OpSnapshot, n: k, after: true})
		}
	case p.crash == FaultCrashCommitIndex && len(live) > 0:
		r.proc.arm(&trigger{op: fake.OpSnapshot, n: len(live), after: true})
	case p.crash == FaultCrashPark && p.stop && r.onStop == owner.OnStopKill && len(live) > 0:
		r.proc.arm(&trigger{op: fake.OpStop, n: 1 + r.rng.IntN(len(live)), after: r.rng.IntN(2) == 0})
	default:
		p.crash = ""
	}
	if p.deleteFail {
		r.fk.FailNext(fake.OpDeleteSnapshot, 1)
	}
	if p.stopFail {
		r.fk.FailNext(fake.OpStop, 1)
	}
	return disarm
}

// actCommit runs the owner's Commit, the records it must export pending
// until it answers (a crash in it leaves them for recovery to judge).
func (r *run) actCommit(ctx context.Context, p commitPlan) (res owner.CommitResult, err error, crashed bool) {
	r.pendingCommit = &pendingCommit{id: p.id, records: p.records, durable: p.crash == FaultCrashPark}
	err, crashed = r.guarded(func(context.Context) error {
		var err error
		res, err = r.o.Commit(ctx, owner.CommitRequest{CheckpointID: p.id, Stop: p.stop, Deadline: p.deadline})
		return err
	})
	r.tracef("commit %s of %v (stop %v; snapshot fault %q, crash %q, delete fails %v, stop fails %v): exported %v parked %v park failed %v err %v",
		p.id, p.live, p.stop, p.snapFault, p.crash, p.deleteFail, p.stopFail, res.Sessions, res.Parked, res.ParkFailed, err)
	if !crashed {
		r.pendingCommit = nil
	}
	return res, err, crashed
}

// checkCommit holds a commit the owner answered to the model: a commit
// fails only by an injected fault and then records nothing; one that
// succeeds exported every live session, whole, and parked as asked.
func (r *run) checkCommit(p commitPlan, res owner.CommitResult, err error) {
	id := p.id
	snapInjected := r.injectedNow(fake.OpSnapshot) > 0
	if p.snapFault == FaultLatency && err != nil {
		// The round may give up at the deadline before the hung snapshot
		// even reached the backend.
		snapInjected = true
	}
	if snapInjected {
		r.fire(p.snapFault)
	}
	if r.injectedNow(fake.OpDeleteSnapshot) > 0 {
		r.fire(FaultDeleteFail)
	}
	r.noteStopFault()
	if err != nil {
		if !snapInjected {
			r.violate(Unexpected, "commit %s failed without a fault: %v", id, err)
			return
		}
		r.awaitOrphans()
		return
	}
	if snapInjected {
		r.violate(WholeCheckpoints, "commit %s succeeded although one of its snapshots failed (%s)", id, p.snapFault)
		return
	}
	if !slices.Equal(res.Sessions, p.live) || len(res.Skipped) > 0 {
		r.violate(WholeCheckpoints, "commit %s exported %v (skipped %v), want %v", id, res.Sessions, res.Skipped, p.live)
		return
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: p.records}
	if !r.settlePark(res, p.stop) {
		return
	}
	if p.drift {
		r.drift(id)
	}
}

// awaitOrphans waits for the owner to clean up the snapshots of a failed
// round that landed after the round gave up on them (the coordinator hands
// them to the owner, which tombstones and deletes them on its own
// goroutine). A no-op Do on every live session waits out its snapshot in
// flight; then every snapshot nothing accounts for must see its delete.
func (r *run) awaitOrphans() {
	for _, sid := range r.m.live() {
		_ = r.o.Do(r.life, sid, func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil })
	}
	st, ok := r.checkCheckpoints(r.o.Index(), "index")
	if !ok {
		return
	}
	var orphans []string
	templates := r.templateSnapshots()
	for _, id := range r.fk.SnapshotIDs() {
		if len(st.refs[id]) == 0 && !st.tomb[id] && !templates[id] {
			orphans = append(orphans, id)
		}
	}
	if len(orphans) == 0 {
		return
	}
	r.calls.expect(fake.OpDeleteSnapshot, orphans)
	for _, id := range orphans {
		if _, ok := r.fk.SnapshotInfo(id); !ok {
			// Deleted between the listing and expect.
			r.calls.observe(fake.OpDeleteSnapshot, id, nil)
		}
	}
	missing := r.waitCalls(30 * time.Second)
	r.tracef("late snapshots of the failed round: %v (not deleted: %v)", orphans, missing)
	if len(missing) > 0 {
		r.violate(NoLeak, "snapshots %v landed after their round gave up and were never deleted", missing)
	}
}

// settlePark applies a stop commit's parking to the model.
func (r *run) settlePark(res owner.CommitResult, stop bool) bool {
	if !stop || r.onStop != owner.OnStopKill {
		if len(res.Parked) > 0 {
			r.violate(LiveState, "a commit parked %v with stop %v, on_stop %s", res.Parked, stop, r.onStop)
			return false
		}
		return true
	}
	for _, sid := range res.Parked {
		r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	}
	if len(res.ParkFailed) > 0 && r.injectedNow(fake.OpStop) == 0 {
		r.violate(Unexpected, "parking failed without a fault: %v", res.ParkFailed)
		return false
	}
	if len(res.Parked)+len(res.ParkFailed) != len(res.Sessions) {
		r.violate(LiveState, "a stop commit exported %v but parked %v (failed %v)", res.Sessions, res.Parked, res.ParkFailed)
		return false
	}
	return true
}

// drift moves a session of checkpoint id on, crashes the owner and restores
// the checkpoint: the drift must be gone.
func (r *run) drift(id string) {
	ck := r.m.ckpts[id]
	var moved []string
	for _, sid := range r.m.live() {
		if _, ok := ck.records[sid]; ok {
			moved = append(moved, sid)
		}
	}
	if len(moved) == 0 {
		return
	}
	r.fire(FaultDrift)
	sid := sample(r.rng, moved)
	r.nextLine++
	line := fmt.Sprintf("%s-drift%d", sid, r.nextLine)
	if err := r.o.Do(r.life, sid, appendNote(line)); err != nil {
		r.violate(Unexpected, "drift append to %s: %v", sid, err)
		return
	}
	s := r.m.sessions[sid]
	s.notes = append(s.notes, line)
	r.tracef("drift: %s appended %q after checkpoint %s; crash and restore it", sid, line, id)
	r.crash()
	r.afterCrash()
	if r.broken {
		return
	}
	r.restore(id, nil, false)
}

// recommitPlan is what one recommit chose: a checkpoint that exists.
type recommitPlan struct{ id string }

// opRecommit retries the commit of a checkpoint that exists, in the
// simulation's one shape; it arms nothing: choose, act, check.
func (r *run) opRecommit() {
	p, ok := r.chooseRecommit()
	if !ok {
		return
	}
	res, snapshots, err := r.actRecommit(p)
	r.checkRecommit(p, res, snapshots, err)
}

func (r *run) chooseRecommit() (recommitPlan, bool) {
	ids := r.m.checkpointIDs()
	if len(ids) == 0 {
		return recommitPlan{}, false
	}
	return recommitPlan{id: sample(r.rng, ids)}, true
}

// actRecommit commits again; snapshots is how many snapshots the provider
// took meanwhile.
func (r *run) actRecommit(p recommitPlan) (res owner.CommitResult, snapshots int, err error) {
	before := r.fk.Stats().Calls[fake.OpSnapshot]
	res, err = r.o.Commit(r.life, owner.CommitRequest{CheckpointID: p.id})
	r.tracef("recommit %s: existing %v sessions %v err %v", p.id, res.Existing, res.Sessions, err)
	return res, r.fk.Stats().Calls[fake.OpSnapshot] - before, err
}

// checkRecommit holds a retried commit to the model: it answers the stored
// checkpoint and snapshots nothing again.
func (r *run) checkRecommit(p recommitPlan, res owner.CommitResult, snapshots int, err error) {
	want := slices.Sorted(maps.Keys(r.m.ckpts[p.id].records))
	switch {
	case err != nil:
		r.violate(Unexpected, "a retried commit of %s failed: %v", p.id, err)
	case !res.Existing || !slices.Equal(res.Sessions, want):
		r.violate(WholeCheckpoints, "a retried commit of %s: existing %v sessions %v, want the stored %v", p.id, res.Existing, res.Sessions, want)
	case snapshots != 0:
		r.violate(WholeCheckpoints, "a retried commit of %s snapshotted again", p.id)
	}
}

// raceCommit runs a seed and an end concurrently with a commit. The model
// accepts either order for each; the index check then holds the checkpoint
// to what each exported session held.
func (r *run) raceCommit() {
	r.fire(FaultRace)
	id := r.newCheckpointID()
	before := map[string]recordState{}
	for _, sid := range r.m.live() {
		before[sid] = r.m.recordOf(sid)
	}
	seedSid, endSid := "", ""
	if absent := r.m.absent(); len(absent) > 0 {
		seedSid = sample(r.rng, absent)
	}
	if live := r.m.live(); len(live) > 0 {
		endSid = sample(r.rng, live)
	}
	token := r.token()
	type outcome struct {
		which string
		err   error
		res   owner.CommitResult
	}
	out := make(chan outcome, 3)
	n := 1
	ctx := r.life
	r.rt.Go(func() {
		res, err := r.o.Commit(ctx, owner.CommitRequest{CheckpointID: id})
		out <- outcome{"commit", err, res}
	})
	if seedSid != "" {
		n++
		r.rt.Go(func() {
			ran := false
			_, err := r.o.StartSessionSandbox(ctx, seedSid, r.spec(), notesSetup(token, false, &ran), "")
			out <- outcome{which: "seed", err: err}
		})
	}
	if endSid != "" {
		n++
		r.rt.Go(func() { out <- outcome{which: "end", err: r.o.EndSessionSandbox(ctx, endSid)} })
	}
	var commit outcome
	var seedErr, endErr error
	for i := 0; i < n; i++ {
		r.rt.Await(ctx, func() bool { return len(out) > 0 })
		o := <-out
		switch o.which {
		case "commit":
			commit = o
		case "seed":
			seedErr = o.err
		case "end":
			endErr = o.err
		}
	}
	r.tracef("race: commit %s exported %v skipped %v err %v; seed %s: %v; end %s: %v",
		id, commit.res.Sessions, commit.res.Skipped, commit.err, seedSid, seedErr, endSid, endErr)
	if seedErr != nil || endErr != nil {
		r.violate(Unexpected, "a race without faults failed: seed %v, end %v", seedErr, endErr)
		return
	}
	if seedSid != "" {
		*r.m.sessions[seedSid] = sessionState{live: true, token: token}
	}
	if endSid != "" {
		r.m.sessions[endSid].live, r.m.sessions[endSid].restored = false, false
	}
	if commit.err != nil {
		// The coordinator counts a session whose actor stopped before it
		// answered as a failure (actors/doc.go), so an end that wins the
		// race can fail the commit; nothing may be recorded then.
		var ce *owner.CommitError
		if errors.As(commit.err, &ce) && ce.Err == nil && len(ce.Failed) == 1 && ce.Failed[endSid] != "" {
			r.tracef("race: the end of %s failed the commit; nothing recorded", endSid)
			return
		}
		r.violate(Unexpected, "a race without faults failed the commit: %v", commit.err)
		return
	}
	records := map[string]recordState{}
	for _, sid := range commit.res.Sessions {
		switch {
		case sid == seedSid:
			records[sid] = recordState{token: token}
		default:
			rec, ok := before[sid]
			if !ok {
				r.violate(WholeCheckpoints, "commit %s exported %s, which was not live", id, sid)
				return
			}
			records[sid] = rec
		}
	}
	for sid := range before {
		if _, ok := records[sid]; !ok && sid != endSid {
			r.violate(WholeCheckpoints, "commit %s did not export live session %s", id, sid)
			return
		}
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: records}
}
