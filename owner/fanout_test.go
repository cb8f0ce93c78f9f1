package owner

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/sched"
)

var detStart = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// newDet returns a Det closed when the test ends, unless the test failed:
// a Det whose driver is stuck cannot be closed.
func newDet(t *testing.T, seed uint64) *sched.Det {
	det := sched.NewDet(seed, detStart)
	t.Cleanup(func() {
		if !t.Failed() {
			det.Close()
		}
	})
	return det
}

// guarded runs fn (which drives a Det) and fails the test if it has not
// returned within guardTimeout: a wait that blocks outside the scheduler
// holds the turn and would otherwise hang the test binary.
func guarded(t *testing.T, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(guardTimeout):
		t.Fatal("the scheduler did not come back: something blocked while holding the turn")
	}
}

// TestTurnMutexWaitsThroughTheRuntime: on a Det, a Lock of a held
// turnMutex parks its coroutine (other work runs) until the holder
// unlocks; TryLock does not wait and counts as held.
func TestTurnMutexWaitsThroughTheRuntime(t *testing.T) {
	det := newDet(t, 1)
	var m turnMutex
	var log []string
	release := false
	det.Go(func() {
		lock(t, &m, det)
		log = append(log, "a locked")
		det.Await(context.Background(), func() bool { return release })
		log = append(log, "a unlocks")
		m.Unlock()
	})
	guarded(t, det.Settle)
	det.Go(func() {
		lock(t, &m, det)
		log = append(log, "b locked")
		m.Unlock()
	})
	guarded(t, det.Settle)
	if diff := cmp.Diff([]string{"a locked"}, log); diff != "" {
		t.Fatalf("while a holds the lock (-want +got):\n%s", diff)
	}
	if got := det.Parked(); got != 2 {
		t.Fatalf("%d coroutines parked, want 2 (a on its release, b on the lock)", got)
	}
	release = true
	guarded(t, det.Settle)
	if diff := cmp.Diff([]string{"a locked", "a unlocks", "b locked"}, log); diff != "" {
		t.Fatalf("after a unlocks (-want +got):\n%s", diff)
	}

	if !m.TryLock() {
		t.Fatal("TryLock of a free mutex failed")
	}
	if m.TryLock() {
		t.Fatal("TryLock of a held mutex succeeded")
	}
	det.Go(func() {
		lock(t, &m, det)
		log = append(log, "c locked")
		m.Unlock()
	})
	guarded(t, det.Settle)
	if len(log) != 3 {
		t.Fatalf("c took a mutex held by TryLock: %v", log)
	}
	m.Unlock()
	guarded(t, det.Settle)
	if diff := cmp.Diff("c locked", log[len(log)-1]); diff != "" {
		t.Fatalf("after TryLock's unlock (-want +got):\n%s", diff)
	}
}

// lock takes m's turn, failing t if it cannot.
func lock(t *testing.T, m *turnMutex, rt sched.Runtime) {
	if err := m.Lock(context.Background(), rt); err != nil {
		t.Errorf("Lock: %v", err)
	}
}

// TestTurnMutexLockEndsWithItsContext: a Lock waiting for a held
// turnMutex returns its context's error once the context ends, without
// the turn; the holder keeps it.
func TestTurnMutexLockEndsWithItsContext(t *testing.T) {
	det := newDet(t, 3)
	var m turnMutex
	if !m.TryLock() {
		t.Fatal("TryLock of a free mutex failed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	var got error
	returned := false
	det.Go(func() {
		got = m.Lock(ctx, det)
		returned = true
	})
	guarded(t, det.Settle)
	if returned {
		t.Fatalf("Lock of a held mutex returned: %v", got)
	}
	cancel()
	guarded(t, det.Settle)
	if !returned || !errors.Is(got, context.Canceled) {
		t.Fatalf("Lock after its context ended: returned %v, %v; want context.Canceled", returned, got)
	}
	if m.TryLock() {
		t.Fatal("the holder lost the turn to a Lock that gave up")
	}
	m.Unlock()
	if err := m.Lock(ctx, det); !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with an ended context: %v, want context.Canceled", err)
	}
}

// TestGroupWaitsThroughTheRuntime: a group's Wait on a Det runs its
// members (which wait on virtual time) until the last has returned.
func TestGroupWaitsThroughTheRuntime(t *testing.T) {
	det := newDet(t, 2)
	var g group
	var ended []time.Duration
	for i := range 3 {
		g.Go(det, func() {
			tm := det.NewTimer(time.Duration(i+1) * time.Second)
			det.Await(context.Background(), func() bool { return len(tm.C()) > 0 })
			ended = append(ended, det.Now().Sub(detStart))
		})
	}
	guarded(t, func() { g.Wait(det) })
	if diff := cmp.Diff([]time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, ended); diff != "" {
		t.Fatalf("members ended at (-want +got):\n%s", diff)
	}
	if got := det.Now().Sub(detStart); got != 3*time.Second {
		t.Fatalf("Wait returned at %v, want when the last member returned (3s)", got)
	}

	// From a coroutine: Wait parks it, the driver runs the members.
	var inner group
	waited := false
	det.Go(func() {
		inner.Go(det, func() {
			tm := det.NewTimer(time.Second)
			det.Await(context.Background(), func() bool { return len(tm.C()) > 0 })
		})
		inner.Wait(det)
		waited = true
	})
	guarded(t, func() { det.RunUntil(func() bool { return waited }) })
	if got := det.Now().Sub(detStart); got != 4*time.Second {
		t.Fatalf("the coroutine's Wait returned at %v, want 4s", got)
	}
}

// countingRuntime is the real runtime counting the goroutines it starts.
type countingRuntime struct {
	sched.Real
	started atomic.Int64
}

func (r *countingRuntime) Go(fn func()) {
	r.started.Add(1)
	go fn()
}

// TestLimitedEachRunsOnAsManyGoroutinesAsSlots: a limited fan-out of 100
// calls over 4 slots starts 4 goroutines, each taking the next call as it
// finishes one (a goroutine a call made a restore's thousand forks start a
// thousand); every call runs once and none is left counted as queued. With
// every slot held elsewhere and the context ended, none runs and the calls
// it counted as queued are counted no more.
func TestLimitedEachRunsOnAsManyGoroutinesAsSlots(t *testing.T) {
	rt := &countingRuntime{}
	o := &Owner{rt: rt, limiter: actors.NewLimiter(4)}
	var mu sync.Mutex
	ran := map[int]int{}
	o.each(context.Background(), 100, true, func(i int) {
		mu.Lock()
		defer mu.Unlock()
		ran[i]++
	})
	if got := rt.started.Load(); got != 4 {
		t.Errorf("%d goroutines started for 100 calls over 4 slots, want 4", got)
	}
	for i := range 100 {
		if ran[i] != 1 {
			t.Errorf("call %d ran %d times, want once", i, ran[i])
		}
	}
	if n, _ := o.limiter.Waiting(); n != 0 {
		t.Errorf("%d calls left counted as queued, want 0", n)
	}

	for range 4 {
		if err := o.limiter.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	o.each(ctx, 10, true, func(i int) { t.Errorf("call %d ran with every slot held and the context ended", i) })
	if n, _ := o.limiter.Waiting(); n != 0 {
		t.Errorf("%d calls left counted as queued after the fan-out gave up, want 0", n)
	}
}

// TestLimitedEachCountsEachCallQueuedOnce: a call beyond the goroutines'
// first is counted as queued from the start and stops being counted as it
// takes a slot, once: with two slots, three calls, both slots held
// elsewhere, three are queued; as the slots come free the goroutines' two
// calls run, one call stays queued, and once it runs none does.
func TestLimitedEachCountsEachCallQueuedOnce(t *testing.T) {
	l := actors.NewLimiter(2)
	o := &Owner{rt: sched.Real{}, limiter: l}
	for range 2 {
		if err := l.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	started := make(chan int, 3)
	release := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		o.each(context.Background(), 3, true, func(i int) {
			started <- i
			<-release[i]
		})
	}()
	waitQueued := func(want int) {
		t.Helper()
		for n, changed := l.Waiting(); n != want; n, changed = l.Waiting() {
			select {
			case <-changed:
			case <-time.After(time.Minute): // a hang guard only
				t.Fatalf("%d calls queued, want %d", n, want)
			}
		}
	}
	waitQueued(3)
	l.Release()
	l.Release()
	first, second := <-started, <-started
	waitQueued(1)
	close(release[first])
	if third := <-started; third != 2 {
		t.Fatalf("call %d ran third, want 2", third)
	}
	if n, _ := l.Waiting(); n != 0 {
		t.Errorf("%d calls counted as queued with every call run, want 0", n)
	}
	close(release[second])
	close(release[2])
	<-done
}
