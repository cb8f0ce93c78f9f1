package actors_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/sched"
)

// TestLimiterOnADetParksItsWaiters: on a Det, an Acquire that finds no
// free slot parks its coroutine (the scheduler runs other work) until a
// Release; one whose context ends gives up with the context's error.
func TestLimiterOnADetParksItsWaiters(t *testing.T) {
	defer hangGuard()()
	det := sched.NewDet(1, roundStart)
	defer det.Close()
	l := actors.NewLimiterOn(1, det)
	var log []string
	release := false
	det.Go(func() {
		if err := l.Acquire(context.Background()); err != nil {
			t.Error(err)
			return
		}
		log = append(log, "a holds")
		det.Await(context.Background(), func() bool { return release })
		l.Release()
	})
	det.Settle()
	det.Go(func() {
		if err := l.Acquire(context.Background()); err != nil {
			t.Error(err)
			return
		}
		log = append(log, "b holds")
		l.Release()
	})
	ctx, cancel := context.WithCancel(context.Background())
	var cErr error
	det.Go(func() { cErr = l.Acquire(ctx) })
	det.Settle()
	if diff := cmp.Diff([]string{"a holds"}, log); diff != "" {
		t.Fatalf("with the one slot held (-want +got):\n%s", diff)
	}
	if n, _ := l.Waiting(); n != 2 {
		t.Fatalf("%d callers waiting for a slot, want 2", n)
	}
	cancel()
	det.Settle()
	if !errors.Is(cErr, context.Canceled) {
		t.Fatalf("Acquire whose context ended = %v, want Canceled", cErr)
	}
	if n, _ := l.Waiting(); n != 1 {
		t.Fatalf("%d callers waiting after one gave up, want 1", n)
	}
	release = true
	det.Settle()
	if diff := cmp.Diff([]string{"a holds", "b holds"}, log); diff != "" {
		t.Fatalf("after the release (-want +got):\n%s", diff)
	}
}

// TestLimiterOnADetFreeSlotWinsOverAnEndedContext: a waiter that finds
// both a free slot and its context ended when it gets the turn takes the
// slot, every time (not select's coin), so a seed replays.
func TestLimiterOnADetFreeSlotWinsOverAnEndedContext(t *testing.T) {
	defer hangGuard()()
	for i := range 32 {
		det := sched.NewDet(uint64(i), roundStart)
		l := actors.NewLimiterOn(1, det)
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		err := errors.New("still waiting")
		det.Go(func() { err = l.Acquire(ctx) })
		det.Settle()
		cancel()
		l.Release()
		det.Settle()
		det.Close()
		if err != nil {
			t.Fatalf("run %d: Acquire with a free slot and an ended context = %v, want the slot", i, err)
		}
	}
}

// TestLimiterOnADetWaitsOnVirtualTime: the driver's own Acquire runs the
// scheduler until a holder releases, at the holder's virtual time.
func TestLimiterOnADetWaitsOnVirtualTime(t *testing.T) {
	defer hangGuard()()
	det := sched.NewDet(2, roundStart)
	defer det.Close()
	l := actors.NewLimiterOn(1, det)
	det.Go(func() {
		if err := l.Acquire(context.Background()); err != nil {
			t.Error(err)
			return
		}
		tm := det.NewTimer(time.Minute)
		det.Await(context.Background(), func() bool { return len(tm.C()) > 0 })
		l.Release()
	})
	det.Settle()
	if err := l.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := det.Now().Sub(roundStart); got != time.Minute {
		t.Fatalf("the driver got the slot at %v, want when the holder released it (1m)", got)
	}
}

// TestLimiterQueuedCalls: calls Queue counted show as waiting until their
// AcquireQueued takes a slot (at once when one is free, after a wait
// otherwise) or gives up, and those never asked for stop being counted
// when unqueued; a watcher's channel closes at every change of the count.
func TestLimiterQueuedCalls(t *testing.T) {
	defer hangGuard()()
	det := sched.NewDet(3, roundStart)
	defer det.Close()
	l := actors.NewLimiterOn(1, det)
	unqueue := l.Queue(3)
	n, changed := l.Waiting()
	if n != 3 {
		t.Fatalf("%d waiting after Queue(3), want 3", n)
	}
	if err := l.AcquireQueued(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !sched.Closed(changed) {
		t.Fatal("the watcher's channel stayed open as a queued call took a slot")
	}
	n, changed = l.Waiting()
	if n != 2 {
		t.Fatalf("%d waiting once a queued call holds the slot, want 2", n)
	}
	var got error = errors.New("still waiting")
	det.Go(func() { got = l.AcquireQueued(context.Background()) })
	det.Settle()
	if n, _ := l.Waiting(); n != 2 || got == nil || sched.Closed(changed) {
		t.Fatalf("a queued call waiting for the held slot: %d waiting (want 2), err %v (want none yet), watcher told %v (want not)", n, got, sched.Closed(changed))
	}
	l.Release()
	det.Settle()
	if got != nil {
		t.Fatalf("AcquireQueued after the release = %v, want the slot", got)
	}
	if n, _ := l.Waiting(); n != 1 {
		t.Fatalf("%d waiting once the second holds the slot, want 1", n)
	}
	unqueue(1)
	if n, _ := l.Waiting(); n != 0 {
		t.Fatalf("%d waiting after the last queued call was unqueued, want 0", n)
	}
	unqueue(0)
	if n, _ := l.Waiting(); n != 0 {
		t.Fatalf("%d waiting after unqueueing none, want 0", n)
	}
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	l.Queue(1)
	if err := l.AcquireQueued(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("AcquireQueued with the slot held and its context ended = %v, want Canceled", err)
	}
	if n, _ := l.Waiting(); n != 0 {
		t.Fatalf("%d waiting after a queued call gave up, want 0", n)
	}
}

// TestLimiterCapacity: a limiter of n allows n calls at once, and one of
// less than one allows one rather than none.
func TestLimiterCapacity(t *testing.T) {
	for n, want := range map[int]int{-1: 1, 0: 1, 1: 1, 3: 3} {
		l := actors.NewLimiter(n)
		if got := l.Cap(); got != want {
			t.Errorf("NewLimiter(%d).Cap() = %d, want %d", n, got, want)
		}
		for range want {
			if err := l.Acquire(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		if err := l.Acquire(ended); err == nil {
			t.Errorf("NewLimiter(%d) gave a slot beyond %d", n, want)
		}
	}
}

// hangGuard crashes the test binary when the test has not returned within
// a minute, and returns what disarms it: a hang guard only (these tests
// take milliseconds). A coroutine that blocks outside Await holds the Det's
// turn and its driver waits forever, which would otherwise last until go
// test's -timeout (the mutants script's run waited 12.5 minutes for each of
// the limiter's wait conditions inverted).
func hangGuard() (disarm func()) {
	tm := time.AfterFunc(time.Minute, func() { panic("hang guard: the test did not return within a minute") })
	return func() { tm.Stop() }
}
