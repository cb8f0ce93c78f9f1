package actors

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// brokenTestBound bounds a wait that only a broken dispatcher makes long:
// it is not a synchronisation, and no outcome depends on it.
const brokenTestBound = 30 * time.Second

// within waits for ch to yield (or close), failing the test if it does not
// within brokenTestBound.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(brokenTestBound):
		t.Fatalf("%s: nothing within %v", what, brokenTestBound)
		panic("unreachable")
	}
}

// Runs go to the workers while they keep up; with every worker busy and the
// queue full, a run gets its own goroutine instead of waiting.
func TestDispatcherNeverMakesARunWait(t *testing.T) {
	d := NewDispatcher(1, 1, 10)
	defer d.Stop()
	block := make(chan struct{})
	started := make(chan struct{})
	d.Schedule(func() { close(started); <-block }) // occupies the worker
	within(t, started, "the first run")
	queued := make(chan struct{})
	d.Schedule(func() { close(queued) }) // fills the queue
	ran := make(chan struct{})
	d.Schedule(func() { close(ran) }) // neither: its own goroutine
	within(t, ran, "the run over a full queue (it waited for the worker)")
	select {
	case <-queued:
		t.Fatal("the queued run ran while the only worker was busy")
	default:
	}
	close(block)
	within(t, queued, "the queued run once the worker was free")
	if d.Throughput() != 10 {
		t.Errorf("Throughput() = %d, want 10", d.Throughput())
	}
}

// Stop leaves no run behind: queued runs and later ones still run, each
// once.
func TestDispatcherStopRunsWhatIsQueued(t *testing.T) {
	d := NewDispatcher(1, 8, 1)
	block := make(chan struct{})
	started := make(chan struct{})
	d.Schedule(func() { close(started); <-block })
	within(t, started, "the first run")
	ran := make(chan int, 8)
	for i := range 3 {
		d.Schedule(func() { ran <- i })
	}
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	close(block)
	within(t, stopped, "Stop")
	d.Schedule(func() { ran <- 3 })
	got := make([]bool, 4)
	for range 4 {
		got[within(t, ran, "a queued or later run")] = true
	}
	if diff := cmp.Diff([]bool{true, true, true, true}, got); diff != "" {
		t.Errorf("runs 0-2 (queued at the stop) and 3 (after it) (-want +got):\n%s", diff)
	}
	d.Stop() // twice is fine
	select {
	case i := <-ran:
		t.Errorf("run %d ran twice", i)
	default:
	}
}

// Runs still queued when the workers are gone are not dropped: Stop gives
// each its own goroutine. (With no worker at all, every run stays queued
// until Stop, whatever the scheduler does.)
func TestDispatcherStopDrainsTheQueue(t *testing.T) {
	d := &Dispatcher{runs: make(chan func(), 8), throughput: 1, done: make(chan struct{})}
	ran := make(chan int, 8)
	for i := range 3 {
		d.Schedule(func() { ran <- i })
	}
	select {
	case i := <-ran:
		t.Fatalf("run %d ran before the stop with no worker to take it", i)
	default:
	}
	d.Stop()
	got := make([]bool, 3)
	for range 3 {
		got[within(t, ran, "a run queued at the stop")] = true
	}
	if diff := cmp.Diff([]bool{true, true, true}, got); diff != "" {
		t.Errorf("runs queued at the stop (-want +got):\n%s", diff)
	}
}
