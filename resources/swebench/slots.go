package swebench

import (
	"context"
	"sync"
)

// slots bounds the eval sandboxes running at once. Callers beyond the bound
// wait in arrival order (FIFO), and are counted, so that /health can show a
// queue building up.
type slots struct {
	mu      sync.Mutex
	max     int
	running int
	queue   []chan struct{} // waiting callers, oldest first; closed when granted
	// onWait, when set (by tests), is called with the queue's length each
	// time a caller starts waiting.
	onWait func(waiting int)
}

func newSlots(max int) *slots { return &slots{max: max} }

// acquire returns once the caller holds a slot, or with ctx's error (holding
// none). The returned func gives the slot back; call it once.
func (s *slots) acquire(ctx context.Context) (func(), error) {
	s.mu.Lock()
	if s.running < s.max && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		return s.release, nil
	}
	ch := make(chan struct{})
	s.queue = append(s.queue, ch)
	waiting, hook := len(s.queue), s.onWait
	s.mu.Unlock()
	if hook != nil {
		hook(waiting)
	}
	select {
	case <-ch:
		return s.release, nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		for i, c := range s.queue {
			if c == ch {
				s.queue = append(s.queue[:i], s.queue[i+1:]...)
				return nil, ctx.Err()
			}
		}
		// Granted while giving up: pass the slot on.
		s.releaseLocked()
		return nil, ctx.Err()
	}
}

func (s *slots) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.releaseLocked()
}

// releaseLocked hands the slot to the oldest waiter, or frees it.
func (s *slots) releaseLocked() {
	if len(s.queue) > 0 {
		ch := s.queue[0]
		s.queue = s.queue[1:]
		close(ch) // the slot passes on; running is unchanged
		return
	}
	s.running--
}

// counts returns the slots in use and the callers waiting.
func (s *slots) counts() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue)
}
