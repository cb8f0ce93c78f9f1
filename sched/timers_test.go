package sched_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/sched"
)

// TestStepsCountsTheChoices: Steps, a run's fingerprint, counts every piece
// of work run, and a Step with nothing to run counts nothing.
func TestStepsCountsTheChoices(t *testing.T) {
	d := sched.NewDet(1, t0)
	defer d.Close()
	if d.Step() || d.Steps != 0 {
		t.Fatalf("an empty scheduler stepped (Steps %d)", d.Steps)
	}
	for range 3 {
		d.Schedule(func() {})
	}
	d.Go(func() {})
	d.Settle()
	if d.Steps != 4 {
		t.Errorf("Steps %d after three tasks and a coroutine, want 4", d.Steps)
	}
}

// TestTasksAndCoroutinesBothRunFirst: the seed chooses among queued tasks
// and runnable coroutines alike; over a few seeds each kind runs first.
func TestTasksAndCoroutinesBothRunFirst(t *testing.T) {
	firsts := map[string]bool{}
	for seed := range uint64(20) {
		d := sched.NewDet(seed, t0)
		var log []string
		d.Schedule(func() { log = append(log, "task") })
		d.Go(func() { log = append(log, "coroutine") })
		d.Settle()
		d.Close()
		if len(log) != 2 {
			t.Fatalf("seed %d ran %v", seed, log)
		}
		firsts[log[0]] = true
	}
	if !firsts["task"] || !firsts["coroutine"] {
		t.Errorf("over 20 seeds only %v ran first", firsts)
	}
}

// TestAfterCloseNothingRuns: a coroutine started after Close never runs,
// and what a killed coroutine's deferred calls queue is dropped.
func TestAfterCloseNothingRuns(t *testing.T) {
	d := sched.NewDet(2, t0)
	d.Go(func() {
		defer d.Schedule(func() { t.Error("work queued while closing ran") })
		d.Await(context.Background(), func() bool { return false })
	})
	d.Settle()
	d.Close()
	d.Go(func() { t.Error("a coroutine started after Close ran") })
	if d.Parked() != 0 {
		t.Errorf("%d coroutines parked after Close", d.Parked())
	}
	d.Settle()
}

// TestDriverAwaitEndsWithItsContext: the driver awaiting with an ended
// context returns at once instead of finding the scheduler stuck.
func TestDriverAwaitEndsWithItsContext(t *testing.T) {
	d := sched.NewDet(3, t0)
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	d.Await(ctx, func() bool { return false })
}

// TestTimeNeverMovesBack: advancing to an earlier time keeps the clock, and
// a timer armed with a negative duration is due now.
func TestTimeNeverMovesBack(t *testing.T) {
	d := sched.NewDet(4, t0)
	defer d.Close()
	d.AdvanceTo(t0.Add(-time.Hour))
	if !d.Now().Equal(t0) {
		t.Fatalf("AdvanceTo an earlier time moved the clock to %v", d.Now())
	}
	tm := d.NewTimer(-time.Second)
	d.AdvanceTo(t0)
	select {
	case at := <-tm.C():
		if !at.Equal(t0) {
			t.Errorf("a negative timer fired at %v, want now", at)
		}
	default:
		t.Error("a negative timer did not fire at once")
	}
}

// TestSameInstantFiresInArmingOrder: each instant settles before the next;
// timers due at the same instant are queued in the order they were armed
// (whatever order the heap holds them in) and the seed picks among them, so
// seed 5 gives this order and no other: the simulation's recorded seeds
// depend on it.
func TestSameInstantFiresInArmingOrder(t *testing.T) {
	d := sched.NewDet(5, t0)
	defer d.Close()
	var got []string
	for _, name := range []string{"a", "b", "c", "d", "e"} {
		d.AfterFunc(2*time.Second, func() { got = append(got, name) })
		d.AfterFunc(time.Second, func() { got = append(got, "early-"+name) })
	}
	d.Advance(2 * time.Second)
	want := []string{"early-d", "early-a", "early-e", "early-c", "early-b", "d", "c", "e", "a", "b"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("firing order (-want +got):\n%s", diff)
	}
}

// TestStopAndResetOfAFiredTimer: Stop of a timer that fired reports false
// and leaves the other timers pending; Reset reports whether the timer was
// pending, drops an undelivered tick and re-arms it from now.
func TestStopAndResetOfAFiredTimer(t *testing.T) {
	d := sched.NewDet(6, t0)
	defer d.Close()
	var fired []string
	tm := d.NewTimer(time.Second)
	for _, s := range []int{2, 3, 4} {
		d.AfterFunc(time.Duration(s)*time.Second, func() { fired = append(fired, d.Now().Sub(t0).String()) })
	}
	d.Advance(time.Second)
	if tm.Stop() {
		t.Error("Stop of a fired timer reported it pending")
	}
	if d.Pending() != 3 {
		t.Fatalf("%d timers pending after stopping a fired one, want 3", d.Pending())
	}
	if tm.Reset(2 * time.Second) {
		t.Error("Reset of a fired timer reported it pending")
	}
	if len(tm.C()) != 0 {
		t.Error("Reset kept the undelivered tick")
	}
	if !tm.Reset(3 * time.Second) {
		t.Error("Reset of a pending timer reported it not pending")
	}
	d.Advance(3 * time.Second)
	if diff := cmp.Diff([]string{"2s", "3s", "4s"}, fired); diff != "" {
		t.Errorf("the other timers fired (-want +got):\n%s", diff)
	}
	select {
	case at := <-tm.C():
		if got := at.Sub(t0); got != 4*time.Second {
			t.Errorf("the reset timer fired at %v, want 4s", got)
		}
	default:
		t.Error("the reset timer did not fire")
	}
	af := d.AfterFunc(time.Second, func() { t.Error("a stopped AfterFunc ran") })
	if !af.Reset(time.Second) || !af.Stop() {
		t.Error("an AfterFunc timer's Reset and Stop do not report it pending")
	}
	d.Advance(time.Minute)
}
