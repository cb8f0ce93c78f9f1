// Package bench holds benchmarks that cut across packages.
package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// benchRecords returns n records of about 1 KB of JSON each, the size of a
// session with a small setup object. tag makes the snapshot ids unique per
// checkpoint, as real snapshots are.
func benchRecords(n int, tag string) []snapshotindex.Record {
	data, _ := json.Marshal(map[string]string{"task": strings.Repeat("t", 400)})
	at := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	recs := make([]snapshotindex.Record, n)
	for i := range recs {
		sid := fmt.Sprintf("session-%06d", i)
		recs[i] = snapshotindex.Record{
			SessionID:  sid,
			Provider:   "fake",
			Sandbox:    provider.Handle{SandboxID: "sb-" + sid, Provider: "fake", Descriptor: json.RawMessage(`{"sandbox_id":"sb-` + sid + `"}`)},
			SnapshotID: fmt.Sprintf("snap-%s-%06d", tag, i),
			Spec: provider.Spec{
				Image:    "swebench/sweb.eval.x86_64.django__django-11099:latest",
				Workdir:  "/testbed",
				Env:      map[string]string{"LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"},
				Metadata: map[string]string{"owner": "bench", "session": sid},
				Resources: &provider.Resources{
					CPU: 2, MemoryMiB: 4096, DiskGiB: 10,
				},
				TTLSeconds: 3600,
			},
			Workdir:    "/testbed",
			Data:       data,
			SnapshotAt: at,
		}
	}
	return recs
}

func openBench(b *testing.B) *snapshotindex.Index {
	b.Helper()
	x, err := snapshotindex.Open(b.TempDir(), snapshotindex.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = x.Close() })
	return x
}

// BenchmarkCommit1000 is one synced commit of a checkpoint of 1,000
// sessions. The previous checkpoint is dropped outside the timer, so the
// index stays the size a retention policy keeps it at.
func BenchmarkCommit1000(b *testing.B) {
	x := openBench(b)
	sets := [2][]snapshotindex.Record{benchRecords(1000, "a"), benchRecords(1000, "b")}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		id := fmt.Sprintf("ckpt-%d", i)
		if _, err := x.Commit(snapshotindex.CheckpointMeta{ID: id}, sets[i%2]); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if i > 0 {
			if err := x.Drop([]string{fmt.Sprintf("ckpt-%d", i-1)}, nil); err != nil {
				b.Fatal(err)
			}
		}
		i++
		b.StartTimer()
	}
}

// BenchmarkCheckpointLoad1000 reads and verifies a 1,000-session checkpoint,
// as a restore does.
func BenchmarkCheckpointLoad1000(b *testing.B) {
	x := openBench(b)
	if _, err := x.Commit(snapshotindex.CheckpointMeta{ID: "ckpt"}, benchRecords(1000, "a")); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		c, err := x.Checkpoint("ckpt")
		if err != nil {
			b.Fatal(err)
		}
		if len(c.Records) != 1000 {
			b.Fatalf("%d records", len(c.Records))
		}
	}
}

// BenchmarkDrop1000 drops a checkpoint of 1,000 sessions and tombstones
// its 1,000 snapshots in one transaction, as a release does.
func BenchmarkDrop1000(b *testing.B) {
	x := openBench(b)
	recs := benchRecords(1000, "a")
	ts := make([]snapshotindex.Tombstone, len(recs))
	for i, r := range recs {
		ts[i] = snapshotindex.Tombstone{SnapshotID: r.SnapshotID, Provider: "fake"}
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.SnapshotID
	}
	i := 0
	for b.Loop() {
		b.StopTimer()
		id := fmt.Sprintf("ckpt-%d", i)
		if err := x.ClearTombstones(ids); err != nil {
			b.Fatal(err)
		}
		if _, err := x.Commit(snapshotindex.CheckpointMeta{ID: id}, recs); err != nil {
			b.Fatal(err)
		}
		i++
		b.StartTimer()
		if err := x.Drop([]string{id}, ts); err != nil {
			b.Fatal(err)
		}
	}
}
