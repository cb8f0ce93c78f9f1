package lazyctx_test

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/lazyctx"
	"github.com/sandboxowner/owner/internal/racebuild"
)

func waitDone(t *testing.T, ctx context.Context) {
	t.Helper()
	select {
	case <-ctx.Done():
	case <-time.After(time.Minute):
		t.Fatal("the context never ended")
	}
}

// deadline is lazyctx.WithDeadline with its Cancel, as
// context.WithDeadline returns them.
func deadline(parent context.Context, at time.Time) (context.Context, context.CancelFunc) {
	c := lazyctx.WithDeadline(parent, at)
	return c, c.Cancel
}

func deadlineIn(parent context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return deadline(parent, time.Now().Add(d))
}

// TestDeadlineEndsAtItsDeadline: a context ends with
// DeadlineExceeded once its deadline passes, read through Err alone (no
// Done ever asked for) or waited for on Done, and reports that deadline.
func TestDeadlineEndsAtItsDeadline(t *testing.T) {
	past, cancel := deadlineIn(context.Background(), -time.Second)
	defer cancel()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Fatalf("a deadline passed: err = %v, want DeadlineExceeded", past.Err())
	}
	select {
	case <-past.Done():
	default:
		t.Fatal("a context found ended by Err has an open Done")
	}

	// Not ended before its deadline: one an hour away, so that no
	// machine is slow enough to reach it first.
	later, cancelLater := deadlineIn(context.Background(), time.Hour)
	defer cancelLater()
	if err := later.Err(); err != nil {
		t.Fatalf("err = %v an hour before the deadline", err)
	}

	at := time.Now().Add(20 * time.Millisecond)
	ctx, cancel2 := deadline(context.Background(), at)
	defer cancel2()
	if d, ok := ctx.Deadline(); !ok || !d.Equal(at) {
		t.Fatalf("deadline = %v, %v, want %v", d, ok, at)
	}
	waitDone(t, ctx)
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v once Done closed, want DeadlineExceeded", ctx.Err())
	}
	if time.Now().Before(at) {
		t.Fatal("Done closed before the deadline")
	}

	// Read through Err alone, without Done.
	ctx3, cancel3 := deadlineIn(context.Background(), time.Millisecond)
	defer cancel3()
	for ctx3.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(ctx3.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", ctx3.Err())
	}
}

// TestDeadlineFollowsItsParent: the parent's end ends the context with
// the parent's error, whether or not Done was asked for before; a parent
// with an earlier deadline gives its own; values are the parent's.
func TestDeadlineFollowsItsParent(t *testing.T) {
	type key struct{}
	for _, armed := range []bool{false, true} {
		parent, pcancel := context.WithCancel(context.WithValue(context.Background(), key{}, "v"))
		ctx, cancel := deadlineIn(parent, time.Hour)
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
	ctx, cancel := deadlineIn(parent, time.Hour)
	defer cancel()
	if d, _ := ctx.Deadline(); !d.Equal(early) {
		t.Fatalf("deadline = %v under a parent ending at %v", d, early)
	}
}

// TestDeadlineCancel: cancel ends the context with Canceled, armed or
// not, and its error does not change when the parent or the deadline end
// later; a child made from it ends with it.
//
// The deadline is near, so that the test sees it pass after the cancel;
// a try whose deadline passed before its cancel returned (a loaded
// machine: a context ended by its deadline is DeadlineExceeded, as
// context.WithDeadline's is) shows nothing and is made again. Only a
// context whose cancel never comes first in a minute of tries fails.
func TestDeadlineCancel(t *testing.T) {
	for _, armed := range []bool{false, true} {
		for bound := time.Now().Add(time.Minute); ; {
			if cancelledFirst(t, armed) {
				break
			}
			if time.Now().After(bound) {
				t.Fatalf("armed %v: no cancel came before a deadline 10 ms away in a minute of tries", armed)
			}
		}
	}
}

// cancelledFirst is one try of TestDeadlineCancel: false when the
// deadline passed before the cancel returned, and so the try shows
// nothing.
func cancelledFirst(t *testing.T, armed bool) bool {
	t.Helper()
	parent, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	at := time.Now().Add(10 * time.Millisecond)
	ctx, cancel := deadline(parent, at)
	child, ccancel := context.WithCancel(ctx)
	defer ccancel()
	if armed {
		_ = ctx.Done()
	}
	cancel()
	if !time.Now().Before(at) {
		return false
	}
	waitDone(t, ctx)
	waitDone(t, child)
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(child.Err(), context.Canceled) {
		t.Fatalf("armed %v: err = %v, child's %v after cancel, want Canceled", armed, ctx.Err(), child.Err())
	}
	pcancel()
	time.Sleep(time.Until(at) + 10*time.Millisecond) // past the deadline: nothing may change
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("armed %v: err changed to %v", armed, ctx.Err())
	}
	return true
}

// TestValueAndItsParents: a context carries its one value and its
// parent's, and the parent's deadline when it has none of its own.
func TestValueAndItsParents(t *testing.T) {
	type k1 struct{}
	type k2 struct{}
	at := time.Now().Add(time.Hour)
	parent, pcancel := context.WithDeadline(context.WithValue(context.Background(), k1{}, "parent's"), at)
	defer pcancel()
	c := lazyctx.WithValue(parent, k2{}, "own")
	defer c.Cancel()
	if got, want := [2]any{c.Value(k1{}), c.Value(k2{})}, [2]any{"parent's", "own"}; got != want {
		t.Fatalf("values = %v, want %v", got, want)
	}
	if d, ok := c.Deadline(); !ok || !d.Equal(at) {
		t.Fatalf("deadline = %v, %v, want the parent's %v", d, ok, at)
	}
	if d, ok := lazyctx.WithCancel(context.Background()).Deadline(); ok {
		t.Fatalf("a context without a deadline reports %v", d)
	}
}

// TestEndsWithItsParentOrItsCancel: the parent's end ends it with the
// parent's error, and Cancel with Canceled, whether Done was asked for
// before or not; a child made from it ends with it; its error never
// changes after.
func TestEndsWithItsParentOrItsCancel(t *testing.T) {
	for _, armed := range []bool{false, true} {
		parent, pcancel := context.WithCancel(context.Background())
		c := lazyctx.WithCancel(parent)
		if armed {
			_ = c.Done()
		}
		pcancel()
		waitDone(t, c)
		if !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("armed %v: err = %v after the parent's end", armed, c.Err())
		}

		parent2, pcancel2 := context.WithTimeout(context.Background(), time.Hour)
		c2 := lazyctx.WithCancel(parent2)
		if armed {
			_ = c2.Done()
		}
		c2.Cancel()
		if !errors.Is(c2.Err(), context.Canceled) {
			t.Fatalf("armed %v: err = %v after Cancel", armed, c2.Err())
		}
		waitDone(t, c2)
		pcancel2()
		if !errors.Is(c2.Err(), context.Canceled) {
			t.Fatalf("armed %v: err = %v after Cancel, then the parent's end", armed, c2.Err())
		}
	}

	// A child made from it (which waits on its Done) ends with it.
	c := lazyctx.WithCancel(context.Background())
	child, ccancel := context.WithCancel(c)
	defer ccancel()
	c.Cancel()
	waitDone(t, child)

	// Found past its deadline, it stays so when cancelled after.
	late := lazyctx.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	if !errors.Is(late.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v past the deadline", late.Err())
	}
	late.Cancel()
	if !errors.Is(late.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v after a Cancel that came later than the deadline", late.Err())
	}
}

// TestArmsNothingUnlessWaitedOn: a context nobody waits on is one
// allocation, carrying a value or not; context.WithCancel over
// context.WithValue, with the registration with a cancellable parent, is
// three.
func TestArmsNothingUnlessWaitedOn(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts differ under -race")
	}
	type key struct{}
	var id any = "request-1"
	parent, pcancel := context.WithCancel(context.Background())
	defer pcancel()
	_ = parent.Done()
	allocs := testing.AllocsPerRun(100, func() {
		c := lazyctx.WithValue(parent, key{}, id)
		if c.Err() != nil || c.Value(key{}) != id {
			t.Fatal("ended at once, or lost its value")
		}
		c.Cancel()
	})
	if allocs > 1 {
		t.Fatalf("%v allocations, want 1", allocs)
	}
}

// TestChildrenRegisterWithoutAGoroutine: contexts made from a Ctx (as a
// provider call makes its own from a request's) are cancelled with it at
// once, and start no goroutine each to wait on its Done, as the context
// package does for a parent it does not know; they see its values.
func TestChildrenRegisterWithoutAGoroutine(t *testing.T) {
	type key struct{}
	parent := context.WithValue(context.Background(), key{}, "parent's")
	for _, c := range []*lazyctx.Ctx{lazyctx.WithCancel(parent), lazyctx.WithDeadline(parent, time.Now().Add(time.Hour))} {
		before := runtime.NumGoroutine()
		var children []context.Context
		for range 200 {
			child, cancel := context.WithCancel(c)
			defer cancel()
			children = append(children, child)
		}
		if n := runtime.NumGoroutine() - before; n > 50 {
			t.Fatalf("%d goroutines more for 200 children", n)
		}
		if got := children[0].Value(key{}); got != "parent's" {
			t.Fatalf("a child sees %v, want the parent's value", got)
		}
		c.Cancel()
		for i, child := range children {
			if !errors.Is(child.Err(), context.Canceled) {
				t.Fatalf("child %d: err = %v right after the Cancel", i, child.Err())
			}
		}
	}
}
