package owner_test

import (
	"context"
	"errors"
	"io/fs"
	"path"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/retention"
	"github.com/sandboxowner/owner/snapshotindex"
)

func following(grace time.Duration) cfgOpt {
	return func(c *owner.Config) {
		c.Checkpoint.Retention = owner.RetentionConfig{FollowDirs: true, Grace: grace}
	}
}

func commitDir(t *testing.T, o *owner.Owner, id, dir string) owner.CommitResult {
	t.Helper()
	res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: id, CheckpointDir: dir})
	if err != nil {
		t.Fatalf("commit %s: %v", id, err)
	}
	return res
}

func check(t *testing.T, o *owner.Owner) owner.RetentionResult {
	t.Helper()
	res, err := o.CheckRetention(context.Background())
	if err != nil {
		t.Fatalf("retention check: %v", err)
	}
	return res
}

// snapshotsOf lists the snapshot of every record of the commits, sorted.
func snapshotsOf(t *testing.T, o *owner.Owner, ids ...string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		ck, err := o.Index().Checkpoint(id)
		if err != nil {
			t.Fatalf("checkpoint %s: %v", id, err)
		}
		for _, r := range ck.Records {
			out = append(out, r.SnapshotID)
		}
	}
	return sortedCopy(out)
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// A checkpoint whose directory the controller deleted is dropped once the
// directory was seen gone for the grace, as a release that no longer keeps
// it: its snapshots are deleted, those of the checkpoints whose
// directories exist stay, and the drop is logged and counted.
func TestGoneDirectoryDropsItsCheckpoint(t *testing.T) {
	e := newEnv(t)
	o := e.open(following(time.Minute))
	seed(t, o, "s1")
	seed(t, o, "s2")
	commitDir(t, o, "c1", "/g/c1")
	c1 := snapshotsOf(t, o, "c1")
	appendNote(t, o, "s1", "two")
	commitDir(t, o, "c2", "/g/c2")
	kept := snapshotsOf(t, o, "c2")

	e.ckdirs.RemoveAll("/g/c1")
	if res := check(t, o); len(res.Dropped) != 0 || len(res.Pending) != 1 || res.Pending[0].ID != "c1" {
		t.Fatalf("first sighting: %+v, want c1 pending and nothing dropped", res)
	}
	e.clk.Advance(59 * time.Second)
	if res := check(t, o); len(res.Dropped) != 0 {
		t.Fatalf("before the grace: %+v", res)
	}
	if diff := cmp.Diff(append(c1, kept...), sortedCopy(e.fk.SnapshotIDs())); diff != "" {
		t.Fatalf("snapshots before the grace (-want +got):\n%s", diff)
	}
	e.clk.Advance(time.Second)
	res := check(t, o)
	if diff := cmp.Diff(owner.RetentionResult{Dropped: []string{"c1"}, Deleted: c1}, res, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("at the grace (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(kept, sortedCopy(e.fk.SnapshotIDs())); diff != "" {
		t.Fatalf("snapshots after the drop (-want +got):\n%s", diff)
	}
	if _, err := o.Index().Checkpoint("c1"); err == nil {
		t.Fatal("c1 is still in the index")
	}
	var logged []logrus.Fields
	for _, en := range e.hook.AllEntries() {
		if en.Message == "checkpoint dropped" {
			logged = append(logged, en.Data)
		}
	}
	want := []logrus.Fields{{"server": "notes", "checkpoint_id": "c1", "checkpoint_dir": "/g/c1", "snapshots_deleted": c1, "snapshots_pending": []string(nil)}}
	if diff := cmp.Diff(want, logged); diff != "" {
		t.Errorf("drop log (-want +got):\n%s", diff)
	}
	st := o.RetentionStatus()
	if diff := cmp.Diff(map[string]uint64{owner.DropReleased: 0, owner.DropDirGone: 1}, st.Drops); diff != "" {
		t.Errorf("drops counted (-want +got):\n%s", diff)
	}
	if n, err := o.CheckpointsHeld(); n != 1 || err != nil {
		t.Errorf("checkpoints held: %d %v, want 1", n, err)
	}
	// A release counts under its own reason.
	if _, err := o.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := o.RetentionStatus().Drops; got[owner.DropReleased] != 1 || got[owner.DropDirGone] != 1 {
		t.Errorf("drops after a release: %v", got)
	}
}

// A snapshot that a kept checkpoint also names is not deleted with the
// checkpoint whose directory went; one a live fork stands on is deferred.
func TestGoneDirectoryKeepsWhatOthersNeed(t *testing.T) {
	e := newEnv(t)
	o1 := e.open(following(0))
	seed(t, o1, "s1")
	commitDir(t, o1, "c1", "/g/c1")
	o1.Abandon()
	o := e.open(following(0))
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointDir: "/g/c1"}); err != nil {
		t.Fatal(err)
	}
	c1 := snapshotsOf(t, o, "c1")
	e.ckdirs.RemoveAll("/g/c1")
	check(t, o)
	res := check(t, o)
	if diff := cmp.Diff(owner.RetentionResult{Dropped: []string{"c1"}, Deferred: c1}, res, cmpopts.EquateEmpty()); diff != "" {
		t.Fatalf("drop under a live fork (-want +got):\n%s", diff)
	}
	if n, _ := o.PendingDeletes(); n != 1 {
		t.Fatalf("pending deletes %d, want the fork's snapshot", n)
	}
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if res := check(t, o); !cmp.Equal(c1, res.Deleted) {
		t.Fatalf("after the fork ended: %+v, want %v deleted", res, c1)
	}
}

// faultyDirs answers some paths with an error, the rest from the MemFS.
type faultyDirs struct {
	mem  *records.MemFS
	errs map[string]error
}

func (f faultyDirs) answer(op, name string, real func(string) (fs.FileInfo, error)) (fs.FileInfo, error) {
	if err, ok := f.errs[path.Clean(name)]; ok {
		return nil, &fs.PathError{Op: op, Path: name, Err: err}
	}
	return real(name)
}
func (f faultyDirs) Lstat(name string) (fs.FileInfo, error) {
	return f.answer("lstat", name, f.mem.Lstat)
}
func (f faultyDirs) ReadDir(name string) (fs.FileInfo, error) {
	return f.answer("open", name, f.mem.ReadDir)
}

// An I/O error, a permission error, a stale handle, an unreadable parent
// and a parent that is missing (an unmounted filesystem) never count as
// gone: nothing is dropped or deleted however long they last, each is
// logged once and counted at every check.
func TestUnreadableDirectoriesDeleteNothing(t *testing.T) {
	e := newEnv(t)
	dirs := faultyDirs{mem: e.ckdirs, errs: map[string]error{
		"/g/eio":    syscall.EIO,
		"/g/eacces": syscall.EACCES,
		"/g/estale": syscall.ESTALE,
		"/p":        syscall.EACCES,
	}}
	o := e.open(func(c *owner.Config) {
		c.Checkpoint.Retention = owner.RetentionConfig{FollowDirs: true, Grace: time.Minute, Dirs: dirs}
	})
	seed(t, o, "s1")
	for _, id := range []string{"eio", "eacces", "estale"} {
		commitDir(t, o, id, "/g/"+id)
	}
	commitDir(t, o, "unreadable-parent", "/p/c")
	commitDir(t, o, "unmounted", "/mnt/ck/c")
	for _, dir := range []string{"/g/eio", "/g/eacces", "/g/estale", "/p/c", "/mnt"} {
		e.ckdirs.RemoveAll(dir)
	}
	before := sortedCopy(e.fk.SnapshotIDs())
	// The commits looked too (the faults answer whether or not the
	// directory is there): count the checks' own.
	counted := o.RetentionStatus().UnreadableDirs
	for range 5 {
		if res := check(t, o); len(res.Dropped) != 0 || len(res.Unreadable) != 5 {
			t.Fatalf("check: %+v", res)
		}
		e.clk.Advance(time.Hour)
	}
	if diff := cmp.Diff(before, sortedCopy(e.fk.SnapshotIDs())); diff != "" {
		t.Fatalf("snapshots deleted on errors (-before +after):\n%s", diff)
	}
	if n, _ := o.CheckpointsHeld(); n != 5 {
		t.Fatalf("checkpoints held %d, want 5", n)
	}
	want := map[string]uint64{
		retention.ReasonIO: 5, retention.ReasonPermission: 5, retention.ReasonStale: 5,
		retention.ReasonParentUnreadable: 5, retention.ReasonParentMissing: 5,
		retention.ReasonParentChanged: 0, retention.ReasonOther: 0,
	}
	got := o.RetentionStatus().UnreadableDirs
	for r, n := range counted {
		got[r] -= n
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("unreadable directories counted (-want +got):\n%s", diff)
	}
	if n := warnings(e.hook, "checkpoint directory could not be read"); n != 5 {
		t.Errorf("%d warnings, want one per directory", n)
	}
}

// Every commit checks before its round: the controller deletes a
// directory after publishing the next checkpoint, and two commits later
// (the grace passed) its checkpoint is gone from the index without a
// check of the owner's own. The commit in flight is not in the index yet,
// so it is never judged.
func TestCommitChecksTheDirectories(t *testing.T) {
	e := newEnv(t)
	o := e.open(following(time.Minute))
	seed(t, o, "s1")
	commitDir(t, o, "c1", "/g/c1")
	gone := snapshotsOf(t, o, "c1")[0]
	commitDir(t, o, "c2", "/g/c2")
	e.ckdirs.RemoveAll("/g/c1")
	commitDir(t, o, "c3", "/g/c3")
	e.clk.Advance(time.Minute)
	deleted := make(chan string, 4)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpDeleteSnapshot && c.Phase == fake.PhaseEnd && c.Err == nil {
			deleted <- c.SnapshotID
		}
	})
	defer e.fk.SetHook(nil)
	commitDir(t, o, "c4", "/g/c4")
	// The dropped checkpoint's snapshot is deleted behind the commit.
	select {
	case id := <-deleted:
		if id != gone {
			t.Fatalf("deleted %s, want c1's %s", id, gone)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("c1's snapshot was not deleted after the commit that dropped it")
	}
	var held []string
	metas, err := o.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range metas {
		held = append(held, m.ID)
	}
	if diff := cmp.Diff([]string{"c2", "c3", "c4"}, held); diff != "" {
		t.Fatalf("checkpoints held (-want +got):\n%s", diff)
	}
}

// Without follow_dirs nothing is looked up or dropped.
func TestNotFollowingKeepsEverything(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	commitDir(t, o, "c1", "/g/c1")
	e.ckdirs.RemoveAll("/g/c1")
	for range 3 {
		if res := check(t, o); !cmp.Equal(owner.RetentionResult{}, res) {
			t.Fatalf("check while not following: %+v", res)
		}
		e.clk.Advance(time.Hour)
	}
	if n, _ := o.CheckpointsHeld(); n != 1 {
		t.Fatalf("checkpoints held %d, want 1", n)
	}
}

// A restore from a directory that is gone is refused as an invalid
// checkpoint, even while the index still holds what it named.
func TestRestoreFromAGoneDirectoryIsRefused(t *testing.T) {
	e := newEnv(t)
	o1 := e.open(following(time.Hour))
	seed(t, o1, "s1")
	commitDir(t, o1, "c1", "/g/c1")
	o1.Abandon()
	e.ckdirs.RemoveAll("/g/c1")
	o := e.open(following(time.Hour))
	for _, req := range []owner.RestoreRequest{{CheckpointDir: "/g/c1"}, {CheckpointID: "c1", CheckpointDir: "/g/c1"}} {
		if _, err := o.Restore(context.Background(), req); !errors.Is(err, owner.ErrInvalidRecord) {
			t.Fatalf("restore %+v: %v, want ErrInvalidRecord", req, err)
		}
	}
	if n := e.fk.Stats().LiveSandboxes; n != 0 {
		t.Fatalf("a refused restore forked %d sandboxes", n)
	}
}

// The loop checks on its period and again when a drop falls due: a
// directory deleted at 0 s is seen gone at the 60 s tick and dropped at
// 90 s (the grace after), not at the next tick.
func TestRetentionLoopOnADet(t *testing.T) {
	e := newDetEnv(t, 3)
	mem := records.NewMemFS()
	cfg := e.config("notes", "ret", 2)
	cfg.Checkpoint.Records = mem
	cfg.Checkpoint.Retention = owner.RetentionConfig{FollowDirs: true, Grace: 30 * time.Second, Every: time.Minute}
	o, err := owner.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	start := e.det.Now()
	var deletedAt []time.Duration
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpDeleteSnapshot && c.Phase == fake.PhaseEnd && c.Err == nil {
			deletedAt = append(deletedAt, e.det.Now().Sub(start))
		}
	})
	if _, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/g/c1"}); err != nil {
		t.Fatal(err)
	}
	mem.RemoveAll("/g/c1")
	e.det.Advance(5 * time.Minute)
	if diff := cmp.Diff([]time.Duration{90 * time.Second}, deletedAt); diff != "" {
		t.Fatalf("deleted at (-want +got):\n%s", diff)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
}

// checkpointsFailingStore fails its next n Checkpoints.
type checkpointsFailingStore struct {
	snapshotindex.Store
	n atomic.Int64
}

func (s *checkpointsFailingStore) Checkpoints() ([]snapshotindex.CheckpointMeta, error) {
	if s.n.Add(-1) >= 0 {
		return nil, errStore
	}
	return s.Store.Checkpoints()
}

// A commit whose look at the directories fails (the index unreadable) is
// still committed; the operator is warned, and a commit whose look works
// warns of nothing.
func TestCommitWhoseDirectoryCheckFailsCommits(t *testing.T) {
	const warning = "checking the checkpoint directories failed"
	e := newEnv(t)
	st := &checkpointsFailingStore{Store: snapshotindex.NewMemory().Open()}
	o := e.open(following(time.Minute), withStore(st))
	seed(t, o, "s1")
	commitDir(t, o, "c1", "/g/c1")
	if n := warnings(e.hook, warning); n != 0 {
		t.Fatalf("%d warnings after a clean check, want 0", n)
	}
	st.n.Store(1)
	commitDir(t, o, "c2", "/g/c2")
	if n := warnings(e.hook, warning); n != 1 {
		t.Fatalf("%d warnings after a failed check, want 1", n)
	}
}
