package actors_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/sandboxowner/owner/actors"
)

// until yields until cond holds: the workers' counters change on their own
// goroutines. A counter that never gets there spins until the hang guard.
func until(cond func() bool) {
	for !cond() {
		runtime.Gosched()
	}
}

// A run goes to an idle worker instead of a new goroutine; a run while
// every worker is busy gets a worker of its own at once (it never waits
// behind a blocked run); no more than maxIdle wait for work, the others
// end; Stop ends the idle ones, and a run after it still runs.
func TestWorkers(t *testing.T) {
	defer hangGuard()()
	w := actors.NewWorkers(2)
	defer w.Stop()
	ran := make(chan int, 8)
	w.Go(func() { ran <- 1 })
	<-ran
	until(func() bool { return w.Idle() == 1 })
	w.Go(func() { ran <- 2 })
	<-ran
	until(func() bool { return w.Idle() == 1 })
	if live := w.Live(); live != 1 {
		t.Fatalf("%d workers after two runs one after the other, want the one reused", live)
	}

	release := make(chan struct{})
	var started sync.WaitGroup
	started.Add(3)
	for range 3 {
		w.Go(func() { started.Done(); <-release })
	}
	// Each blocked run got a worker: all three run at once.
	started.Wait()
	if live := w.Live(); live != 3 {
		t.Fatalf("%d workers for three blocked runs, want 3", live)
	}
	close(release)
	until(func() bool { return w.Live() == 2 && w.Idle() == 2 })

	w.Stop()
	until(func() bool { return w.Live() == 0 })
	if idle := w.Idle(); idle != 0 {
		t.Fatalf("%d workers idle once Stop ended them all, want 0", idle)
	}
	w.Go(func() { ran <- 3 })
	if got := <-ran; got != 3 {
		t.Fatalf("a run after Stop: %d", got)
	}
	until(func() bool { return w.Live() == 0 })
}
