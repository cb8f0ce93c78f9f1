package owner_test

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

func benchOwner(b *testing.B, n int) (*owner.Owner, *fake.Provider) {
	b.Helper()
	fk := fake.New(fake.Options{})
	o, err := owner.New(context.Background(), owner.Config{
		Name:       "bench",
		Provider:   fk,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: b.TempDir()},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = o.Close() })
	for i := 0; i < n; i++ {
		sid := fmt.Sprintf("s%05d", i)
		if _, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{Image: "notes"}, notesSetup(sid), "/workspace"); err != nil {
			b.Fatal(err)
		}
	}
	return o, fk
}

// BenchmarkCommit1000 commits 1,000 live sessions on the fake provider at
// zero latency: the owner's own cost (fan-out, fan-in, one index
// transaction).
func BenchmarkCommit1000(b *testing.B) {
	o, _ := benchOwner(b, 1000)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: fmt.Sprintf("c%d", i)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCommit1000Records is BenchmarkCommit1000 with a checkpoint_dir
// on the disk: each commit also writes, fsyncs and publishes the 1,000
// records and their manifest, as the control plane's commits do.
func BenchmarkCommit1000Records(b *testing.B) {
	o, _ := benchOwner(b, 1000)
	dir := b.TempDir()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("c%d", i)
		if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: id, CheckpointDir: filepath.Join(dir, id)}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRestore1000 restores a checkpoint of 1,000 sessions: validation,
// 1,000 forks, 1,000 installs and 1,000 superseded stops.
func BenchmarkRestore1000(b *testing.B) {
	o, _ := benchOwner(b, 1000)
	if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c"}); err != nil {
		b.Fatal(err)
	}
	ids, _ := o.Sessions()
	end := func() {
		for _, sid := range ids {
			if err := o.EndSessionSandbox(context.Background(), sid); err != nil {
				b.Fatal(err)
			}
		}
	}
	end()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c"})
		if err != nil || len(res.Sessions) != 1000 {
			b.Fatalf("restore: %d sessions, %v", len(res.Sessions), err)
		}
		b.StopTimer()
		end()
		b.StartTimer()
	}
}
