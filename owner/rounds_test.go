package owner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sandboxowner/owner/internal/flock/flocktest"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/snapshotindex"
)

// writeCountingStore counts the index's intent writes, and fails the next
// failTombstones tombstone writes.
type writeCountingStore struct {
	snapshotindex.Store
	puts           atomic.Int64
	failTombstones atomic.Int64
	failDeletes    atomic.Int64
}

func (s *writeCountingStore) DeleteIntent(k snapshotindex.IntentKey) error {
	if s.failDeletes.Add(-1) >= 0 {
		return errStore
	}
	return s.Store.DeleteIntent(k)
}

func (s *writeCountingStore) PutIntent(in snapshotindex.Intent) error {
	s.puts.Add(1)
	return s.Store.PutIntent(in)
}

func (s *writeCountingStore) AddTombstones(ts []snapshotindex.Tombstone, clear ...snapshotindex.IntentKey) error {
	if s.failTombstones.Add(-1) >= 0 {
		return errStore
	}
	return s.Store.AddTombstones(ts, clear...)
}

// A commit writes nothing to the index before its snapshots: the
// incarnation's rounds intent, written at its start, already covers them.
func TestACommitWritesNoIntentBeforeItsSnapshots(t *testing.T) {
	e := newEnv(t)
	st := &writeCountingStore{Store: snapshotindex.NewMemory().Open()}
	o := e.open(withStore(st))
	seed(t, o, "s1")
	seed(t, o, "s2")
	if n := st.puts.Load(); n != 1 {
		t.Fatalf("%d intents written by the start, want its rounds intent", n)
	}
	var mu sync.Mutex
	var atFirst int64 = -1
	e.fk.SetHook(func(c fake.Call) {
		mu.Lock()
		defer mu.Unlock()
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin && atFirst < 0 {
			atFirst = st.puts.Load()
		}
	})
	commit(t, o, "c1")
	e.fk.SetHook(nil)
	mu.Lock()
	defer mu.Unlock()
	if atFirst != 1 || st.puts.Load() != 1 {
		t.Errorf("intents written: %d at the first snapshot, %d after the commit; want the start's one only", atFirst, st.puts.Load())
	}
}

// A clean Close drops the rounds intent once every round is accounted for
// (recorded, or tombstoned by its discard); a round whose snapshots could
// not be tombstoned keeps it, and the next start finds them by the
// incarnation's mark and deletes them.
func TestCloseKeepsTheRoundsIntentOfALooseRound(t *testing.T) {
	e := newEnv(t)
	mem := snapshotindex.NewMemory()
	st := &writeCountingStore{Store: mem.Open()}
	o1 := e.open(withStore(st), parallelism(1))
	seed(t, o1, "s1")
	b := seed(t, o1, "s2")
	commit(t, o1, "c1")
	// c1's snapshots are recorded; c2's round fails on s2 and its
	// discard cannot tombstone what s1 took.
	e.fk.FailNextFor(fake.OpSnapshot, b.Handle.SandboxID, 1)
	st.failTombstones.Store(1)
	if _, err := o1.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c2"}); err == nil {
		t.Fatal("c2 committed with a failed snapshot")
	}
	if n := e.fk.Stats().LiveSnapshots; n != 3 {
		t.Fatalf("%d snapshots, want c1's 2 and the one of c2 left by its failed discard", n)
	}
	if err := o1.Close(); err != nil {
		t.Fatal(err)
	}
	if in, _ := mem.Open().Intents(""); !onlyRoundsOf(in, o1) || len(in) != 1 {
		t.Fatalf("intents after Close: %v, want the rounds intent of the loose round", in)
	}
	o2 := e.open(withStore(mem.Open()))
	if n := e.fk.Stats().LiveSnapshots; n != 2 {
		t.Errorf("%d snapshots after the next start, want c1's 2", n)
	}
	if ids := snapshotIDs(t, o2, "c1"); len(ids) != 2 {
		t.Errorf("c1 names %v", ids)
	}
	// o2's rounds: one discarded whole, one recorded; then a clean Close
	// leaves no intent.
	seed(t, o2, "s3")
	d := seed(t, o2, "s4")
	e.fk.FailNextFor(fake.OpSnapshot, d.Handle.SandboxID, 1)
	if _, err := o2.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c3"}); err == nil {
		t.Fatal("c3 committed with a failed snapshot")
	}
	commit(t, o2, "c4")
	if err := o2.Close(); err != nil {
		t.Fatal(err)
	}
	if in, err := mem.Open().Intents(""); len(in) != 0 || err != nil {
		t.Errorf("intents after a clean Close: %v (%v), want none", in, err)
	}
}

// Snapshots of another incarnation's rounds, or named by no round, are
// never taken for an earlier run's by a start's recovery.
func TestRecoveryTakesOnlyItsPredecessorsMark(t *testing.T) {
	e := newEnv(t)
	mem := snapshotindex.NewMemory()
	o1 := e.open(withStore(mem.Open()))
	seed(t, o1, "s1")
	// A foreign snapshot and one named as an unmarked round's are not
	// o1's rounds'.
	sb, err := o1.RequireSessionSandbox(context.Background(), "s1")
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"someone-else", "ng-s1-1-0123abcd"} {
		if _, err := e.fk.Snapshot(context.Background(), sb.Handle, name); err != nil {
			t.Fatal(err)
		}
	}
	o1.Abandon()
	o2 := e.open(withStore(mem.Open()))
	if n := e.fk.Stats().LiveSnapshots; n != 2 {
		t.Errorf("%d snapshots after the start, want the 2 that are not o1's rounds'", n)
	}
	if in, _ := o2.Index().Intents(""); !onlyRoundsOf(in, o2) {
		t.Errorf("intents after the start: %v", in)
	}
}

// closeFailingStore is an index whose Close fails.
type closeFailingStore struct{ snapshotindex.Store }

var errClose = errors.New("index: close failed")

func (s closeFailingStore) Close() error { return errors.Join(s.Store.Close(), errClose) }

// Abandon reports the index's close error (a test that reopens the state_dir
// next learns why it cannot), once: a second Abandon, or one after Close,
// does nothing.
func TestAbandonReportsTheIndexsCloseError(t *testing.T) {
	e := newEnv(t)
	o := e.open(withStore(closeFailingStore{snapshotindex.NewMemory().Open()}))
	seed(t, o, "s1")
	if err := o.Abandon(); !errors.Is(err, errClose) {
		t.Fatalf("Abandon: %v, want the index's close error", err)
	}
	if err := o.Abandon(); err != nil {
		t.Errorf("a second Abandon: %v, want nil", err)
	}
	if err := o.Close(); err != nil {
		t.Errorf("Close after Abandon: %v, want nil", err)
	}
}

// An owner on a state_dir abandoned a moment ago opens its index although a
// child forked meanwhile (a sandbox's start on another goroutine, not yet
// exec'd) holds a copy of every descriptor the first had: Abandon returns
// once the directory is free.
func TestAnAbandonedStateDirReopensWhileAForkedChildHoldsCopies(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	commit(t, o1, "c1")
	flocktest.HoldCopies(t)
	if err := o1.Abandon(); err != nil {
		t.Fatal(err)
	}
	o2 := e.open()
	if ids := snapshotIDs(t, o2, "c1"); len(ids) != 1 {
		t.Errorf("c1 names %v after the reopen", ids)
	}
}
