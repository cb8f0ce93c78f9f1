package actors

import "sync"

// Dispatcher runs actors' mailboxes on a few long-lived goroutines instead
// of a fresh goroutine per mailbox run (protoactor's default). A fresh
// goroutine starts on a small stack that every run grows again (the
// profile of a request showed a tenth of its CPU copying stacks); a worker
// keeps the stack it grew. When every worker is busy and the queue is
// full, a run gets its own goroutine as before, so a burst never waits on a
// worker and no mailbox run can block another.
type Dispatcher struct {
	runs       chan func()
	throughput int
	// mu orders Schedule's enqueue before Stop's drain, so that no run is
	// left in the queue once the workers are gone.
	mu      sync.RWMutex
	stopped bool
	done    chan struct{}
	wg      sync.WaitGroup
}

// NewDispatcher starts workers goroutines (at least 1) taking mailbox runs
// from a queue of queue runs; throughput is how many messages a run
// processes before it yields.
func NewDispatcher(workers, queue, throughput int) *Dispatcher {
	d := &Dispatcher{runs: make(chan func(), max(queue, 0)), throughput: max(throughput, 1), done: make(chan struct{})}
	for range max(workers, 1) {
		d.wg.Add(1)
		go d.work()
	}
	return d
}

func (d *Dispatcher) work() {
	defer d.wg.Done()
	for {
		select {
		case fn := <-d.runs:
			fn()
		case <-d.done:
			return
		}
	}
}

// Schedule runs fn on a worker, or on its own goroutine when none is free
// (or the dispatcher is stopped).
func (d *Dispatcher) Schedule(fn func()) {
	d.mu.RLock()
	if !d.stopped {
		select {
		case d.runs <- fn:
			d.mu.RUnlock()
			return
		default:
		}
	}
	d.mu.RUnlock()
	go fn()
}

// Throughput is the messages a mailbox processes per run.
func (d *Dispatcher) Throughput() int { return d.throughput }

// Stop ends the workers once their current runs return; runs still queued
// get their own goroutines, and later ones too.
func (d *Dispatcher) Stop() {
	d.mu.Lock()
	if d.stopped {
		d.mu.Unlock()
		return
	}
	d.stopped = true
	d.mu.Unlock()
	close(d.done)
	d.wg.Wait()
	for {
		select {
		case fn := <-d.runs:
			go fn()
		default:
			return
		}
	}
}
