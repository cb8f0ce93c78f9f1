package clock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
)

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// fired reports the tick a channel holds, without waiting.
func fired(c <-chan time.Time) (time.Time, bool) {
	select {
	case at := <-c:
		return at, true
	default:
		return time.Time{}, false
	}
}

func TestManualTimersFireWhenTheClockPassesThem(t *testing.T) {
	m := clock.NewManual(t0)
	a := m.NewTimer(2 * time.Second)
	b := m.After(time.Second)
	if _, ok := fired(a.C()); ok {
		t.Fatal("a timer fired before the clock moved")
	}
	m.Advance(999 * time.Millisecond)
	if _, ok := fired(b); ok {
		t.Fatal("a 1 s timer fired at 999 ms")
	}
	m.Advance(time.Millisecond)
	if at, ok := fired(b); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("1 s timer: fired %v at %v, want true at %v", ok, at, t0.Add(time.Second))
	}
	if _, ok := fired(a.C()); ok {
		t.Fatal("the 2 s timer fired at 1 s")
	}
	if got := m.Pending(); got != 1 {
		t.Fatalf("pending = %d, want 1", got)
	}
	// Jumping past it delivers the time it was due, once.
	m.Set(t0.Add(time.Hour))
	if at, ok := fired(a.C()); !ok || !at.Equal(t0.Add(2*time.Second)) {
		t.Fatalf("2 s timer: fired %v at %v", ok, at)
	}
	m.Advance(time.Hour)
	if _, ok := fired(a.C()); ok {
		t.Fatal("a one-shot timer fired twice")
	}
}

func TestManualTimerStopResetAndZero(t *testing.T) {
	m := clock.NewManual(t0)
	if _, ok := fired(m.After(0)); !ok {
		t.Fatal("After(0) did not fire at once")
	}
	if _, ok := fired(m.After(-time.Second)); !ok {
		t.Fatal("After(<0) did not fire at once")
	}
	tm := m.NewTimer(time.Second)
	if !tm.Stop() {
		t.Fatal("Stop of a pending timer reported false")
	}
	if tm.Stop() {
		t.Fatal("second Stop reported true")
	}
	m.Advance(time.Minute)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a stopped timer reported it pending")
	}
	if !tm.Reset(3 * time.Second) {
		t.Fatal("Reset of a pending timer reported false")
	}
	m.Advance(2 * time.Second)
	if _, ok := fired(tm.C()); ok {
		t.Fatal("the reset timer fired at its old due time")
	}
	m.Advance(time.Second)
	if _, ok := fired(tm.C()); !ok {
		t.Fatal("the reset timer did not fire at its new due time")
	}
	if m.Pending() != 0 {
		t.Fatalf("pending = %d after every timer fired", m.Pending())
	}
}

func TestManualFiresInDueOrder(t *testing.T) {
	m := clock.NewManual(t0)
	var order []string
	type named struct {
		name string
		c    <-chan time.Time
	}
	// Armed out of order; the two at 2 s in the order they were armed.
	timers := []named{{"3s", m.After(3 * time.Second)}, {"2s-a", m.After(2 * time.Second)}, {"1s", m.After(time.Second)}, {"2s-b", m.After(2 * time.Second)}}
	if at, ok := m.Next(); !ok || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("Next = %v %v, want %v", at, ok, t0.Add(time.Second))
	}
	m.Advance(5 * time.Second)
	type tick struct {
		name string
		at   time.Time
	}
	var ticks []tick
	for _, n := range timers {
		at, ok := fired(n.c)
		if !ok {
			t.Fatalf("%s did not fire", n.name)
		}
		ticks = append(ticks, tick{n.name, at})
	}
	for len(ticks) > 0 {
		best := 0
		for i, tk := range ticks {
			if tk.at.Before(ticks[best].at) {
				best = i
			}
		}
		order = append(order, ticks[best].name)
		ticks = append(ticks[:best], ticks[best+1:]...)
	}
	if diff := cmp.Diff([]string{"1s", "2s-a", "2s-b", "3s"}, order); diff != "" {
		t.Fatalf("order (-want +got):\n%s", diff)
	}
	if _, ok := m.Next(); ok {
		t.Fatal("Next reports a timer after all fired")
	}
}

func TestWaitPendingWakesWhenCodeStartsWaiting(t *testing.T) {
	m := clock.NewManual(t0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		<-m.After(time.Minute)
	}()
	if !m.WaitPending(1, nil) {
		t.Fatal("WaitPending gave up")
	}
	m.Advance(time.Minute)
	<-done
	stop := make(chan struct{})
	close(stop)
	if m.WaitPending(5, stop) {
		t.Fatal("WaitPending reported 5 timers that do not exist")
	}
}

func TestWithDeadlineOnAManualClock(t *testing.T) {
	m := clock.NewManual(t0)
	ctx, cancel := clock.WithTimeout(context.Background(), m, time.Second)
	defer cancel()
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a manual-clock context reports a deadline callers would read as wall time")
	}
	m.WaitPending(1, nil)
	m.Advance(999 * time.Millisecond)
	select {
	case <-ctx.Done():
		t.Fatal("ended before its deadline")
	default:
	}
	m.Advance(time.Millisecond)
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("err = %v, want DeadlineExceeded", ctx.Err())
	}

	// Already past: ended at once.
	past, cancel2 := clock.WithDeadline(context.Background(), m, t0)
	defer cancel2()
	<-past.Done()
	if !errors.Is(past.Err(), context.DeadlineExceeded) {
		t.Fatalf("past deadline: err = %v", past.Err())
	}

	// Cancelled before its deadline: Canceled, and its timer is gone.
	c3, cancel3 := clock.WithTimeout(context.Background(), m, time.Hour)
	cancel3()
	<-c3.Done()
	if !errors.Is(c3.Err(), context.Canceled) {
		t.Fatalf("cancelled: err = %v", c3.Err())
	}

	// The parent ending ends it with the parent's error.
	parent, pcancel := context.WithCancel(context.Background())
	c4, cancel4 := clock.WithTimeout(parent, m, time.Hour)
	defer cancel4()
	pcancel()
	<-c4.Done()
	if !errors.Is(c4.Err(), context.Canceled) {
		t.Fatalf("parent cancelled: err = %v", c4.Err())
	}
}

func TestWithDeadlineOnTheRealClockIsContextWithDeadline(t *testing.T) {
	at := time.Now().Add(time.Hour)
	ctx, cancel := clock.WithDeadline(context.Background(), clock.Real{}, at)
	defer cancel()
	if dl, ok := ctx.Deadline(); !ok || !dl.Equal(at) {
		t.Fatalf("deadline = %v %v, want %v", dl, ok, at)
	}
	if _, ok := fired(clock.Real{}.After(-time.Second)); ok {
		// time.After(<0) fires asynchronously; only check it does fire.
		return
	}
	<-clock.Real{}.After(0)
}
