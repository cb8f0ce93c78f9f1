package actors

import (
	"sync"
	"testing"
)

// Runs go to the workers while they keep up; with every worker busy and the
// queue full, a run gets its own goroutine instead of waiting.
func TestDispatcherNeverMakesARunWait(t *testing.T) {
	d := NewDispatcher(1, 1, 10)
	defer d.Stop()
	block := make(chan struct{})
	started := make(chan struct{})
	d.Schedule(func() { close(started); <-block }) // occupies the worker
	<-started
	queued := make(chan struct{})
	d.Schedule(func() { close(queued) }) // fills the queue
	ran := make(chan struct{})
	d.Schedule(func() { close(ran) }) // neither: its own goroutine
	<-ran
	select {
	case <-queued:
		t.Fatal("the queued run ran while the only worker was busy")
	default:
	}
	close(block)
	<-queued
	if d.Throughput() != 10 {
		t.Errorf("Throughput() = %d, want 10", d.Throughput())
	}
}

// Stop leaves no run behind: queued runs and later ones still run.
func TestDispatcherStopRunsWhatIsQueued(t *testing.T) {
	d := NewDispatcher(1, 8, 1)
	block := make(chan struct{})
	started := make(chan struct{})
	d.Schedule(func() { close(started); <-block })
	<-started
	var wg sync.WaitGroup
	wg.Add(4)
	for range 3 {
		d.Schedule(wg.Done)
	}
	stopped := make(chan struct{})
	go func() { d.Stop(); close(stopped) }()
	close(block)
	<-stopped
	d.Schedule(wg.Done)
	wg.Wait()
	d.Stop() // twice is fine
}
