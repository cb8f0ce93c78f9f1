package control

import (
	"context"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/broadcast"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/sched"
)

// Hooks are the participant's effects. The machine calls CloseAdmission and
// OpenAdmission with its lock held (they must not call back into the
// machine); the others without.
type Hooks interface {
	// CloseAdmission makes data requests wait; if it fails, the machine
	// reopens and fails the operation.
	CloseAdmission() error
	// OpenAdmission lets waiting and new requests in.
	OpenAdmission()
	// Readiness reports whether a checkpoint can be cut now. The machine
	// caps Blockers and fills BlockerCount.
	Readiness() Report
	// Commit exports the scope and records it durably.
	Commit(ctx context.Context, req CommitRequest) (CommitResult, error)
	// Restore installs the requested episodes under their next attempts,
	// all or none; it refuses a process that already serves sessions.
	Restore(ctx context.Context, req RestoreRequest) (RestoreResult, error)
	// Retire stops the work of the given attempts (already fenced) and
	// frees their state. It must tolerate repeats.
	Retire(ctx context.Context, episodes []EpisodeID) error
	// Forget drops what the hooks keep of retired rollouts.
	Forget(rolloutIDs []string)
	// StopWriter stops the commit writer of checkpoint id, as a resume
	// must before it reopens: once it returns, no commit of id is
	// recorded, and what an unrecorded commit of id took is let go. It
	// must tolerate repeats and ids never committed.
	StopWriter(id string)
	// Describe adds the participant's fields to status.
	Describe() Description
}

// CommitResult is what Hooks.Commit recorded.
type CommitResult struct {
	Manifest   Manifest
	EpisodeIDs []string
	Parked     []string
}

// RestoreResult is what Hooks.Restore installed.
type RestoreResult struct {
	SourceCheckpointID string
	// Restored are capture keys of the next attempts.
	Restored []string
}

// Config configures a Machine.
type Config struct {
	// Kind is the participant kind ("resources"); Instance its config name.
	Kind, Instance string
	Hooks          Hooks
	// Clock reads time for deadlines and the lease (default the wall
	// clock).
	Clock clock.Clock
	// Runtime runs the hooks' commit and restore and the waits for them
	// (nil: goroutines and blocking selects).
	Runtime sched.Runtime
	// LeaseGrace is added to deadline_ts to give the lease (default 600 s).
	LeaseGrace time.Duration
	// PollEvery bounds a prepare's wait between readiness checks, on the
	// clock (default 1 s).
	PollEvery time.Duration
	// MaxDeadline bounds how far ahead of now a prepare's or a renew's
	// deadline_ts may be (default DefaultMaxDeadline): a deadline years
	// ahead would keep admission closed until a resume.
	MaxDeadline time.Duration
	Logger      logrus.FieldLogger
}

// Defaults.
const (
	DefaultLeaseGrace  = 600 * time.Second
	DefaultMaxDeadline = time.Hour
	ResumedMemory      = 64
	eventMemory        = 64
)

// Operation names, as routes and as keys of recorded replies.
const (
	OpPrepare = "prepare"
	OpCommit  = "commit"
	OpRestore = "restore"
	OpResume  = "resume"
	OpRetire  = "retire"
	OpForget  = "forget"
	OpRenew   = "renew"
)

// call is one run of a commit or restore hook; awaiters wait on done.
type call struct {
	done  chan struct{}
	reply any
	err   error
}

// Machine is the shell around State: it serialises steps, performs their
// effects (the hooks, the log, wake-ups), runs commit and restore hooks once
// per id on their own goroutine, and waits on the clock. It is safe for
// concurrent use.
type Machine struct {
	cfg   Config
	hooks Hooks
	clk   clock.Clock
	rt    sched.Runtime
	log   logrus.FieldLogger

	// changed wakes waiting prepares: readiness may have changed, or the
	// checkpoint was resumed.
	changed *broadcast.Broadcast

	mu    sync.Mutex
	st    *state
	calls map[opKey]*call
}

// New returns an idle machine.
func New(cfg Config) *Machine {
	if cfg.Kind == "" {
		cfg.Kind = "resources"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.LeaseGrace <= 0 {
		cfg.LeaseGrace = DefaultLeaseGrace
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = time.Second
	}
	if cfg.MaxDeadline <= 0 {
		cfg.MaxDeadline = DefaultMaxDeadline
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Discard()
	}
	return &Machine{
		cfg:     cfg,
		hooks:   cfg.Hooks,
		clk:     cfg.Clock,
		rt:      sched.Or(cfg.Runtime),
		log:     cfg.Logger.WithField("component", "checkpoint-control"),
		changed: broadcast.New(),
		st:      newState(cfg.Kind, cfg.Instance, cfg.LeaseGrace, cfg.MaxDeadline),
		calls:   map[opKey]*call{},
	}
}

// step applies in and performs its effects: admission changes with the
// lock held (so they happen in the order of the steps), the rest after. A
// close of admission that fails is stepped back in.
func (m *Machine) step(ctx context.Context, in input) output {
	out, _ := m.stepRun(ctx, in)
	return out
}

// stepRun is step that also hands back the run the output's Await names,
// taken under the step's lock. Looked up after the lock is let go, a run
// that ended in between would be gone: the caller would step again and
// start a second run of the hook in place of reporting the first one's
// failure.
func (m *Machine) stepRun(ctx context.Context, in input) (output, *call) {
	m.mu.Lock()
	out := m.st.Step(in, m.clk.Now())
	var after []effect
	for i := 0; i < len(out.Effects); i++ {
		switch e := out.Effects[i].(type) {
		case effCloseAdmission:
			if err := m.hooks.CloseAdmission(); err != nil {
				// What the step did is undone, and nothing after the
				// close is performed.
				out = m.st.Step(inAdmissionFailed{Op: e.Op, ID: e.ID, Err: err}, m.clk.Now())
				i = -1
			}
		case effOpenAdmission:
			m.hooks.OpenAdmission()
		case effRun:
			m.calls[e.Key] = &call{done: make(chan struct{})}
		case effSettle:
			if c, ok := m.calls[e.Key]; ok {
				delete(m.calls, e.Key)
				c.reply, c.err = e.Reply, e.Err
				close(c.done)
			}
		default:
			after = append(after, e)
		}
	}
	var run *call
	if out.Await != nil {
		// The state's running runs and the calls are kept in step under
		// the lock, so an awaited run is always here.
		run = m.calls[*out.Await]
	}
	m.mu.Unlock()
	m.perform(ctx, after)
	return out, run
}

// perform runs the effects that need no lock; its lines carry the id of
// the request ctx serves.
func (m *Machine) perform(ctx context.Context, effects []effect) {
	for _, e := range effects {
		switch e := e.(type) {
		case effNotify:
			m.changed.Fire()
		case effLog:
			logs.ForRequest(ctx, m.log).WithFields(e.Fields).Log(e.Level, e.Msg)
		case effForget:
			m.hooks.Forget(e.RolloutIDs)
		case effStopWriter:
			m.hooks.StopWriter(e.ID)
		}
	}
}

// Notify wakes waiting prepares; the gate calls it when requests finish.
func (m *Machine) Notify() { m.changed.Fire() }

// Changed returns a channel closed at the machine's next change (a phase
// opened or ended, a run finished, a Notify), for tests and the simulation
// to wait on instead of sleeping.
func (m *Machine) Changed() <-chan struct{} { return m.changed.Wait() }

// Phase reports the current phase and active checkpoint id.
func (m *Machine) Phase() (Phase, string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Phase, m.st.Active
}

// Events returns the last events, oldest first.
func (m *Machine) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Events()
}

// Fenced reports whether e is an attempt a retire refused.
func (m *Machine) Fenced(e EpisodeID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Fenced(e)
}

// FencedRollouts is how many rollouts carry retire marks.
func (m *Machine) FencedRollouts() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.FencedRollouts()
}

// Tick resumes the active checkpoint if its lease has passed (unless a
// commit or restore of it is still running; the next tick retries). It
// reports whether it did.
func (m *Machine) Tick() bool {
	// A tick serves no request: its lines carry none.
	expired, _ := m.step(context.Background(), inTick{}).Reply.(bool)
	return expired
}

// Status reports the phase, the lease, the retire marks and readiness.
func (m *Machine) Status() Status {
	in := inStatus{Report: m.hooks.Readiness(), Description: m.hooks.Describe()}
	st, _ := m.step(context.Background(), in).Reply.(Status)
	return st
}

// Prepare closes admission and waits until the participant is ready or the
// deadline passes. Not ready by then is not an error: the reply's phase is
// preparing, its report names the blockers, and admission stays closed.
func (m *Machine) Prepare(ctx context.Context, req PrepareRequest) (PrepareReply, error) {
	out := m.step(ctx, inPrepare{Req: req})
	if !out.Wait {
		rep, _ := out.Reply.(PrepareReply)
		return rep, out.Err
	}
	deadline := req.Deadline()
	timer := m.clk.NewTimer(min(m.cfg.PollEvery, deadline.Sub(m.clk.Now())))
	defer timer.Stop()
	for {
		woken := m.changed.Wait()
		out := m.step(ctx, inReadiness{Req: req, Report: m.hooks.Readiness()})
		if !out.Wait {
			rep, _ := out.Reply.(PrepareReply)
			return rep, out.Err
		}
		m.rt.Await(ctx, func() bool { return sched.Closed(woken) || len(timer.C()) > 0 })
		// A change wins over the poll, which wins over an ended context,
		// in a fixed order (select would pick at random).
		if sched.Closed(woken) {
			continue
		}
		if len(timer.C()) > 0 {
			<-timer.C()
			timer.Reset(min(m.cfg.PollEvery, deadline.Sub(m.clk.Now())))
			continue
		}
		select {
		case <-woken:
		case <-timer.C():
			timer.Reset(min(m.cfg.PollEvery, deadline.Sub(m.clk.Now())))
		case <-ctx.Done():
			return PrepareReply{}, ErrDeadlineExceeded.With("prepare of %q: %v", req.CheckpointID, ctx.Err())
		}
	}
}

// await waits for run c, bounded by the request's deadline (on the clock)
// and its context; the run itself goes on.
func (m *Machine) await(ctx context.Context, b Base, c *call) (any, error) {
	wait := b.Deadline().Sub(m.clk.Now())
	if wait <= 0 {
		select {
		case <-c.done:
			return c.reply, c.err
		default:
			return nil, ErrDeadlineExceeded.With("checkpoint %q: deadline passed", b.CheckpointID)
		}
	}
	t := m.clk.NewTimer(wait)
	defer t.Stop()
	m.rt.Await(ctx, func() bool { return sched.Closed(c.done) || len(t.C()) > 0 })
	// The run's end wins over the deadline and the context, in a fixed
	// order (select would pick at random).
	if sched.Closed(c.done) {
		return c.reply, c.err
	}
	select {
	case <-c.done:
		return c.reply, c.err
	case <-t.C():
		return nil, ErrDeadlineExceeded.With("checkpoint %q: deadline passed; the operation continues and a retry awaits it", b.CheckpointID)
	case <-ctx.Done():
		return nil, ErrDeadlineExceeded.With("checkpoint %q: %v", b.CheckpointID, ctx.Err())
	}
}

// Commit cuts the checkpoint: readiness is checked again, a scope naming a
// restart is refused, and the hook runs once per checkpoint id, shielded from
// the caller's deadline.
func (m *Machine) Commit(ctx context.Context, req CommitRequest) (CommitReply, error) {
	out, run := m.stepRun(ctx, inCommit{Req: req})
	if out.Start {
		// Shielded from the caller's deadline: the run goes on, and a
		// retry awaits it.
		shielded := context.WithoutCancel(ctx)
		m.rt.Go(func() { m.runCommit(shielded, req) })
	}
	v, err := out.Reply, out.Err
	if out.Await != nil {
		v, err = m.await(ctx, req.Base, run)
	}
	rep, _ := v.(CommitReply)
	return rep, err
}

func (m *Machine) runCommit(ctx context.Context, req CommitRequest) {
	out := m.step(ctx, inCommitCheck{Req: req, Report: m.hooks.Readiness()})
	if !out.Start {
		return
	}
	res, err := m.hooks.Commit(ctx, req)
	m.step(ctx, inCommitDone{Req: req, Result: res, Err: err})
}

// Restore installs checkpointed episodes in a process with no live state:
// admission closes, the hook runs shielded from the deadline, and on failure
// admission reopens once the hook has returned.
func (m *Machine) Restore(ctx context.Context, req RestoreRequest) (RestoreReply, error) {
	out, run := m.stepRun(ctx, inRestore{Req: req})
	if out.Start {
		shielded := context.WithoutCancel(ctx)
		m.rt.Go(func() {
			res, err := m.hooks.Restore(shielded, req)
			m.step(shielded, inRestoreDone{Req: req, Result: res, Err: err})
		})
	}
	v, err := out.Reply, out.Err
	if out.Await != nil {
		v, err = m.await(ctx, req.Base, run)
	}
	rep, _ := v.(RestoreReply)
	return rep, err
}

// Resume ends the checkpoint (or aborts it) and reopens admission. A commit
// of the id still running is not waited for: its writer is stopped first,
// so nothing of it is recorded, and admission reopens at once. A restore
// still running is waited for. Resuming an id already resumed is
// idempotent; resuming while idle fences the id, so a late prepare of it
// cannot close admission.
func (m *Machine) Resume(ctx context.Context, req ResumeRequest) (ResumeReply, error) {
	stopped := false
	for {
		out, run := m.stepRun(ctx, inResume{Req: req, WriterStopped: stopped})
		if out.StopWriter {
			m.hooks.StopWriter(req.CheckpointID)
			stopped = true
			continue
		}
		if out.Await == nil {
			rep, _ := out.Reply.(ResumeReply)
			return rep, out.Err
		}
		if _, err := m.await(ctx, req.Base, run); err != nil && IsCode(err, ErrDeadlineExceeded) {
			return ResumeReply{}, err
		}
	}
}

// IsCode reports whether err is a protocol error with target's code.
func IsCode(err error, target *problem.Error) bool {
	e, ok := err.(*problem.Error)
	return ok && e.Code == target.Code
}

// Retire fences the attempts (every attempt of the rollout up to the highest
// named) and has the hooks stop their work. The marks outlive the call until
// forget; a retire that fails can be repeated.
func (m *Machine) Retire(ctx context.Context, req RetireRequest) (RetireReply, error) {
	for {
		out, run := m.stepRun(ctx, inRetire{Req: req})
		if out.Await != nil {
			if _, err := m.await(ctx, req.Base, run); IsCode(err, ErrDeadlineExceeded) {
				return RetireReply{}, err
			}
			continue
		}
		if out.Err != nil {
			return RetireReply{}, out.Err
		}
		eff := out.Effects[len(out.Effects)-1].(effRetire)
		rctx, cancel := clock.WithDeadline(ctx, m.clk, eff.Deadline)
		err := m.hooks.Retire(rctx, eff.Episodes)
		cancel()
		done := m.step(ctx, inRetireDone{Req: req, Err: err})
		rep, _ := done.Reply.(RetireReply)
		return rep, done.Err
	}
}

// Forget drops the retire marks of rollouts that can no longer run.
func (m *Machine) Forget(ctx context.Context, req ForgetRequest) (ForgetReply, error) {
	out := m.step(ctx, inForget{Req: req})
	rep, _ := out.Reply.(ForgetReply)
	return rep, out.Err
}

// Renew extends the active checkpoint's lease.
func (m *Machine) Renew(ctx context.Context, req RenewRequest) (RenewReply, error) {
	out := m.step(ctx, inRenew{Req: req})
	rep, _ := out.Reply.(RenewReply)
	return rep, out.Err
}
