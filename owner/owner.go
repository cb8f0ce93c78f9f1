// Package owner is the sandbox owner that resources servers are written
// against: the Go form of NeMo Gym's SandboxOwnerResourcesServer.
//
// An Owner holds one sandbox per agent session. A resources server starts a
// session's sandbox with StartSessionSandbox (start, run its setup, then
// track), works in it with Do or SessionSandbox, and ends it with
// EndSessionSandbox. With checkpointing on, Commit snapshots every live
// session's sandbox into the snapshot index (all or nothing), Restore forks
// them back in a fresh process (all or nothing), Retire stops discarded
// attempts, and Release deletes the snapshots no kept checkpoint needs.
//
// Inside, every session is a protoactor actor (package actors) owned by a
// supervisor (package supervisor); a coordinator actor runs snapshot rounds.
// Control operations (Commit, Restore, Retire, Release) run one at a time.
//
// Crash safety rests on three things written to the index before the effect
// they guard: a commit intent (names the round's snapshots, so a crash
// mid-round leaks none), tombstones (snapshots decided for deletion), and
// sandbox labels (every sandbox carries ng.owner and ng.incarnation metadata,
// so a fresh owner stops what a crashed one left running).
package owner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/sirupsen/logrus"
	logrusslog "github.com/sirupsen/logrus/hooks/slog"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/fifo"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/retention"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/supervisor"
)

// Mode is the checkpoint mode in effect, decided at startup.
type Mode string

// Modes.
const (
	// ModeOff: checkpointing is disabled; nothing is checked.
	ModeOff Mode = "off"
	// ModeRestartOnly: nothing of the server is in a checkpoint; its
	// rollouts restart after a crash.
	ModeRestartOnly Mode = "restart_only"
	// ModeExported: every live session's sandbox is snapshotted at commit.
	ModeExported Mode = "exported"
)

// OnStop values: what a commit with stop does with the exported sandboxes.
const (
	OnStopKill = "kill"
	OnStopNone = "none"
)

// Sandbox metadata labels the owner sets on every sandbox it starts.
const (
	LabelOwner       = "ng.owner"
	LabelIncarnation = "ng.incarnation"
	LabelSession     = "ng.session"
	LabelRestore     = "ng.restore"
)

// Errors callers branch on.
var (
	// ErrConfig: the configuration is not usable.
	ErrConfig = errors.New("owner config")
	// ErrCheckpointingOff: a checkpoint operation on an owner without one.
	ErrCheckpointingOff = errors.New("checkpointing is off")
	// ErrCommitFailed: at least one session could not be snapshotted, or
	// the index refused the commit; nothing was recorded.
	ErrCommitFailed = errors.New("checkpoint commit failed")
	// ErrCommitStopped: StopCommit stopped the commit's writer (the
	// controller resumed); nothing of it is recorded.
	ErrCommitStopped = errors.New("checkpoint commit stopped by a resume")
	// ErrRestoreFailed: the restore installed nothing.
	ErrRestoreFailed = errors.New("checkpoint restore failed")
	// ErrInvalidRecord: a checkpoint record cannot be restored.
	ErrInvalidRecord = errors.New("invalid checkpoint record")
	// ErrUnknownCheckpoint: the index has no such checkpoint.
	ErrUnknownCheckpoint = errors.New("unknown checkpoint")
	// ErrClosed: the owner was closed.
	ErrClosed = errors.New("owner closed")
	// ErrAtCapacity: the owner holds MaxSessions sessions; a seed starts
	// nothing (HTTP 503 at_capacity).
	ErrAtCapacity = supervisor.ErrAtCapacity
)

// CheckpointConfig is the checkpoint.* part of the configuration.
type CheckpointConfig struct {
	Enabled bool
	// StateDir holds the snapshot index (required in exported mode unless
	// Index is set).
	StateDir string
	// Index, when set, is the snapshot index instead of the Badger one in
	// StateDir: the simulation's in-memory index. The owner closes it.
	Index snapshotindex.Store
	// Records is the file system checkpoint directories are on (nil: the
	// operating system's); the simulation's is in memory.
	Records records.FS
	// Parallelism bounds concurrent provider calls of a checkpoint
	// operation (default 16).
	Parallelism int
	// OnStop is "kill" (default: a commit with stop stops the exported
	// sandboxes) or "none".
	OnStop string
	// RoundTimeout bounds a commit's snapshot round (default 10 minutes).
	RoundTimeout time.Duration
	// Retention follows the controller's deletion of checkpoint
	// directories.
	Retention RetentionConfig
}

// Config configures an Owner.
type Config struct {
	// Name is the resources server's name, used in logs and labels.
	Name string
	// Provider starts the sandboxes. nil means the server lends none.
	Provider   provider.Provider
	Checkpoint CheckpointConfig
	// NumWorkers mirrors upstream's key; exported mode refuses more than 1.
	NumWorkers int
	// LendsNoSandboxes says the server's sessions hold no sandboxes (a
	// golden-patch grader: Provider only grades). Its mode is restart_only
	// by design, which is logged as such rather than as a provider that
	// cannot snapshot.
	LendsNoSandboxes bool
	// SnapshotsRefused, when set, is why a provider that has snapshot calls
	// cannot take them (a remote runtime without snapshots, found out at
	// startup): the mode is restart_only, said with the reason.
	SnapshotsRefused error
	// Clock drives leases (default the wall clock).
	Clock clock.Clock
	// ActorSystem, when set, is the protoactor system the owner's actors
	// live in (named after the incarnation), instead of one of its own: a
	// system costs a few milliseconds to make, which the simulation pays
	// once per worker instead of once per owner. Close stops the owner's
	// actors; Abandon drops them from the system without a word, as a
	// crash would.
	ActorSystem *actor.ActorSystem
	// Runtime runs the owner's concurrent work (effects, fan-outs,
	// mailboxes when it is also a sched.Dispatcher) and its waits; nil is
	// goroutines. The simulation passes a sched.Det.
	Runtime sched.Runtime
	// Logger is the one logger; protoactor's and Badger's logs go to it.
	Logger *logrus.Logger
	// RenewEvery starts a lease-renewal ticker on the clock; zero
	// leaves renewal to Tick (tests, the simulation).
	RenewEvery time.Duration
	// Incarnation names this process's owner in sandbox labels (default a
	// random id); the simulation derives it from its seed, so that a seed
	// replays.
	Incarnation string
	// FateMemory bounds how many ended sandboxes are remembered for
	// SandboxFate (default 65536).
	FateMemory int
	// MaxSessions bounds the sessions a seed may start (0: no bound); a
	// seed beyond it gets ErrAtCapacity and starts nothing. A restore is
	// not bounded: it brings back what a checkpoint holds.
	MaxSessions int
	// IdleTimeout ends a session with no use for that long (0: never),
	// checked at every renewal tick (ReapIdle).
	IdleTimeout time.Duration
	// DefaultTTL is the lease of a sandbox whose spec names none, for a
	// provider whose sandboxes always have one (OpenSandbox's ttl_s): the
	// owner renews only leases it knows of.
	DefaultTTL time.Duration
}

// Owner owns the sessions' sandboxes. It is safe for concurrent use.
type Owner struct {
	cfg  Config
	name string
	mode Mode
	prov provider.Provider
	// caps are prov's capabilities (none without a provider).
	caps        provider.Capabilities
	clk         clock.Clock
	log         logrus.FieldLogger
	incarnation string

	system      *actor.ActorSystem
	deadLetters *eventstream.Subscription
	dispatch    *actors.Dispatcher
	sup         *actor.PID
	dir         *supervisor.Directory
	coord       *actor.PID
	limiter     *actors.Limiter
	index       snapshotindex.Store

	// ctl serialises control operations (commit, restore, retire,
	// release) with each other.
	ctl   turnMutex
	round uint64
	// writer fences the store of commits: once StopCommit returns, no
	// commit of that checkpoint id is recorded. stopped are the ids it
	// stopped; unstored the commits whose snapshots were taken but whose
	// store failed, by checkpoint id, so that a retry stores the same
	// records instead of snapshotting again. Both are guarded by writer.
	writer   turnMutex
	stopped  *fifo.Map[string, struct{}]
	unstored map[string]*unstoredCommit

	fates *fateMemory
	// ret is what the retention checks remember; dirs where they look.
	ret  *retentionState
	dirs retention.FS
	// starting counts StartSessionSandbox calls in progress.
	starting atomic.Int64

	// ask is the owner's typed client of its actors.
	ask *client

	// base bounds the provider calls the owner makes on its own; Abandon
	// cancels it, as a crash ends them.
	base       context.Context
	cancelBase context.CancelFunc

	closeOnce sync.Once
	closed    chan struct{}
	bg        group
	rt        sched.Runtime
}

// New decides the mode in effect, opens the index, recovers what a crashed
// predecessor left (tombstones, unfinished commits, running sandboxes) and
// starts the actors.
func New(ctx context.Context, cfg Config) (*Owner, error) {
	if cfg.Name == "" {
		cfg.Name = "owner"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Discard()
	}
	if cfg.Incarnation == "" {
		cfg.Incarnation = newIncarnation()
	}
	if cfg.Checkpoint.Parallelism <= 0 {
		cfg.Checkpoint.Parallelism = 16
	}
	if cfg.Checkpoint.OnStop == "" {
		cfg.Checkpoint.OnStop = OnStopKill
	}
	if cfg.Checkpoint.RoundTimeout <= 0 {
		cfg.Checkpoint.RoundTimeout = 10 * time.Minute
	}
	if cfg.FateMemory <= 0 {
		cfg.FateMemory = 1 << 16
	}
	o := &Owner{
		cfg:         cfg,
		name:        cfg.Name,
		prov:        cfg.Provider,
		clk:         cfg.Clock,
		log:         cfg.Logger.WithField("server", cfg.Name),
		incarnation: cfg.Incarnation,
		limiter:     actors.NewLimiterOn(cfg.Checkpoint.Parallelism, cfg.Runtime),
		rt:          sched.Or(cfg.Runtime),
		fates:       newFateMemory(cfg.FateMemory),
		ret:         newRetentionState(cfg.Checkpoint.Retention.Grace),
		dirs:        dirsOf(cfg.Checkpoint),
		stopped:     fifo.New[string, struct{}](stoppedMemory),
		unstored:    map[string]*unstoredCommit{},
		closed:      make(chan struct{}),
	}
	if cfg.Provider != nil {
		o.caps = cfg.Provider.Capabilities()
	}
	o.base, o.cancelBase = context.WithCancel(context.Background())
	mode, err := o.decideMode()
	if err != nil {
		return nil, err
	}
	o.mode = mode
	if mode == ModeExported && cfg.Checkpoint.Index != nil {
		o.index = cfg.Checkpoint.Index
	} else if mode == ModeExported {
		idx, err := snapshotindex.Open(cfg.Checkpoint.StateDir, snapshotindex.Options{Logger: o.log.WithField("lib", "badger")})
		if err != nil {
			return nil, fmt.Errorf("open snapshot index: %w", err)
		}
		o.index = idx
	}
	o.startActors()
	if err := o.recover(ctx); err != nil {
		o.Close()
		return nil, err
	}
	if cfg.RenewEvery > 0 && o.prov != nil {
		o.bg.Go(o.rt, func() { o.renewLoop(cfg.RenewEvery) })
	}
	if every := cfg.Checkpoint.Retention.Every; every > 0 && o.followsDirs() {
		o.bg.Go(o.rt, func() { o.retentionLoop(every) })
	}
	o.log.WithFields(logrus.Fields{"mode": mode, "incarnation": o.incarnation}).Info("sandbox owner started")
	return o, nil
}

func (o *Owner) decideMode() (Mode, error) {
	c := o.cfg
	if !c.Checkpoint.Enabled {
		return ModeOff, nil
	}
	if c.Checkpoint.OnStop != OnStopKill && c.Checkpoint.OnStop != OnStopNone {
		return "", fmt.Errorf("%w: checkpoint.on_stop must be %q or %q, not %q", ErrConfig, OnStopKill, OnStopNone, c.Checkpoint.OnStop)
	}
	if err := checkInstance(c.Name); err != nil {
		return "", err
	}
	if c.Provider == nil {
		return ModeRestartOnly, nil
	}
	if c.LendsNoSandboxes {
		o.log.Infof("%s: lends no sandboxes, so there is nothing to export: checkpoint mode restart_only", c.Name)
		return ModeRestartOnly, nil
	}
	if c.SnapshotsRefused != nil {
		o.log.Warnf("%s: sandbox provider '%s' takes no snapshots (%v); its rollouts restart after a crash instead of continuing", c.Name, c.Provider.Name(), c.SnapshotsRefused)
		return ModeRestartOnly, nil
	}
	if c.Provider.Capabilities().Snapshotter == nil {
		o.log.Warnf("%s: sandbox provider '%s' cannot snapshot; its rollouts restart after a crash instead of continuing", c.Name, c.Provider.Name())
		return ModeRestartOnly, nil
	}
	if c.Checkpoint.StateDir == "" && c.Checkpoint.Index == nil {
		return "", fmt.Errorf("%w: checkpoint.state_dir is required to export sandbox snapshots", ErrConfig)
	}
	if c.NumWorkers > 1 {
		return "", fmt.Errorf("%w: num_workers is %d, but an exported owner runs in one process (it serves all sessions concurrently); set num_workers to 1", ErrConfig, c.NumWorkers)
	}
	return ModeExported, nil
}

func newIncarnation() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (o *Owner) startActors() {
	lg := o.cfg.Logger
	names := func(n string) string { return n }
	if o.cfg.ActorSystem != nil {
		o.system = o.cfg.ActorSystem
		names = func(n string) string { return n + "-" + o.incarnation }
	} else {
		o.system = actor.NewActorSystem(
			actor.WithLoggerFactory(func(s *actor.ActorSystem) *slog.Logger {
				return slog.New(logrusslog.NewHandler(lg, nil)).With("lib", "protoactor", "server", o.name)
			}),
			actor.WithDeadLetterRequestLogging(false),
		)
	}
	env := &actors.SessionEnv{
		Provider: o.prov,
		Clock:    o.clk,
		Log:      o.log,
		Limiter:  o.limiter,
		OnEnded:  o.onEnded,
		OnHeld:   o.onHeld,
		OnLost:   o.onLost,
		Context:  o.base,
		Runtime:  o.rt,
	}
	// Every actor of the owner runs its mailbox on the dispatcher's
	// long-lived goroutines.
	var onPool actor.PropsOption
	if d, ok := o.rt.(sched.Dispatcher); ok {
		onPool = actor.WithDispatcher(d)
	} else {
		o.dispatch = actors.NewDispatcher(dispatchWorkers, dispatchQueue, dispatchThroughput)
		onPool = actor.WithDispatcher(o.dispatch)
	}
	props := func(sessionID string, install *sandbox.Sandbox, snapshots []string) *actor.Props {
		return actors.SessionProps(env, func() *actors.Session {
			if install != nil {
				s := actors.NewInstalledSession(sessionID, *install, snapshots)
				s.LastUse = o.clk.Now() // a restored episode goes on from now
				return s
			}
			return actors.NewSession(sessionID)
		}).Configure(onPool)
	}
	// A request sent to an actor that has stopped is a dead letter: answer
	// its slot, so that its asker learns at once that nobody acted on it.
	o.deadLetters = o.system.EventStream.Subscribe(func(ev any) {
		if d, ok := ev.(*actor.DeadLetterEvent); ok {
			if r := messages.ReplySlot(d.Message); r != nil {
				r.Deliver(messages.Undelivered{})
			}
		}
	})
	root := o.system.Root
	o.dir = supervisor.NewDirectory()
	o.sup, _ = root.SpawnNamed(supervisor.PropsOn(props, o.dir, o.clk).Configure(onPool), names("sessions"))
	o.coord, _ = root.SpawnNamed(actors.CoordinatorProps(&actors.CoordinatorEnv{
		Log:      o.log,
		Clock:    o.clk,
		OnOrphan: o.onOrphan,
	}).Configure(onPool), names("coordinator"))
	o.ask = newClient(root, o.sup, o.coord, o.dir, o.closed, o.rt)
}

// The dispatcher's shape: a few workers per CPU are enough for mailbox runs,
// which never block; the queue absorbs a burst (a commit's fan-out), and
// beyond it a run gets its own goroutine. The throughput is protoactor's
// default.
const (
	dispatchWorkers    = 8
	dispatchQueue      = 4096
	dispatchThroughput = 300
)

// Mode reports the checkpoint mode in effect.
func (o *Owner) Mode() Mode { return o.mode }

// Name is the server's name.
func (o *Owner) Name() string { return o.name }

// Incarnation identifies this process's owner in sandbox labels.
func (o *Owner) Incarnation() string { return o.incarnation }

// SharedProvider is the provider, for sandboxes that are not session state
// (a grading sandbox). nil when the server lends none.
func (o *Owner) SharedProvider() provider.Provider { return o.prov }

// Index is the snapshot index (nil unless the mode is exported).
func (o *Owner) Index() snapshotindex.Store { return o.index }

// CheckpointQueue is how many checkpoint provider calls wait for a slot of
// checkpoint.parallelism, and a channel closed when that changes.
func (o *Owner) CheckpointQueue() (int, <-chan struct{}) { return o.limiter.Waiting() }

// --- the session API ---

// labelled returns spec with the owner's labels added.
func (o *Owner) labelled(spec provider.Spec, sessionID string, extra map[string]string) provider.Spec {
	md := make(map[string]string, len(spec.Metadata)+4)
	for k, v := range spec.Metadata {
		md[k] = v
	}
	md[LabelOwner] = o.name
	md[LabelIncarnation] = o.incarnation
	md[LabelSession] = sessionID
	for k, v := range extra {
		md[k] = v
	}
	spec.Metadata = md
	if spec.TTLSeconds == 0 && o.cfg.DefaultTTL > 0 {
		spec.TTLSeconds = o.cfg.DefaultTTL.Seconds()
	}
	return spec
}

// StartSessionSandbox starts the session's sandbox on the shared provider,
// runs setup against it, and only then tracks it. A failed setup (or one
// returning anything but a JSON object of at most 64 KiB) stops the sandbox
// and tracks nothing. workdir "" means the sandbox's pwd after setup. A
// session that already has a sandbox gets sandbox.ErrExists, except a session
// a restore rebuilt: a replacement attempt gets the fork (Restored is set)
// and setup does not run again.
func (o *Owner) StartSessionSandbox(ctx context.Context, sessionID string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (sandbox.Sandbox, error) {
	if o.prov == nil {
		return sandbox.Sandbox{}, fmt.Errorf("%w: server %q lends no sandboxes", provider.ErrUnsupported, o.name)
	}
	if sessionID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("%w: empty session id", provider.ErrInvalidSpec)
	}
	spec = o.labelled(spec, sessionID, nil)
	o.starting.Add(1)
	defer o.starting.Add(-1)
	// An ended session's actor may still be on its way out: retry once it
	// is forgotten.
	for attempt := 0; ; attempt++ {
		ref, err := o.ask.spawn(sessionID, nil, nil, o.cfg.MaxSessions)
		if err != nil {
			return sandbox.Sandbox{}, err
		}
		pid := ref.PID.(*actor.PID)
		rep, err := o.ask.start(ctx, pid, messages.StartSandbox{Ctx: ctx, Spec: spec, Setup: setup, Workdir: workdir})
		if err != nil {
			return sandbox.Sandbox{}, err
		}
		if errors.Is(rep.Err, actors.ErrSessionEnded) && attempt < 100 {
			o.ask.forget(sessionID, pid)
			continue
		}
		if rep.Err != nil {
			if ref.Spawned && !errors.Is(rep.Err, sandbox.ErrExists) {
				// Nothing is tracked for a failed start: drop the empty actor.
				o.ask.forget(sessionID, pid)
				o.ask.settle()
			}
			return sandbox.Sandbox{}, rep.Err
		}
		return rep.Sandbox, nil
	}
}

// SessionSandbox returns the session's sandbox, including one a restore
// rebuilt. ok is false when it holds none (unknown, in setup, ended).
func (o *Owner) SessionSandbox(ctx context.Context, sessionID string) (sandbox.Sandbox, bool) {
	sb, err := o.RequireSessionSandbox(ctx, sessionID)
	return sb, err == nil
}

// RequireSessionSandbox is SessionSandbox with sandbox.ErrNone when
// there is none, so that a resent verify is refused instead of graded 0.
func (o *Owner) RequireSessionSandbox(ctx context.Context, sessionID string) (sandbox.Sandbox, error) {
	pid, err := o.ask.lookup(sessionID)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if pid == nil {
		return sandbox.Sandbox{}, fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	// A session answers a view at once unless its mailbox is stuck: bound
	// the wait even for a caller without a deadline.
	ctx, cancel := context.WithTimeout(ctx, timeouts.Reply)
	defer cancel()
	rep, err := o.ask.view(ctx, pid)
	if err == nil && rep.Lost {
		return sandbox.Sandbox{}, fmt.Errorf("%w: session %q", sandbox.ErrLost, sessionID)
	}
	if err != nil || !rep.Held {
		return sandbox.Sandbox{}, fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	return rep.Sandbox, nil
}

// SessionData is the session's setup object ({} when setup returned none or
// the session holds no sandbox).
func (o *Owner) SessionData(ctx context.Context, sessionID string) json.RawMessage {
	sb, ok := o.SessionSandbox(ctx, sessionID)
	if !ok || len(sb.Data) == 0 {
		return json.RawMessage("{}")
	}
	return sb.Data
}

// Do runs fn against the session's sandbox, serialised with the session's
// other operations (a stop or a snapshot never runs during it).
func (o *Owner) Do(ctx context.Context, sessionID string, fn sandbox.DoFunc) error {
	pid, err := o.ask.lookup(sessionID)
	if err != nil {
		return err
	}
	if pid == nil {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	rep, err := o.ask.do(ctx, pid, fn)
	if gone(err) {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	if err != nil {
		return err
	}
	if err := rep.Err; err != nil {
		if errors.Is(err, sandbox.ErrNone) {
			return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
		}
		if errors.Is(err, sandbox.ErrLost) {
			return fmt.Errorf("%w: session %q", sandbox.ErrLost, sessionID)
		}
		return err
	}
	return nil
}

// EndSessionSandbox stops the session's sandbox and forgets the session.
// Ending a session without a sandbox is success. The session's snapshots
// stay until the checkpoints that name them are dropped (a release, or
// their checkpoint_dir gone).
func (o *Owner) EndSessionSandbox(ctx context.Context, sessionID string) error {
	_, err := o.stopSession(ctx, sessionID, messages.StopEnd)
	return err
}

// stopSession stops a session's sandbox for reason and reports the handle
// stopped (nil when none was held).
func (o *Owner) stopSession(ctx context.Context, sessionID string, reason messages.StopReason) (*provider.Handle, error) {
	pid, err := o.ask.lookup(sessionID)
	if err != nil || pid == nil {
		return nil, err
	}
	rep, err := o.ask.stop(ctx, pid, reason, time.Time{})
	if gone(err) {
		return nil, nil // ended meanwhile: nothing held
	}
	if err != nil {
		return nil, err
	}
	if rep.Err == nil {
		// The session told the supervisor to forget it before answering.
		o.ask.settle()
	}
	return rep.Stopped, rep.Err
}

// SessionCounts are how many sessions hold a sandbox (live, restored ones
// included), how many seeds are starting one (in setup), and how many hold
// one that was lost behind the owner's back and not yet ended.
func (o *Owner) SessionCounts() (live, inSetup, lost int) {
	live, lost = o.fates.liveCount()
	return live, int(o.starting.Load()), lost
}

// Sessions lists the ids of the sessions the owner tracks.
func (o *Owner) Sessions() ([]string, error) {
	refs, err := o.ask.list()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.SessionID
	}
	return ids, nil
}

// --- fates, orphans, leases ---

func (o *Owner) onHeld(sessionID string, sb sandbox.Sandbox) {
	o.fates.hold(sessionID, sb.Handle, sb.FromSnapshot)
}

func (o *Owner) onLost(sessionID string, sb sandbox.Sandbox) {
	o.fates.markLost(sb.Handle.SandboxID)
}

func (o *Owner) onEnded(sessionID string, stopped *provider.Handle, reason messages.StopReason) {
	if stopped != nil {
		o.fates.set(stopped.SandboxID, sandbox.FateEnded)
	}
}

// SandboxFate tells what became of a sandbox the owner held: live (with the
// session holding it and its handle), ended, superseded by a restore's fork,
// or unknown.
func (o *Owner) SandboxFate(sandboxID string) (sessionID string, h provider.Handle, fate sandbox.Fate) {
	l, fate := o.fates.get(sandboxID)
	return l.sessionID, l.handle, fate
}

// onOrphan deletes a snapshot that arrived after its round gave up on it.
func (o *Owner) onOrphan(sessionID, snapshotID string) {
	if o.index == nil {
		return
	}
	o.log.WithFields(logrus.Fields{"session_id": sessionID, "snapshot_id": snapshotID}).Warn("snapshot arrived after its checkpoint failed; deleting it")
	o.bg.Go(o.rt, func() {
		ts := []snapshotindex.Tombstone{{SnapshotID: snapshotID, Provider: o.prov.Name(), Reason: "late snapshot of a failed commit", At: o.clk.Now()}}
		if err := o.index.AddTombstones(ts); err != nil {
			o.log.WithError(err).Warn("could not tombstone a late snapshot")
			return
		}
		o.deleteTombstoned(o.base, []string{snapshotID})
	})
}

// Tick asks every session to renew its sandbox's lease if a third of it
// has passed at now. The simulation and tests call it with logical time.
func (o *Owner) Tick(now time.Time) error {
	refs, err := o.ask.list()
	if err != nil {
		return err
	}
	for _, r := range refs {
		o.ask.send(r.PID.(*actor.PID), &messages.RenewLease{Now: now})
	}
	return nil
}

func (o *Owner) renewLoop(every time.Duration) {
	o.tickLoop(every, func(now time.Time) time.Duration {
		if err := o.Tick(now); err != nil {
			o.log.WithError(err).Debug("lease renewal tick failed")
		}
		if _, err := o.ReapIdle(o.base, now); err != nil {
			o.log.WithError(err).Debug("idle reaping failed")
		}
		return every
	})
}

// tickLoop runs fn when a timer on the clock fires, first after wait and
// then after the wait fn returns, until the owner closes.
func (o *Owner) tickLoop(wait time.Duration, fn func(now time.Time) time.Duration) {
	t := o.clk.NewTimer(wait)
	defer t.Stop()
	for {
		o.rt.Await(context.Background(), func() bool { return len(t.C()) > 0 || sched.Closed(o.closed) })
		select {
		case <-o.closed:
			return
		case <-t.C():
			t.Reset(fn(o.clk.Now()))
		}
	}
}

// Close shuts the owner down: every session's sandbox is stopped (a fresh
// process could not serve them; checkpoints keep their snapshots), the
// actors stop, and the index is closed cleanly.
func (o *Owner) Close() error {
	var err error
	o.closeOnce.Do(func() {
		if ids, lerr := o.Sessions(); lerr == nil && len(ids) > 0 {
			ctx, cancel := context.WithTimeout(context.Background(), timeouts.CloseStops)
			_, failed := o.stopMany(ctx, ids, messages.StopEnd)
			cancel()
			if len(failed) > 0 {
				o.log.WithField("failed", len(failed)).Warn("some sandboxes could not be stopped at shutdown; the next start stops them")
			}
		}
		close(o.closed)
		o.cancelBase()
		if o.sup != nil {
			o.poisonAndWait(o.sup)
			o.poisonAndWait(o.coord)
		}
		o.bg.Wait(o.rt)
		o.leaveSystem()
		o.stopDispatcher()
		if o.index != nil {
			err = o.index.Close()
		}
	})
	return err
}

// poisonAndWait stops an actor and waits until it has (its children first).
func (o *Owner) poisonAndWait(pid *actor.PID) {
	f := o.system.Root.PoisonFuture(pid)
	o.rt.Await(context.Background(), func() bool {
		_, alive := o.system.ProcessRegistry.GetLocal(pid.Id)
		return !alive
	})
	_ = f.Wait()
}

// leaveSystem shuts the actor system down if it is the owner's own, and
// stops listening to it.
func (o *Owner) leaveSystem() {
	o.system.EventStream.Unsubscribe(o.deadLetters)
	if o.cfg.ActorSystem == nil {
		o.system.Shutdown()
	}
}

func (o *Owner) stopDispatcher() {
	if o.dispatch != nil {
		o.dispatch.Stop()
	}
}

// Abandon drops the owner as a crash would: no sandbox is stopped, no
// session is told, and the index is closed without any further write. For
// tests and the simulation: a fresh owner on the same state_dir and provider
// then recovers.
func (o *Owner) Abandon() {
	o.closeOnce.Do(func() {
		close(o.closed)
		o.cancelBase()
		o.bg.Wait(o.rt)
		if o.cfg.ActorSystem != nil {
			// Gone from the system without a word: no actor runs its stop
			// (a session's would stop its sandbox), as in a crash.
			for _, pid := range append(o.dir.Children(), o.sup, o.coord) {
				o.system.ProcessRegistry.Remove(pid)
			}
		}
		o.leaveSystem()
		o.stopDispatcher()
		if o.index != nil {
			_ = o.index.Close()
		}
	})
}

// Touch records that the session was used now (a request named it), which
// defers its idle end. A session the owner does not hold is ignored.
func (o *Owner) Touch(sessionID string) {
	pid, err := o.ask.lookup(sessionID)
	if err != nil || pid == nil {
		return
	}
	o.ask.send(pid, &messages.Touch{At: o.clk.Now()})
}

// ReapIdle ends the sessions unused for IdleTimeout at now (sandbox
// stopped, snapshots kept until a release drops the checkpoints naming
// them) and returns their ids. A session with an operation running or
// queued is not idle. The renewal loop calls it at every tick; tests and
// the simulation call it with logical time.
func (o *Owner) ReapIdle(ctx context.Context, now time.Time) ([]string, error) {
	if o.cfg.IdleTimeout <= 0 {
		return nil, nil
	}
	// Not during a commit, restore, retire or release: an end racing a
	// commit fails it. The next tick reaps instead.
	if !o.ctl.TryLock() {
		return nil, nil
	}
	defer o.ctl.Unlock()
	refs, err := o.ask.list()
	if err != nil {
		return nil, err
	}
	since := now.Add(-o.cfg.IdleTimeout)
	ended, failed := o.eachOutcome(ctx, len(refs), false, func(i int) (string, error) {
		sid := refs[i].SessionID
		rep, err := o.ask.stop(ctx, refs[i].PID.(*actor.PID), messages.StopIdle, since)
		if gone(err) {
			return "", nil
		}
		if err != nil {
			return sid, err
		}
		if rep.NotIdle || (rep.Err == nil && rep.Stopped == nil) {
			return "", nil
		}
		if rep.Err != nil {
			return sid, rep.Err
		}
		o.log.WithFields(logrus.Fields{"session_id": sid, "sandbox_id": rep.Stopped.SandboxID, "idle_timeout": o.cfg.IdleTimeout.String()}).
			Warn("session ended: no request for the idle timeout (its snapshots stay until a release)")
		return sid, nil
	})
	if len(ended) > 0 {
		o.ask.settle()
	}
	for _, sid := range slices.Sorted(maps.Keys(failed)) {
		o.log.WithFields(logrus.Fields{"session_id": sid, "error": failed[sid]}).Warn("could not end an idle session; the next tick retries")
	}
	return ended, nil
}
