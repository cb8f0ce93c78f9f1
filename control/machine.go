package control

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
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

type opKey struct{ id, op string }

// call is one run of a commit or restore hook; retries wait on done.
type call struct {
	fp    string
	done  chan struct{}
	reply any
	err   error
}

type recorded struct {
	fp    string
	reply any
}

// Machine is the phase machine. It is safe for concurrent use.
type Machine struct {
	cfg   Config
	hooks Hooks
	clk   clock.Clock
	log   logrus.FieldLogger

	// changed wakes waiting prepares: readiness may have changed, or the
	// checkpoint was resumed.
	changed *broadcast

	mu       sync.Mutex
	phase    Phase
	active   string
	lease    time.Time
	results  map[opKey]recorded
	running  map[opKey]*call
	resumed  []string // ring, oldest first
	resumedS map[string]bool
	retiring int
	events   []Event

	// fence has its own lock: the data plane checks it on every request,
	// and it must not wait for a checkpoint operation.
	fenceMu sync.RWMutex
	fence   map[string]int // rollout id -> highest retired attempt
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
		l := logrus.New()
		l.SetOutput(nopWriter{})
		cfg.Logger = l
	}
	return &Machine{
		cfg:      cfg,
		hooks:    cfg.Hooks,
		clk:      cfg.Clock,
		log:      cfg.Logger.WithField("component", "checkpoint-control"),
		changed:  newBroadcast(),
		phase:    PhaseIdle,
		results:  map[opKey]recorded{},
		running:  map[opKey]*call{},
		resumedS: map[string]bool{},
		fence:    map[string]int{},
	}
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

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
	return m.phase, m.active
}

// Events returns the last events, oldest first.
func (m *Machine) Events() []Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.events)
}

// Fenced reports whether e is an attempt a retire refused.
func (m *Machine) Fenced(e EpisodeID) bool {
	m.fenceMu.RLock()
	defer m.fenceMu.RUnlock()
	max, ok := m.fence[e.RolloutID]
	return ok && e.Attempt <= max
}

// FencedRollouts is how many rollouts carry retire marks.
func (m *Machine) FencedRollouts() int {
	m.fenceMu.RLock()
	defer m.fenceMu.RUnlock()
	return len(m.fence)
}

// --- admission of operations ---

// admit applies the checks every phased operation shares, in the order of
// the protocol. It returns a recorded reply when there is one. m.mu is held.
func (m *Machine) admitLocked(op, id, fp string, ring bool, allowed ...Phase) (any, bool, error) {
	if ring && m.resumedS[id] {
		return nil, false, ErrStaleCheckpoint.With("checkpoint %q was already resumed", id)
	}
	if m.active != "" && m.active != id {
		return nil, false, ErrCheckpointConflict.With("checkpoint %q is active, not %q", m.active, id)
	}
	if r, ok := m.results[opKey{id, op}]; ok {
		if r.fp != fp {
			return nil, false, ErrCheckpointConflict.With("%s of %q was already answered for other arguments", op, id)
		}
		return r.reply, true, nil
	}
	if !slices.Contains(allowed, m.phase) {
		return nil, false, ErrInvalidPhase.With("%s is not allowed in phase %s", op, m.phase)
	}
	if m.phase == PhaseIdle && m.active != "" && op == OpPrepare {
		// Idle with an active id: its restore is still running.
		return nil, false, ErrInvalidPhase.With("%s: restore of %q is still running", op, m.active)
	}
	return nil, false, nil
}

// runningLocked returns a commit or restore of id still running, if any.
func (m *Machine) runningLocked(id string) *call {
	for k, c := range m.running {
		if k.id == id {
			return c
		}
	}
	return nil
}

// armLocked moves the lease to at least deadline + grace.
func (m *Machine) armLocked(deadline time.Time) {
	if at := deadline.Add(m.cfg.LeaseGrace); at.After(m.lease) {
		m.lease = at
	}
}

// reopenLocked ends the active checkpoint as a resume does: admission
// reopens, the id is remembered, its recorded replies are cleared.
func (m *Machine) reopenLocked(id string) {
	m.hooks.OpenAdmission()
	m.rememberLocked(id)
	for k := range m.results {
		if k.id == id {
			delete(m.results, k)
		}
	}
	m.phase, m.active, m.lease = PhaseIdle, "", time.Time{}
}

func (m *Machine) rememberLocked(id string) {
	if m.resumedS[id] {
		return
	}
	m.resumed = append(m.resumed, id)
	m.resumedS[id] = true
	if len(m.resumed) > ResumedMemory {
		delete(m.resumedS, m.resumed[0])
		m.resumed = m.resumed[1:]
	}
}

func (m *Machine) eventLocked(kind, id string) {
	m.events = append(m.events, Event{At: m.clk.Now(), Kind: kind, CheckpointID: id})
	if len(m.events) > eventMemory {
		m.events = m.events[1:]
	}
}

// report asks the hooks for readiness and caps the blockers.
func (m *Machine) report() Report {
	r := m.hooks.Readiness()
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

// Tick resumes the active checkpoint if its lease has passed (unless a
// commit or restore of it is still running; the next tick retries). It
// reports whether it did.
func (m *Machine) Tick() bool {
	m.mu.Lock()
	if m.active == "" || m.lease.IsZero() || m.clk.Now().Before(m.lease) {
		m.mu.Unlock()
		return false
	}
	for k := range m.running {
		if k.id == m.active {
			m.mu.Unlock()
			return false
		}
	}
	id := m.active
	m.log.WithFields(logrus.Fields{"checkpoint": id, "phase": m.phase, "lease_expired_at": m.lease}).Warn("checkpoint lease expired; resuming as the controller would")
	m.eventLocked("lease_expired", id)
	m.reopenLocked(id)
	m.mu.Unlock()
	m.changed.Fire()
	return true
}

// --- operations ---

// Status reports the phase, the lease, the retire marks and readiness.
func (m *Machine) Status() Status {
	m.Tick()
	rep := m.report()
	m.mu.Lock()
	st := Status{Kind: m.cfg.Kind, Instance: m.cfg.Instance, Phase: m.phase, Retiring: m.retiring, Report: rep}
	if m.active != "" {
		id := m.active
		st.CheckpointID = &id
	}
	if !m.lease.IsZero() {
		ts := UnixSeconds(m.lease)
		st.LeaseExpiresAt = &ts
	}
	m.mu.Unlock()
	st.RetiredRollouts = m.FencedRollouts()
	st.Description = m.hooks.Describe()
	return st
}

// Prepare closes admission and waits until the participant is ready or the
// deadline passes. Not ready by then is not an error: the reply's phase is
// preparing, its report names the blockers, and admission stays closed.
func (m *Machine) Prepare(ctx context.Context, req PrepareRequest) (PrepareReply, error) {
	if err := req.Validate(); err != nil {
		return PrepareReply{}, err
	}
	if err := m.nearEnough(req.Base); err != nil {
		return PrepareReply{}, err
	}
	m.Tick()
	id := req.CheckpointID
	m.mu.Lock()
	if r, ok, err := m.admitLocked(OpPrepare, id, "", true, PhaseIdle, PhasePreparing); err != nil || ok {
		m.mu.Unlock()
		rep, _ := r.(PrepareReply)
		return rep, err
	}
	if m.phase == PhaseIdle {
		if req.Deadline().Before(m.clk.Now()) {
			// Closing admission now would only hold every episode until
			// the lease runs out: the commit it prepares is refused.
			m.mu.Unlock()
			return PrepareReply{}, ErrDeadlineExceeded.With("deadline_ts %v of %q has passed; admission stays open", req.DeadlineTS, id)
		}
		m.phase, m.active = PhasePreparing, id
		m.armLocked(req.Deadline())
		if err := m.hooks.CloseAdmission(); err != nil {
			m.hooks.OpenAdmission()
			m.phase, m.active, m.lease = PhaseIdle, "", time.Time{}
			m.mu.Unlock()
			return PrepareReply{}, ErrCheckpoint.With("close admission: %v", err)
		}
		m.log.WithField("checkpoint", id).Info("checkpoint prepare: admission closed")
		m.mu.Unlock()
		m.changed.Fire()
	} else {
		m.mu.Unlock()
	}

	deadline := req.Deadline()
	timer := m.clk.NewTimer(min(m.cfg.PollEvery, deadline.Sub(m.clk.Now())))
	defer timer.Stop()
	for {
		woken := m.changed.Wait()
		rep := m.report()
		m.mu.Lock()
		if m.active != id || (m.phase != PhasePreparing && m.phase != PhasePrepared) {
			m.mu.Unlock()
			return PrepareReply{}, ErrStaleCheckpoint.With("checkpoint %q was resumed while it prepared", id)
		}
		if rep.Ready {
			m.phase = PhasePrepared
			reply := PrepareReply{Phase: PhasePrepared, Report: rep}
			m.results[opKey{id, OpPrepare}] = recorded{reply: reply}
			m.mu.Unlock()
			return reply, nil
		}
		m.mu.Unlock()
		if !m.clk.Now().Before(deadline) {
			return PrepareReply{Phase: PhasePreparing, Report: rep}, nil
		}
		select {
		case <-woken:
		case <-timer.C():
			timer.Reset(min(m.cfg.PollEvery, deadline.Sub(m.clk.Now())))
		case <-ctx.Done():
			return PrepareReply{}, ErrDeadlineExceeded.With("prepare of %q: %v", id, ctx.Err())
		}
	}
}

// nearEnough refuses a deadline further ahead than MaxDeadline.
func (m *Machine) nearEnough(b Base) error {
	// Compared as floats: a huge deadline_ts does not fit a time.Time.
	if limit := m.clk.Now().Add(m.cfg.MaxDeadline); b.DeadlineTS > UnixSeconds(limit) {
		return ErrInvalidRequest.With("deadline_ts %v is more than %v ahead (checkpoint.max_deadline_seconds)", b.DeadlineTS, m.cfg.MaxDeadline)
	}
	return nil
}

// startLocked admits a commit or restore. It returns the recorded reply, or
// the run to wait on; first is true when this caller registered it and must
// start it.
func (m *Machine) startLocked(op, id, fp string, allowed ...Phase) (c *call, first bool, rec any, err error) {
	key := opKey{id, op}
	if c, ok := m.running[key]; ok {
		if c.fp != fp {
			return nil, false, nil, ErrCheckpointConflict.With("%s of %q is running with other arguments", op, id)
		}
		return c, false, nil, nil
	}
	r, ok, err := m.admitLocked(op, id, fp, true, allowed...)
	if err != nil || ok {
		return nil, false, r, err
	}
	c = &call{fp: fp, done: make(chan struct{})}
	m.running[key] = c
	return c, true, nil, nil
}

// finish ends a run: a reply is recorded, an error is not (a retry runs
// again), and every waiter is woken.
func (m *Machine) finish(key opKey, c *call, reply any, err error) {
	m.mu.Lock()
	delete(m.running, key)
	if err == nil {
		m.results[key] = recorded{fp: c.fp, reply: reply}
	}
	c.reply, c.err = reply, err
	m.mu.Unlock()
	close(c.done)
	m.changed.Fire()
}

// await waits for a run, bounded by the request's deadline (on the clock)
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
	select {
	case <-c.done:
		return c.reply, c.err
	case <-t.C():
		return nil, ErrDeadlineExceeded.With("checkpoint %q: deadline passed; the operation continues and a retry awaits it", b.CheckpointID)
	case <-ctx.Done():
		return nil, ErrDeadlineExceeded.With("checkpoint %q: %v", b.CheckpointID, ctx.Err())
	}
}

func pastDeadline(now time.Time, b Base) error {
	if !now.Before(b.Deadline()) {
		return ErrDeadlineExceeded.With("checkpoint %q: deadline_ts is already past", b.CheckpointID)
	}
	return nil
}

// Commit cuts the checkpoint: readiness is checked again, a scope naming a
// restart is refused, and the hook runs once per checkpoint id, shielded from
// the caller's deadline.
func (m *Machine) Commit(ctx context.Context, req CommitRequest) (CommitReply, error) {
	if err := req.Validate(); err != nil {
		return CommitReply{}, err
	}
	m.Tick()
	id, key := req.CheckpointID, opKey{req.CheckpointID, OpCommit}
	scope := "*"
	if req.EpisodeIDs != nil {
		scope = strings.Join(CaptureKeys(req.EpisodeIDs), ",")
	}
	m.mu.Lock()
	c, first, rec, err := m.startLocked(OpCommit, id, req.CheckpointDir+"\x00"+scope, PhasePrepared)
	if first {
		if err = pastDeadline(m.clk.Now(), req.Base); err != nil {
			delete(m.running, key)
		} else {
			m.armLocked(req.Deadline())
		}
	}
	m.mu.Unlock()
	if err != nil || rec != nil {
		rep, _ := rec.(CommitReply)
		return rep, err
	}
	if first {
		go m.runCommit(req, key, c)
	}
	v, err := m.await(ctx, req.Base, c)
	rep, _ := v.(CommitReply)
	return rep, err
}

func (m *Machine) runCommit(req CommitRequest, key opKey, c *call) {
	rep := m.report()
	if !rep.Ready {
		m.finish(key, c, nil, ErrInvalidPhase.With("not ready to commit; %d blockers: %s", rep.BlockerCount, strings.Join(rep.Blockers, ", ")))
		return
	}
	if req.EpisodeIDs != nil {
		restarts := map[string]bool{}
		for _, k := range rep.Restarts {
			restarts[k] = true
		}
		var clash []string
		for _, k := range CaptureKeys(req.EpisodeIDs) {
			if restarts[k] {
				clash = append(clash, k)
			}
		}
		if len(clash) > 0 {
			m.finish(key, c, nil, ErrRestartInScope.With("episodes that restart cannot be continued: %s", strings.Join(clash, ", ")))
			return
		}
	}
	res, err := m.hooks.Commit(context.Background(), req)
	if err != nil {
		m.log.WithError(err).WithField("checkpoint", req.CheckpointID).Warn("checkpoint commit failed")
		m.finish(key, c, nil, err)
		return
	}
	reply := CommitReply{Phase: PhaseCommitted, Manifest: res.Manifest, EpisodeIDs: res.EpisodeIDs, Parked: res.Parked}
	if reply.EpisodeIDs == nil {
		reply.EpisodeIDs = []string{}
	}
	m.mu.Lock()
	if m.active == req.CheckpointID && m.phase == PhasePrepared {
		m.phase = PhaseCommitted
	}
	m.mu.Unlock()
	m.finish(key, c, reply, nil)
}

// Restore installs checkpointed episodes in a process with no live state:
// admission closes, the hook runs shielded from the deadline, and on failure
// admission reopens once the hook has returned.
func (m *Machine) Restore(ctx context.Context, req RestoreRequest) (RestoreReply, error) {
	if err := req.Validate(); err != nil {
		return RestoreReply{}, err
	}
	m.Tick()
	id, key := req.CheckpointID, opKey{req.CheckpointID, OpRestore}
	fp := req.CheckpointDir + "\x00" + req.SourceCheckpointID + "\x00" + strings.Join(CaptureKeys(req.EpisodeIDs), ",")
	m.mu.Lock()
	c, first, rec, err := m.startLocked(OpRestore, id, fp, PhaseIdle)
	if first {
		err = pastDeadline(m.clk.Now(), req.Base)
		if err == nil {
			if cerr := m.hooks.CloseAdmission(); cerr != nil {
				m.hooks.OpenAdmission()
				err = ErrCheckpoint.With("close admission: %v", cerr)
			}
		}
		if err != nil {
			delete(m.running, key)
		} else {
			// Active while it runs, so another checkpoint conflicts.
			m.active = id
		}
	}
	m.mu.Unlock()
	if err != nil || rec != nil {
		rep, _ := rec.(RestoreReply)
		return rep, err
	}
	if first {
		go m.runRestore(req, key, c)
	}
	v, err := m.await(ctx, req.Base, c)
	rep, _ := v.(RestoreReply)
	return rep, err
}

func (m *Machine) runRestore(req RestoreRequest, key opKey, c *call) {
	res, err := m.hooks.Restore(context.Background(), req)
	m.mu.Lock()
	if err != nil {
		m.hooks.OpenAdmission()
		if m.active == req.CheckpointID {
			m.active = ""
		}
		m.mu.Unlock()
		m.log.WithError(err).WithField("checkpoint", req.CheckpointID).Warn("checkpoint restore failed; admission reopened")
		m.finish(key, c, nil, err)
		return
	}
	m.phase = PhaseRestored
	m.armLocked(req.Deadline())
	m.mu.Unlock()
	restored := res.Restored
	if restored == nil {
		restored = []string{}
	}
	slices.Sort(restored)
	m.finish(key, c, RestoreReply{Phase: PhaseRestored, SourceCheckpointID: res.SourceCheckpointID, Restored: restored}, nil)
}

// Resume ends the checkpoint (or aborts it) and reopens admission. It waits
// for a commit or restore of the id that is still running. Resuming an id
// already resumed is idempotent; resuming while idle fences the id, so a
// late prepare of it cannot close admission.
func (m *Machine) Resume(ctx context.Context, req ResumeRequest) (ResumeReply, error) {
	if err := req.Validate(); err != nil {
		return ResumeReply{}, err
	}
	m.Tick()
	id := req.CheckpointID
	for {
		m.mu.Lock()
		if m.resumedS[id] {
			m.mu.Unlock()
			return ResumeReply{Phase: PhaseIdle, Idempotent: true}, nil
		}
		if m.active != "" && m.active != id {
			m.mu.Unlock()
			return ResumeReply{}, ErrCheckpointConflict.With("checkpoint %q is active, not %q", m.active, id)
		}
		pending := m.runningLocked(id)
		if pending == nil {
			wasActive := m.active == id
			m.reopenLocked(id)
			m.mu.Unlock()
			m.changed.Fire()
			if wasActive {
				m.log.WithField("checkpoint", id).Info("checkpoint resumed: admission open")
			}
			return ResumeReply{Phase: PhaseIdle}, nil
		}
		m.mu.Unlock()
		if _, err := m.await(ctx, req.Base, pending); err != nil && IsCode(err, ErrDeadlineExceeded) {
			return ResumeReply{}, err
		}
	}
}

// IsCode reports whether err is a protocol error with target's code.
func IsCode(err error, target *Error) bool {
	e, ok := err.(*Error)
	return ok && e.Code == target.Code
}

// Retire fences the attempts (every attempt of the rollout up to the highest
// named) and has the hooks stop their work. The marks outlive the call until
// forget; a retire that fails can be repeated.
func (m *Machine) Retire(ctx context.Context, req RetireRequest) (RetireReply, error) {
	if err := req.Validate(); err != nil {
		return RetireReply{}, err
	}
	m.Tick()
	m.mu.Lock()
	for {
		if _, _, err := m.admitLocked(OpRetire, req.CheckpointID, "", false, PhaseIdle, PhaseRestored); err != nil {
			phase := m.phase
			m.mu.Unlock()
			if IsCode(err, ErrInvalidPhase) {
				err = ErrInvalidPhase.With("retire is not allowed while a checkpoint is open (phase %s); resume first", phase)
			}
			return RetireReply{}, err
		}
		// A retire after a restore that outlived its deadline waits for
		// the install, so it stops what the install made.
		c := m.runningLocked(m.active)
		if m.active == "" || c == nil {
			break
		}
		m.mu.Unlock()
		if _, err := m.await(ctx, req.Base, c); IsCode(err, ErrDeadlineExceeded) {
			return RetireReply{}, err
		}
		m.mu.Lock()
	}
	if m.phase == PhaseRestored {
		m.armLocked(req.Deadline())
	}
	m.fenceMu.Lock()
	for _, e := range req.EpisodeIDs {
		if max, ok := m.fence[e.RolloutID]; !ok || e.Attempt > max {
			m.fence[e.RolloutID] = e.Attempt
		}
	}
	m.fenceMu.Unlock()
	m.retiring++
	m.mu.Unlock()

	rctx, cancel := clock.WithDeadline(ctx, m.clk, req.Deadline())
	err := m.hooks.Retire(rctx, req.EpisodeIDs)
	cancel()
	m.mu.Lock()
	m.retiring--
	m.mu.Unlock()
	m.changed.Fire()
	if err != nil {
		return RetireReply{}, err
	}
	return RetireReply{Retired: CaptureKeys(req.EpisodeIDs)}, nil
}

// Forget drops the retire marks of rollouts that can no longer run.
func (m *Machine) Forget(_ context.Context, req ForgetRequest) (ForgetReply, error) {
	if err := req.Validate(); err != nil {
		return ForgetReply{}, err
	}
	m.Tick()
	m.mu.Lock()
	if _, _, err := m.admitLocked(OpForget, req.CheckpointID, "", false, PhaseIdle, PhaseRestored); err != nil {
		m.mu.Unlock()
		return ForgetReply{}, err
	}
	m.fenceMu.Lock()
	for _, id := range req.RolloutIDs {
		delete(m.fence, id)
	}
	m.fenceMu.Unlock()
	m.mu.Unlock()
	m.hooks.Forget(req.RolloutIDs)
	ids := slices.Clone(req.RolloutIDs)
	slices.Sort(ids)
	return ForgetReply{Forgotten: slices.Compact(ids)}, nil
}

// Renew extends the active checkpoint's lease.
func (m *Machine) Renew(_ context.Context, req RenewRequest) (RenewReply, error) {
	if err := req.Validate(); err != nil {
		return RenewReply{}, err
	}
	if err := m.nearEnough(req.Base); err != nil {
		return RenewReply{}, err
	}
	m.Tick()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, _, err := m.admitLocked(OpRenew, req.CheckpointID, "", true, PhasePreparing, PhasePrepared, PhaseCommitted, PhaseRestored); err != nil {
		return RenewReply{}, err
	}
	m.armLocked(req.Deadline())
	return RenewReply{LeaseExpiresAt: UnixSeconds(m.lease)}, nil
}
