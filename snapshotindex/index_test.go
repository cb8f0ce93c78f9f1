package snapshotindex

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/internal/flock/flocktest"
	"github.com/sandboxowner/owner/provider"
)

// --- helpers ---------------------------------------------------------------

func openAt(t testing.TB, dir string) *Index {
	t.Helper()
	x, err := Open(dir, Options{})
	if err != nil {
		t.Fatalf("Open(%s): %v", dir, err)
	}
	t.Cleanup(func() { _ = x.Close() })
	return x
}

func openMem(t testing.TB, m *Memory) *MemIndex {
	t.Helper()
	x := m.Open()
	t.Cleanup(func() { _ = x.Close() })
	return x
}

// backend is an implementation of Store under the contract tests.
type backend struct {
	name string
	// open returns a fresh store, closed when the test ends, and reopen,
	// which opens another over the same durable contents: after closing
	// the first, that is a restart.
	open func(t testing.TB) (x Store, reopen func() Store)
}

func backends() []backend {
	return []backend{
		{"badger", func(t testing.TB) (Store, func() Store) {
			dir := t.TempDir()
			return openAt(t, dir), func() Store { return openAt(t, dir) }
		}},
		{"memory", func(t testing.TB) (Store, func() Store) {
			m := NewMemory()
			return openMem(t, m), func() Store { return openMem(t, m) }
		}},
	}
}

// forEach runs a contract test against a fresh store of every backend.
func forEach(t *testing.T, test func(t *testing.T, x Store, reopen func() Store)) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			x, reopen := b.open(t)
			test(t, x, reopen)
		})
	}
}

// engineOf returns the engine under x, for raw access to its keys.
func engineOf(t testing.TB, x Store) *engine {
	t.Helper()
	switch x := x.(type) {
	case *Index:
		return &x.engine
	case *MemIndex:
		return &x.engine
	}
	t.Fatalf("no engine in %T", x)
	return nil
}

// testRecord is a realistic record whose session data pads it to about
// size bytes of JSON.
func testRecord(session, snapshot string, size int) Record {
	desc, _ := json.Marshal(map[string]string{"sandbox_id": "sb-" + session})
	pad := max(size-600, 0)
	data, _ := json.Marshal(map[string]any{"notes": strings.Repeat("x", pad), "turn": 3.0})
	return Record{
		SessionID:  session,
		Episode:    "ep-" + session,
		Provider:   "fake",
		Sandbox:    provider.Handle{SandboxID: "sb-" + session, Provider: "fake", Descriptor: desc},
		SnapshotID: snapshot,
		Spec: provider.Spec{
			Image:           "python:3.12",
			Workdir:         "/work",
			Env:             map[string]string{"LANG": "C.UTF-8", "SESSION": session},
			Metadata:        map[string]string{"owner": "test", "session": session},
			TTLSeconds:      600,
			Resources:       &provider.Resources{CPU: 1, MemoryMiB: 512},
			Ports:           []int{8080},
			ProviderOptions: map[string]any{"pool": "default", "weight": 1.5},
		},
		Workdir: "/work/repo",
		Data:    data,
		// A non-UTC zone: the index stores UTC, and cmp compares instants.
		SnapshotAt: time.Date(2025, 6, 1, 12, 0, 0, 123456789, time.FixedZone("CEST", 2*3600)),
	}
}

// testRecords returns n records of about size bytes, snapshot ids tagged.
func testRecords(n, size int, tag string) []Record {
	recs := make([]Record, n)
	for i := range recs {
		recs[i] = testRecord(fmt.Sprintf("sess-%05d", i), fmt.Sprintf("snap-%s-%05d", tag, i), size)
	}
	return recs
}

func sortedBySession(recs []Record) []Record {
	out := slices.Clone(recs)
	slices.SortFunc(out, func(a, b Record) int { return strings.Compare(a.SessionID, b.SessionID) })
	return out
}

// canonicalHash recomputes RecordsSHA256 independently of the stored meta.
func canonicalHash(t testing.TB, recs []Record) string {
	t.Helper()
	enc, err := encodeRecords(recs)
	if err != nil {
		t.Fatal(err)
	}
	return hashValues(len(enc), func(i int) []byte { return enc[i].value })
}

// rawSet writes a value under a key directly, bypassing every check: the way
// to plant corrupt data.
func rawSet(t testing.TB, x Store, key string, val []byte) {
	t.Helper()
	if err := engineOf(t, x).update(func(txn kvTxn) error { return txn.set([]byte(key), val) }); err != nil {
		t.Fatal(err)
	}
}

func rawDelete(t testing.TB, x Store, key string) {
	t.Helper()
	if err := engineOf(t, x).update(func(txn kvTxn) error { return txn.delete([]byte(key)) }); err != nil {
		t.Fatal(err)
	}
}

func mustCommit(t testing.TB, x Store, meta CheckpointMeta, recs []Record, clear ...IntentKey) CheckpointMeta {
	t.Helper()
	got, err := x.Commit(meta, recs, clear...)
	if err != nil {
		t.Fatalf("Commit(%s): %v", meta.ID, err)
	}
	return got
}

func mustCheckpoint(t testing.TB, x Store, id string) Checkpoint {
	t.Helper()
	c, err := x.Checkpoint(id)
	if err != nil {
		t.Fatalf("Checkpoint(%s): %v", id, err)
	}
	return c
}

func ids(metas []CheckpointMeta) []string {
	out := make([]string, len(metas))
	for i, m := range metas {
		out[i] = m.ID
	}
	return out
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error = %v, want %v", err, target)
	}
}

func wantCorrupt(t testing.TB, err error, key string) {
	t.Helper()
	var ce *CorruptError
	if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
		t.Fatalf("error = %v, want a *CorruptError", err)
	}
	if ce.Key != key {
		t.Fatalf("CorruptError.Key = %q, want %q (%v)", ce.Key, key, err)
	}
	if !strings.Contains(err.Error(), key) {
		t.Fatalf("error %q does not name key %q", err, key)
	}
}

// --- tests -----------------------------------------------------------------

func TestRoundTrip(t *testing.T) { forEach(t, testRoundTrip) }

func testRoundTrip(t *testing.T, x Store, _ func() Store) {
	// Unsorted input, and ids with the characters the key escaping handles.
	recs := []Record{
		testRecord("zeta", "snap/3", 900),
		testRecord("alpha%2F/x", "snap-1", 700),
		testRecord("mid", "snap-2", 2000),
	}
	recs[1].Data = nil // no session data: stays nil
	in := CheckpointMeta{
		ID:            "ckpt/1",
		CommittedAt:   time.Date(2025, 6, 1, 12, 0, 1, 0, time.FixedZone("X", -5*3600)),
		CheckpointDir: "/ckpt/dir-1",
		Scope:         []string{"zeta", "mid"},
	}
	got := mustCommit(t, x, in, recs)

	want := in
	want.RecordCount, want.Seq, want.RecordsSHA256 = 3, 1, canonicalHash(t, recs)
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Commit meta (-want +got):\n%s", d)
	}
	c := mustCheckpoint(t, x, "ckpt/1")
	if d := cmp.Diff(Checkpoint{Meta: want, Records: sortedBySession(recs)}, c); d != "" {
		t.Fatalf("Checkpoint (-want +got):\n%s", d)
	}
	if c.Records[0].Data != nil {
		t.Errorf("record without data came back with %q", c.Records[0].Data)
	}

	metas, err := x.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]CheckpointMeta{want}, metas); d != "" {
		t.Fatalf("Checkpoints (-want +got):\n%s", d)
	}
	if _, err := x.Checkpoint("ckpt"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Checkpoint(prefix of an id) = %v, want ErrNotFound", err)
	}
}

func TestCommitEmptyAndLatestAndFindByDir(t *testing.T) {
	forEach(t, testCommitEmptyAndLatestAndFindByDir)
}

func testCommitEmptyAndLatestAndFindByDir(t *testing.T, x Store, _ func() Store) {
	if _, ok, err := x.Latest(); ok || err != nil {
		t.Fatalf("Latest on empty index = %v, %v", ok, err)
	}
	a := mustCommit(t, x, CheckpointMeta{ID: "a", CheckpointDir: "/d1"}, nil)
	if a.CommittedAt.IsZero() || a.RecordCount != 0 {
		t.Fatalf("empty commit meta = %+v", a)
	}
	mustCommit(t, x, CheckpointMeta{ID: "b", CheckpointDir: "/d2"}, testRecords(2, 800, "b"))
	c := mustCommit(t, x, CheckpointMeta{ID: "c", CheckpointDir: "/d1"}, testRecords(1, 800, "c"))

	latest, ok, err := x.Latest()
	if err != nil || !ok || latest.ID != "c" || latest.Seq != 3 {
		t.Fatalf("Latest = %+v, %v, %v", latest, ok, err)
	}
	got, ok, err := x.FindByDir("/d1")
	if err != nil || !ok || got.ID != c.ID {
		t.Fatalf("FindByDir(/d1) = %+v, %v, %v; want c", got, ok, err)
	}
	if _, ok, _ := x.FindByDir("/nope"); ok {
		t.Fatal("FindByDir(/nope) found something")
	}
	if err := x.Drop([]string{"c"}, nil); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := x.FindByDir("/d1"); got.ID != "a" {
		t.Fatalf("FindByDir(/d1) after dropping c = %q, want a", got.ID)
	}
	// The seq never goes back, even though the newest checkpoint is gone.
	if d := mustCommit(t, x, CheckpointMeta{ID: "d"}, nil); d.Seq != 4 {
		t.Fatalf("seq after drop = %d, want 4", d.Seq)
	}
	metas, _ := x.Checkpoints()
	if d := cmp.Diff([]string{"a", "b", "d"}, ids(metas)); d != "" {
		t.Fatalf("Checkpoints order (-want +got):\n%s", d)
	}
}

func TestReopenPersists(t *testing.T) { forEach(t, testReopenPersists) }

func testReopenPersists(t *testing.T, x Store, reopen func() Store) {
	recs := testRecords(50, 1500, "r")
	meta := mustCommit(t, x, CheckpointMeta{ID: "r1", Scope: []string{"sess-00001"}}, recs)
	if err := x.AddTombstones([]Tombstone{{SnapshotID: "old", Provider: "fake", Reason: "failed commit"}}); err != nil {
		t.Fatal(err)
	}
	if err := x.PutIntent(Intent{Kind: "commit", ID: "r2", Body: json.RawMessage(`{"snapshots":["s1"]}`)}); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}

	y := reopen()
	c := mustCheckpoint(t, y, "r1")
	if d := cmp.Diff(Checkpoint{Meta: meta, Records: sortedBySession(recs)}, c); d != "" {
		t.Fatalf("after reopen (-want +got):\n%s", d)
	}
	if ts, _ := y.Tombstones(); len(ts) != 1 || ts[0].SnapshotID != "old" {
		t.Fatalf("tombstones after reopen = %+v", ts)
	}
	if ins, _ := y.Intents("commit"); len(ins) != 1 || string(ins[0].Body) != `{"snapshots":["s1"]}` {
		t.Fatalf("intents after reopen = %+v", ins)
	}
	if m := mustCommit(t, y, CheckpointMeta{ID: "r2"}, nil); m.Seq != 2 {
		t.Fatalf("seq after reopen = %d, want 2", m.Seq)
	}
}

func TestIdempotentRecommit(t *testing.T) { forEach(t, testIdempotentRecommit) }

func testIdempotentRecommit(t *testing.T, x Store, _ func() Store) {
	recs := testRecords(20, 1000, "i")
	first := mustCommit(t, x, CheckpointMeta{ID: "i1", CheckpointDir: "/d", Scope: []string{"a"}}, recs)

	// Same content in another order, a later time and with an intent to
	// clear: nothing changes but the intent.
	if err := x.PutIntent(Intent{Kind: "commit", ID: "i1"}); err != nil {
		t.Fatal(err)
	}
	rev := slices.Clone(recs)
	slices.Reverse(rev)
	again, err := x.Commit(CheckpointMeta{ID: "i1", CheckpointDir: "/d", Scope: []string{"a"},
		CommittedAt: first.CommittedAt.Add(time.Hour)}, rev, IntentKey{"commit", "i1"})
	if err != nil {
		t.Fatalf("re-commit: %v", err)
	}
	if d := cmp.Diff(first, again); d != "" {
		t.Fatalf("re-commit returned (-first +again):\n%s", d)
	}
	if ins, _ := x.Intents(""); len(ins) != 0 {
		t.Fatalf("re-commit left intents %+v", ins)
	}
	if m := mustCommit(t, x, CheckpointMeta{ID: "i2"}, nil); m.Seq != 2 {
		t.Fatalf("re-commit consumed a seq: next = %d, want 2", m.Seq)
	}
}

func TestConflict(t *testing.T) { forEach(t, testConflict) }

func testConflict(t *testing.T, x Store, _ func() Store) {
	recs := testRecords(3, 800, "c")
	stored := mustCommit(t, x, CheckpointMeta{ID: "c1", CheckpointDir: "/d", Scope: []string{"s"}}, recs)

	changed := slices.Clone(recs)
	changed[1].Workdir = "/elsewhere"
	for name, tc := range map[string]struct {
		meta CheckpointMeta
		recs []Record
		// differ are what the error says differs, of records, scope and
		// checkpoint_dir.
		differ []string
	}{
		"records": {CheckpointMeta{ID: "c1", CheckpointDir: "/d", Scope: []string{"s"}}, changed, []string{"records"}},
		"fewer":   {CheckpointMeta{ID: "c1", CheckpointDir: "/d", Scope: []string{"s"}}, recs[:2], []string{"records"}},
		"scope":   {CheckpointMeta{ID: "c1", CheckpointDir: "/d", Scope: []string{"t"}}, recs, []string{"scope"}},
		"dir":     {CheckpointMeta{ID: "c1", CheckpointDir: "/e", Scope: []string{"s"}}, recs, []string{"checkpoint_dir"}},
		"all":     {CheckpointMeta{ID: "c1", CheckpointDir: "/e", Scope: []string{"t"}}, changed, []string{"records", "scope", "checkpoint_dir"}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := x.Commit(tc.meta, tc.recs)
			wantErr(t, err, ErrConflict)
			var ce *ConflictError
			if !errors.As(err, &ce) || ce.CheckpointID != "c1" || ce.Stored.Seq != stored.Seq {
				t.Fatalf("error = %#v, want *ConflictError for c1", err)
			}
			if !strings.Contains(err.Error(), `"c1"`) {
				t.Fatalf("error %q does not name the checkpoint", err)
			}
			var said []string
			for _, what := range []string{"records", "scope", "checkpoint_dir"} {
				if strings.Contains(err.Error(), what+" ") {
					said = append(said, what)
				}
			}
			if d := cmp.Diff(tc.differ, said); d != "" {
				t.Errorf("error %q says the wrong things differ (-want +got):\n%s", err, d)
			}
		})
	}
	if d := cmp.Diff(Checkpoint{Meta: stored, Records: sortedBySession(recs)}, mustCheckpoint(t, x, "c1")); d != "" {
		t.Fatalf("conflicting commits changed the checkpoint (-want +got):\n%s", d)
	}
}

func TestCommitValidation(t *testing.T) { forEach(t, testCommitValidation) }

func testCommitValidation(t *testing.T, x Store, _ func() Store) {
	good := testRecords(2, 700, "v")
	with := func(f func(r *Record)) []Record {
		rs := slices.Clone(good)
		f(&rs[1])
		return rs
	}
	for name, tc := range map[string]struct {
		meta CheckpointMeta
		recs []Record
		keys []IntentKey
	}{
		"empty id":         {CheckpointMeta{}, good, nil},
		"empty session":    {CheckpointMeta{ID: "v"}, with(func(r *Record) { r.SessionID = "" }), nil},
		"empty snapshot":   {CheckpointMeta{ID: "v"}, with(func(r *Record) { r.SnapshotID = "" }), nil},
		"empty provider":   {CheckpointMeta{ID: "v"}, with(func(r *Record) { r.Provider = "" }), nil},
		"duplicate":        {CheckpointMeta{ID: "v"}, with(func(r *Record) { r.SessionID = good[0].SessionID }), nil},
		"bad data json":    {CheckpointMeta{ID: "v"}, with(func(r *Record) { r.Data = json.RawMessage(`{`) }), nil},
		"wrong hash":       {CheckpointMeta{ID: "v", RecordsSHA256: "00"}, good, nil},
		"wrong count":      {CheckpointMeta{ID: "v", RecordCount: 5}, good, nil},
		"empty intent key": {CheckpointMeta{ID: "v"}, good, []IntentKey{{Kind: "commit"}}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := x.Commit(tc.meta, tc.recs, tc.keys...)
			wantErr(t, err, ErrInvalid)
		})
	}
	if metas, _ := x.Checkpoints(); len(metas) != 0 {
		t.Fatalf("invalid commits stored %v", ids(metas))
	}
	// The caller's slice is left as it was.
	in := []Record{good[1], good[0]}
	mustCommit(t, x, CheckpointMeta{ID: "ok", RecordsSHA256: canonicalHash(t, good), RecordCount: 2}, in)
	if in[0].SessionID != good[1].SessionID {
		t.Fatal("Commit reordered the caller's records")
	}
}

func TestSnapshotRefs(t *testing.T) { forEach(t, testSnapshotRefs) }

func testSnapshotRefs(t *testing.T, x Store, _ func() Store) {
	a := []Record{testRecord("s1", "snap", 500), testRecord("s2", "snap2", 500)}
	b := []Record{testRecord("s1", "snap", 500), testRecord("s3", "snap/x", 500)}
	mustCommit(t, x, CheckpointMeta{ID: "b"}, b)
	mustCommit(t, x, CheckpointMeta{ID: "a"}, a)

	for snap, want := range map[string][]string{
		"snap": {"a", "b"}, "snap2": {"a"}, "snap/x": {"b"}, "sna": nil, "none": nil,
	} {
		got, err := x.SnapshotRefs(snap)
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("SnapshotRefs(%q) (-want +got):\n%s", snap, d)
		}
	}
	all, err := x.ReferencedSnapshots()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{"snap": {"a", "b"}, "snap2": {"a"}, "snap/x": {"b"}}
	if d := cmp.Diff(want, all); d != "" {
		t.Fatalf("ReferencedSnapshots (-want +got):\n%s", d)
	}
}

func TestDrop(t *testing.T) { forEach(t, testDrop) }

func testDrop(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "a"}, []Record{testRecord("s1", "shared", 900), testRecord("s2", "only-a", 900)})
	mustCommit(t, x, CheckpointMeta{ID: "b"}, []Record{testRecord("s1", "shared", 900), testRecord("s3", "only-b", 900)})

	// One transaction: a tombstone for a snapshot that b still names fails
	// the whole drop, and a stays.
	err := x.Drop([]string{"a"}, []Tombstone{{SnapshotID: "only-a"}, {SnapshotID: "shared"}})
	wantErr(t, err, ErrInvalid)
	if !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("error %q does not name the checkpoint still using the snapshot", err)
	}
	mustCheckpoint(t, x, "a")
	if refs, _ := x.SnapshotRefs("only-a"); len(refs) != 1 {
		t.Fatalf("failed drop removed refs: %v", refs)
	}
	if ts, _ := x.Tombstones(); len(ts) != 0 {
		t.Fatalf("failed drop wrote tombstones %+v", ts)
	}

	ts := []Tombstone{{SnapshotID: "only-a", Provider: "fake", Reason: "released"}}
	for range 2 { // idempotent, and missing ids are ignored
		if err := x.Drop([]string{"a", "never-there"}, ts); err != nil {
			t.Fatalf("Drop: %v", err)
		}
	}
	if _, err := x.Checkpoint("a"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Checkpoint(a) after drop = %v, want ErrNotFound", err)
	}
	all, _ := x.ReferencedSnapshots()
	if d := cmp.Diff(map[string][]string{"shared": {"b"}, "only-b": {"b"}}, all); d != "" {
		t.Fatalf("refs after drop (-want +got):\n%s", d)
	}
	got, _ := x.Tombstones()
	if d := cmp.Diff([]string{"only-a"}, tombIDs(got)); d != "" {
		t.Fatalf("tombstones after drop (-want +got):\n%s", d)
	}
	// Dropping the last user of a snapshot lets it be tombstoned in the
	// same transaction.
	if err := x.Drop([]string{"b"}, []Tombstone{{SnapshotID: "shared"}, {SnapshotID: "only-b"}}); err != nil {
		t.Fatal(err)
	}
	if all, _ := x.ReferencedSnapshots(); len(all) != 0 {
		t.Fatalf("refs after dropping everything: %v", all)
	}
	if metas, _ := x.Checkpoints(); len(metas) != 0 {
		t.Fatalf("checkpoints after dropping everything: %v", ids(metas))
	}
}

func tombIDs(ts []Tombstone) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.SnapshotID
	}
	return out
}

func TestTombstones(t *testing.T) { forEach(t, testTombstones) }

func testTombstones(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "k"}, []Record{testRecord("s1", "kept", 500)})
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := x.PutIntent(Intent{Kind: "commit", ID: "failed"}); err != nil {
		t.Fatal(err)
	}
	in := []Tombstone{
		{SnapshotID: "z/1", Provider: "fake", Reason: "failed commit", At: at},
		{SnapshotID: "a-1", Provider: "fake", Reason: "failed commit"},
	}
	if err := x.AddTombstones(in, IntentKey{"commit", "failed"}); err != nil {
		t.Fatal(err)
	}
	got, err := x.Tombstones()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"a-1", "z/1"}, tombIDs(got)); d != "" {
		t.Fatalf("Tombstones order (-want +got):\n%s", d)
	}
	if !got[1].At.Equal(at) || got[0].At.IsZero() {
		t.Fatalf("tombstone times = %v, %v", got[0].At, got[1].At)
	}
	if ins, _ := x.Intents(""); len(ins) != 0 {
		t.Fatalf("AddTombstones left intents %+v", ins)
	}

	// The index never names a doomed snapshot, nor dooms a named one.
	_, err = x.Commit(CheckpointMeta{ID: "n"}, []Record{testRecord("s1", "a-1", 500)})
	wantErr(t, err, ErrInvalid)
	wantErr(t, x.AddTombstones([]Tombstone{{SnapshotID: "kept"}}), ErrInvalid)
	wantErr(t, x.AddTombstones([]Tombstone{{SnapshotID: ""}}), ErrInvalid)

	// An absent id first: the ones after it are cleared too.
	if err := x.ClearTombstones([]string{"missing", "a-1"}); err != nil {
		t.Fatal(err)
	}
	got, _ = x.Tombstones()
	if d := cmp.Diff([]string{"z/1"}, tombIDs(got)); d != "" {
		t.Fatalf("after clear (-want +got):\n%s", d)
	}
	mustCommit(t, x, CheckpointMeta{ID: "n"}, []Record{testRecord("s1", "a-1", 500)})
}

func TestIntents(t *testing.T) { forEach(t, testIntents) }

func testIntents(t *testing.T, x Store, _ func() Store) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, in := range []Intent{
		{Kind: "commit", ID: "c2", Body: json.RawMessage(`{"snapshots":["a","b"]}`), At: at},
		{Kind: "commit", ID: "c1", At: at},
		{Kind: "commit2", ID: "x", At: at},
		{Kind: "release", ID: "r/1", At: at},
	} {
		if err := x.PutIntent(in); err != nil {
			t.Fatal(err)
		}
	}
	keys := func(ins []Intent) []IntentKey {
		out := make([]IntentKey, len(ins))
		for i, in := range ins {
			out[i] = IntentKey{in.Kind, in.ID}
		}
		return out
	}
	all, err := x.Intents("")
	if err != nil {
		t.Fatal(err)
	}
	want := []IntentKey{{"commit", "c1"}, {"commit", "c2"}, {"commit2", "x"}, {"release", "r/1"}}
	if d := cmp.Diff(want, keys(all)); d != "" {
		t.Fatalf("Intents(\"\") (-want +got):\n%s", d)
	}
	if string(all[1].Body) != `{"snapshots":["a","b"]}` || !all[1].At.Equal(at) {
		t.Fatalf("intent c2 = %+v", all[1])
	}
	commits, _ := x.Intents("commit")
	if d := cmp.Diff(want[:2], keys(commits)); d != "" {
		t.Fatalf("Intents(commit) (-want +got):\n%s", d)
	}

	// A commit clears every intent it names, an absent one among them.
	mustCommit(t, x, CheckpointMeta{ID: "c1"}, nil, IntentKey{"commit", "never"}, IntentKey{"commit", "c1"}, IntentKey{"commit2", "x"})
	if err := x.DeleteIntent(IntentKey{"release", "r/1"}); err != nil {
		t.Fatal(err)
	}
	if err := x.DeleteIntent(IntentKey{"release", "never"}); err != nil {
		t.Fatal(err)
	}
	all, _ = x.Intents("")
	if d := cmp.Diff(want[1:2], keys(all)); d != "" {
		t.Fatalf("after deletes (-want +got):\n%s", d)
	}
	wantErr(t, x.PutIntent(Intent{Kind: "commit"}), ErrInvalid)
	wantErr(t, x.PutIntent(Intent{Kind: "commit", ID: "bad", Body: json.RawMessage(`nope`)}), ErrInvalid)
}

func TestSchemaVersion(t *testing.T) {
	for name, tc := range map[string]struct {
		plant func(t *testing.T, x *Index)
		check func(t *testing.T, err error)
	}{
		"other version": {
			func(t *testing.T, x *Index) { rawSet(t, x, keySchema, []byte("2")) },
			func(t *testing.T, err error) { wantErr(t, err, ErrSchemaVersion) },
		},
		"no version but data": {
			func(t *testing.T, x *Index) {
				mustCommit(t, x, CheckpointMeta{ID: "a"}, nil)
				rawDelete(t, x, keySchema)
			},
			func(t *testing.T, err error) { wantErr(t, err, ErrSchemaVersion) },
		},
		"garbage version": {
			func(t *testing.T, x *Index) { rawSet(t, x, keySchema, []byte("one")) },
			func(t *testing.T, err error) { wantCorrupt(t, err, keySchema) },
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			x, err := Open(dir, Options{})
			if err != nil {
				t.Fatal(err)
			}
			tc.plant(t, x)
			if err := x.Close(); err != nil {
				t.Fatal(err)
			}
			y, err := Open(dir, Options{})
			if err == nil {
				_ = y.Close()
			}
			tc.check(t, err)
		})
	}
	// A good version reopens fine (and the failed opens released the lock).
	dir := t.TempDir()
	x := openAt(t, dir)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	openAt(t, dir)
}

func TestCorruptValues(t *testing.T) { forEach(t, testCorruptValues) }

func testCorruptValues(t *testing.T, x Store, _ func() Store) {
	setup := func(t *testing.T) {
		mustCommit(t, x, CheckpointMeta{ID: "c"}, testRecords(3, 800, "c"))
	}
	rk := string(recordKey("c", "sess-00001"))
	for name, tc := range map[string]struct {
		key   string
		value []byte // nil: delete the key
		read  func() error
		want  string // the key the error must name
	}{
		"meta":                 {"c/c", []byte(`{"checkpoint_id":`), func() error { _, err := x.Checkpoint("c"); return err }, "c/c"},
		"meta in list":         {"c/c", []byte(`[]`), func() error { _, err := x.Checkpoints(); return err }, "c/c"},
		"meta in latest":       {"c/c", []byte(`"x"`), func() error { _, _, err := x.Latest(); return err }, "c/c"},
		"meta wrong id":        {"c/c", []byte(`{"checkpoint_id":"d"}`), func() error { _, err := x.Checkpoint("c"); return err }, "c/c"},
		"record":               {rk, []byte("\x00\xff garbage"), func() error { _, err := x.Checkpoint("c"); return err }, rk},
		"record wrong session": {rk, []byte(`{"session_id":"other"}`), func() error { _, err := x.Checkpoint("c"); return err }, rk},
		"record changed": {rk, func() []byte {
			b, _ := json.Marshal(testRecord("sess-00001", "snap-other", 800))
			return b
		}(), func() error { _, err := x.Checkpoint("c"); return err }, "c/c"},
		"record missing": {rk, nil, func() error { _, err := x.Checkpoint("c"); return err }, "c/c"},
		"tombstone":      {"t/x", []byte(`{`), func() error { _, err := x.Tombstones(); return err }, "t/x"},
		"intent":         {"i/commit/x", []byte(`{`), func() error { _, err := x.Intents("commit"); return err }, "i/commit/x"},
		"seq":            {keySeq, []byte("123"), func() error { _, err := x.Commit(CheckpointMeta{ID: "n"}, nil); return err }, keySeq},
		"ref key":        {"s/only-snapshot", []byte{}, func() error { _, err := x.ReferencedSnapshots(); return err }, "s/only-snapshot"},
	} {
		t.Run(name, func(t *testing.T) {
			setup(t)
			if tc.value == nil {
				rawDelete(t, x, tc.key)
			} else {
				rawSet(t, x, tc.key, tc.value)
			}
			defer rawDelete(t, x, tc.key)
			wantCorrupt(t, tc.read(), tc.want)
			// Whatever is corrupt, dropping the checkpoint cleans it up,
			// references included.
			if err := x.Drop([]string{"c"}, nil); err != nil {
				t.Fatalf("Drop of corrupt checkpoint: %v", err)
			}
			if refs, _ := x.SnapshotRefs("snap-c-00001"); len(refs) != 0 {
				t.Fatalf("refs left after dropping the corrupt checkpoint: %v", refs)
			}
			rawSet(t, x, keySeq, encodeSeq(1))
		})
	}
}

func TestDropCheckpointWithoutRecords(t *testing.T) { forEach(t, testDropCheckpointWithoutRecords) }

// A checkpoint whose every record is gone is corrupt, not absent: dropping
// it removes its meta and its references, found by a scan.
func testDropCheckpointWithoutRecords(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "c"}, []Record{testRecord("s1", "snap-1", 500)})
	rawDelete(t, x, string(recordKey("c", "s1")))
	wantCorrupt(t, func() error { _, err := x.Checkpoint("c"); return err }(), "c/c")
	if err := x.Drop([]string{"c"}, []Tombstone{{SnapshotID: "snap-1"}}); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if _, err := x.Checkpoint("c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Checkpoint after drop = %v, want ErrNotFound", err)
	}
	if refs, _ := x.SnapshotRefs("snap-1"); len(refs) != 0 {
		t.Fatalf("refs left: %v", refs)
	}
}

func TestDropCheckpointWithoutMeta(t *testing.T) { forEach(t, testDropCheckpointWithoutMeta) }

// A checkpoint whose meta is gone but whose records remain reads as absent,
// yet dropping it still removes its records and their references.
func testDropCheckpointWithoutMeta(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "c"}, testRecords(2, 500, "c"))
	rawDelete(t, x, "c/c")
	if _, err := x.Checkpoint("c"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Checkpoint without its meta = %v, want ErrNotFound", err)
	}
	if err := x.Drop([]string{"c"}, nil); err != nil {
		t.Fatalf("Drop: %v", err)
	}
	if snaps, err := x.ReferencedSnapshots(); err != nil || len(snaps) != 0 {
		t.Fatalf("snapshots still referenced after the drop: %v (%v)", snaps, err)
	}
}

func TestClosed(t *testing.T) { forEach(t, testClosed) }

func testClosed(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(1, 500, "a"))
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}
	calls := map[string]func() error{
		"Commit":              func() error { _, err := x.Commit(CheckpointMeta{ID: "b"}, nil); return err },
		"Checkpoint":          func() error { _, err := x.Checkpoint("a"); return err },
		"Checkpoints":         func() error { _, err := x.Checkpoints(); return err },
		"Latest":              func() error { _, _, err := x.Latest(); return err },
		"FindByDir":           func() error { _, _, err := x.FindByDir(""); return err },
		"SnapshotRefs":        func() error { _, err := x.SnapshotRefs("s"); return err },
		"ReferencedSnapshots": func() error { _, err := x.ReferencedSnapshots(); return err },
		"AddTombstones":       func() error { return x.AddTombstones([]Tombstone{{SnapshotID: "s"}}) },
		"Tombstones":          func() error { _, err := x.Tombstones(); return err },
		"ClearTombstones":     func() error { return x.ClearTombstones([]string{"s"}) },
		"Drop":                func() error { return x.Drop([]string{"a"}, nil) },
		"PutIntent":           func() error { return x.PutIntent(Intent{Kind: "k", ID: "i"}) },
		"Intents":             func() error { _, err := x.Intents(""); return err },
		"DeleteIntent":        func() error { return x.DeleteIntent(IntentKey{"k", "i"}) },
	}
	for name, call := range calls {
		if err := call(); !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close = %v, want ErrClosed", name, err)
		}
	}
}

// A reopen right after Close finds the directory free although a child
// forked while the index was open (and not yet exec'd: a sandbox's start on
// another goroutine) holds a copy of every descriptor the index had. With
// Badger's own lock, dropped by closing the directory, such a reopen failed
// with "Cannot acquire directory lock".
func TestReopenWhileAForkedChildHoldsCopies(t *testing.T) {
	dir := t.TempDir()
	x, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(1, 10, "a"))
	flocktest.HoldCopies(t)
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	y := openAt(t, dir)
	if _, err := y.Checkpoint("a"); err != nil {
		t.Fatalf("the reopened index: %v", err)
	}
}

// A second Open of an open index's directory is refused, in this process
// as from another; the first goes on, and once closed frees it.
func TestASecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	x, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if y, err := Open(dir, Options{}); !errors.Is(err, ErrLocked) {
		if y != nil {
			_ = y.Close()
		}
		t.Fatalf("second Open = %v, want ErrLocked", err)
	}
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(1, 10, "a"))
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	openAt(t, dir)
}

func TestInMemory(t *testing.T) {
	x, err := Open("", Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	recs := testRecords(100, 1000, "m")
	mustCommit(t, x, CheckpointMeta{ID: "m"}, recs)
	if c := mustCheckpoint(t, x, "m"); len(c.Records) != 100 {
		t.Fatalf("in-memory checkpoint has %d records", len(c.Records))
	}
}

func TestCommitTooBig(t *testing.T) {
	// In memory every value counts against the transaction budget, so a
	// commit that fits on disk does not fit here: it must fail clearly and
	// write nothing.
	x, err := Open("", Options{InMemory: true})
	if err != nil {
		t.Fatal(err)
	}
	defer x.Close()
	_, err = x.Commit(CheckpointMeta{ID: "big"}, testRecords(5000, 2000, "big"))
	wantErr(t, err, ErrInvalid)
	wantErr(t, err, badger.ErrTxnTooBig)
	if !strings.Contains(err.Error(), "one Badger transaction") {
		t.Errorf("error %q does not say why", err)
	}
	if metas, _ := x.Checkpoints(); len(metas) != 0 {
		t.Fatalf("a failed commit stored %v", ids(metas))
	}
	if refs, _ := x.ReferencedSnapshots(); len(refs) != 0 {
		t.Fatalf("a failed commit stored %d refs", len(refs))
	}
}

func TestLargeCommits(t *testing.T) {
	// 10,000 records of 700 bytes: every record is past the value
	// threshold, so each costs the transaction its key and a pointer
	// whatever its size (doc.go's "any size"); a lower threshold or a
	// smaller memtable than Open's would not hold them. Bigger records
	// cost the suite seconds of CPU under -race and prove nothing more.
	for _, tc := range []struct{ n, size int }{{1000, 1000}, {10000, 700}} {
		t.Run(fmt.Sprintf("%dx%dB", tc.n, tc.size), func(t *testing.T) {
			if testing.Short() && tc.n > 1000 {
				t.Skip("-short")
			}
			forEach(t, func(t *testing.T, x Store, reopen func() Store) {
				if _, mem := x.(*MemIndex); mem && tc.n > 1000 {
					// The budget under test is Badger's transaction size; the
					// memory store has none, and its engine is the one above.
					t.Skip("no transaction budget in the memory store")
				}
				recs := testRecords(tc.n, tc.size, "l")
				start := time.Now()
				meta := mustCommit(t, x, CheckpointMeta{ID: "large"}, recs)
				t.Logf("commit of %d records: %v", tc.n, time.Since(start))
				if meta.RecordCount != tc.n {
					t.Fatalf("RecordCount = %d", meta.RecordCount)
				}
				if err := x.Close(); err != nil {
					t.Fatal(err)
				}
				y := reopen()
				start = time.Now()
				c := mustCheckpoint(t, y, "large")
				t.Logf("load of %d records: %v", tc.n, time.Since(start))
				if len(c.Records) != tc.n || c.Meta.RecordsSHA256 != canonicalHash(t, recs) {
					t.Fatalf("reloaded %d records, hash %s", len(c.Records), c.Meta.RecordsSHA256)
				}
				// And the whole thing can be dropped in one transaction too.
				if err := y.Drop([]string{"large"}, nil); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}

func TestConcurrentUse(t *testing.T) { forEach(t, testConcurrentUse) }

func testConcurrentUse(t *testing.T, x Store, _ func() Store) {
	const writers, rounds = 4, 15
	var wg sync.WaitGroup
	errs := make(chan error, writers*rounds*4)
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				id := fmt.Sprintf("w%d-r%d", w, r)
				recs := testRecords(20, 600, id)
				if _, err := x.Commit(CheckpointMeta{ID: id}, recs); err != nil {
					errs <- err
					return
				}
				// Re-commits race with readers and drops of others.
				if _, err := x.Commit(CheckpointMeta{ID: id}, recs); err != nil {
					errs <- err
				}
				if r > 0 {
					prev := fmt.Sprintf("w%d-r%d", w, r-1)
					if err := x.Drop([]string{prev}, []Tombstone{{SnapshotID: "snap-" + prev + "-00000"}}); err != nil {
						errs <- err
					}
				}
			}
		})
		wg.Go(func() {
			for range rounds * 2 {
				metas, err := x.Checkpoints()
				if err != nil {
					errs <- err
					return
				}
				for _, m := range metas {
					c, err := x.Checkpoint(m.ID)
					if errors.Is(err, ErrNotFound) {
						continue // dropped meanwhile
					}
					if err != nil {
						errs <- err
						return
					}
					if len(c.Records) != c.Meta.RecordCount {
						errs <- fmt.Errorf("%s: %d records, meta %d", m.ID, len(c.Records), c.Meta.RecordCount)
					}
				}
				if _, err := x.ReferencedSnapshots(); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	metas, _ := x.Checkpoints()
	if len(metas) != writers {
		t.Fatalf("%d checkpoints left, want %d", len(metas), writers)
	}
	seqs := map[uint64]bool{}
	for _, m := range metas {
		if seqs[m.Seq] {
			t.Fatalf("seq %d handed out twice", m.Seq)
		}
		seqs[m.Seq] = true
	}
	if ts, _ := x.Tombstones(); len(ts) != writers*(rounds-1) {
		t.Fatalf("%d tombstones, want %d", len(ts), writers*(rounds-1))
	}
}

func TestCloseWhileBusy(t *testing.T) { forEach(t, testCloseWhileBusy) }

func testCloseWhileBusy(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(50, 800, "a"))
	started := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				if i == 1 && g == 0 {
					close(started)
				}
				var err error
				if g%2 == 0 {
					_, err = x.Checkpoint("a")
				} else {
					_, err = x.Commit(CheckpointMeta{ID: fmt.Sprintf("g%d-%d", g, i)}, nil)
				}
				if errors.Is(err, ErrClosed) {
					return
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	<-started
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// --- crash test ------------------------------------------------------------

const (
	helperDirEnv   = "SNAPSHOTINDEX_CRASH_HELPER_DIR"
	helperRoundEnv = "SNAPSHOTINDEX_CRASH_HELPER_ROUND"
)

// TestHelperProcess is the child of TestCrashDuringCommits: it commits (and
// drops old checkpoints) in a loop, printing each acknowledged step, until
// it is killed. Run directly it does nothing.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		return
	}
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	x, err := Open(dir, Options{})
	if err != nil {
		fail(err)
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(verb, id string) {
		fmt.Fprintln(out, verb, id)
		if err := out.Flush(); err != nil {
			fail(err)
		}
	}
	round := os.Getenv(helperRoundEnv)
	name := func(i int) string { return fmt.Sprintf("r%s-ck-%05d", round, i) }
	for i := 0; i < 100000; i++ {
		id := name(i)
		// Vary the size so kills land in commits of different shapes.
		if _, err := x.Commit(CheckpointMeta{ID: id}, testRecords(50+(i*37)%400, 1000, id)); err != nil {
			fail(err)
		}
		say("committed", id)
		if i >= 3 {
			old := name(i - 3)
			ts := []Tombstone{{SnapshotID: fmt.Sprintf("snap-%s-%05d", old, 0), Provider: "fake", Reason: "released"}}
			if err := x.Drop([]string{old}, ts); err != nil {
				fail(err)
			}
			say("dropped", old)
		}
	}
	os.Exit(3) // never reached in the test: the parent kills us first
}

// crashChild runs the helper on dir and SIGKILLs it as soon as it has
// acknowledged n steps of kind killAfter. It returns every step the child
// acknowledged.
func crashChild(t *testing.T, dir, round, killAfter string, n int) (committed, dropped map[string]bool) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir, helperRoundEnv+"="+round)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	committed, dropped = map[string]bool{}, map[string]bool{}
	enough, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		seen := 0
		for sc.Scan() {
			verb, id, _ := strings.Cut(sc.Text(), " ")
			switch verb {
			case "committed":
				committed[id] = true
			case "dropped":
				dropped[id] = true
			default:
				continue
			}
			if verb == killAfter {
				if seen++; seen == n {
					close(enough)
				}
			}
		}
	}()
	select {
	case <-enough:
	case <-done:
		_ = cmd.Wait()
		t.Fatalf("helper exited before %d %s steps; stderr:\n%s", n, killAfter, stderr.String())
	case <-time.After(3 * time.Minute): // a failsafe, not a pacing sleep
		_ = cmd.Process.Kill()
		t.Fatal("helper too slow")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	<-done // every line written before the kill has been read
	_ = cmd.Wait()
	return committed, dropped
}

func TestCrashDuringCommits(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	dir := t.TempDir()
	committed, dropped := map[string]bool{}, map[string]bool{}
	// Killed right after a commit the child is dropping; right after a drop
	// it is committing (up to 450 records). Eight steps in, the child has
	// committed, dropped and tombstoned, and the kill lands about the drop
	// of its fifth checkpoint or the commit of its twelfth (57 records).
	for round, killAfter := range []string{"committed", "dropped"} {
		c, d := crashChild(t, dir, strconv.Itoa(round), killAfter, 8)
		maps.Copy(committed, c)
		maps.Copy(dropped, d)
	}

	x := openAt(t, dir)
	metas, err := x.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	present := map[string]bool{}
	for _, m := range metas {
		present[m.ID] = true
		c, err := x.Checkpoint(m.ID)
		if err != nil {
			t.Fatalf("checkpoint %s after the crash: %v", m.ID, err)
		}
		if c.Meta.RecordCount != len(c.Records) || canonicalHash(t, c.Records) != c.Meta.RecordsSHA256 {
			t.Fatalf("checkpoint %s incomplete: meta %d records %s, has %d", m.ID,
				c.Meta.RecordCount, c.Meta.RecordsSHA256, len(c.Records))
		}
		for _, r := range c.Records {
			if refs, _ := x.SnapshotRefs(r.SnapshotID); !slices.Contains(refs, m.ID) {
				t.Fatalf("snapshot %s of %s lost its reverse reference", r.SnapshotID, m.ID)
			}
		}
	}
	for id := range committed {
		if !dropped[id] && !present[id] {
			t.Errorf("acknowledged checkpoint %s lost in the crash", id)
		}
	}
	for id := range dropped {
		if present[id] {
			t.Errorf("acknowledged drop of %s undone by the crash", id)
		}
	}
	// Every reference points at a present checkpoint, and no referenced
	// snapshot is tombstoned.
	refs, _ := x.ReferencedSnapshots()
	for snap, ckpts := range refs {
		for _, id := range ckpts {
			if !present[id] {
				t.Errorf("snapshot %s references missing checkpoint %s", snap, id)
			}
		}
	}
	ts, _ := x.Tombstones()
	for _, tb := range ts {
		if len(refs[tb.SnapshotID]) > 0 {
			t.Errorf("tombstoned snapshot %s is still referenced", tb.SnapshotID)
		}
	}
	// No stray record of a commit the kill interrupted.
	err = x.view(func(txn kvTxn) error {
		return txn.scan([]byte(pfxRecord), false, func(key, _ []byte) error {
			id, _, _ := strings.Cut(strings.TrimPrefix(string(key), pfxRecord), "/")
			if !present[unescape(id)] {
				t.Errorf("record %q of an absent checkpoint", key)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("2 kills after %d acknowledged commits; %d checkpoints present (%v), %d tombstones",
		len(committed), len(metas), ids(metas), len(ts))
	// The index keeps working after the crashes.
	mustCommit(t, x, CheckpointMeta{ID: "after-crash"}, testRecords(10, 500, "after"))
}

func TestBadgerLogsAtDebug(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	x, err := Open(t.TempDir(), Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(3, 500, "a"))
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	fromBadger := 0
	for _, e := range hook.AllEntries() {
		if e.Data["component"] != "badger" {
			continue
		}
		fromBadger++
		if e.Level != logrus.DebugLevel {
			t.Errorf("badger logged at %s: %s", e.Level, e.Message)
		}
		if strings.HasSuffix(e.Message, "\n") {
			t.Errorf("badger line keeps its newline: %q", e.Message)
		}
	}
	if fromBadger == 0 {
		t.Error("no badger line reached the injected logger")
	}
}

// TestDropManyTombstones covers the one-pass reference check a drop of many
// snapshots takes: it refuses a snapshot a remaining checkpoint names and
// accepts the rest.
func TestDropManyTombstones(t *testing.T) { forEach(t, testDropManyTombstones) }

func testDropManyTombstones(t *testing.T, x Store, _ func() Store) {
	var recs []Record
	var ts []Tombstone
	for i := 0; i < 3*fewTombstones; i++ {
		snap := fmt.Sprintf("only-a-%03d", i)
		recs = append(recs, testRecord(fmt.Sprintf("s%03d", i), snap, 100))
		ts = append(ts, Tombstone{SnapshotID: snap})
	}
	mustCommit(t, x, CheckpointMeta{ID: "a"}, append(recs, testRecord("shared-session", "shared", 100)))
	mustCommit(t, x, CheckpointMeta{ID: "b"}, []Record{testRecord("s1", "shared", 100)})

	err := x.Drop([]string{"a"}, append(ts, Tombstone{SnapshotID: "shared"}))
	wantErr(t, err, ErrInvalid)
	if !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("error %q does not name the checkpoint still using the snapshot", err)
	}
	mustCheckpoint(t, x, "a")
	if err := x.Drop([]string{"a"}, ts); err != nil {
		t.Fatal(err)
	}
	got, err := x.Tombstones()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ts) {
		t.Fatalf("%d tombstones, want %d", len(got), len(ts))
	}
}
