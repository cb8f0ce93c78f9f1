package owner_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/snapshotindex"
)

// failingStore fails the next n commits of its index.
type failingStore struct {
	snapshotindex.Store
	n atomic.Int64
}

var errStore = errors.New("index: disk full")

func (s *failingStore) Commit(meta snapshotindex.CheckpointMeta, records []snapshotindex.Record, clear ...snapshotindex.IntentKey) (snapshotindex.CheckpointMeta, error) {
	if s.n.Add(-1) >= 0 {
		return snapshotindex.CheckpointMeta{}, errStore
	}
	return s.Store.Commit(meta, records, clear...)
}

func withStore(s snapshotindex.Store) cfgOpt {
	return func(c *owner.Config) { c.Checkpoint.Index, c.Checkpoint.StateDir = s, "" }
}

func snapshotIDs(t *testing.T, o *owner.Owner, id string) []string {
	t.Helper()
	ck, err := o.Index().Checkpoint(id)
	if err != nil {
		t.Fatalf("checkpoint %s: %v", id, err)
	}
	var ids []string
	for _, r := range ck.Records {
		ids = append(ids, r.SnapshotID)
	}
	return ids
}

// A commit whose store fails keeps its snapshots; the retry stores the same
// records and takes no snapshot again.
func TestAFailedStoreIsRetriedWithTheSameRecords(t *testing.T) {
	e := newEnv(t)
	st := &failingStore{Store: snapshotindex.NewMemory().Open()}
	st.n.Store(1)
	o := e.open(withStore(st))
	seed(t, o, "s1")
	seed(t, o, "s2")
	req := owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck/c1"}
	if _, err := o.Commit(context.Background(), req); !errors.Is(err, errStore) {
		t.Fatalf("first commit: %v, want the store's failure", err)
	}
	if n := e.fk.Stats().LiveSnapshots; n != 2 {
		t.Fatalf("%d snapshots after the failed store, want its 2 kept for the retry", n)
	}
	other := req
	other.CheckpointDir = "/ck/other"
	if _, err := o.Commit(context.Background(), other); !errors.Is(err, snapshotindex.ErrConflict) {
		t.Fatalf("retry with another dir: %v, want ErrConflict", err)
	}
	res, err := o.Commit(context.Background(), req)
	if err != nil {
		t.Fatalf("retried commit: %v", err)
	}
	if diff := cmp.Diff([]string{"s1", "s2"}, res.Sessions); diff != "" {
		t.Errorf("sessions (-want +got):\n%s", diff)
	}
	if s := e.fk.Stats(); s.Calls[fake.OpSnapshot] != 2 || s.LiveSnapshots != 2 {
		t.Errorf("%d snapshot calls, %d snapshots, want 2 and 2: the retry snapshotted again", s.Calls[fake.OpSnapshot], s.LiveSnapshots)
	}
	if ids := snapshotIDs(t, o, "c1"); len(ids) != 2 {
		t.Errorf("checkpoint records snapshots %v", ids)
	}
}

// StopCommit after a failed store deletes the kept snapshots, and a commit
// of that id afterwards is refused without a snapshot.
func TestStopCommitLetsAnUnstoredCommitGo(t *testing.T) {
	e := newEnv(t)
	st := &failingStore{Store: snapshotindex.NewMemory().Open()}
	st.n.Store(1)
	o, err := owner.New(context.Background(), e.config(withStore(st)))
	if err != nil {
		t.Fatal(err)
	}
	seed(t, o, "s1")
	req := owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck/c1"}
	if _, err := o.Commit(context.Background(), req); !errors.Is(err, errStore) {
		t.Fatalf("first commit: %v", err)
	}
	deleted := make(chan struct{})
	var once sync.Once
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpDeleteSnapshot && c.Phase == fake.PhaseEnd && c.Err == nil {
			once.Do(func() { close(deleted) })
		}
	})
	o.StopCommit("c1")
	if _, err := o.Commit(context.Background(), req); !errors.Is(err, owner.ErrCommitStopped) {
		t.Fatalf("commit after the stop: %v, want ErrCommitStopped", err)
	}
	// The deletion runs in the background.
	<-deleted
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if s := e.fk.Stats(); s.Calls[fake.OpSnapshot] != 1 || s.LiveSnapshots != 0 {
		t.Errorf("%d snapshot calls, %d snapshots left, want 1 and 0", s.Calls[fake.OpSnapshot], s.LiveSnapshots)
	}
}

// StopCommit during the round returns without waiting for it; the round's
// snapshots are deleted when it ends and nothing is recorded.
func TestStopCommitDuringTheRoundRecordsNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	sb := seed(t, o, "s1")
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			once.Do(func() { close(entered); <-release })
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck/c1"})
		done <- err
	}()
	<-entered
	o.StopCommit("c1")
	close(release)
	if err := <-done; !errors.Is(err, owner.ErrCommitStopped) {
		t.Fatalf("stopped commit: %v, want ErrCommitStopped", err)
	}
	if _, err := o.Index().Checkpoint("c1"); !errors.Is(err, snapshotindex.ErrNotFound) {
		t.Errorf("a stopped commit was recorded: %v", err)
	}
	if n := e.fk.Stats().LiveSnapshots; n != 0 {
		t.Errorf("%d snapshots left by the stopped commit", n)
	}
	if got, ok := o.SessionSandbox(context.Background(), "s1"); !ok || got.Handle.SandboxID != sb.Handle.SandboxID {
		t.Errorf("the session's sandbox after the stopped commit: %+v %v", got, ok)
	}
}

// clearFailingStore fails its next n ClearTombstones.
type clearFailingStore struct {
	snapshotindex.Store
	n atomic.Int64
}

func (s *clearFailingStore) ClearTombstones(ids []string) error {
	if s.n.Add(-1) >= 0 {
		return errStore
	}
	return s.Store.ClearTombstones(ids)
}

// A release whose snapshots are deleted but whose tombstones cannot be
// cleared still succeeds: the tombstones stay, the operator is warned, and
// the next release clears them. A release that clears them warns of
// nothing.
func TestReleaseKeepsTombstonesItCouldNotClear(t *testing.T) {
	const warning = "could not clear tombstones"
	e := newEnv(t)
	st := &clearFailingStore{Store: snapshotindex.NewMemory().Open()}
	o := e.open(withStore(st))
	seed(t, o, "s1")
	commit(t, o, "c1")
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	st.n.Store(1)
	if _, err := o.Release(context.Background(), nil); err != nil {
		t.Fatalf("a release whose clear failed: %v", err)
	}
	if n := len(e.fk.SnapshotIDs()); n != 0 {
		t.Fatalf("%d snapshots left", n)
	}
	if ts, _ := st.Tombstones(); len(ts) != 1 || warnings(e.hook, warning) != 1 {
		t.Fatalf("after a failed clear: tombstones %v, %d warnings; want one of each", ts, warnings(e.hook, warning))
	}
	if _, err := o.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if ts, _ := st.Tombstones(); len(ts) != 0 || warnings(e.hook, warning) != 1 {
		t.Fatalf("after the next release: tombstones %v, %d warnings; want none and still one", ts, warnings(e.hook, warning))
	}
}
