package actors

import (
	"context"
	"sync"
	"sync/atomic"
)

// Workers runs the sessions' effects (a tool call's function, a snapshot, a
// stop) on goroutines kept between runs, instead of a fresh goroutine for
// each: a fresh one starts on a small stack that every run grows again,
// where a kept one has the stack it grew. A run is handed to an idle worker
// or, when none is idle, to a goroutine of its own that becomes a worker
// once it is done; so a run never waits behind another (an effect may block
// for as long as a command runs). At most maxIdle workers wait for work; the
// others end. It is a sched.Runtime for the real runtime only (Await does
// nothing, as sched.Real's).
type Workers struct {
	// runs is unbuffered: a send succeeds only into an idle worker's hands.
	runs    chan func()
	maxIdle int32
	idle    atomic.Int32
	// live counts the workers' goroutines, running or idle.
	live     atomic.Int32
	done     chan struct{}
	stopOnce sync.Once
}

// NewWorkers returns a pool keeping at most maxIdle (at least 1) idle
// workers.
func NewWorkers(maxIdle int) *Workers {
	return &Workers{runs: make(chan func()), maxIdle: int32(max(maxIdle, 1)), done: make(chan struct{})}
}

// Go runs fn on an idle worker, or on a new one.
func (w *Workers) Go(fn func()) {
	select {
	case w.runs <- fn:
	default:
		w.live.Add(1)
		go w.run(fn)
	}
}

func (w *Workers) run(fn func()) {
	defer w.live.Add(-1)
	for {
		fn()
		if w.idle.Add(1) > w.maxIdle {
			w.idle.Add(-1)
			return
		}
		select {
		case fn = <-w.runs:
			w.idle.Add(-1)
		case <-w.done:
			w.idle.Add(-1)
			return
		}
	}
}

// Await returns at once: the caller blocks in its own select.
func (w *Workers) Await(context.Context, func() bool) {}

// Stop ends the idle workers, and each running one once its run returns;
// later runs get goroutines of their own, which end with them.
func (w *Workers) Stop() { w.stopOnce.Do(func() { close(w.done) }) }

// Idle is the number of workers waiting for work; Live, of workers.
func (w *Workers) Idle() int { return int(w.idle.Load()) }

// Live is the number of workers' goroutines, running or idle.
func (w *Workers) Live() int { return int(w.live.Load()) }
