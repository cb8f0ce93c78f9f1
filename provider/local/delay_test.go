package local

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// TestDelaysHoldSnapshotAndForkUntilTheContextEnds: the crash-test delays
// hold the call, and a context that ends first ends it with nothing made.
func TestDelaysHoldSnapshotAndForkUntilTheContextEnds(t *testing.T) {
	t.Parallel()
	p := newProvider(t, mode{isolation: IsolationNone, overlay: OverlayOff}, Options{SnapshotDelay: time.Hour, ForkDelay: time.Hour})
	ctx := context.Background()
	h, err := p.Start(ctx, provider.Spec{Files: map[string]string{"a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := p.Snapshot(short, h, "held"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("snapshot under a delay longer than its context: %v", err)
	}
	if snaps, _ := p.ListSnapshots(ctx); len(snaps) != 0 {
		t.Fatalf("a snapshot cut short by its context was made: %v", snaps)
	}

	p.snapshotDelay = 0
	id, err := p.Snapshot(ctx, h, "free")
	if err != nil {
		t.Fatal(err)
	}
	short2, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if _, err := p.Fork(short2, provider.Spec{}, id); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fork under a delay longer than its context: %v", err)
	}
	if list, _ := p.ListSandboxes(ctx); len(list) != 1 {
		t.Fatalf("a fork cut short by its context was made: %d sandboxes", len(list))
	}
}
