package owner_test

import (
	"context"
	"errors"
	"os"
	"path"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
)

var notesParticipant = records.Participant{Kind: "resources", Instance: "notes"}

// readRecords reads and verifies the records a commit wrote under dir.
func readRecords(t *testing.T, fsys records.FS, dir string) (records.Manifest, []records.Record) {
	t.Helper()
	var out []records.Record
	m, err := records.Read(fsys, dir, notesParticipant, func(line []byte) error {
		r, err := records.ParseRecord(line)
		out = append(out, r)
		return err
	})
	if err != nil {
		t.Fatalf("read the records under %s: %v", dir, err)
	}
	return m, out
}

// A commit writes one record per exported session under checkpoint_dir;
// the server dies with its state_dir, and a fresh one on an empty state_dir
// restores from those records alone, learning the checkpoint into its
// index so that a release accounts for it.
func TestRestoreOnAFreshStateDirFromTheRecords(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	seed(t, o1, "s2")
	appendNote(t, o1, "s1", "one")
	appendNote(t, o1, "s2", "uno")
	ctx := context.Background()
	// An earlier checkpoint, which the controller will drop.
	c0, err := o1.Commit(ctx, owner.CommitRequest{CheckpointID: "c0", CheckpointDir: "/ck/c0", Episodes: map[string]string{"s1": "r1", "s2": "r2-a1"}})
	if err != nil {
		t.Fatal(err)
	}
	_, recs0 := readRecords(t, e.ckdirs, "/ck/c0")
	if c0.Manifest.RecordCount != 2 || len(recs0) != 2 {
		t.Fatalf("c0: %+v", c0.Manifest)
	}
	res, err := o1.Commit(ctx, owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck/c1", Episodes: map[string]string{"s1": "r1", "s2": "r2-a1"}})
	if err != nil {
		t.Fatal(err)
	}
	m, recs := readRecords(t, e.ckdirs, "/ck/c1")
	if diff := cmp.Diff(m, res.Manifest); diff != "" {
		t.Fatalf("the commit's manifest is not the file's (-file +commit):\n%s", diff)
	}
	ck, err := o1.Index().Checkpoint("c1")
	if err != nil {
		t.Fatal(err)
	}
	var got, want []string
	for _, r := range recs {
		got = append(got, strings.Join([]string{r.SessionID, r.EpisodeID.RolloutID, string(rune('0' + r.EpisodeID.Attempt)), r.State.Sandbox.SnapshotID, r.State.Sandbox.Descriptor.SandboxID, r.State.Workdir, string(r.State.Data)}, " "))
	}
	for _, r := range ck.Records {
		ep := records.EpisodeOf(r.Episode)
		want = append(want, strings.Join([]string{r.SessionID, ep.RolloutID, string(rune('0' + ep.Attempt)), r.SnapshotID, r.Sandbox.SandboxID, r.Workdir, string(r.Data)}, " "))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("records (-index +file):\n%s", diff)
	}
	appendNote(t, o1, "s1", "drift")
	o1.Abandon()

	// The machine is gone with its state_dir.
	if err := os.RemoveAll(e.dir); err != nil {
		t.Fatal(err)
	}
	e.dir = t.TempDir()
	o2 := e.open()
	if _, err := o2.Index().Checkpoint("c1"); !errors.Is(err, snapshotindex.ErrNotFound) {
		t.Fatalf("the fresh index knows c1 before the restore: %v", err)
	}
	rr, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointDir: "/ck/c1", Episodes: []string{"r1", "r2-a1"}})
	if err != nil {
		t.Fatal(err)
	}
	if rr.CheckpointID != "c1" || len(rr.Sessions) != 2 {
		t.Fatalf("restore: %+v", rr)
	}
	if diff := cmp.Diff([]string{"one"}, notes(t, o2, "s1")); diff != "" {
		t.Fatalf("restored notes (-want +got):\n%s", diff)
	}
	if got := string(o2.SessionData(ctx, "s2")); got != `{"seed_token":"tok-s2"}` {
		t.Fatalf("restored data %s", got)
	}
	again, err := o2.Index().Checkpoint("c1")
	if err != nil || len(again.Records) != 2 || again.Meta.CheckpointDir != "/ck/c1" {
		t.Fatalf("the index did not learn c1 from its records: %+v %v", again.Meta, err)
	}
	exists := func(rs []records.Record) []bool {
		var out []bool
		for _, r := range rs {
			_, ok := e.fk.SnapshotInfo(r.State.Sandbox.SnapshotID)
			out = append(out, ok)
		}
		return out
	}
	// While the controller keeps c0, which this index never saw, nothing
	// of the earlier run is deleted: its snapshots cannot be told apart.
	rel, err := o2.Release(ctx, []string{"c0", "c1"})
	if err != nil || len(rel.Deleted) != 0 || len(rel.Dropped) != 0 {
		t.Fatalf("release keeping c0 and c1: %+v %v", rel, err)
	}
	if diff := cmp.Diff([]bool{true, true}, exists(recs0)); diff != "" {
		t.Fatalf("c0's snapshots while kept (-want +got):\n%s", diff)
	}
	// Once only c1 is kept, what the earlier run left goes (found by its
	// labels) and c1's snapshots stay.
	rel, err = o2.Release(ctx, []string{"c1"})
	if err != nil || len(rel.Deleted) != 2 || len(rel.Dropped) != 0 {
		t.Fatalf("release keeping c1: %+v %v", rel, err)
	}
	if diff := cmp.Diff([]bool{false, false}, exists(recs0)); diff != "" {
		t.Fatalf("c0's snapshots once dropped (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]bool{true, true}, exists(recs)); diff != "" {
		t.Fatalf("c1's snapshots (-want +got):\n%s", diff)
	}
}

// failingFS fails the first n links (the manifest's publication).
type failingFS struct {
	*records.MemFS
	n int
}

func (f *failingFS) Link(from, to string) error {
	if f.n > 0 {
		f.n--
		return errors.New("disk full")
	}
	return f.MemFS.Link(from, to)
}

// A commit whose records cannot be written fails, keeps its snapshots in
// the index, and its retry writes the records as they were cut without
// snapshotting again.
func TestCommitRetryWritesTheRecordsAFailedWriteLost(t *testing.T) {
	e := newEnv(t)
	ffs := &failingFS{MemFS: records.NewMemFS(), n: 1}
	o := e.open(func(c *owner.Config) { c.Checkpoint.Records = ffs })
	seed(t, o, "s1")
	ctx := context.Background()
	req := owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck", Episodes: map[string]string{"s1": "r1"}}
	_, err := o.Commit(ctx, req)
	if !errors.Is(err, records.ErrInvalidState) || !errors.Is(err, owner.ErrCommitFailed) {
		t.Fatalf("commit with a failing disk: %v", err)
	}
	if _, err := records.Read(ffs, "/ck", notesParticipant, func([]byte) error { return nil }); !errors.Is(err, records.ErrNoManifest) {
		t.Fatalf("a manifest was published: %v", err)
	}
	snaps := e.fk.Stats().Calls[fake.OpSnapshot]
	appendNote(t, o, "s1", "after")
	res, err := o.Commit(ctx, req)
	if err != nil || !res.Existing {
		t.Fatalf("retry: %+v %v", res, err)
	}
	if n := e.fk.Stats().Calls[fake.OpSnapshot]; n != snaps {
		t.Fatalf("the retry snapshotted again (%d snapshot calls, was %d)", n, snaps)
	}
	m, recs := readRecords(t, ffs, "/ck")
	if m != res.Manifest || len(recs) != 1 || recs[0].SessionID != "s1" {
		t.Fatalf("retry wrote %+v %+v, replied %+v", m, recs, res.Manifest)
	}
	// A third try finds the same manifest.
	if res2, err := o.Commit(ctx, req); err != nil || res2.Manifest != m {
		t.Fatalf("second retry: %+v %v", res2, err)
	}
}

// A directory that holds another commit of this server is not written
// over.
func TestCommitIntoADirectoryHoldingAnotherCommitIsRefused(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	ctx := context.Background()
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck"}); err != nil {
		t.Fatal(err)
	}
	before := e.ckdirs.Files()
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c2", CheckpointDir: "/ck"}); !errors.Is(err, records.ErrInvalidState) {
		t.Fatalf("commit c2 into c1's directory: %v", err)
	}
	if diff := cmp.Diff(before, e.ckdirs.Files()); diff != "" {
		t.Fatalf("files changed (-before +after):\n%s", diff)
	}
}

// Records that do not verify, or that name another checkpoint than the
// one asked for, are refused before anything is forked.
func TestRestoreRefusesRecordsThatDoNotVerifyBeforeForking(t *testing.T) {
	e := newEnv(t)
	o1 := e.open()
	seed(t, o1, "s1")
	ctx := context.Background()
	res, err := o1.Commit(ctx, owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck", Episodes: map[string]string{"s1": "r1"}})
	if err != nil {
		t.Fatal(err)
	}
	o1.Abandon()
	e.dir = t.TempDir()
	o2 := e.open()
	if _, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointID: "c9", CheckpointDir: "/ck"}); !errors.Is(err, owner.ErrInvalidRecord) || !strings.Contains(err.Error(), `holds checkpoint "c1", not "c9"`) {
		t.Fatalf("restore of c9 from c1's directory: %v", err)
	}
	name := path.Join("/ck/gym/resources/notes", res.Manifest.RecordsFile)
	f, err := e.ckdirs.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 1<<16)
	n, _ := f.Read(b)
	f.Close()
	if err := e.ckdirs.WriteFile(name, []byte(strings.Replace(string(b[:n]), `"snapshot_id": "`, `"snapshot_id": "x`, 1))); err != nil {
		t.Fatal(err)
	}
	if _, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointDir: "/ck"}); !errors.Is(err, owner.ErrInvalidRecord) || !strings.Contains(err.Error(), "digest") {
		t.Fatalf("restore of tampered records: %v", err)
	}
	if got := e.fk.Stats().Calls[fake.OpFork]; got != 0 {
		t.Fatalf("refused restores forked %d times", got)
	}
	if _, err := o2.Index().Checkpoint("c1"); !errors.Is(err, snapshotindex.ErrNotFound) {
		t.Fatalf("a refused restore taught the index: %v", err)
	}
}

// A server that cannot checkpoint its sessions still answers a commit with
// its (empty) records, as Gym's participants do.
func TestRestartOnlyCommitWritesNoRecords(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Provider = fake.NewWithoutSnapshots(fake.Options{}) })
	res, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck"})
	if err != nil || res.Mode != owner.ModeRestartOnly {
		t.Fatalf("commit: %+v %v", res, err)
	}
	m, recs := readRecords(t, e.ckdirs, "/ck")
	if len(recs) != 0 || m != res.Manifest || m.RecordCount != 0 {
		t.Fatalf("manifest %+v, records %v, replied %+v", m, recs, res.Manifest)
	}
}

// A name that cannot be a directory is refused at start.
func TestUnsafeNameIsRefusedWithCheckpointing(t *testing.T) {
	e := newEnv(t)
	_, err := owner.New(context.Background(), e.config(func(c *owner.Config) { c.Name = "../notes" }))
	if !errors.Is(err, owner.ErrConfig) {
		t.Fatalf("owner.New with name ../notes: %v", err)
	}
}

// Once a resume stopped a commit's writer, a retry publishes no records.
func TestNoRecordsArePublishedAfterStopCommit(t *testing.T) {
	e := newEnv(t)
	ffs := &failingFS{MemFS: records.NewMemFS(), n: 1}
	o := e.open(func(c *owner.Config) { c.Checkpoint.Records = ffs })
	seed(t, o, "s1")
	ctx := context.Background()
	req := owner.CommitRequest{CheckpointID: "c1", CheckpointDir: "/ck"}
	if _, err := o.Commit(ctx, req); !errors.Is(err, records.ErrInvalidState) {
		t.Fatalf("commit with a failing disk: %v", err)
	}
	o.StopCommit("c1")
	if _, err := o.Commit(ctx, req); !errors.Is(err, owner.ErrCommitStopped) {
		t.Fatalf("retry after the stop: %v", err)
	}
	if _, err := records.Read(ffs, "/ck", notesParticipant, func([]byte) error { return nil }); !errors.Is(err, records.ErrNoManifest) {
		t.Fatalf("a manifest was published after the stop: %v", err)
	}
}
