package engine

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"time"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources"
)

// The control plane's lease grace in the simulation: short, so that a lease
// runs out within one step that moves time by less than half a sandbox
// lease.
const simLeaseGrace = 5 * time.Second

// newParticipant is the participant a fresh owner serves: the control
// plane's Step machine and the gate, on the run's clock.
func (r *run) newParticipant() *participant.Participant {
	return participant.New(participant.Config{
		Owner: r.o, Mode: owner.ModeExported, Instance: "notes",
		Clock: r.clk, Runtime: r.rt, LeaseGrace: simLeaseGrace, Logger: r.log,
	})
}

// wallBound is the run's context bounded by d of wall time in the real mode
// (turning a hang into a violation); the deterministic mode reports a hang
// as ErrStuck instead, and a wall-clock bound would make a run depend on
// the machine's speed.
func (r *run) wallBound(d time.Duration) (context.Context, context.CancelFunc) {
	if r.det != nil {
		return context.WithCancel(r.life)
	}
	return context.WithTimeout(r.life, d)
}

// episodeOf is the episode the simulation binds a session to: its own id as
// the rollout, attempt 0.
func episodeOf(sid string) control.EpisodeID { return control.EpisodeID{RolloutID: sid} }

// bindLive tells the participant which sessions run which episode, as the
// data plane's seeds and verifies would have.
func (r *run) bindLive() {
	for _, sid := range r.m.ids {
		if r.m.sessions[sid].live {
			r.part.Bind(sid, episodeOf(sid))
		} else {
			r.part.Unbind(sid)
		}
	}
}

// opControl drives a checkpoint through the control plane, as the
// controller does: prepare, then commit and resume (a snapshot may fail),
// or a lease that runs out after the prepare, or a retire of a live
// episode that fences its attempt.
func (r *run) opControl() {
	// Only this step's own faults: a fault an earlier step armed and did
	// not use would make a retire cut short, and prepare wait for it.
	r.fk.ClearFaults()
	m := r.part.Machine()
	r.bindLive()
	live := r.m.live()
	id := r.newCheckpointID()
	base := control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(r.clk.Now().Add(time.Minute))}
	switch r.rng.IntN(3) {
	case 0:
		r.controlRetire(m, base, live)
		return
	case 1:
		r.controlLease(m, base)
		return
	}
	snapFail := r.chance(FaultSnapshotFail) && len(live) > 0
	if snapFail {
		r.fk.FailNext(fake.OpSnapshot, 1)
	}
	records := map[string]recordState{}
	for _, sid := range live {
		records[sid] = r.m.recordOf(sid)
	}
	// Nothing holds a prepare up in the simulation; the wall-clock bound
	// turns a bug into a violation instead of a hung run.
	ctx, cancel := r.wallBound(30 * time.Second)
	defer cancel()
	prep, err := m.Prepare(ctx, control.PrepareRequest{Base: base})
	if err != nil || prep.Phase != control.PhasePrepared {
		r.violate(Unexpected, "control prepare %s: %+v %v", id, prep, err)
		return
	}
	held := r.heldExec(ctx, live)
	rep, err := m.Commit(ctx, control.CommitRequest{Base: base, CheckpointDir: "/ck/" + id})
	_, rerr := m.Resume(ctx, control.ResumeRequest{Base: base})
	if held != nil {
		// Admission reopened: the agent's exec runs now.
		r.rt.Await(ctx, func() bool { return len(held) > 0 })
		if eerr := <-held; eerr != nil {
			r.violate(Unexpected, "an agent's exec held at the gate during %s: %v", id, eerr)
		}
	}
	r.tracef("control checkpoint %s of %v (snapshot fails %v): committed %v err %v; resume err %v", id, live, snapFail, rep.EpisodeIDs, err, rerr)
	if rerr != nil {
		r.violate(Unexpected, "control resume %s: %v", id, rerr)
		return
	}
	injected := r.injectedNow(fake.OpSnapshot) > 0
	if injected {
		r.fire(FaultSnapshotFail)
	}
	if err != nil {
		if !injected {
			r.violate(Unexpected, "control commit %s failed without a fault: %v", id, err)
			return
		}
		r.awaitOrphans()
		return
	}
	if injected {
		r.violate(WholeCheckpoints, "control commit %s succeeded although a snapshot failed", id)
		return
	}
	var want []string
	for _, sid := range live {
		want = append(want, episodeOf(sid).CaptureKey())
	}
	sort.Strings(want)
	if !slices.Equal(rep.EpisodeIDs, want) && !(len(want) == 0 && len(rep.EpisodeIDs) == 0) {
		r.violate(WholeCheckpoints, "control commit %s exported episodes %v, want %v", id, rep.EpisodeIDs, want)
		return
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: records, control: true}
}

// controlRestore restores checkpoint id (scope nil: all of it) in a fresh
// process through the control plane, as the controller does after a crash:
// restore by checkpoint_dir with the episodes to continue, then resume. The
// episodes come back under their next attempt; a fork that fails fails the
// restore, which must leave nothing installed and admission open after the
// resume.
func (r *run) controlRestore(id string, scope []string) {
	ck := r.m.ckpts[id]
	want := scope
	if want == nil {
		want = slices.Sorted(maps.Keys(ck.records))
	}
	eps := []control.EpisodeID{}
	var next []string
	for _, sid := range want {
		eps = append(eps, episodeOf(sid))
		next = append(next, episodeOf(sid).Next().CaptureKey())
	}
	sort.Strings(next)
	forkFail := r.chance(FaultForkFail) && len(want) > 0
	if forkFail {
		r.fk.FailNext(fake.OpFork, 1)
	}
	m := r.part.Machine()
	incarnation := r.o.Incarnation()
	base := control.Base{CheckpointID: r.newCheckpointID(), DeadlineTS: control.UnixSeconds(r.clk.Now().Add(time.Minute))}
	ctx, cancel := r.wallBound(30 * time.Second)
	defer cancel()
	rep, err := m.Restore(ctx, control.RestoreRequest{Base: base, CheckpointDir: "/ck/" + id, EpisodeIDs: eps})
	_, rerr := m.Resume(ctx, control.ResumeRequest{Base: base})
	r.tracef("control restore of %s episodes %v (fork fails %v): restored %v err %v; resume err %v", id, want, forkFail, rep.Restored, err, rerr)
	if rerr != nil || !r.part.Gate().IsOpen() {
		r.violate(Unexpected, "control resume after restoring %s: %v (admission open %v)", id, rerr, r.part.Gate().IsOpen())
		return
	}
	injected := r.injectedNow(fake.OpFork) > 0
	if injected {
		r.fire(FaultForkFail)
	}
	if err != nil {
		if !injected {
			r.violate(Unexpected, "control restore of %s failed without a fault: %v", id, err)
			return
		}
		r.checkRolledBack(id, incarnation)
		return
	}
	if injected {
		r.violate(AllOrNone, "control restore of %s succeeded although a fork failed", id)
		return
	}
	if !slices.Equal(rep.Restored, next) {
		r.violate(AllOrNone, "control restore of %s continued episodes %v, want %v", id, rep.Restored, next)
		return
	}
	for _, sid := range want {
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			r.violate(AllOrNone, "control restore of %s did not install %s: %v", id, sid, err)
			return
		}
		if !r.checkRestored(ck, sid, sb) {
			return
		}
	}
}

// controlLease prepares, lets the lease run out (deadline plus grace) and
// ticks: admission reopens as a resume would, and the id is stale.
func (r *run) controlLease(m *control.Machine, base control.Base) {
	base.DeadlineTS = control.UnixSeconds(r.clk.Now().Add(time.Second))
	if _, err := m.Prepare(r.life, control.PrepareRequest{Base: base}); err != nil {
		r.violate(Unexpected, "control prepare %s: %v", base.CheckpointID, err)
		return
	}
	if r.part.Gate().IsOpen() {
		r.violate(Unexpected, "admission open after prepare %s", base.CheckpointID)
	}
	// Past deadline + grace (deadline_ts is a float: a second more).
	r.clk.Advance(2*time.Second + simLeaseGrace)
	expired := m.Tick()
	phase, active := m.Phase()
	r.tracef("control lease of %s: expired %v, phase %s", base.CheckpointID, expired, phase)
	if !expired || phase != control.PhaseIdle || active != "" || !r.part.Gate().IsOpen() {
		r.violate(Unexpected, "the lease of %s ran out: expired %v, phase %s, active %q, admission open %v", base.CheckpointID, expired, phase, active, r.part.Gate().IsOpen())
		return
	}
	base.DeadlineTS = control.UnixSeconds(r.clk.Now().Add(time.Minute))
	if _, err := m.Commit(r.life, control.CommitRequest{Base: base, CheckpointDir: "/ck"}); !errors.Is(err, control.ErrStaleCheckpoint) {
		r.violate(WholeCheckpoints, "a commit of %s after its lease ran out: %v, want stale_checkpoint", base.CheckpointID, err)
	}
}

// controlRetire retires a live episode: its sandbox stops (the snapshots
// stay), its requests are refused as stale, and forget lifts the fence.
func (r *run) controlRetire(m *control.Machine, base control.Base, live []string) {
	if len(live) == 0 {
		return
	}
	sid := sample(r.rng, live)
	e := episodeOf(sid)
	_, err := m.Retire(r.life, control.RetireRequest{Base: base, EpisodeIDs: []control.EpisodeID{e}})
	r.tracef("control retire %s: %v", e.CaptureKey(), err)
	if err != nil {
		r.violate(Unexpected, "control retire of %s: %v", sid, err)
		return
	}
	r.m.sessions[sid].live, r.m.sessions[sid].restored = false, false
	r.lastRetired = e
	r.sabotagePoint(atRetired)
	_, aerr := r.part.Admit(r.life, participant.Tool, &resources.Session{ID: sid, Episode: e, HasEpisode: true})
	if !errors.Is(aerr, control.ErrStaleAttempt) {
		r.violate(NoEmptyGrading, "a request of retired episode %s was admitted: %v", e.CaptureKey(), aerr)
	}
	if _, err := m.Forget(r.life, control.ForgetRequest{Base: base, RolloutIDs: []string{e.RolloutID}}); err != nil {
		r.violate(Unexpected, "forget %s: %v", e.RolloutID, err)
	}
}

// heldExec sends an agent's exec on a live session's sandbox through the
// admission gate, as the sandbox API does, while a checkpoint is prepared:
// it must wait at the closed gate (it reads the seed token and changes nothing, so the
// checkpoint's records stay the model's). It returns once the exec waits;
// the channel gets its outcome.
func (r *run) heldExec(ctx context.Context, live []string) <-chan error {
	if len(live) == 0 || r.rng.IntN(2) == 0 {
		return nil
	}
	sid := sample(r.rng, live)
	sb, err := r.o.RequireSessionSandbox(ctx, sid)
	if err != nil {
		r.violate(LiveState, "live session %s has no sandbox: %v", sid, err)
		return nil
	}
	gate := r.part.Gate()
	changed := gate.Changed()
	done := make(chan error, 1)
	id := sb.Handle.SandboxID
	r.rt.Go(func() { done <- r.agentHeldExec(id) })
	for gate.Waiting() == 0 {
		r.rt.Await(ctx, func() bool { return gate.Waiting() > 0 || len(done) > 0 })
		select {
		case <-changed:
			changed = gate.Changed()
		case err := <-done:
			r.violate(Unexpected, "an agent's exec passed the closed gate: %v", err)
			return nil
		case <-ctx.Done():
			r.violate(Unexpected, "an agent's exec never reached the gate: %v", ctx.Err())
			return nil
		}
	}
	r.tracef("agent exec on %s waits at the gate", sid)
	return done
}
