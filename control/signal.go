package control

import "sync"

// broadcast wakes every goroutine waiting on the channel Wait returned
// before the last Fire: a channel closed on each change and replaced. The
// channel is made by the first Wait after a Fire, so that a Fire nobody
// waits for (every request entering and leaving an open gate) costs no
// allocation.
type broadcast struct {
	mu sync.Mutex
	ch chan struct{}
}

func newBroadcast() *broadcast { return &broadcast{} }

// Wait returns a channel closed at the next Fire. Take it before checking
// the condition, so a change in between is not missed.
func (b *broadcast) Wait() <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch == nil {
		b.ch = make(chan struct{})
	}
	return b.ch
}

// Fire wakes the current waiters.
func (b *broadcast) Fire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.ch != nil {
		close(b.ch)
		b.ch = nil
	}
}
