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

// controlKind is which of its three a control step runs.
type controlKind int

const (
	controlCheckpoint controlKind = iota
	controlRetires
	controlLeaseRunsOut
)

// controlPlan is what one control step chose: the checkpoint id and its
// base, which of the three it runs, the live sessions and what the model
// holds of them; for a retire the session it fences ("": none live); for a
// checkpoint a failed snapshot and the session whose agent's exec is held at
// the gate meanwhile ("": none).
type controlPlan struct {
	kind     controlKind
	base     control.Base
	live     []string
	records  map[string]recordState
	retire   string
	snapFail bool
	held     string
}

// controlled is what a checkpoint through the control plane answered: the
// commit's reply and error, and the resume's error.
type controlled struct {
	rep       control.CommitReply
	err, rerr error
}

// opControl drives a checkpoint through the control plane, as the
// controller does, in the simulation's one shape: choose, arm, act, check.
// It is a prepare, then commit and resume (a snapshot may fail), or a
// lease that runs out after the prepare, or a retire of a live episode that
// fences its attempt.
func (r *run) opControl() {
	// Only this step's own faults: a fault an earlier step armed and did
	// not use would make a retire cut short, and prepare wait for it.
	r.fk.ClearFaults()
	m := r.part.Machine()
	r.bindLive()
	p := r.chooseControl()
	switch p.kind {
	case controlRetires:
		r.controlRetire(m, p.base, p.retire)
		return
	case controlLeaseRunsOut:
		r.controlLease(m, p.base)
		return
	}
	r.armControl(p)
	// Nothing holds a prepare up in the simulation; the wall-clock bound
	// turns a bug into a violation instead of a hung run.
	ctx, cancel := r.wallBound(30 * time.Second)
	defer cancel()
	if c, ok := r.actControl(ctx, m, p); ok {
		r.checkControl(p, c)
	}
}

func (r *run) chooseControl() controlPlan {
	live := r.m.live()
	id := r.newCheckpointID()
	p := controlPlan{live: live, base: control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(r.clk.Now().Add(time.Minute))}}
	switch r.rng.IntN(3) {
	case 0:
		p.kind = controlRetires
		if len(live) > 0 {
			p.retire = sample(r.rng, live)
		}
		return p
	case 1:
		p.kind = controlLeaseRunsOut
		return p
	}
	p.snapFail = r.chance(FaultSnapshotFail) && len(live) > 0
	p.records = map[string]recordState{}
	for _, sid := range live {
		p.records[sid] = r.m.recordOf(sid)
	}
	if len(live) > 0 && r.rng.IntN(2) != 0 {
		p.held = sample(r.rng, live)
	}
	return p
}

func (r *run) armControl(p controlPlan) {
	if p.snapFail {
		r.fk.FailNext(fake.OpSnapshot, 1)
	}
}

// actControl prepares, holds an agent's exec at the closed gate, commits
// and resumes; ok is false when the prepare failed (a violation).
func (r *run) actControl(ctx context.Context, m *control.Machine, p controlPlan) (c controlled, ok bool) {
	id := p.base.CheckpointID
	prep, err := m.Prepare(ctx, control.PrepareRequest{Base: p.base})
	if err != nil || prep.Phase != control.PhasePrepared {
		r.violate(Unexpected, "control prepare %s: %+v %v", id, prep, err)
		return c, false
	}
	held := r.heldExec(ctx, p.held)
	c.rep, c.err = m.Commit(ctx, control.CommitRequest{Base: p.base, CheckpointDir: "/ck/" + id})
	_, c.rerr = m.Resume(ctx, control.ResumeRequest{Base: p.base})
	if held != nil {
		// Admission reopened: the agent's exec runs now.
		r.rt.Await(ctx, func() bool { return len(held) > 0 })
		if eerr := <-held; eerr != nil {
			r.violate(Unexpected, "an agent's exec held at the gate during %s: %v", id, eerr)
		}
	}
	r.tracef("control checkpoint %s of %v (snapshot fails %v): committed %v err %v; resume err %v", id, p.live, p.snapFail, c.rep.EpisodeIDs, c.err, c.rerr)
	return c, true
}

// checkControl holds a checkpoint through the control plane to the model:
// the resume succeeds, the commit fails only by the injected snapshot fault
// (and then leaves no snapshot behind), and otherwise exports every live
// session's episode.
func (r *run) checkControl(p controlPlan, c controlled) {
	id := p.base.CheckpointID
	if c.rerr != nil {
		r.violate(Unexpected, "control resume %s: %v", id, c.rerr)
		return
	}
	injected := r.injectedNow(fake.OpSnapshot) > 0
	if injected {
		r.fire(FaultSnapshotFail)
	}
	if c.err != nil {
		if !injected {
			r.violate(Unexpected, "control commit %s failed without a fault: %v", id, c.err)
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
	for _, sid := range p.live {
		want = append(want, episodeOf(sid).CaptureKey())
	}
	sort.Strings(want)
	if !slices.Equal(c.rep.EpisodeIDs, want) && !(len(want) == 0 && len(c.rep.EpisodeIDs) == 0) {
		r.violate(WholeCheckpoints, "control commit %s exported episodes %v, want %v", id, c.rep.EpisodeIDs, want)
		return
	}
	r.m.ckpts[id] = &checkpointState{id: id, records: p.records, control: true}
}

// controlRestorePlan is what a restore through the control plane chose:
// the checkpoint (and what the model holds of it), the sessions it continues, their episodes and the
// attempts they must continue as, and a failed fork.
type controlRestorePlan struct {
	id       string
	ck       *checkpointState
	want     []string
	eps      []control.EpisodeID
	next     []string
	forkFail bool
}

// controlRestore restores checkpoint id (scope nil: all of it) in a fresh
// process through the control plane, as the controller does after a crash:
// restore by checkpoint_dir with the episodes to continue, then resume, in
// the simulation's one shape: choose, arm, act, check.
func (r *run) controlRestore(id string, scope []string) {
	p := r.chooseControlRestore(id, scope)
	if p.forkFail {
		r.fk.FailNext(fake.OpFork, 1)
	}
	incarnation := r.o.Incarnation()
	rep, err, ok := r.actControlRestore(p)
	if ok {
		r.checkControlRestore(p, rep, err, incarnation)
	}
}

func (r *run) chooseControlRestore(id string, scope []string) controlRestorePlan {
	p := controlRestorePlan{id: id, ck: r.m.ckpts[id], want: scope, eps: []control.EpisodeID{}}
	if p.want == nil {
		p.want = slices.Sorted(maps.Keys(r.m.ckpts[id].records))
	}
	for _, sid := range p.want {
		p.eps = append(p.eps, episodeOf(sid))
		p.next = append(p.next, episodeOf(sid).Next().CaptureKey())
	}
	sort.Strings(p.next)
	p.forkFail = r.chance(FaultForkFail) && len(p.want) > 0
	return p
}

// actControlRestore restores and resumes; ok is false when the resume
// failed or left admission closed (a violation).
func (r *run) actControlRestore(p controlRestorePlan) (rep control.RestoreReply, err error, ok bool) {
	m := r.part.Machine()
	base := control.Base{CheckpointID: r.newCheckpointID(), DeadlineTS: control.UnixSeconds(r.clk.Now().Add(time.Minute))}
	ctx, cancel := r.wallBound(30 * time.Second)
	defer cancel()
	rep, err = m.Restore(ctx, control.RestoreRequest{Base: base, CheckpointDir: "/ck/" + p.id, EpisodeIDs: p.eps})
	_, rerr := m.Resume(ctx, control.ResumeRequest{Base: base})
	r.tracef("control restore of %s episodes %v (fork fails %v): restored %v err %v; resume err %v", p.id, p.want, p.forkFail, rep.Restored, err, rerr)
	if rerr != nil || !r.part.Gate().IsOpen() {
		r.violate(Unexpected, "control resume after restoring %s: %v (admission open %v)", p.id, rerr, r.part.Gate().IsOpen())
		return rep, err, false
	}
	return rep, err, true
}

// checkControlRestore holds a restore through the control plane to the
// model: it fails only by the injected fork fault, and then leaves nothing
// installed; otherwise the episodes come back under their next attempts,
// each session on its fork.
func (r *run) checkControlRestore(p controlRestorePlan, rep control.RestoreReply, err error, incarnation string) {
	injected := r.injectedNow(fake.OpFork) > 0
	if injected {
		r.fire(FaultForkFail)
	}
	if err != nil {
		if !injected {
			r.violate(Unexpected, "control restore of %s failed without a fault: %v", p.id, err)
			return
		}
		r.checkRolledBack(p.id, incarnation)
		return
	}
	if injected {
		r.violate(AllOrNone, "control restore of %s succeeded although a fork failed", p.id)
		return
	}
	if !slices.Equal(rep.Restored, p.next) {
		r.violate(AllOrNone, "control restore of %s continued episodes %v, want %v", p.id, rep.Restored, p.next)
		return
	}
	for _, sid := range p.want {
		sb, err := r.o.RequireSessionSandbox(r.life, sid)
		if err != nil {
			r.violate(AllOrNone, "control restore of %s did not install %s: %v", p.id, sid, err)
			return
		}
		if !r.checkRestored(p.ck, sid, sb) {
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

// controlRetire retires a live episode (sid "": none is live): its
// sandbox stops (the snapshots stay), its requests are refused as stale,
// and forget lifts the fence.
func (r *run) controlRetire(m *control.Machine, base control.Base, sid string) {
	if sid == "" {
		return
	}
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

// heldExec sends an agent's exec on live session sid's sandbox through
// the admission gate, as the sandbox API does, while a checkpoint is
// prepared (sid "": none): it must wait at the closed gate (it reads the
// seed token and changes nothing, so the checkpoint's records stay the
// model's). It returns once the exec waits; the channel gets its outcome.
func (r *run) heldExec(ctx context.Context, sid string) <-chan error {
	if sid == "" {
		return nil
	}
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
