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
// they guard: the incarnation's rounds intent (written at its start, it
// names the mark every commit round's snapshot names begin their tag with,
// so a crash mid-round leaks none), tombstones (snapshots decided for deletion), and
// sandbox labels (every sandbox carries ng.owner and ng.incarnation metadata,
// so a fresh owner stops what a crashed one left running).
package owner

import (
	"context"
	"fmt"
	"log/slog"
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
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/retention"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/supervisor"
)

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
	// starts numbers the starts and forks labelled LabelStart.
	starts atomic.Uint64
	// launchNumbered is startNumbered as a seed's launch, made once: the
	// method value taken on every seed was an allocation.
	launchNumbered sandbox.LaunchFunc

	system      *actor.ActorSystem
	deadLetters *eventstream.Subscription
	// orphans hears of snapshots the coordinator gave up on.
	orphans *eventstream.Subscription
	workers *actors.Workers
	// effects runs the sessions' effects, and the Dos callers run on a
	// session's lent permit.
	effects sched.Runtime
	sup     *actor.PID
	dir     *supervisor.Directory
	coord   *actor.PID
	limiter *actors.Limiter
	index   snapshotindex.Store

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
	// loose counts the commit rounds begun whose snapshots are neither
	// recorded nor tombstoned: Close keeps the rounds intent while any is.
	loose atomic.Int64

	fates *fateMemory
	// ret is what the retention checks remember; dirs where they look.
	ret  *retentionState
	dirs retention.FS
	// starting counts StartSessionSandbox calls in progress.
	starting atomic.Int64
	// tmpl are the templates of keyed seeds; pools the warm pools (nil:
	// none).
	tmpl  *templates
	pools *pools

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
		tmpl:        newTemplates(),
		pools:       newPools(poolConfig(cfg)),
		closed:      make(chan struct{}),
	}
	o.launchNumbered = o.startNumbered
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
	if err := o.loadTemplates(); err != nil {
		o.Close()
		return nil, fmt.Errorf("read the templates: %w", err)
	}
	if every := cfg.Pool.MaxIdle / 4; o.pools != nil && every > 0 {
		o.bg.Go(o.rt, func() {
			o.tickLoop(every, func(now time.Time) time.Duration { o.PoolTick(now); return every })
		})
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
	// A mailbox with work runs on the goroutine that gave it the work (the
	// caller that asked, the effect worker that fed back an outcome, the
	// actor that sent), not on a dispatcher's: a request and its answer
	// cross no goroutine they need not. A seed handed its caller to a
	// dispatcher worker for the supervisor's run, to another for the
	// session's, and its completion went from the effect worker to a
	// dispatcher worker before it reached the caller; each hand-off was a
	// wake-up and a switch. It is safe because no actor's Receive blocks
	// or takes a lock held by a sender (the owner's callbacks take only
	// the directory's and the fates' locks, under which nothing is sent),
	// and a mailbox runs on one goroutine at a time whichever it is.
	var onPool actor.PropsOption
	if d, ok := o.rt.(sched.Dispatcher); ok {
		onPool = actor.WithDispatcher(d)
	} else {
		onPool = actor.WithDispatcher(actor.NewSynchronizedDispatcher(dispatchThroughput))
		// The sessions' effects (each Do among them) run on kept
		// goroutines too.
		o.workers = actors.NewWorkers(effectWorkers)
		env.Runtime = o.workers
	}
	o.effects = sched.Or(env.Runtime)
	// The supervisor asks for each spawn's props right before it spawns.
	maker := actors.NewSessionMaker(env, onPool)
	props := func(sessionID string, install *sandbox.Sandbox, view *messages.SessionView) *actor.Props {
		if install != nil {
			s := actors.NewInstalledSession(sessionID, *install)
			s.LastUse = o.clk.Now() // a restored episode goes on from now
			return maker.Props(view, s)
		}
		return maker.Props(view, actors.NewSession(sessionID))
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
	// The supervisor and the coordinator take every seed's and every
	// round's messages: they run on the sessions' kind of mailbox, which
	// allocates nothing per message.
	mailbox := actor.WithMailbox(actors.Mailbox())
	o.sup, _ = root.SpawnNamed(supervisor.PropsPublishing(props, o.dir, o.clk).Configure(onPool, mailbox), names("sessions"))
	o.coord, _ = root.SpawnNamed(actors.CoordinatorProps(&actors.CoordinatorEnv{
		Log:   o.log,
		Clock: o.clk,
	}).Configure(onPool, mailbox), names("coordinator"))
	// The snapshots the coordinator reports as orphans are deleted. The
	// owner listens for them: the coordinator does not call up into it.
	o.orphans = o.system.EventStream.Subscribe(func(ev any) {
		if m, ok := ev.(*actors.OrphanSnapshot); ok && m.Coordinator.Equal(o.coord) {
			o.onOrphan(m.SessionID, m.SnapshotID)
		}
	})
	o.ask = newClient(root, o.sup, o.coord, o.dir, o.closed, o.rt)
}

// effectWorkers is how many goroutines that ran sessions' effects wait for
// the next one; dispatchThroughput is how many messages a mailbox run
// processes before it yields (protoactor's default).
const (
	effectWorkers      = 64
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
