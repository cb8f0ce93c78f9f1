package control

import (
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/fifo"
)

// state is the whole of the control plane's decisions: the phase, the
// active checkpoint, its lease, the recorded replies, the runs in flight,
// the resumed ids and the retire marks. Step is its only writer. It holds no
// lock, goroutine or timer; Machine is the shell that performs its effects.
type state struct {
	Kind, Instance string
	LeaseGrace     time.Duration
	MaxDeadline    time.Duration

	Phase  Phase
	Active string
	Lease  time.Time
	// results are the replies recorded per (id, operation); a retry with
	// the same arguments gets them again.
	results map[opKey]recorded
	// running are the commits and restores in flight, by their arguments'
	// fingerprint.
	running  map[opKey]string
	resumed  *fifo.Map[string, struct{}]
	fence    map[string]int // rollout id -> highest retired attempt
	Retiring int
	events   []Event // the last eventMemory, oldest first
}

// opKey names one operation on one checkpoint id.
type opKey struct{ ID, Op string }

type recorded struct {
	fp    string
	reply any
}

// newState returns an idle state.
func newState(kind, instance string, leaseGrace, maxDeadline time.Duration) *state {
	return &state{
		Kind: kind, Instance: instance, LeaseGrace: leaseGrace, MaxDeadline: maxDeadline,
		Phase:   PhaseIdle,
		results: map[opKey]recorded{},
		running: map[opKey]string{},
		resumed: fifo.New[string, struct{}](ResumedMemory),
		fence:   map[string]int{},
	}
}

// Inputs: one per route, one per hook completion, and the lease's tick.
type (
	// inPrepare opens a prepare (or joins one of the same id).
	inPrepare struct{ Req PrepareRequest }
	// inReadiness is a prepare's readiness check.
	inReadiness struct {
		Req    PrepareRequest
		Report Report
	}
	// inCommit admits a commit.
	inCommit struct{ Req CommitRequest }
	// inCommitCheck is a commit run's readiness check, before its hook.
	inCommitCheck struct {
		Req    CommitRequest
		Report Report
	}
	// inCommitDone is the commit hook's outcome.
	inCommitDone struct {
		Req    CommitRequest
		Result CommitResult
		Err    error
	}
	// inRestore admits a restore.
	inRestore struct{ Req RestoreRequest }
	// inRestoreDone is the restore hook's outcome.
	inRestoreDone struct {
		Req    RestoreRequest
		Result RestoreResult
		Err    error
	}
	// inResume ends (or aborts) a checkpoint. WriterStopped: the caller
	// stopped the writer of a commit of the id still running.
	inResume struct {
		Req           ResumeRequest
		WriterStopped bool
	}
	// inRetire fences attempts.
	inRetire struct{ Req RetireRequest }
	// inRetireDone is the retire hook's outcome.
	inRetireDone struct {
		Req RetireRequest
		Err error
	}
	// inForget drops retire marks.
	inForget struct{ Req ForgetRequest }
	// inRenew extends the lease.
	inRenew struct{ Req RenewRequest }
	// inTick checks the lease.
	inTick struct{}
	// inStatus reports the state with the hooks' readiness and fields.
	inStatus struct {
		Report      Report
		Description Description
	}
	// inAdmissionFailed: the hooks could not close admission for op.
	inAdmissionFailed struct {
		Op, ID string
		Err    error
	}
)

// input is one of the In* types.
type input any

// Effects the shell performs, in order.
type (
	// effCloseAdmission makes data requests wait; if it fails the shell
	// steps inAdmissionFailed.
	effCloseAdmission struct{ Op, ID string }
	// effOpenAdmission lets them in.
	effOpenAdmission struct{}
	// effRun starts the commit or restore hook of the request the caller
	// holds (output.Start says this caller is the first).
	effRun struct{ Key opKey }
	// effRetire has the hooks stop the fenced attempts, bounded by
	// Deadline; the shell steps inRetireDone.
	effRetire struct {
		Episodes []EpisodeID
		Deadline time.Time
	}
	// effForget drops what the hooks keep of retired rollouts.
	effForget struct{ RolloutIDs []string }
	// effStopWriter stops the commit writer of a checkpoint that ended.
	effStopWriter struct{ ID string }
	// effSettle answers everyone waiting on the run Key with Reply or Err.
	effSettle struct {
		Key   opKey
		Reply any
		Err   error
	}
	// effNotify wakes waiting prepares and awaiters.
	effNotify struct{}
	// effLog is a line for the log.
	effLog struct {
		Level  logrus.Level
		Msg    string
		Fields logrus.Fields
	}
)

// effect is one of the Eff* types.
type effect any

// output is what one Step decided.
type output struct {
	// Reply answers the input (nil while it must wait); Err refuses it.
	Reply any
	Err   error
	// Await names a run in flight the caller waits for: a commit or
	// restore retry, or a resume or retire that must step again after it.
	Await *opKey
	// Start: the caller registered the run (effRun) and must start it;
	// after inCommitCheck, the commit hook may run.
	Start bool
	// Wait: a prepare not yet ready and not yet past its deadline; the
	// caller checks readiness again when woken.
	Wait bool
	// StopWriter: a resume found a commit of its id running; the caller
	// stops its writer (Hooks.StopWriter) and steps again with
	// WriterStopped.
	StopWriter bool
	Effects    []effect
}

func (o *output) emit(e ...effect) { o.Effects = append(o.Effects, e...) }

// Step applies one input at time now.
func (s *state) Step(in input, now time.Time) (out output) {
	switch in := in.(type) {
	case inTick:
		out.Reply = s.expire(now, &out)
	case inStatus:
		s.expire(now, &out)
		out.Reply = s.status(in)
	case inPrepare:
		s.prepare(in.Req, now, &out)
	case inReadiness:
		s.readiness(in, now, &out)
	case inCommit:
		s.commit(in.Req, now, &out)
	case inCommitCheck:
		s.commitCheck(in, &out)
	case inCommitDone:
		s.commitDone(in, &out)
	case inRestore:
		s.restore(in.Req, now, &out)
	case inRestoreDone:
		s.restoreDone(in, &out)
	case inResume:
		s.resume(in, now, &out)
	case inRetire:
		s.retire(in.Req, now, &out)
	case inRetireDone:
		s.Retiring--
		out.emit(effNotify{})
		if in.Err != nil {
			out.Err = in.Err
		} else {
			out.Reply = RetireReply{Retired: CaptureKeys(in.Req.EpisodeIDs)}
		}
	case inForget:
		s.forget(in.Req, now, &out)
	case inRenew:
		s.renew(in.Req, now, &out)
	case inAdmissionFailed:
		s.admissionFailed(in, &out)
	default:
		out.Err = ErrInvalidRequest.With("unknown input %T", in)
	}
	return out
}

// Fenced reports whether e is an attempt a retire refused.
func (s *state) Fenced(e EpisodeID) bool {
	max, ok := s.fence[e.RolloutID]
	return ok && e.Attempt <= max
}

// FencedRollouts is how many rollouts carry retire marks.
func (s *state) FencedRollouts() int { return len(s.fence) }

// Events returns the last events, oldest first.
func (s *state) Events() []Event { return slices.Clone(s.events) }

// Running reports whether a commit or restore of id is in flight.
func (s *state) Running(id string) bool {
	_, ok := s.runningOf(id)
	return ok
}

func (s *state) runningOf(id string) (opKey, bool) {
	for _, op := range []string{OpCommit, OpRestore} {
		if _, ok := s.running[opKey{id, op}]; ok {
			return opKey{id, op}, true
		}
	}
	return opKey{}, false
}

// --- shared rules ---

// admit applies the checks every phased operation shares, in the order of
// the protocol. It returns a recorded reply when there is one.
func (s *state) admit(op, id, fp string, ring bool, allowed ...Phase) (any, bool, error) {
	if ring && s.resumed.Has(id) {
		return nil, false, ErrStaleCheckpoint.With("checkpoint %q was already resumed", id)
	}
	if s.Active != "" && s.Active != id {
		return nil, false, ErrCheckpointConflict.With("checkpoint %q is active, not %q", s.Active, id)
	}
	if r, ok := s.results[opKey{id, op}]; ok {
		if r.fp != fp {
			return nil, false, ErrCheckpointConflict.With("%s of %q was already answered for other arguments", op, id)
		}
		return r.reply, true, nil
	}
	if !slices.Contains(allowed, s.Phase) {
		return nil, false, ErrInvalidPhase.With("%s is not allowed in phase %s", op, s.Phase)
	}
	if s.Phase == PhaseIdle && s.Active != "" && op == OpPrepare {
		// Idle with an active id: its restore is still running.
		return nil, false, ErrInvalidPhase.With("%s: restore of %q is still running", op, s.Active)
	}
	return nil, false, nil
}

// nearEnough refuses a deadline further ahead than MaxDeadline.
func (s *state) nearEnough(now time.Time, b Base) error {
	// Compared as floats: a huge deadline_ts does not fit a time.Time.
	if limit := now.Add(s.MaxDeadline); b.DeadlineTS > UnixSeconds(limit) {
		return ErrInvalidRequest.With("deadline_ts %v is more than %v ahead (checkpoint.max_deadline_seconds)", b.DeadlineTS, s.MaxDeadline)
	}
	return nil
}

func pastDeadline(now time.Time, b Base) error {
	if !now.Before(b.Deadline()) {
		return ErrDeadlineExceeded.With("checkpoint %q: deadline_ts is already past", b.CheckpointID)
	}
	return nil
}

// arm moves the lease to at least deadline + grace.
func (s *state) arm(deadline time.Time) {
	if at := deadline.Add(s.LeaseGrace); at.After(s.Lease) {
		s.Lease = at
	}
}

// reopen ends the checkpoint as a resume does: admission reopens, the id is
// remembered, its recorded replies are cleared.
func (s *state) reopen(id string, out *output) {
	out.emit(effStopWriter{ID: id}, effOpenAdmission{})
	s.resumed.Put(id, struct{}{})
	for k := range s.results {
		if k.ID == id {
			delete(s.results, k)
		}
	}
	s.Phase, s.Active, s.Lease = PhaseIdle, "", time.Time{}
	out.emit(effNotify{})
}

// expire resumes the active checkpoint if its lease has passed (unless a
// commit or restore of it is still running; the next tick retries). It
// reports whether it did.
func (s *state) expire(now time.Time, out *output) bool {
	if s.Active == "" || s.Lease.IsZero() || now.Before(s.Lease) || s.Running(s.Active) {
		return false
	}
	id := s.Active
	out.emit(effLog{Level: logrus.WarnLevel, Msg: "checkpoint lease expired; resuming as the controller would",
		Fields: logrus.Fields{"checkpoint_id": id, "phase": s.Phase, "lease_expired_at": s.Lease}})
	s.events = append(s.events, Event{At: now, Kind: "lease_expired", CheckpointID: id})
	if len(s.events) > eventMemory {
		s.events = s.events[1:]
	}
	s.reopen(id, out)
	return true
}

// normalize caps the blockers and fills the counts of a hooks' report.
func normalize(r Report) Report {
	r.BlockerCount = len(r.Blockers)
	if len(r.Blockers) > MaxBlockers {
		r.Blockers = r.Blockers[:MaxBlockers]
	}
	if r.Blockers == nil {
		r.Blockers = []string{}
	}
	if r.Restarts == nil {
		r.Restarts = []string{}
	}
	if r.Counts == nil {
		r.Counts = map[string]int{}
	}
	return r
}

// --- operations ---

func (s *state) status(in inStatus) Status {
	st := Status{Kind: s.Kind, Instance: s.Instance, Phase: s.Phase, Retiring: s.Retiring, Report: normalize(in.Report),
		RetiredRollouts: len(s.fence), Description: in.Description}
	if s.Active != "" {
		id := s.Active
		st.CheckpointID = &id
	}
	if !s.Lease.IsZero() {
		ts := UnixSeconds(s.Lease)
		st.LeaseExpiresAt = &ts
	}
	return st
}

func (s *state) prepare(req PrepareRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	if out.Err = s.nearEnough(now, req.Base); out.Err != nil {
		return
	}
	s.expire(now, out)
	id := req.CheckpointID
	if r, ok, err := s.admit(OpPrepare, id, "", true, PhaseIdle, PhasePreparing); err != nil || ok {
		out.Reply, out.Err = r, err
		return
	}
	if s.Phase == PhaseIdle {
		if req.Deadline().Before(now) {
			// Closing admission now would only hold every episode until
			// the lease runs out: the commit it prepares is refused.
			out.Err = ErrDeadlineExceeded.With("deadline_ts %v of %q has passed; admission stays open", req.DeadlineTS, id)
			return
		}
		s.Phase, s.Active = PhasePreparing, id
		s.arm(req.Deadline())
		out.emit(effCloseAdmission{Op: OpPrepare, ID: id},
			effLog{Level: logrus.InfoLevel, Msg: "checkpoint prepare: admission closed", Fields: logrus.Fields{"checkpoint_id": id}},
			effNotify{})
	}
	out.Wait = true
}

func (s *state) readiness(in inReadiness, now time.Time, out *output) {
	id := in.Req.CheckpointID
	if s.Active != id || (s.Phase != PhasePreparing && s.Phase != PhasePrepared) {
		out.Err = ErrStaleCheckpoint.With("checkpoint %q was resumed while it prepared", id)
		return
	}
	rep := normalize(in.Report)
	if rep.Ready {
		s.Phase = PhasePrepared
		reply := PrepareReply{Phase: PhasePrepared, Report: rep}
		s.results[opKey{id, OpPrepare}] = recorded{reply: reply}
		out.Reply = reply
		return
	}
	if !now.Before(in.Req.Deadline()) {
		out.Reply = PrepareReply{Phase: PhasePreparing, Report: rep}
		return
	}
	out.Wait = true
}

// commitFP is what a commit retry must repeat.
func commitFP(req CommitRequest) string {
	scope := "*"
	if req.EpisodeIDs != nil {
		scope = strings.Join(CaptureKeys(req.EpisodeIDs), ",")
	}
	return req.CheckpointDir + "\x00" + scope
}

func restoreFP(req RestoreRequest) string {
	return req.CheckpointDir + "\x00" + req.SourceCheckpointID + "\x00" + strings.Join(CaptureKeys(req.EpisodeIDs), ",")
}

// start admits a commit or restore: a recorded reply, the run to await, or
// a new run this caller starts.
func (s *state) start(op, id, fp string, out *output, allowed ...Phase) bool {
	key := opKey{id, op}
	if s.resumed.Has(id) {
		out.Err = ErrStaleCheckpoint.With("checkpoint %q was already resumed", id)
		return false
	}
	if rfp, ok := s.running[key]; ok {
		if rfp != fp {
			out.Err = ErrCheckpointConflict.With("%s of %q is running with other arguments", op, id)
			return false
		}
		out.Await = &key
		return false
	}
	r, ok, err := s.admit(op, id, fp, true, allowed...)
	if err != nil || ok {
		out.Reply, out.Err = r, err
		return false
	}
	return true
}

func (s *state) run(key opKey, fp string, out *output) {
	s.running[key] = fp
	out.Await, out.Start = &key, true
	out.emit(effRun{Key: key})
}

func (s *state) commit(req CommitRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	s.expire(now, out)
	fp := commitFP(req)
	if !s.start(OpCommit, req.CheckpointID, fp, out, PhasePrepared) {
		return
	}
	if out.Err = pastDeadline(now, req.Base); out.Err != nil {
		return
	}
	s.arm(req.Deadline())
	s.run(opKey{req.CheckpointID, OpCommit}, fp, out)
}

// commitCheck decides, before the hook runs, whether the commit may: ready
// again, and no episode of the scope restarting.
func (s *state) commitCheck(in inCommitCheck, out *output) {
	rep := normalize(in.Report)
	if !rep.Ready {
		s.finish(opKey{in.Req.CheckpointID, OpCommit}, nil, ErrInvalidPhase.With("not ready to commit; %d blockers: %s", rep.BlockerCount, strings.Join(rep.Blockers, ", ")), out)
		return
	}
	if in.Req.EpisodeIDs != nil {
		restarts := map[string]bool{}
		for _, k := range rep.Restarts {
			restarts[k] = true
		}
		var clash []string
		for _, k := range CaptureKeys(in.Req.EpisodeIDs) {
			if restarts[k] {
				clash = append(clash, k)
			}
		}
		if len(clash) > 0 {
			s.finish(opKey{in.Req.CheckpointID, OpCommit}, nil, ErrRestartInScope.With("episodes that restart cannot be continued: %s", strings.Join(clash, ", ")), out)
			return
		}
	}
	out.Start = true // go on: run the hook
}

func (s *state) commitDone(in inCommitDone, out *output) {
	id, key := in.Req.CheckpointID, opKey{in.Req.CheckpointID, OpCommit}
	if in.Err != nil {
		out.emit(effLog{Level: logrus.WarnLevel, Msg: "checkpoint commit failed", Fields: logrus.Fields{"checkpoint_id": id, logrus.ErrorKey: in.Err}})
		s.finish(key, nil, in.Err, out)
		return
	}
	res := in.Result
	reply := CommitReply{Phase: PhaseCommitted, Manifest: res.Manifest, EpisodeIDs: res.EpisodeIDs, Parked: res.Parked}
	if reply.EpisodeIDs == nil {
		reply.EpisodeIDs = []string{}
	}
	if s.Active == id && s.Phase == PhasePrepared {
		s.Phase = PhaseCommitted
	}
	s.finish(key, reply, nil, out)
}

// finish ends a run: a reply is recorded, an error is not (a retry runs
// again), and every waiter is woken.
func (s *state) finish(key opKey, reply any, err error, out *output) {
	fp := s.running[key]
	delete(s.running, key)
	if err == nil && !s.resumed.Has(key.ID) {
		s.results[key] = recorded{fp: fp, reply: reply}
	}
	out.Reply, out.Err = reply, err
	out.emit(effSettle{Key: key, Reply: reply, Err: err}, effNotify{})
}

func (s *state) restore(req RestoreRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	s.expire(now, out)
	fp := restoreFP(req)
	if !s.start(OpRestore, req.CheckpointID, fp, out, PhaseIdle) {
		return
	}
	if out.Err = pastDeadline(now, req.Base); out.Err != nil {
		return
	}
	// Active while it runs, so another checkpoint conflicts.
	s.Active = req.CheckpointID
	out.emit(effCloseAdmission{Op: OpRestore, ID: req.CheckpointID})
	s.run(opKey{req.CheckpointID, OpRestore}, fp, out)
}

func (s *state) restoreDone(in inRestoreDone, out *output) {
	id, key := in.Req.CheckpointID, opKey{in.Req.CheckpointID, OpRestore}
	if in.Err != nil {
		out.emit(effOpenAdmission{})
		if s.Active == id {
			s.Active = ""
		}
		out.emit(effLog{Level: logrus.WarnLevel, Msg: "checkpoint restore failed; admission reopened", Fields: logrus.Fields{"checkpoint_id": id, logrus.ErrorKey: in.Err}})
		s.finish(key, nil, in.Err, out)
		return
	}
	s.Phase = PhaseRestored
	s.arm(in.Req.Deadline())
	restored := slices.Clone(in.Result.Restored)
	if restored == nil {
		restored = []string{}
	}
	slices.Sort(restored)
	s.finish(key, RestoreReply{Phase: PhaseRestored, SourceCheckpointID: in.Result.SourceCheckpointID, Restored: restored}, nil, out)
}

// admissionFailed undoes what a prepare or restore did before its
// admission could not close.
func (s *state) admissionFailed(in inAdmissionFailed, out *output) {
	out.emit(effOpenAdmission{})
	switch in.Op {
	case OpPrepare:
		s.Phase, s.Active, s.Lease = PhaseIdle, "", time.Time{}
	case OpRestore:
		delete(s.running, opKey{in.ID, OpRestore})
		if s.Active == in.ID {
			s.Active = ""
		}
	}
	out.Err = ErrCheckpoint.With("close admission: %v", in.Err)
	out.emit(effNotify{})
}

func (s *state) resume(in inResume, now time.Time, out *output) {
	req := in.Req
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	s.expire(now, out)
	id := req.CheckpointID
	if s.resumed.Has(id) {
		out.Reply = ResumeReply{Phase: PhaseIdle, Idempotent: true}
		return
	}
	if s.Active != "" && s.Active != id {
		out.Err = ErrCheckpointConflict.With("checkpoint %q is active, not %q", s.Active, id)
		return
	}
	if key, ok := s.runningOf(id); ok {
		switch {
		case key.Op == OpRestore:
			out.Await = &key
			return
		case !in.WriterStopped:
			out.StopWriter = true
			return
		}
		// The commit runs on, but its writer is stopped: nothing of it is
		// recorded, and its snapshots go when it ends.
		out.emit(effLog{Level: logrus.InfoLevel, Msg: "checkpoint resumed during its commit: the commit is abandoned", Fields: logrus.Fields{"checkpoint_id": id}})
	}
	// A resume with no checkpoint open changes nothing but the fence: it
	// answers as a repeat does.
	idle := s.Active == ""
	if !idle {
		out.emit(effLog{Level: logrus.InfoLevel, Msg: "checkpoint resumed: admission open", Fields: logrus.Fields{"checkpoint_id": id}})
	}
	s.reopen(id, out)
	out.Reply = ResumeReply{Phase: PhaseIdle, Idempotent: idle}
}

func (s *state) retire(req RetireRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	s.expire(now, out)
	if _, _, err := s.admit(OpRetire, req.CheckpointID, "", true, PhaseIdle, PhaseRestored); err != nil {
		if IsCode(err, ErrInvalidPhase) {
			err = ErrInvalidPhase.With("retire is not allowed while a checkpoint is open (phase %s); resume first", s.Phase)
		}
		out.Err = err
		return
	}
	// A retire after a restore that outlived its deadline waits for the
	// install, so it stops what the install made.
	if s.Active != "" {
		if key, ok := s.runningOf(s.Active); ok {
			out.Await = &key
			return
		}
	}
	if s.Phase == PhaseRestored {
		s.arm(req.Deadline())
	}
	for _, e := range req.EpisodeIDs {
		if max, ok := s.fence[e.RolloutID]; !ok || e.Attempt > max {
			s.fence[e.RolloutID] = e.Attempt
		}
	}
	s.Retiring++
	out.emit(effRetire{Episodes: req.EpisodeIDs, Deadline: req.Deadline()})
}

func (s *state) forget(req ForgetRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	s.expire(now, out)
	if _, _, err := s.admit(OpForget, req.CheckpointID, "", true, PhaseIdle, PhaseRestored); err != nil {
		out.Err = err
		return
	}
	for _, id := range req.RolloutIDs {
		delete(s.fence, id)
	}
	out.emit(effForget{RolloutIDs: req.RolloutIDs})
	ids := slices.Clone(req.RolloutIDs)
	slices.Sort(ids)
	out.Reply = ForgetReply{Forgotten: slices.Compact(ids)}
}

func (s *state) renew(req RenewRequest, now time.Time, out *output) {
	if out.Err = req.Validate(); out.Err != nil {
		return
	}
	if out.Err = s.nearEnough(now, req.Base); out.Err != nil {
		return
	}
	s.expire(now, out)
	if _, _, err := s.admit(OpRenew, req.CheckpointID, "", true, PhasePreparing, PhasePrepared, PhaseCommitted, PhaseRestored); err != nil {
		out.Err = err
		return
	}
	s.arm(req.Deadline())
	out.Reply = RenewReply{LeaseExpiresAt: UnixSeconds(s.Lease)}
}
