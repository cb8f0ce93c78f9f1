package actors

import "context"

// Limiter bounds how many checkpoint provider calls (snapshot, fork, park
// and retire stops, snapshot deletes) run at once: checkpoint.parallelism.
type Limiter struct {
	slots chan struct{}
}

// NewLimiter allows n concurrent calls (at least 1).
func NewLimiter(n int) *Limiter {
	if n < 1 {
		n = 1
	}
	return &Limiter{slots: make(chan struct{}, n)}
}

// Acquire waits for a slot or for ctx to end.
func (l *Limiter) Acquire(ctx context.Context) error {
	select {
	case l.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Release frees a slot taken by Acquire.
func (l *Limiter) Release() { <-l.slots }

// Cap is the bound.
func (l *Limiter) Cap() int { return cap(l.slots) }
