package clock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
)

// TestManualAfterFuncRunsWhenTheClockPassesIt: each function runs when
// Advance or Set moves the clock to its time, not before, in due order (ties
// in the order armed), on the goroutine that moves the clock, and may read
// the clock itself.
func TestManualAfterFuncRunsWhenTheClockPassesIt(t *testing.T) {
	m := clock.NewManual(t0)
	var ran []string
	arm := func(name string, d time.Duration) {
		m.AfterFunc(d, func() { ran = append(ran, fmt.Sprintf("%s@%s", name, m.Now().Sub(t0))) })
	}
	arm("3s", 3*time.Second)
	arm("2s-a", 2*time.Second)
	arm("1s", time.Second)
	arm("2s-b", 2*time.Second)
	if got := m.Pending(); got != 4 {
		t.Fatalf("pending = %d, want 4", got)
	}
	if at, ok := m.Next(); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("Next = %v %v, want %v", at, ok, t0.Add(time.Second))
	}
	m.Advance(999 * time.Millisecond)
	if len(ran) != 0 {
		t.Fatalf("ran %v before any was due", ran)
	}
	m.Advance(time.Millisecond)
	if diff := cmp.Diff([]string{"1s@1s"}, ran); diff != "" {
		t.Fatalf("at 1 s (-want +got):\n%s", diff)
	}
	if got := m.Pending(); got != 3 {
		t.Fatalf("pending = %d after one ran, want 3", got)
	}
	m.Set(t0.Add(time.Minute))
	want := []string{"1s@1s", "2s-a@1m0s", "2s-b@1m0s", "3s@1m0s"}
	if diff := cmp.Diff(want, ran); diff != "" {
		t.Fatalf("after Set (-want +got):\n%s", diff)
	}
	if got := m.Pending(); got != 0 {
		t.Fatalf("pending = %d after all ran", got)
	}
	m.Advance(time.Hour)
	if diff := cmp.Diff(want, ran); diff != "" {
		t.Fatalf("a function ran twice (-want +got):\n%s", diff)
	}
}

func TestManualAfterFuncStopAndReset(t *testing.T) {
	m := clock.NewManual(t0)
	ran := 0
	tm := m.AfterFunc(time.Second, func() { ran++ })
	if tm.C() != nil {
		t.Fatal("an AfterFunc timer has a channel")
	}
	if !tm.Stop() {
		t.Fatal("Stop of a pending AfterFunc timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	if got := m.Pending(); got != 0 {
		t.Fatalf("pending = %d after Stop", got)
	}
	m.Advance(time.Minute)
	if ran != 0 {
		t.Fatal("a stopped AfterFunc ran")
	}
	if tm.Reset(2 * time.Second) {
		t.Fatal("Reset of a stopped timer reported it pending")
	}
	m.Advance(time.Second)
	if ran != 0 {
		t.Fatal("the reset function ran before its new time")
	}
	m.Advance(time.Second)
	if ran != 1 {
		t.Fatalf("the reset function ran %d times at its new time, want 1", ran)
	}
}

// TestManualAfterFuncNotDue: a function due now or earlier runs at once, on
// a goroutine of its own (so a caller holding a lock it takes does not
// deadlock), and is not pending.
func TestManualAfterFuncNotDue(t *testing.T) {
	m := clock.NewManual(t0)
	for _, d := range []time.Duration{0, -time.Second} {
		done := make(chan time.Time)
		// It reads the clock, whose lock AfterFunc holds while arming.
		m.AfterFunc(d, func() { done <- m.Now() })
		if got := m.Pending(); got != 0 {
			t.Fatalf("AfterFunc(%v): pending = %d", d, got)
		}
		if at := <-done; !at.Equal(t0) {
			t.Fatalf("AfterFunc(%v) ran at %v, want %v", d, at, t0)
		}
	}
}

// TestWithDeadlineCancelStopsItsTimer: a context cancelled before its
// deadline leaves no timer on the clock, so a test that counts pending
// timers (or a deterministic scheduler that moves time to the next one)
// does not see it.
func TestWithDeadlineCancelStopsItsTimer(t *testing.T) {
	m := clock.NewManual(t0)
	ctx, cancel := clock.WithTimeout(context.Background(), m, time.Hour)
	if got := m.Pending(); got != 1 {
		t.Fatalf("pending = %d with a deadline armed, want 1", got)
	}
	cancel()
	if got := m.Pending(); got != 0 {
		t.Fatalf("pending = %d after cancel, want 0", got)
	}
	m.Advance(2 * time.Hour)
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Fatalf("err = %v after the deadline passed, want the earlier Canceled", ctx.Err())
	}
}

// TestWithDeadlineErrDoesNotChange: a context whose parent ended first
// keeps reporting the parent's error once the clock passes its deadline
// (context.Context: successive calls to Err return the same error).
func TestWithDeadlineErrDoesNotChange(t *testing.T) {
	m := clock.NewManual(t0)
	parent, pcancel := context.WithCancel(context.Background())
	ctx, cancel := clock.WithTimeout(parent, m, time.Second)
	defer cancel()
	pcancel()
	<-ctx.Done()
	first := ctx.Err()
	m.Advance(time.Minute)
	if got := ctx.Err(); got != first {
		t.Fatalf("Err changed from %v to %v when the deadline passed", first, got)
	}

	// The deadline first: DeadlineExceeded, however the context ends later.
	ctx2, cancel2 := clock.WithTimeout(context.Background(), m, time.Second)
	m.Advance(time.Second)
	cancel2()
	if !errors.Is(ctx2.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v after the deadline then cancel, want DeadlineExceeded", ctx2.Err())
	}
}
