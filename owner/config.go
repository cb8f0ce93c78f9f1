package owner

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
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
	// seed beyond it gets sandbox.ErrAtCapacity and starts nothing. A restore is
	// not bounded: it brings back what a checkpoint holds.
	MaxSessions int
	// IdleTimeout ends a session with no use for that long (0: never),
	// checked at every renewal tick (ReapIdle).
	IdleTimeout time.Duration
	// DefaultTTL is the lease of a sandbox whose spec names none, for a
	// provider whose sandboxes always have one (OpenSandbox's ttl_s): the
	// owner renews only leases it knows of.
	DefaultTTL time.Duration
	// Pool keeps started sandboxes ready for seeds (Size 0: none).
	Pool PoolConfig
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
