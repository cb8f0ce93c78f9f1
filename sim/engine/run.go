package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/sandboxapi"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
)

// Invariant names a property the simulation checks.
type Invariant string

// The invariants of a sandbox owner, and two the harness needs besides.
const (
	// NoLeak: every sandbox and snapshot that exists is held by a live
	// session, named by a committed checkpoint, or tombstoned; once every
	// session ended and a release kept nothing, nothing exists.
	NoLeak Invariant = "no leak"
	// AllOrNone: a failed restore installed nothing and left no fork
	// running; a successful one installed every session it was asked for.
	AllOrNone Invariant = "all or none"
	// ExactRestore: a restored session holds exactly its checkpoint's
	// notes and seed token, and verifies to 1.0.
	ExactRestore Invariant = "exact restore"
	// Restorable: every checkpoint a successful commit made and no release
	// dropped is in the index, and every snapshot it names exists.
	Restorable Invariant = "restorable"
	// WholeCheckpoints: each checkpoint in the index is wholly present or
	// absent: it loads, holds exactly the sessions it exported with the
	// notes and token they had, and no failed commit left one.
	WholeCheckpoints Invariant = "whole checkpoints"
	// NoEmptyGrading: a verify without a sandbox is refused, never graded.
	NoEmptyGrading Invariant = "no empty grading"
	// LiveState: the owner holds exactly the sessions the workload
	// seeded, each with the notes and token it was given (no loss, no
	// lease running out under a live session).
	LiveState Invariant = "live state"
	// FollowsRetention: a checkpoint whose directory the controller
	// deleted leaves the index, and every snapshot only it named is
	// deleted (or tombstoned, its delete pending), within the grace plus
	// one check period of the deletion (or of the owner's start, for an
	// owner that never saw the directory); no checkpoint whose directory
	// is there is dropped.
	FollowsRetention Invariant = "follows retention"
	// StaleAccess: an agent's call in a sandbox that is no longer its
	// session's (ended, superseded by a restore, or a crashed process's) is
	// refused (410 or 404) before it reaches the provider.
	StaleAccess Invariant = "stale access"
	// Unexpected: an operation failed although no fault was injected, or
	// the owner could not be driven (did not start, did not return).
	Unexpected Invariant = "unexpected error"
)

// Invariants lists the invariants in report order.
func Invariants() []Invariant {
	return []Invariant{NoLeak, AllOrNone, ExactRestore, Restorable, WholeCheckpoints, FollowsRetention, NoEmptyGrading, StaleAccess, LiveState, Unexpected}
}

// Violation is one broken invariant, with what reproduces it.
type Violation struct {
	Seed      int64
	Step      int // 0: startup; Steps+1: the final clean-up
	Invariant Invariant
	Detail    string
}

func (v Violation) String() string {
	return fmt.Sprintf("seed %d step %d: %s: %s", v.Seed, v.Step, v.Invariant, v.Detail)
}

// Result is what one run did.
type Result struct {
	Seed  int64
	Steps int
	// Armed counts the faults a step set up; Fired those that happened
	// (a fault armed for a call that never came does not fire).
	Armed, Fired map[Fault]int
	Violations   []Violation
	Elapsed      time.Duration
}

// The model: what each session and checkpoint should hold.
type sessionState struct {
	live     bool
	notes    []string
	token    string
	restored bool
}

type recordState struct {
	notes []string
	token string
}

type checkpointState struct {
	id      string
	records map[string]recordState
	// control: committed through the control plane, so its records name
	// their episodes (a control restore can find them).
	control bool
}

type model struct {
	ids      []string // session ids, sorted
	sessions map[string]*sessionState
	ckpts    map[string]*checkpointState
	// gone are the checkpoints whose directory the controller deleted,
	// until the harness saw them dropped: the index may still hold them.
	gone map[string]*goneCheckpoint
}

// goneCheckpoint is a checkpoint whose directory the controller deleted.
type goneCheckpoint struct {
	ck *checkpointState
	at time.Time
	// snaps are the snapshots its records named.
	snaps []string
	// slack is how late the harness's checks came, the clock having moved
	// past a check the owner's loop would have made (outside an advance).
	slack time.Duration
}

func (m *model) live() []string {
	var out []string
	for _, id := range m.ids {
		if m.sessions[id].live {
			out = append(out, id)
		}
	}
	return out
}

func (m *model) absent() []string {
	var out []string
	for _, id := range m.ids {
		if !m.sessions[id].live {
			out = append(out, id)
		}
	}
	return out
}

func (m *model) checkpointIDs() []string {
	out := make([]string, 0, len(m.ckpts))
	for id := range m.ckpts {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// snapshotOf is the record a commit now would make of a live session.
func (m *model) recordOf(sid string) recordState {
	s := m.sessions[sid]
	return recordState{notes: append([]string(nil), s.notes...), token: s.token}
}

// pendingCommit is a commit whose outcome a crash left open: the index on
// disk decides it.
type pendingCommit struct {
	id      string
	records map[string]recordState
	// durable: the crash came after the index transaction.
	durable bool
}

// run is one simulation run.
type run struct {
	seed  int64
	cfg   Config
	res   *Result
	trace io.Writer
	log   *logrus.Logger

	clk simClock
	// det is the deterministic scheduler (nil in RuntimeReal); rt is what the
	// owner and the harness run concurrent work on (det, or goroutines).
	det *sched.Det
	rt  sched.Runtime
	// mem is the index's durable contents in the deterministic mode (nil:
	// Badger on the state_dir).
	mem *snapshotindex.Memory
	// ckdirs holds the controller's checkpoint directories, which outlive
	// every owner (in memory in both modes).
	ckdirs *records.MemFS
	// sys is the actor system the owners share in the deterministic mode
	// (nil: each owner makes its own, as the server does).
	sys         *actor.ActorSystem
	fk          *fake.Provider
	inner       backend // nil: the owner calls fk directly
	osb         *opensandboxtest.Server
	dir         string
	ttl         time.Duration
	parallelism int
	onStop      string

	o        *owner.Owner
	proc     *process
	life     context.Context
	stopLife context.CancelFunc
	calls    *callWaiter

	m        model
	step     int
	rng      *rand.Rand
	injected map[fake.Op]int // the fake's injected counters when the step began
	nextCkpt int
	nextLine int
	broken   bool // a violation was found: the run stops after this step

	pendingCommit  *pendingCommit
	pendingRelease []string // kept ids of a release a crash interrupted
	releasing      bool

	// ownerStarted is when the current owner started; nextCheck when its
	// retention loop (which the harness runs for it) checks next.
	ownerStarted, nextCheck time.Time

	// part is the participant over the current owner.
	part *participant.Participant
	// incarnations counts the owners started, for their ids.
	incarnations int

	// sabotage, when set (by the engine's own tests), runs after every
	// step to break the real state behind the owner's back.
	sabotage func(r *run)
	// sabotageAt, when set, runs at named points inside a step (just
	// before a resent verify, just before a failed restore is checked) to
	// break what that step's own check must catch.
	sabotageAt func(r *run, point string)
	// sabotageOwner, when set, changes every owner's configuration.
	sabotageOwner func(c *owner.Config)
	// sabotageResolve, when set, replaces the sandbox API's resolver.
	sabotageResolve func(r *run) sandboxapi.Resolver

	// tokens sign the agents' sandbox tokens; lent maps every sandbox a
	// live session was seen holding to that session.
	tokens *sandboxapi.Tokens
	lent   map[string]string
	// lastVerified and lastRestore name the session of the verify and the
	// checkpoint of the restore in progress, for sabotage.
	lastVerified, lastRestore string
	lastRetired               control.EpisodeID
}

// Sabotage points.
const (
	atResentVerify  = "resent-verify"
	atFailedRestore = "failed-restore"
	atRetired       = "retired"
)

func (r *run) sabotagePoint(point string) {
	if r.sabotageAt != nil {
		r.sabotageAt(r, point)
	}
}

// Run performs one seeded run and reports it.
func Run(seed int64, cfg Config) Result {
	return newWorker().run(seed, cfg)
}

// worker performs runs one after another. In the deterministic mode its
// runs' owners share one protoactor system (each owner's actors are named
// after its incarnation and leave the system with it): making a system
// costs more than a whole run otherwise.
type worker struct {
	sys *actor.ActorSystem
}

func newWorker() *worker { return &worker{} }

func (w *worker) run(seed int64, cfg Config) Result {
	cfg = cfg.withDefaults()
	r := newRun(seed, cfg)
	if r.det != nil {
		if w.sys == nil {
			w.sys = actor.NewActorSystem(
				actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }),
				actor.WithDeadLetterRequestLogging(false),
			)
		}
		r.sys = w.sys
	}
	return r.exec()
}

func newRun(seed int64, cfg Config) *run {
	cfg = cfg.withDefaults()
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	start := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	var (
		clk simClock
		det *sched.Det
		rt  sched.Runtime = sched.Real{}
	)
	var mem *snapshotindex.Memory
	if cfg.Runtime == RuntimeDeterministic {
		det = sched.NewDet(uint64(seed), start)
		clk, rt = det, det
		mem = snapshotindex.NewMemory()
	} else {
		clk = clock.NewManual(start)
	}
	r := &run{
		ckdirs:      records.NewMemFS(),
		seed:        seed,
		cfg:         cfg,
		res:         &Result{Seed: seed, Armed: map[Fault]int{}, Fired: map[Fault]int{}},
		trace:       cfg.Trace,
		clk:         clk,
		det:         det,
		mem:         mem,
		rt:          rt,
		fk:          fake.New(fake.Options{Clock: clk, Seed: seed, Runtime: det.OrNil()}),
		ttl:         600 * time.Second,
		parallelism: 1 + rng.IntN(4),
		onStop:      owner.OnStopKill,
		calls:       newCallWaiter(),
		lent:        map[string]string{},
	}
	// A secret from the seed: a run's tokens are the same every time.
	r.tokens, _ = sandboxapi.NewTokens([]byte(fmt.Sprintf("sim tokens of seed %016x", uint64(seed))), clk)
	if rng.IntN(4) == 0 {
		r.onStop = owner.OnStopNone
	}
	r.log = logrus.New()
	r.log.SetOutput(io.Discard)
	if r.trace != nil {
		// The owner logs from its own goroutines.
		r.trace = &syncWriter{w: r.trace}
		r.log.SetOutput(r.trace)
		r.log.SetLevel(logrus.WarnLevel)
		r.log.SetFormatter(&logrus.TextFormatter{DisableTimestamp: true, DisableQuote: true})
	}
	r.m = model{sessions: map[string]*sessionState{}, ckpts: map[string]*checkpointState{}, gone: map[string]*goneCheckpoint{}}
	for i := 0; i < cfg.Sessions; i++ {
		id := fmt.Sprintf("s%d", i)
		r.m.ids = append(r.m.ids, id)
		r.m.sessions[id] = &sessionState{}
	}
	return r
}

func (r *run) exec() Result {
	began := time.Now()
	defer func() { r.res.Elapsed = time.Since(began) }()
	dir, err := os.MkdirTemp(r.cfg.TempDir, "sim-state-")
	if err != nil {
		r.violate(Unexpected, "make state_dir: %v", err)
		return *r.res
	}
	defer os.RemoveAll(dir)
	r.dir = dir
	if r.cfg.Provider == ProviderOpenSandbox {
		stop, err := r.openSandbox()
		if err != nil {
			r.violate(Unexpected, "the OpenSandbox provider: %v", err)
			return *r.res
		}
		defer stop()
	}
	r.tracef("run seed %d: %d sessions, %d steps, parallelism %d, on_stop %s, ttl %v, faults %s",
		r.seed, r.cfg.Sessions, r.cfg.Steps, r.parallelism, r.onStop, r.ttl, r.cfg.Faults)
	if !r.startOwner() {
		return *r.res
	}
	defer func() {
		if r.o != nil {
			r.unstuck(r.abandon)
		}
		if r.det != nil {
			r.det.Close()
		}
	}()
	for i := 1; i <= r.cfg.Steps && !r.broken; i++ {
		r.beginStep(i)
		r.unstuck(r.doStep)
		if r.broken {
			break
		}
		r.endStep()
		if r.broken {
			break
		}
		if r.chance(FaultCrash) {
			r.fire(FaultCrash)
			r.tracef("crash between steps")
			r.crash()
			r.afterCrash()
		}
		if r.o != nil && !r.broken {
			r.check()
		}
		r.res.Steps++
	}
	if !r.broken {
		r.beginStep(r.cfg.Steps + 1)
		r.unstuck(r.final)
	}
	return *r.res
}

// unstuck runs fn and turns the deterministic scheduler's ErrStuck (the
// owner waits for something nothing can bring about: in the real mode, a
// call that never returns) into a violation.
func (r *run) unstuck(fn func()) {
	if err := catchStuck(fn); err != nil {
		r.violate(Unexpected, "the owner is stuck: %v", err)
	}
}

// until runs the deterministic scheduler until cond holds, and reports
// false when it never can.
func (r *run) until(cond func() bool) bool {
	return catchStuck(func() { r.det.RunUntil(cond) }) == nil
}

// catchStuck runs fn and returns the ErrStuck it panicked with, if any;
// any other panic goes on.
func catchStuck(fn func()) (err error) {
	defer func() {
		if v := recover(); v != nil {
			e, ok := v.(error)
			if !ok || !errors.Is(e, sched.ErrStuck) {
				panic(v)
			}
			err = e
		}
	}()
	fn()
	return nil
}

// simClock is the run's clock: a clock.Manual, or the deterministic
// scheduler's.
type simClock interface {
	clock.Clock
	Advance(d time.Duration) time.Time
	Set(t time.Time)
}

func (r *run) beginStep(i int) {
	r.step = i
	r.rng = rand.New(rand.NewPCG(uint64(r.seed), uint64(i)))
	r.injected = r.fk.Stats().Injected
}

// endStep removes every fault the step armed and did not use, so that none
// leaks into a later step.
func (r *run) endStep() {
	r.fk.ClearFaults()
	r.fk.SetLatency(fake.OpSnapshot, 0)
	if r.proc != nil {
		r.proc.arm(nil)
	}
	if r.sabotage != nil {
		r.sabotage(r)
	}
}

// chance draws once from the step's stream (always, so that the draws of a
// step do not depend on which faults are enabled) and reports whether f
// strikes; it counts f as armed when it does.
func (r *run) chance(f Fault) bool {
	v := r.rng.Float64()
	if v < r.cfg.Faults[f] {
		r.res.Armed[f]++
		return true
	}
	return false
}

func (r *run) fire(f Fault) { r.res.Fired[f]++ }

// injectedNow is how many faults of op the fake consumed in this step.
func (r *run) injectedNow(op fake.Op) int {
	return r.fk.Stats().Injected[op] - r.injected[op]
}

func (r *run) violate(inv Invariant, format string, args ...any) {
	v := Violation{Seed: r.seed, Step: r.step, Invariant: inv, Detail: fmt.Sprintf(format, args...)}
	r.res.Violations = append(r.res.Violations, v)
	r.broken = true
	r.tracef("VIOLATION %s: %s", inv, v.Detail)
}

func (r *run) tracef(format string, args ...any) {
	if r.trace == nil {
		return
	}
	fmt.Fprintf(r.trace, "[%3d] %s\n", r.step, fmt.Sprintf(format, args...))
}

// --- the owner's life ---

func (r *run) ownerConfig() owner.Config {
	c := r.baseOwnerConfig()
	if r.sabotageOwner != nil {
		r.sabotageOwner(&c)
	}
	return c
}

func (r *run) baseOwnerConfig() owner.Config {
	c := owner.Config{
		Name:     "notes",
		Provider: r.proc,
		Checkpoint: owner.CheckpointConfig{
			Enabled:     true,
			StateDir:    r.dir,
			Index:       r.ownerIndex(),
			Records:     r.ckdirs,
			Parallelism: r.parallelism,
			OnStop:      r.onStop,
			// No loop of its own: the harness checks on the period.
			Retention: owner.RetentionConfig{FollowDirs: true, Grace: retentionGrace},
		},
		Clock:       r.clk,
		Runtime:     r.rt,
		ActorSystem: r.sys,
		Logger:      r.log,
		// From the seed and the number of owners so far: a seed replays
		// its incarnation ids too.
		Incarnation: fmt.Sprintf("%08x-%d", uint32(r.seed), r.incarnations),
	}
	if r.cfg.Keyed {
		c.Pool = keyedPool()
	}
	return c
}

func (r *run) ownerIndex() snapshotindex.Store {
	if r.mem == nil {
		return nil
	}
	return r.mem.Open()
}

// startOwner starts a fresh owner on the run's state_dir and fake.
func (r *run) startOwner() bool {
	r.life, r.stopLife = context.WithCancel(context.Background())
	r.proc = newProcess(r.fk, r.inner, r.calls.observe, r.rt)
	r.incarnations++
	o, err := owner.New(r.life, r.ownerConfig())
	if err != nil {
		r.violate(Unexpected, "owner.New on the state_dir: %v", err)
		r.stopLife()
		return false
	}
	r.o = o
	r.ownerStarted = r.clk.Now()
	r.nextCheck = r.ownerStarted.Add(retentionPeriod)
	r.part = r.newParticipant()
	r.tracef("owner started (incarnation %s)", o.Incarnation())
	return true
}

// crash abandons the owner as a crash would: its process makes no provider
// call from now on, the calls in flight end, and its sessions are gone.
func (r *run) crash() {
	r.proc.kill()
	r.stopLife()
	r.abandon()
	for _, s := range r.m.sessions {
		s.live, s.restored = false, false
	}
}

func (r *run) abandon() {
	if err := r.o.Abandon(); err != nil {
		r.violate(Unexpected, "the crash's index close: %v", err)
	}
	r.proc.bury()
	if r.det != nil {
		if !r.until(r.proc.idle) {
			r.violate(Unexpected, "after the crash: provider calls of the crashed owner still in flight")
		}
	} else if err := r.proc.drain(30 * time.Second); err != nil {
		r.violate(Unexpected, "after the crash: %v", err)
	}
	r.o = nil
}

// afterCrash checks what the crash left on disk, settles what it left open,
// lets leases run out if the owner stays down past the TTL, and starts a
// fresh owner.
func (r *run) afterCrash() {
	if r.broken {
		return
	}
	r.checkDisk()
	if r.broken {
		return
	}
	if r.chance(FaultLease) {
		r.fire(FaultLease)
		r.clk.Advance(r.ttl + time.Second)
		reaped := r.fk.Reap()
		r.tracef("owner down past the ttl: the backend reaped %d sandboxes", len(reaped))
	}
	r.startOwner()
}

// afterCrashLosing is afterCrash, but with lost the crashed owner's
// machine is gone with its state_dir (loseMachine) when some checkpoint can
// be restored from its records; it reports whether it was, and the
// replacement restored the checkpoint the controller keeps.
func (r *run) afterCrashLosing(lost bool) bool {
	if !lost {
		r.afterCrash()
		return false
	}
	if r.broken {
		return false
	}
	r.checkDisk()
	if r.broken {
		return false
	}
	if r.loseMachine() {
		return true
	}
	r.startOwner()
	return false
}

// loseMachine deletes the state_dir of the crashed owner, as the loss of
// its machine would, and starts a fresh owner on an empty one, which
// restores one checkpoint from its records alone (through the control
// plane), as a replacement owner elsewhere does; then a release that keeps
// only that checkpoint must reclaim every snapshot the earlier runs left.
// The controller keeps only that checkpoint, so the model drops the others.
// It does nothing (and reports false) when no checkpoint has records.
func (r *run) loseMachine() bool {
	var withRecords []string
	for _, id := range r.m.checkpointIDs() {
		m, err := records.ReadManifest(r.ckdirs, "/ck/"+id, records.Participant{Kind: records.KindResources, Instance: "notes"})
		if err == nil && m.CheckpointID == id {
			withRecords = append(withRecords, id)
		}
	}
	if len(withRecords) == 0 {
		return false
	}
	r.fire(FaultMachineLost)
	keep := withRecords[r.rng.IntN(len(withRecords))]
	if r.mem != nil {
		r.mem = snapshotindex.NewMemory()
	} else if err := os.RemoveAll(r.dir); err != nil {
		r.violate(Unexpected, "delete the state_dir: %v", err)
		return true
	}
	for _, id := range r.m.checkpointIDs() {
		if id != keep {
			delete(r.m.ckpts, id)
		}
	}
	// The fresh index never knew the checkpoints whose directories went:
	// the release below reclaims their snapshots as leftovers.
	clear(r.m.gone)
	r.tracef("the machine is lost with its state_dir; the controller keeps %s", keep)
	if !r.startOwner() {
		return true
	}
	r.bindLive()
	r.controlRestore(keep, nil)
	if r.broken {
		return true
	}
	res, err := r.o.Release(r.life, []string{keep})
	r.tracef("release keeping %s after the lost machine: deleted %v deferred %v err %v", keep, res.Deleted, res.Deferred, err)
	if err != nil {
		r.violate(Unexpected, "release keeping %s after the lost machine: %v", keep, err)
	}
	return true
}

// guarded runs fn (an owner call) on its own goroutine and waits for it or
// for the process to crash; on a crash it abandons the owner and then waits
// for fn to return. A watchdog turns a call that never returns into a
// violation instead of a hung simulation.
func (r *run) guarded(fn func(ctx context.Context) error) (err error, crashed bool) {
	done := make(chan error, 1)
	ctx := r.life
	r.rt.Go(func() { done <- fn(ctx) })
	if r.det != nil {
		r.det.RunUntil(func() bool { return len(done) > 0 || sched.Closed(r.proc.crashed) })
		if len(done) > 0 && !sched.Closed(r.proc.crashed) {
			return <-done, false
		}
		r.crash()
		if !r.until(func() bool { return len(done) > 0 }) {
			r.violate(Unexpected, "an owner call did not return after the owner was abandoned")
			return nil, true
		}
		return <-done, true
	}
	watchdog := time.NewTimer(2 * time.Minute)
	defer watchdog.Stop()
	select {
	case err = <-done:
		select {
		case <-r.proc.crashed:
		default:
			return err, false
		}
		r.crash()
		return err, true
	case <-r.proc.crashed:
	case <-watchdog.C:
		r.violate(Unexpected, "an owner call did not return within 2 minutes")
		r.proc.kill()
	}
	r.crash()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		r.violate(Unexpected, "an owner call did not return after the owner was abandoned")
	}
	return err, true
}

// --- waiting for the owner's own provider calls ---

// callKey names one provider call: an op about a sandbox or snapshot id.
type callKey struct {
	op fake.Op
	id string
}

// callWaiter lets the harness wait for provider calls the owner makes on its
// own goroutines (lease renewals after a Tick, the deletes of snapshots that
// landed after their round gave up).
type callWaiter struct {
	mu   sync.Mutex
	want map[callKey]bool
	done chan struct{}
	// seen counts every call that reached the backend.
	seen map[callKey]int
}

func newCallWaiter() *callWaiter { return &callWaiter{seen: map[callKey]int{}} }

// count is how many calls of op about id reached the backend so far.
func (w *callWaiter) count(op fake.Op, id string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[callKey{op, id}]
}

func (w *callWaiter) expect(op fake.Op, ids []string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.want = map[callKey]bool{}
	for _, id := range ids {
		w.want[callKey{op, id}] = true
	}
	w.done = make(chan struct{})
	if len(w.want) == 0 {
		close(w.done)
	}
}

func (w *callWaiter) observe(op fake.Op, id string, _ error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seen[callKey{op, id}]++
	if w.want[callKey{op, id}] {
		delete(w.want, callKey{op, id})
		if len(w.want) == 0 {
			close(w.done)
		}
	}
}

// waitCalls returns the ids whose expected call did not come within timeout
// (in the deterministic mode: before nothing was left to run).
func (r *run) waitCalls(timeout time.Duration) []string {
	w := r.calls
	w.mu.Lock()
	done := w.done
	w.mu.Unlock()
	if r.det != nil {
		if r.until(func() bool { return sched.Closed(done) }) {
			return nil
		}
		return w.missing()
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C:
	}
	return w.missing()
}

func (w *callWaiter) missing() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for k := range w.want {
		out = append(out, k.id)
	}
	sort.Strings(out)
	return out
}

// --- disk ---

// checkDisk opens the index on the state_dir while no owner has it open,
// settles a commit or release a crash interrupted, and checks every
// checkpoint on disk.
func (r *run) checkDisk() {
	idx, err := r.openIndex()
	if err != nil {
		r.violate(WholeCheckpoints, "the index on the state_dir cannot be opened after the crash: %v", err)
		return
	}
	defer idx.Close()
	metas, err := idx.Checkpoints()
	if err != nil {
		r.violate(WholeCheckpoints, "list checkpoints on disk: %v", err)
		return
	}
	onDisk := map[string]bool{}
	for _, m := range metas {
		onDisk[m.ID] = true
	}
	if pc := r.pendingCommit; pc != nil {
		r.pendingCommit = nil
		switch {
		case onDisk[pc.id]:
			r.m.ckpts[pc.id] = &checkpointState{id: pc.id, records: pc.records}
			r.tracef("the interrupted commit %s is on disk", pc.id)
		case pc.durable:
			r.violate(Restorable, "commit %s crashed after its index transaction, but the checkpoint is not on disk", pc.id)
			return
		default:
			r.tracef("the interrupted commit %s is not on disk", pc.id)
		}
	}
	if r.releasing {
		r.releasing = false
		kept := toSet(r.pendingRelease)
		before := r.m.checkpointIDs()
		var after []string
		for _, id := range before {
			if kept[id] {
				after = append(after, id)
			}
		}
		var now []string
		for _, id := range slices.Sorted(maps.Keys(onDisk)) {
			if r.m.gone[id] == nil {
				now = append(now, id)
			}
		}
		switch {
		case equalStrings(now, before):
			r.tracef("the interrupted release dropped nothing")
		case equalStrings(now, after):
			for _, id := range before {
				if !kept[id] {
					delete(r.m.ckpts, id)
				}
			}
			r.tracef("the interrupted release dropped %d checkpoints", len(before)-len(after))
		default:
			r.violate(WholeCheckpoints, "an interrupted release left checkpoints %v: neither all before it %v nor the kept ones %v", now, before, after)
			return
		}
	}
	r.checkCheckpoints(idx, "on disk after the crash")
}

// openIndex opens the index no owner holds: the Badger one on the
// state_dir, or in the deterministic mode a handle on the in-memory one
// (what a disk keeps across a crash).
func (r *run) openIndex() (snapshotindex.Store, error) {
	if r.mem != nil {
		return r.mem.Open(), nil
	}
	return snapshotindex.Open(r.dir, snapshotindex.Options{})
}

// --- helpers ---

// syncWriter serialises writes of the harness and the owner's logger.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func toSet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// parseNotes splits a notes file into its lines.
func parseNotes(s string) []string {
	s = strings.TrimSuffix(s, "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func sample[T any](rng *rand.Rand, items []T) T {
	return items[rng.IntN(len(items))]
}

// subset picks each item with probability 1/2.
func subset(rng *rand.Rand, items []string) []string {
	var out []string
	for _, it := range items {
		if rng.IntN(2) == 0 {
			out = append(out, it)
		}
	}
	return out
}
