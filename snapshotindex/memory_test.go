package snapshotindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// dump returns every key of x's store and its value.
func dump(t testing.TB, x Store) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := engineOf(t, x).view(func(txn kvTxn) error {
		return txn.scan(nil, true, func(key, val []byte) error {
			out[string(key)] = string(val)
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestSameBytes runs one history against every backend and compares what
// each stores, key by key and byte by byte.
func TestSameBytes(t *testing.T) {
	at := time.Date(2025, 3, 1, 9, 30, 0, 0, time.FixedZone("X", 3600))
	history := func(t *testing.T, x Store) {
		mustCommit(t, x, CheckpointMeta{ID: "a/1", CommittedAt: at, CheckpointDir: "/d", Scope: []string{"s2", "s1"}},
			[]Record{testRecord("s2", "snap/2", 900), testRecord("s1", "snap%1", 400)})
		mustCommit(t, x, CheckpointMeta{ID: "b", CommittedAt: at.Add(time.Minute)}, testRecords(3, 700, "b"))
		mustCommit(t, x, CheckpointMeta{ID: "c", CommittedAt: at.Add(2 * time.Minute)}, []Record{testRecord("s1", "snap%1", 400)})
		for _, in := range []Intent{
			{Kind: "commit", ID: "d", Body: json.RawMessage(`{ "snapshots": ["x"] }`), At: at},
			{Kind: "release/x", ID: "e", At: at},
		} {
			if err := x.PutIntent(in); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Drop([]string{"a/1"}, []Tombstone{{SnapshotID: "snap/2", Provider: "fake", Reason: "released", At: at}}); err != nil {
			t.Fatal(err)
		}
		if err := x.AddTombstones([]Tombstone{{SnapshotID: "x", Provider: "fake", At: at}, {SnapshotID: "y", At: at}},
			IntentKey{"commit", "d"}); err != nil {
			t.Fatal(err)
		}
		if err := x.ClearTombstones([]string{"y"}); err != nil {
			t.Fatal(err)
		}
	}
	var first map[string]string
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			x, _ := b.open(t)
			history(t, x)
			got := dump(t, x)
			if first == nil {
				first = got
				return
			}
			if d := cmp.Diff(first, got); d != "" {
				t.Fatalf("stored keys and values differ from %s's (-%s +%s):\n%s", backends()[0].name, backends()[0].name, b.name, d)
			}
		})
	}
	if len(first) < 10 {
		t.Fatalf("the history stored only %d keys: %v", len(first), first)
	}
}

func TestFailedWritesLeaveNothing(t *testing.T) { forEach(t, testFailedWritesLeaveNothing) }

// testFailedWritesLeaveNothing: a call that fails, whether before or after
// its transaction wrote, leaves every key as it was.
func testFailedWritesLeaveNothing(t *testing.T, x Store, _ func() Store) {
	mustCommit(t, x, CheckpointMeta{ID: "a"}, []Record{testRecord("s1", "kept", 500), testRecord("s2", "only-a", 500)})
	mustCommit(t, x, CheckpointMeta{ID: "b"}, []Record{testRecord("s1", "kept", 500)})
	if err := x.AddTombstones([]Tombstone{{SnapshotID: "dead"}}); err != nil {
		t.Fatal(err)
	}
	if err := x.PutIntent(Intent{Kind: "commit", ID: "a"}); err != nil {
		t.Fatal(err)
	}
	before := dump(t, x)
	for name, tc := range map[string]struct {
		call func() error
		want error
	}{
		"commit conflict": {func() error {
			_, err := x.Commit(CheckpointMeta{ID: "a"}, nil, IntentKey{"commit", "a"})
			return err
		}, ErrConflict},
		"commit of a tombstoned snapshot": {func() error {
			_, err := x.Commit(CheckpointMeta{ID: "n"}, []Record{testRecord("s1", "dead", 500)}, IntentKey{"commit", "a"})
			return err
		}, ErrInvalid},
		// The first tombstone is written before the second is refused.
		"tombstones, the second referenced": {func() error {
			return x.AddTombstones([]Tombstone{{SnapshotID: "free"}, {SnapshotID: "kept"}}, IntentKey{"commit", "a"})
		}, ErrInvalid},
		// The drop deletes a's keys before the tombstone is refused.
		"drop, tombstone still referenced": {func() error {
			return x.Drop([]string{"a"}, []Tombstone{{SnapshotID: "only-a"}, {SnapshotID: "kept"}})
		}, ErrInvalid},
	} {
		t.Run(name, func(t *testing.T) {
			wantErr(t, tc.call(), tc.want)
			if d := cmp.Diff(before, dump(t, x)); d != "" {
				t.Fatalf("a failed call changed the store (-before +after):\n%s", d)
			}
		})
	}
}

// TestMemoryHandles: a handle is a process. Closing one refuses its calls
// and leaves the others and the contents alone; a handle opened later sees
// every commit made before, and the seq goes on.
func TestMemoryHandles(t *testing.T) {
	m := NewMemory()
	a, b := openMem(t, m), openMem(t, m)
	mustCommit(t, a, CheckpointMeta{ID: "1"}, testRecords(2, 500, "1"))
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	_, err := a.Checkpoint("1")
	wantErr(t, err, ErrClosed)
	_, err = a.Commit(CheckpointMeta{ID: "x"}, nil)
	wantErr(t, err, ErrClosed)
	if err := a.Close(); err != nil {
		t.Fatalf("second Close = %v", err)
	}

	mustCheckpoint(t, b, "1")
	two := mustCommit(t, b, CheckpointMeta{ID: "2"}, nil)
	if err := b.PutIntent(Intent{Kind: "commit", ID: "3"}); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}

	c := openMem(t, m)
	metas, err := c.Checkpoints()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"1", "2"}, ids(metas)); d != "" {
		t.Fatalf("checkpoints after restart (-want +got):\n%s", d)
	}
	if d := cmp.Diff(two, metas[1]); d != "" {
		t.Fatalf("meta after restart (-committed +reloaded):\n%s", d)
	}
	if ins, _ := c.Intents("commit"); len(ins) != 1 {
		t.Fatalf("intents after restart = %+v", ins)
	}
	if m := mustCommit(t, c, CheckpointMeta{ID: "3"}, nil); m.Seq != 3 {
		t.Fatalf("seq after restart = %d, want 3", m.Seq)
	}
}

// TestMemoryRollbackOnPanic: a transaction that panics after writing
// leaves nothing, as Badger discards a transaction it never committed.
func TestMemoryRollbackOnPanic(t *testing.T) {
	x := openMem(t, NewMemory())
	mustCommit(t, x, CheckpointMeta{ID: "a"}, testRecords(2, 500, "a"))
	before := dump(t, x)
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		_ = x.update(func(txn kvTxn) error {
			if err := txn.delete(metaKey("a")); err != nil {
				return err
			}
			if err := txn.set([]byte(keySeq), encodeSeq(9)); err != nil {
				return err
			}
			if err := txn.set([]byte("t/new"), []byte("{}")); err != nil {
				return err
			}
			panic("mid-transaction")
		})
	}()
	if d := cmp.Diff(before, dump(t, x)); d != "" {
		t.Fatalf("a panicking transaction changed the store (-before +after):\n%s", d)
	}
}

// TestMemoryScanIgnoresOwnWrites: like a Badger iterator, a scan yields the
// keys and values that were there when it began, whatever its callback
// writes.
func TestMemoryScanIgnoresOwnWrites(t *testing.T) {
	x := openMem(t, NewMemory())
	for i := range 4 {
		rawSet(t, x, fmt.Sprintf("t/%d", i), fmt.Appendf(nil, "v%d", i))
	}
	var seen []string
	err := x.update(func(txn kvTxn) error {
		return txn.scan([]byte(pfxTomb), true, func(key, val []byte) error {
			seen = append(seen, string(key)+"="+string(val))
			if string(key) == "t/0" {
				for _, k := range []string{"t/1", "t/2"} {
					if err := txn.delete([]byte(k)); err != nil {
						return err
					}
				}
				return errors.Join(txn.set([]byte("t/3"), []byte("new")), txn.set([]byte("t/00"), []byte("new")))
			}
			return nil
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"t/0=v0", "t/1=v1", "t/2=v2", "t/3=v3"}, seen); d != "" {
		t.Fatalf("scan (-want +got):\n%s", d)
	}
	want := map[string]string{keySchema: "1", "t/0": "v0", "t/00": "new", "t/3": "new"}
	if d := cmp.Diff(want, dump(t, x)); d != "" {
		t.Fatalf("after the scan's writes (-want +got):\n%s", d)
	}
}

// TestMemoryReadOnlyView: a read-only transaction refuses writes, as
// Badger's does.
func TestMemoryReadOnlyView(t *testing.T) {
	x := openMem(t, NewMemory())
	err := x.view(func(txn kvTxn) error { return txn.set([]byte("t/x"), nil) })
	if err == nil {
		t.Fatal("a view wrote")
	}
	if _, ok := dump(t, x)["t/x"]; ok {
		t.Fatal("the refused write is stored")
	}
}

// BenchmarkMemoryRun is what a simulated run spends on its index: a fresh
// Memory, a few commits, a restart, a restore and a drop.
func BenchmarkMemoryRun(b *testing.B) {
	recs := testRecords(8, 1000, "r")
	for b.Loop() {
		m := NewMemory()
		x := m.Open()
		for i := range 4 {
			if _, err := x.Commit(CheckpointMeta{ID: strconv.Itoa(i)}, recs[i*2:i*2+2]); err != nil {
				b.Fatal(err)
			}
		}
		_ = x.Close()
		y := m.Open()
		if _, err := y.Checkpoint("3"); err != nil {
			b.Fatal(err)
		}
		if err := y.Drop([]string{"0"}, []Tombstone{{SnapshotID: recs[0].SnapshotID}}); err != nil {
			b.Fatal(err)
		}
		_ = y.Close()
	}
}

// TestMemoryCopiesValues: a write stores a copy, so a caller reusing its
// buffer cannot change what is stored.
func TestMemoryCopiesValues(t *testing.T) {
	x := openMem(t, NewMemory())
	buf := []byte("before")
	if err := x.update(func(txn kvTxn) error { return txn.set([]byte("t/x"), buf) }); err != nil {
		t.Fatal(err)
	}
	copy(buf, "after!")
	if got := dump(t, x)["t/x"]; got != "before" {
		t.Fatalf("stored value = %q, want %q", got, "before")
	}
}
