package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/racebuild"
)

// TestWallDeadlineArmsNothingUnlessWaitedOn: a bound nobody waits on is
// two allocations (the context and its cancel func), where
// context.WithDeadline's, with its timer and its registration with a
// cancellable parent, are four.
func TestWallDeadlineArmsNothingUnlessWaitedOn(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts differ under -race")
	}
	parent, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	_ = parent.Done()
	allocs := testing.AllocsPerRun(100, func() {
		ctx, cancel := clock.WithTimeout(parent, clock.Real{}, time.Minute)
		if ctx.Err() != nil {
			t.Fatal("ended at once")
		}
		cancel()
	})
	if allocs > 2 {
		t.Fatalf("%v allocations a bound, want 2", allocs)
	}
}
