package sched

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"time"

	"github.com/sandboxowner/owner/clock"
)

// ErrStuck is what Det panics with when the goroutine that drives it waits
// for something nothing can bring about any more: no work is runnable and no
// timer is pending. The simulation recovers it and reports the run.
var ErrStuck = errors.New("deterministic scheduler: nothing runnable, no timer pending, and the awaited condition never held")

// Det is a deterministic runtime and clock. Exactly one piece of work runs
// at a time: the goroutine that drives it (the driver), a task (a mailbox
// run, a timer's function), or one coroutine (a Go'd function, which runs
// on its own goroutine but only while it holds the turn). Which runnable
// piece runs next is drawn from the seed; time is virtual and moves only
// when nothing is runnable (to the next timer) or when the driver moves
// it. So one seed gives one run, whatever the Go scheduler does.
//
// Det is not safe for use by goroutines it does not run: everything that
// touches it must be the driver, a task or a coroutine of it.
type Det struct {
	rng *rand.Rand
	now time.Time
	seq uint64

	tasks  []func()
	timers timerHeap
	// parked are the coroutines waiting for their turn: new ones (ready
	// nil) and those in Await.
	parked []*coro
	cur    *coro
	yield  chan struct{}
	closed bool

	// Steps counts the choices made: a cheap fingerprint of a run.
	Steps uint64
}

type coro struct {
	ctx    context.Context
	ready  func() bool
	resume chan bool // true: run on; false: exit
}

// NewDet returns a scheduler whose choices come from seed and whose clock
// starts at start.
func NewDet(seed uint64, start time.Time) *Det {
	return &Det{rng: rand.New(rand.NewPCG(seed, 0x5eed)), now: start, yield: make(chan struct{})}
}

// --- Runtime ---

// Go makes fn a coroutine: it runs when the scheduler gives it the turn,
// and holds the turn until it awaits or returns.
func (d *Det) Go(fn func()) {
	if d.closed {
		return
	}
	c := &coro{resume: make(chan bool)}
	d.parked = append(d.parked, c)
	go func() {
		if !<-c.resume {
			d.yield <- struct{}{}
			return
		}
		// Goexit (a kill in Await) runs this too.
		defer func() { d.yield <- struct{}{} }()
		fn()
	}()
}

// Await hands the turn on until ready holds or ctx is done. Called by the
// driver (or a task), it runs the scheduler itself until then, and panics
// with ErrStuck if that can never happen.
func (d *Det) Await(ctx context.Context, ready func() bool) {
	done := func() bool { return (ctx != nil && ctx.Err() != nil) || ready() }
	if done() {
		return
	}
	c := d.cur
	if c == nil {
		d.RunUntil(done)
		return
	}
	c.ctx, c.ready = ctx, ready
	d.parked = append(d.parked, c)
	d.cur = nil
	d.yield <- struct{}{}
	if !<-c.resume {
		runtime.Goexit()
	}
}

// Schedule queues fn as a task (protoactor's mailbox dispatcher).
func (d *Det) Schedule(fn func()) { d.tasks = append(d.tasks, fn) }

// Throughput is how many messages a mailbox run takes: all of them, since a
// run never yields anyway.
func (d *Det) Throughput() int { return 1 << 30 }

// --- running ---

func (c *coro) runnable() bool {
	return c.ready == nil || (c.ctx != nil && c.ctx.Err() != nil) || c.ready()
}

// Step runs one runnable piece of work, chosen by the seed, and reports
// whether there was one. Time does not move.
func (d *Det) Step() bool {
	var runnable []int
	for i, c := range d.parked {
		if c.runnable() {
			runnable = append(runnable, i)
		}
	}
	n := len(d.tasks) + len(runnable)
	if n == 0 {
		return false
	}
	d.Steps++
	k := d.rng.IntN(n)
	if k < len(d.tasks) {
		fn := d.tasks[k]
		d.tasks = append(d.tasks[:k], d.tasks[k+1:]...)
		fn()
		return true
	}
	i := runnable[k-len(d.tasks)]
	c := d.parked[i]
	d.parked = append(d.parked[:i], d.parked[i+1:]...)
	c.ready, c.ctx = nil, nil
	prev := d.cur
	d.cur = c
	c.resume <- true
	<-d.yield
	d.cur = prev
	return true
}

// Settle runs work until none is runnable, without moving time.
func (d *Det) Settle() {
	for d.Step() {
	}
}

// RunUntil runs work, moving time to the next timer whenever none is
// runnable, until cond holds. It panics with ErrStuck when cond can no
// longer come true.
func (d *Det) RunUntil(cond func() bool) {
	for !cond() {
		if d.Step() {
			continue
		}
		if !d.fireNext() {
			panic(fmt.Errorf("%w (at %s, %d coroutines parked)", ErrStuck, d.now.Format(time.RFC3339Nano), len(d.parked)))
		}
	}
}

// AdvanceTo moves time to t, firing every timer due by then in order (each
// instant settled before the next), and settles.
func (d *Det) AdvanceTo(t time.Time) {
	d.Settle()
	for len(d.timers) > 0 && !d.timers[0].at.After(t) {
		d.fireNext()
		d.Settle()
	}
	if t.After(d.now) {
		d.now = t
	}
	d.Settle()
}

// Advance is AdvanceTo(Now()+dt); it returns the new time.
func (d *Det) Advance(dt time.Duration) time.Time {
	d.AdvanceTo(d.now.Add(dt))
	return d.now
}

// Set is AdvanceTo (the clock.Manual spelling).
func (d *Det) Set(t time.Time) { d.AdvanceTo(t) }

// fireNext moves time to the earliest pending timer and queues every timer
// due then, in the order they were armed; it reports whether there was one.
func (d *Det) fireNext() bool {
	if len(d.timers) == 0 {
		return false
	}
	at := d.timers[0].at
	if at.After(d.now) {
		d.now = at
	}
	for len(d.timers) > 0 && !d.timers[0].at.After(at) {
		t := heap.Pop(&d.timers).(*detTimer)
		d.tasks = append(d.tasks, t.fire)
	}
	return true
}

// Close ends every parked coroutine (each exits from its Await, running its
// deferred calls while it holds the turn) and drops queued work. A run
// calls it at its end, so no goroutine outlives it.
func (d *Det) Close() {
	d.closed = true
	d.tasks = nil
	d.timers = nil
	for len(d.parked) > 0 {
		c := d.parked[0]
		d.parked = d.parked[1:]
		d.cur = c
		c.resume <- false
		<-d.yield
		d.cur = nil
		// Deferred calls may have queued work; none of it runs.
		d.tasks = nil
	}
}

// Parked is how many coroutines wait for their turn.
func (d *Det) Parked() int { return len(d.parked) }

// --- clock ---

// Now is the virtual time.
func (d *Det) Now() time.Time { return d.now }

// After returns the channel of a new timer of dt.
func (d *Det) After(dt time.Duration) <-chan time.Time { return d.NewTimer(dt).C() }

// NewTimer returns a timer whose channel gets the time once dt has passed.
func (d *Det) NewTimer(dt time.Duration) clock.Timer {
	t := &detTimer{d: d, c: make(chan time.Time, 1)}
	t.fire = func() {
		select {
		case t.c <- d.now:
		default:
		}
	}
	d.arm(t, dt)
	return t
}

// AfterFunc runs f as a task once dt has passed.
func (d *Det) AfterFunc(dt time.Duration, f func()) clock.Timer {
	t := &detTimer{d: d, fire: f}
	d.arm(t, dt)
	return t
}

// Pending is how many timers wait to fire.
func (d *Det) Pending() int { return len(d.timers) }

func (d *Det) arm(t *detTimer, dt time.Duration) {
	d.seq++
	t.at, t.seq = d.now.Add(max(dt, 0)), d.seq
	heap.Push(&d.timers, t)
}

type detTimer struct {
	d    *Det
	c    chan time.Time
	fire func()
	at   time.Time
	seq  uint64
	// index is the timer's place in the heap, -1 once fired or stopped.
	index int
}

func (t *detTimer) C() <-chan time.Time { return t.c }

func (t *detTimer) Stop() bool {
	if t.index < 0 {
		return false
	}
	heap.Remove(&t.d.timers, t.index)
	return true
}

func (t *detTimer) Reset(dt time.Duration) bool {
	was := t.Stop()
	if t.c != nil {
		select {
		case <-t.c:
		default:
		}
	}
	t.d.arm(t, dt)
	return was
}

type timerHeap []*detTimer

func (h timerHeap) Len() int { return len(h) }
func (h timerHeap) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timerHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i]; h[i].index = i; h[j].index = j }
func (h *timerHeap) Push(x any)   { t := x.(*detTimer); t.index = len(*h); *h = append(*h, t) }
func (h *timerHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	t.index = -1
	return t
}

// OrNil returns d as a Runtime, or nil for a nil d (so that a nil *Det is
// not passed on as a non-nil interface).
func (d *Det) OrNil() Runtime {
	if d == nil {
		return nil
	}
	return d
}
