package sched_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/sched"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// trace runs three coroutines that each log, wait on a shared counter and
// on timers, and returns what they logged in order.
func trace(seed uint64) []string {
	d := sched.NewDet(seed, t0)
	defer d.Close()
	var log []string
	counter, done := 0, 0
	for _, name := range []string{"a", "b", "c"} {
		d.Go(func() {
			defer func() { done++ }()
			for i := range 3 {
				log = append(log, fmt.Sprintf("%s%d@%s", name, i, d.Now().Sub(t0)))
				counter++
				target := counter + 1
				d.Await(context.Background(), func() bool { return counter >= target })
			}
		})
	}
	d.Schedule(func() { log = append(log, "task") })
	// A ticker wakes whoever waits last.
	var tick func()
	tick = func() {
		log = append(log, "tick")
		counter++
		d.AfterFunc(time.Second, tick)
	}
	d.AfterFunc(time.Second, tick)
	d.RunUntil(func() bool { return done == 3 })
	return log
}

func TestSameSeedSameRun(t *testing.T) {
	distinct := map[string]bool{}
	for seed := range uint64(20) {
		a, b := trace(seed), trace(seed)
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("seed %d ran differently twice (-first +second):\n%s", seed, diff)
		}
		distinct[strings.Join(a, " ")] = true
	}
	// The seed decides the interleaving: twenty seeds give more than one.
	if len(distinct) < 2 {
		t.Fatalf("20 seeds gave %d interleaving(s)", len(distinct))
	}
}

func TestOneAtATime(t *testing.T) {
	d := sched.NewDet(1, t0)
	defer d.Close()
	running := 0
	for range 50 {
		d.Go(func() {
			running++
			if running != 1 {
				t.Errorf("%d coroutines running at once", running)
			}
			running--
			d.Await(context.Background(), func() bool { return true })
			running++
			if running != 1 {
				t.Errorf("%d coroutines running at once", running)
			}
			running--
		})
	}
	d.Settle()
	if d.Parked() != 0 {
		t.Fatalf("%d coroutines still parked", d.Parked())
	}
}

func TestTimeMovesOnlyWhenIdle(t *testing.T) {
	d := sched.NewDet(3, t0)
	defer d.Close()
	var fired []time.Duration
	tm := d.NewTimer(2 * time.Second)
	d.AfterFunc(time.Second, func() { fired = append(fired, d.Now().Sub(t0)) })
	stopped := d.AfterFunc(time.Second, func() { t.Error("a stopped timer fired") })
	if !stopped.Stop() || stopped.Stop() {
		t.Fatal("Stop reports whether the timer was pending, once")
	}
	d.Go(func() {
		d.Await(context.Background(), func() bool { return len(tm.C()) > 0 })
		fired = append(fired, d.Now().Sub(t0))
	})
	d.Settle()
	if len(fired) != 0 || !d.Now().Equal(t0) {
		t.Fatalf("settling moved time or fired a timer: %v at %s", fired, d.Now())
	}
	d.RunUntil(func() bool { return len(fired) == 2 })
	if diff := cmp.Diff([]time.Duration{time.Second, 2 * time.Second}, fired); diff != "" {
		t.Fatal(diff)
	}
}

func TestAwaitEndsWithItsContext(t *testing.T) {
	d := sched.NewDet(4, t0)
	defer d.Close()
	ctx, cancel := context.WithCancel(context.Background())
	woke := false
	d.Go(func() {
		d.Await(ctx, func() bool { return false })
		woke = true
	})
	d.Settle()
	if woke {
		t.Fatal("woke before its context ended")
	}
	cancel()
	d.Settle()
	if !woke {
		t.Fatal("a cancelled context did not wake the coroutine")
	}
}

func TestStuckDriverPanics(t *testing.T) {
	d := sched.NewDet(5, t0)
	defer d.Close()
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, sched.ErrStuck) {
			t.Fatalf("recovered %v, want ErrStuck", err)
		}
	}()
	d.Await(context.Background(), func() bool { return false })
	t.Fatal("Await returned although nothing could make it ready")
}

func TestCloseEndsParkedCoroutines(t *testing.T) {
	d := sched.NewDet(6, t0)
	deferred := 0
	for range 3 {
		d.Go(func() {
			defer func() { deferred++ }()
			d.Await(context.Background(), func() bool { return false })
			t.Error("a killed coroutine went on")
		})
	}
	d.Go(func() { t.Error("a coroutine that never had the turn ran at Close") })
	// Let the first three park; the fourth is still new.
	d.RunUntil(func() bool { return d.Parked() == 4 && deferred == 0 })
	d.Close()
	if d.Parked() != 0 {
		t.Fatalf("%d coroutines still parked after Close", d.Parked())
	}
}

func TestAdvanceFiresInOrder(t *testing.T) {
	d := sched.NewDet(7, t0)
	defer d.Close()
	var got []string
	for _, s := range []int{3, 1, 2, 1} {
		d.AfterFunc(time.Duration(s)*time.Second, func() { got = append(got, fmt.Sprint(s, "@", d.Now().Sub(t0))) })
	}
	d.Advance(2 * time.Second)
	if diff := cmp.Diff([]string{"1@1s", "1@1s", "2@2s"}, got); diff != "" {
		t.Fatal(diff)
	}
	if d.Pending() != 1 || !d.Now().Equal(t0.Add(2*time.Second)) {
		t.Fatalf("pending %d at %s", d.Pending(), d.Now())
	}
}
