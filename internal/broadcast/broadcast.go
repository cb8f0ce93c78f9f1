// Package broadcast is a change signal that costs nothing when nobody
// waits: the gate's and the HTTP body budget's, which every data request
// fires.
package broadcast

import "sync/atomic"

// Broadcast wakes every goroutine waiting on the channel Wait returned
// before the last Fire: a channel closed on each change and replaced. The
// channel is made by the first Wait after a Fire, so that a Fire nobody
// waits for (every request entering and leaving an open gate) costs no
// allocation, and no lock: every data request fires twice, and a lock
// shared by all of them is where concurrent requests queued.
type Broadcast struct {
	ch atomic.Pointer[chan struct{}]
}

// New returns a broadcast nobody waits on yet. The zero value is one too.
func New() *Broadcast { return &Broadcast{} }

// Wait returns a channel closed at the next Fire. Take it before checking
// the condition, so a change in between is not missed.
func (b *Broadcast) Wait() <-chan struct{} {
	for {
		if p := b.ch.Load(); p != nil {
			return *p
		}
		ch := make(chan struct{})
		if b.ch.CompareAndSwap(nil, &ch) {
			return ch
		}
	}
}

// Fire wakes the current waiters.
func (b *Broadcast) Fire() {
	if b.ch.Load() == nil {
		return
	}
	if p := b.ch.Swap(nil); p != nil {
		close(*p)
	}
}
