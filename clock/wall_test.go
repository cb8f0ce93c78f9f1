package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/racebuild"
)

// waitDone waits for ctx to end, failing after a bound that only a hang
// reaches.
func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the context never ended")
	}
}

// TestWallDeadlineEndsAtItsDeadline: on the wall clock a context ends with
// DeadlineExceeded once its deadline passes, read through Err alone (no
// Done ever asked for) or waited for on Done, and reports that deadline.
func TestWallDeadlineEndsAtItsDeadline(t *testing.T) {
	past, cancel := clock.WithDeadline(context.Background(), clock.Real{}, time.Now().Add(-time.Second))
	defer cancel()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Fatalf("a deadline passed: err = %v, want DeadlineExceeded", past.Err())
	}
	select {
	case <-past.Done():
	default:
		t.Fatal("a context found ended by Err has an open Done")
	}

	at := time.Now().Add(20 * time.Millisecond)
	ctx, cancel2 := clock.WithDeadline(context.Background(), clock.Real{}, at)
	defer cancel2()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(at) {
		t.Fatalf("deadline = %v, %v, want %v", d, ok, at)
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("err = %v before the deadline", err)
	}
	waitDone(t, ctx)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v once Done closed, want DeadlineExceeded", ctx.Err())
	}
	if time.Now().Before(at) {
		t.Fatal("Done closed before the deadline")
	}

	// Read through Err alone, without Done.
	ctx3, cancel3 := clock.WithTimeout(context.Background(), clock.Real{}, time.Millisecond)
	defer cancel3()
	for ctx3.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(ctx3.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", ctx3.Err())
	}
}

// TestWallDeadlineFollowsItsParent: the parent's end ends the context with
// the parent's error, whether or not Done was asked for before; a parent
// with an earlier deadline gives its own; values are the parent's.
func TestWallDeadlineFollowsItsParent(t *testing.T) {
	type key struct{}
	for _, armed := range []bool{false, true} {
		parent, pcancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		ctx, cancel := clock.WithTimeout(parent, clock.Real{}, time.Hour)
		if armed {
			_ = ctx.Done()
		}
		if got := ctx.Value(key{}); got != "v" {
			t.Fatalf("value = %v, want the parent's", got)
		}
		pcancel()
		waitDone(t, ctx)
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("armed %v: err = %v after the parent's cancel, want Canceled", armed, ctx.Err())
		}
		cancel()
	}

	early := time.Now().Add(time.Minute)
	parent, pcancel := context.WithDeadline(context.Background(), early)
	defer pcancel()
	ctx, cancel := clock.WithTimeout(parent, clock.Real{}, time.Hour)
	defer cancel()
	if d, _ := ctx.Deadline(); !d.Equal(early) {
		t.Fatalf("deadline = %v under a parent ending at %v", d, early)
	}
}

// TestWallDeadlineCancel: cancel ends the context with Canceled, armed or
// not, and its error does not change when the parent or the deadline end
// later; a child made from it ends with it.
func TestWallDeadlineCancel(t *testing.T) {
	for _, armed := range []bool{false, true} {
		parent, pcancel := context.WithCancel(context.Background())
		ctx, cancel := clock.WithTimeout(parent, clock.Real{}, 10*time.Millisecond)
		child, ccancel := context.WithCancel(ctx)
		if armed {
			_ = ctx.Done()
		}
		cancel()
		waitDone(t, ctx)
		waitDone(t, child)
		if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
			t.Fatalf("armed %v: err = %v, child's %v after cancel, want Canceled", armed, ctx.Err(), child.Err())
		}
		pcancel()
		time.Sleep(20 * time.Millisecond) // past the deadline: nothing may change
		if !errors.Is(ctx.Err(), context.Canceled) {
			t.Fatalf("armed %v: err changed to %v", armed, ctx.Err())
		}
		ccancel()
	}
}

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
