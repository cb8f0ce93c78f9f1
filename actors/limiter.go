package actors

import (
	"context"
	"sync"

	"github.com/sandboxowner/owner/sched"
)

// Limiter bounds how many checkpoint provider calls (snapshot, fork, park
// and retire stops, snapshot deletes) run at once: checkpoint.parallelism.
type Limiter struct {
	slots chan struct{}
	rt    sched.Runtime

	// mu guards waiting and changed, which let a test see every caller
	// accounted for (holding a slot or waiting for one) without sleeping.
	mu      sync.Mutex
	waiting int
	changed chan struct{}
	// watched: changed was handed out since it was made, so a change must
	// close it; one nobody holds is kept (a fan-out changes the count
	// twice a call).
	watched bool
}

// NewLimiter allows n concurrent calls (at least 1).
func NewLimiter(n int) *Limiter { return NewLimiterOn(n, nil) }

// NewLimiterOn is NewLimiter whose callers wait through rt (nil: block).
func NewLimiterOn(n int, rt sched.Runtime) *Limiter {
	if n < 1 {
		n = 1
	}
	return &Limiter{slots: make(chan struct{}, n), rt: sched.Or(rt), changed: make(chan struct{})}
}

// Acquire waits for a slot or for ctx to end.
func (l *Limiter) Acquire(ctx context.Context) error {
	if l.tryTake() {
		return nil
	}
	l.wait(1)
	defer l.wait(-1)
	return l.acquireSlow(ctx)
}

// acquireSlow waits for a slot or for ctx to end.
func (l *Limiter) acquireSlow(ctx context.Context) error {
	l.rt.Await(ctx, func() bool { return len(l.slots) < cap(l.slots) })
	// A free slot wins over an ended context, in a fixed order (select
	// would pick at random).
	if l.tryTake() {
		return nil
	}
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Queue counts n calls as waiting for a slot before their callers ask
// for one with AcquireQueued, and returns a func that stops counting
// those of them never asked for (their fan-out ended first): a fan-out
// that runs its calls on fewer goroutines than it has calls shows every
// call not yet at the provider as queued, as one goroutine a call did.
func (l *Limiter) Queue(n int) (unqueue func(left int)) {
	l.wait(n)
	return func(left int) { l.wait(-left) }
}

// AcquireQueued is Acquire for one call Queue counted: it stops being
// counted once it holds a slot or ctx ended. A slot free at once is taken
// without touching the count's lock until then.
func (l *Limiter) AcquireQueued(ctx context.Context) error {
	defer l.wait(-1)
	if l.tryTake() {
		return nil
	}
	return l.acquireSlow(ctx)
}

func (l *Limiter) tryTake() bool {
	select {
	case l.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (l *Limiter) wait(d int) {
	l.mu.Lock()
	l.waiting += d
	if l.watched {
		close(l.changed)
		l.changed, l.watched = make(chan struct{}), false
	}
	l.mu.Unlock()
}

// Release frees a slot taken by Acquire.
func (l *Limiter) Release() { <-l.slots }

// Cap is the bound.
func (l *Limiter) Cap() int { return cap(l.slots) }

// Waiting is how many callers wait for a slot, and a channel closed when
// that changes.
func (l *Limiter) Waiting() (int, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.watched = true
	return l.waiting, l.changed
}
