package owner_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/hangguard"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
)

// detEnv runs owners the way the simulation's deterministic mode does: the
// owner's mailboxes, effects, fan-outs and waits, the fake's latency and the
// clock all on one sched.Det, driven by the test goroutine (every owner
// call runs the scheduler until it has its answer); the owners share one
// actor system and an in-memory index.
type detEnv struct {
	t   *testing.T
	det *sched.Det
	sys *actor.ActorSystem
	fk  *fake.Provider
	mem *snapshotindex.Memory
}

func newDetEnv(t *testing.T, seed uint64) *detEnv {
	t.Helper()
	hangguard.Arm(t) // a wait outside the Det holds its turn for ever
	det := sched.NewDet(seed, time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	// Registered first, so it runs after every owner's cleanup.
	t.Cleanup(det.Close)
	sys := actor.NewActorSystem(
		actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }),
		actor.WithDeadLetterRequestLogging(false),
	)
	t.Cleanup(sys.Shutdown)
	return &detEnv{
		t:   t,
		det: det,
		sys: sys,
		// One fake seed for every run: the Det's seed alone decides.
		fk:  fake.New(fake.Options{Clock: det, Runtime: det, Seed: 1}),
		mem: snapshotindex.NewMemory(),
	}
}

func (e *detEnv) config(name, incarnation string, par int) owner.Config {
	return owner.Config{
		Name:     name,
		Provider: e.fk,
		Checkpoint: owner.CheckpointConfig{
			Enabled:     true,
			Index:       e.mem.Open(),
			Parallelism: par,
		},
		Clock:       e.det,
		Runtime:     e.det,
		ActorSystem: e.sys,
		Incarnation: incarnation,
	}
}

// open starts an owner named notes.
func (e *detEnv) open(incarnation string, par int) *owner.Owner {
	e.t.Helper()
	return e.openNamed("notes", incarnation, par)
}

func (e *detEnv) openNamed(name, incarnation string, par int) *owner.Owner {
	e.t.Helper()
	o, err := owner.New(context.Background(), e.config(name, incarnation, par))
	if err != nil {
		e.t.Fatalf("owner.New: %v", err)
	}
	e.t.Cleanup(func() { _ = o.Close() })
	return o
}

// actorIDs lists every process in the system's registry.
func actorIDs(sys *actor.ActorSystem) []string {
	var ids []string
	for _, bucket := range sys.ProcessRegistry.LocalPIDs.LocalPIDs {
		ids = append(ids, bucket.Keys()...)
	}
	sort.Strings(ids)
	return ids
}

// detCommitTrace starts sessions on an owner on a Det of runSeed, commits
// them with snapshots of seeded latency two at a time, and returns the
// provider calls as the fake saw them, with their virtual times, and the
// commit's result.
func detCommitTrace(t *testing.T, runSeed uint64) ([]string, owner.CommitResult) {
	e := newDetEnv(t, runSeed)
	o := e.open("replay", 2)
	for i := range 4 {
		seed(t, o, fmt.Sprintf("s%d", i))
	}
	start := e.det.Now()
	var trace []string
	e.fk.SetLatencyRange(fake.OpSnapshot, time.Second, 5*time.Second)
	e.fk.SetHook(func(c fake.Call) {
		trace = append(trace, fmt.Sprintf("%s %s %s %s %s", e.det.Now().Sub(start), c.Phase, c.Op, c.SandboxID, c.SnapshotID))
	})
	res := commit(t, o, "c1")
	e.fk.SetHook(nil)
	return trace, res
}

// TestOwnerOnADetReplays: the same seed gives the same run, call for call
// and snapshot id for snapshot id, and the seed is what decides it.
func TestOwnerOnADetReplays(t *testing.T) {
	distinct := map[string]bool{}
	for s := range uint64(6) {
		a, ra := detCommitTrace(t, s)
		b, rb := detCommitTrace(t, s)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("seed %d: the provider calls differ between two runs (-first +second):\n%s", s, diff)
		}
		if diff := cmp.Diff(ra, rb); diff != "" {
			t.Fatalf("seed %d: the commit results differ between two runs (-first +second):\n%s", s, diff)
		}
		if len(ra.Sessions) != 4 {
			t.Fatalf("seed %d: exported %v, want 4 sessions", s, ra.Sessions)
		}
		distinct[strings.Join(a, "\n")] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("6 seeds gave %d distinct runs: the seed does not decide the schedule", len(distinct))
	}
}

// TestCommitOnADetKeepsToItsParallelism: with parallelism 1 the snapshots
// of a commit never overlap, so the commit lasts the sum of their
// latencies on the Det's clock; with parallelism 2 they go two by two.
func TestCommitOnADetKeepsToItsParallelism(t *testing.T) {
	const n, lat = 4, 3 * time.Second
	for _, tc := range []struct {
		par      int
		wantPeak int
		wantTook time.Duration
	}{
		{par: 1, wantPeak: 1, wantTook: n * lat},
		{par: 2, wantPeak: 2, wantTook: n / 2 * lat},
	} {
		t.Run(fmt.Sprintf("parallelism %d", tc.par), func(t *testing.T) {
			e := newDetEnv(t, 3)
			o := e.open("par", tc.par)
			for i := range n {
				seed(t, o, fmt.Sprintf("s%d", i))
			}
			e.fk.SetLatency(fake.OpSnapshot, lat)
			inFlight, peak := 0, 0
			e.fk.SetHook(func(c fake.Call) {
				if c.Op != fake.OpSnapshot {
					return
				}
				if c.Phase == fake.PhaseBegin {
					inFlight++
					peak = max(peak, inFlight)
				} else {
					inFlight--
				}
			})
			began := e.det.Now()
			res := commit(t, o, "c1")
			took := e.det.Now().Sub(began)
			if len(res.Sessions) != n {
				t.Fatalf("exported %v, want %d sessions", res.Sessions, n)
			}
			if peak != tc.wantPeak {
				t.Errorf("%d snapshots in flight at once, want %d", peak, tc.wantPeak)
			}
			if took != tc.wantTook {
				t.Errorf("the commit took %v on the Det's clock, want %v", took, tc.wantTook)
			}
		})
	}
}

// TestAbandonOnASharedSystemLeavesNoActorAndStopsNothing: an owner on a
// shared actor system that is abandoned leaves none of its actors in the
// system's registry and no listener on its event stream, and, as in a
// crash, its sessions' sandboxes are still running; an owner that is
// closed leaves nothing either, so a new owner of the same incarnation can
// start on the same system and serve.
func TestAbandonOnASharedSystemLeavesNoActorAndStopsNothing(t *testing.T) {
	e := newDetEnv(t, 4)
	before := actorIDs(e.sys)
	listeners := e.sys.EventStream.Length()

	o1 := e.open("inc-1", 2)
	seed(t, o1, "s1")
	seed(t, o1, "s2")
	mine := 0
	for _, id := range actorIDs(e.sys) {
		if strings.Contains(id, "inc-1") {
			mine++
		}
	}
	// The supervisor, the coordinator and two sessions.
	if mine < 4 {
		t.Fatalf("the registry names %d actors after the incarnation, want at least 4: %v", mine, actorIDs(e.sys))
	}
	// A second owner on the system at the same time (of another name, so
	// that it does not take the first's sandboxes for a crashed
	// predecessor's), with a session of the same id: each serves its own.
	o2 := e.openNamed("other", "inc-2", 2)
	seed(t, o2, "s1")
	appendNote(t, o1, "s1", "first")
	appendNote(t, o2, "s1", "second")
	if diff := cmp.Diff([]string{"first"}, notes(t, o1, "s1")); diff != "" {
		t.Fatalf("notes of s1 of the first owner (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"second"}, notes(t, o2, "s1")); diff != "" {
		t.Fatalf("notes of s1 of the second owner (-want +got):\n%s", diff)
	}
	if err := o2.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}

	live, stops := e.fk.LiveSandboxIDs(), e.fk.Stats().Calls[fake.OpStop]
	o1.Abandon()
	if diff := cmp.Diff(before, actorIDs(e.sys)); diff != "" {
		t.Fatalf("actors left in the shared system after one owner closed and one was abandoned (-before +after):\n%s", diff)
	}
	if got := e.sys.EventStream.Length(); got != listeners {
		t.Fatalf("%d event stream listeners after Close and Abandon, want %d", got, listeners)
	}
	// Nothing ran a session's stop, even once the scheduler has nothing left.
	e.det.Settle()
	if diff := cmp.Diff(live, e.fk.LiveSandboxIDs()); diff != "" {
		t.Fatalf("sandboxes after Abandon (-before +after):\n%s", diff)
	}
	// Not even tried (a stop on the owner's ended context would fail).
	if got := e.fk.Stats().Calls[fake.OpStop] - stops; got != 0 {
		t.Fatalf("an abandoned owner made %d stop calls", got)
	}

	// The closed owner's incarnation again, on the same system: its
	// actors are its own, not the closed owner's.
	o3 := e.open("inc-2", 2)
	seed(t, o3, "s4")
	appendNote(t, o3, "s4", "again")
	if diff := cmp.Diff([]string{"again"}, notes(t, o3, "s4")); diff != "" {
		t.Fatalf("notes of a session of the second owner named inc-2 (-want +got):\n%s", diff)
	}
	if res := commit(t, o3, "c1"); len(res.Sessions) != 1 {
		t.Fatalf("the second owner named inc-2 exported %v", res.Sessions)
	}
}

// TestMemIndexCheckpointSurvivesAbandon: an owner whose index is a handle
// over a snapshotindex.Memory commits and is abandoned; a new owner over
// another handle of the same Memory restores the checkpoint.
func TestMemIndexCheckpointSurvivesAbandon(t *testing.T) {
	e := newDetEnv(t, 5)
	o1 := e.open("inc-1", 2)
	seed(t, o1, "s1")
	seed(t, o1, "s2")
	appendNote(t, o1, "s1", "one")
	appendNote(t, o1, "s2", "uno")
	commit(t, o1, "c1")
	appendNote(t, o1, "s1", "drift")
	o1.Abandon()

	o2 := e.open("inc-2", 2)
	res, err := o2.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"})
	if err != nil {
		t.Fatalf("restore c1 on a new owner over the same memory: %v", err)
	}
	var got []string
	for _, s := range res.Sessions {
		got = append(got, s.SessionID)
	}
	if diff := cmp.Diff([]string{"s1", "s2"}, got); diff != "" {
		t.Fatalf("restored sessions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"one"}, notes(t, o2, "s1")); diff != "" {
		t.Fatalf("restored notes of s1 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"uno"}, notes(t, o2, "s2")); diff != "" {
		t.Fatalf("restored notes of s2 (-want +got):\n%s", diff)
	}
}

// TestRenewLoopOnADet: the renewal loop of RenewEvery runs as a coroutine
// of the Det, ticking on its clock: a sandbox with a 100 s lease is still
// running after 300 s of virtual time, renewed only at the loop's ticks,
// and Close ends the loop.
func TestRenewLoopOnADet(t *testing.T) {
	e := newDetEnv(t, 6)
	cfg := e.config("notes", "renew", 2)
	cfg.RenewEvery = 10 * time.Second
	o, err := owner.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := e.det.Now()
	var renewedAt []time.Duration
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpRenew && c.Phase == fake.PhaseEnd && c.Err == nil {
			renewedAt = append(renewedAt, e.det.Now().Sub(start))
		}
	})
	sb, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{TTLSeconds: 100}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	e.det.Advance(300 * time.Second)
	if diff := cmp.Diff([]string{sb.Handle.SandboxID}, e.fk.LiveSandboxIDs()); diff != "" {
		t.Fatalf("live sandboxes after 300 s of a 100 s lease (-want +got):\n%s", diff)
	}
	if len(renewedAt) < 3 {
		t.Fatalf("renewed at %v, want at least three renewals in 300 s of a 100 s lease", renewedAt)
	}
	for _, at := range renewedAt {
		if at%(10*time.Second) != 0 {
			t.Fatalf("renewed at %v, want only at the loop's ticks (every 10 s): %v", at, renewedAt)
		}
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if got := e.det.Parked(); got != 0 {
		t.Fatalf("%d coroutines still parked after Close, want the renewal loop ended", got)
	}
}

// TestAnOrphanSnapshotIsDeletedByItsOwnerAlone: a snapshot reply that
// reaches a coordinator with no round running (its round gave up on it) is
// deleted, once, by that coordinator's owner, though another owner hears
// the same actor system's events.
func TestAnOrphanSnapshotIsDeletedByItsOwnerAlone(t *testing.T) {
	e := newDetEnv(t, 5)
	o1 := e.open("inc-1", 2)
	e.openNamed("other", "inc-2", 2)
	sb := seed(t, o1, "s1")
	snap, err := e.fk.Snapshot(context.Background(), sb.Handle, "late")
	if err != nil {
		t.Fatal(err)
	}
	deletes := e.fk.Stats().Calls[fake.OpDeleteSnapshot]
	coord := actor.NewPID(e.sys.Address(), "coordinator-inc-1")
	e.sys.Root.Send(coord, &messages.SnapshotReply{Round: 99, SessionID: "s1", SnapshotID: snap})
	e.det.Settle()
	if got := e.fk.Stats().Calls[fake.OpDeleteSnapshot] - deletes; got != 1 {
		t.Fatalf("%d deletes of the orphan, want 1 (by its coordinator's owner alone)", got)
	}
	if slices.Contains(e.fk.SnapshotIDs(), snap) {
		t.Fatalf("the orphan %s is still there", snap)
	}
}

// TestZeroPeriodsRunNoLoopOnADet: pools without an idle time, no
// RenewEvery and retention without a period run no loop of their own (a
// loop of period 0 would spin and the Det never settle): a pooled
// sandbox's lease is renewed at the owner's Tick only.
func TestZeroPeriodsRunNoLoopOnADet(t *testing.T) {
	e := newDetEnv(t, 7)
	cfg := e.config("notes", "zero", 2)
	cfg.DefaultTTL = 90 * time.Second
	cfg.Pool = owner.PoolConfig{Size: 1, RefillConcurrency: 1}
	cfg.Checkpoint.Retention = owner.RetentionConfig{FollowDirs: true}
	o, err := owner.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = o.Close() })
	seed(t, o, "s0")
	e.det.Advance(60 * time.Second)
	if st := o.PoolStats(); st.Ready != 1 {
		t.Fatalf("pool stats %+v, want one ready", st)
	}
	if n := e.fk.Stats().Calls[fake.OpRenew]; n != 0 {
		t.Fatalf("%d renewals before any tick, want 0", n)
	}
	if err := o.Tick(e.det.Now()); err != nil {
		t.Fatal(err)
	}
	e.det.Settle() // the session renews on its own mailbox
	if n := e.fk.Stats().Calls[fake.OpRenew]; n != 2 {
		t.Fatalf("%d renewals at the tick, want 2 (the session's and the pooled sandbox's)", n)
	}
}
