// Package clock is the seam through which every lease, deadline, timer and
// reaper reads time, so that the simulation and the tests can drive it
// instead of the wall clock.
package clock

import (
	"sort"
	"sync"
	"time"
)

// Clock tells the time and makes timers on that time. Everything that
// waits for a moment (a round's deadline, a lease, a poll) waits on the
// same clock it reads, so a test that moves a Manual clock moves all of it.
type Clock interface {
	Now() time.Time
	// After returns a channel that receives the clock's time once d has
	// passed on it (at once for d <= 0).
	After(d time.Duration) <-chan time.Time
	// NewTimer returns a timer that fires once d has passed on the clock.
	NewTimer(d time.Duration) Timer
	// AfterFunc calls f once d has passed on the clock (time.AfterFunc);
	// the returned timer's C is nil. Waiting this way needs no goroutine
	// of the caller's, so a deterministic scheduler can order the call.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a one-shot timer of a Clock, with time.Timer's semantics:
// Stop and Reset report whether the timer was still pending, and C holds at
// most one undelivered tick.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// Real is the wall clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// After is time.After.
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// AfterFunc wraps time.AfterFunc.
func (Real) AfterFunc(d time.Duration, f func()) Timer { return realTimer{time.AfterFunc(d, f)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

// Manual is a clock that moves only when told to: its timers fire, in the
// order they are due, when Advance or Set moves it past them. It is safe for
// concurrent use.
type Manual struct {
	mu     sync.Mutex
	now    time.Time
	seq    uint64
	timers map[*manualTimer]bool
	// changed is closed (and replaced) whenever a timer is armed, so a
	// test can wait for the code under test to start waiting.
	changed chan struct{}
}

// NewManual returns a manual clock set to start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start, timers: map[*manualTimer]bool{}, changed: make(chan struct{})}
}

// Now returns the clock's current time.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d, fires the timers now due, and
// returns the new time.
func (m *Manual) Advance(d time.Duration) time.Time {
	m.mu.Lock()
	m.now = m.now.Add(d)
	now := m.now
	calls := m.fireLocked()
	m.mu.Unlock()
	run(calls)
	return now
}

// run calls the functions of AfterFunc timers that fired, outside the lock
// (they may use the clock).
func run(calls []func()) {
	for _, f := range calls {
		f()
	}
}

// Set moves the clock to t and fires the timers now due.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	m.now = t
	calls := m.fireLocked()
	m.mu.Unlock()
	run(calls)
}

// After returns the channel of a new timer of d.
func (m *Manual) After(d time.Duration) <-chan time.Time { return m.NewTimer(d).C() }

// NewTimer returns a timer due d from now; it fires at once if d <= 0.
func (m *Manual) NewTimer(d time.Duration) Timer {
	t := &manualTimer{m: m, c: make(chan time.Time, 1)}
	m.mu.Lock()
	m.armLocked(t, d)
	m.mu.Unlock()
	return t
}

// AfterFunc calls f when the clock is moved past d from now (on the
// goroutine that moves it), or at once on a goroutine of its own if d <= 0.
func (m *Manual) AfterFunc(d time.Duration, f func()) Timer {
	t := &manualTimer{m: m, f: f}
	m.mu.Lock()
	m.armLocked(t, d)
	m.mu.Unlock()
	return t
}

// Pending is how many timers wait to fire.
func (m *Manual) Pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.timers)
}

// Next reports when the earliest pending timer is due.
func (m *Manual) Next() (time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var at time.Time
	for t := range m.timers {
		if at.IsZero() || t.due.Before(at) {
			at = t.due
		}
	}
	return at, !at.IsZero()
}

// Armed returns a channel closed the next time a timer is armed, for a test
// to wait (instead of sleeping) until the code it drives waits on the clock.
func (m *Manual) Armed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// WaitPending blocks until at least n timers are pending or done is
// closed; it reports whether n were reached.
func (m *Manual) WaitPending(n int, done <-chan struct{}) bool {
	for {
		m.mu.Lock()
		if len(m.timers) >= n {
			m.mu.Unlock()
			return true
		}
		ch := m.changed
		m.mu.Unlock()
		select {
		case <-ch:
		case <-done:
			return false
		}
	}
}

func (m *Manual) armLocked(t *manualTimer, d time.Duration) {
	m.seq++
	t.due, t.seq = m.now.Add(d), m.seq
	if d <= 0 {
		t.send(m.now)
		return
	}
	m.timers[t] = true
	close(m.changed)
	m.changed = make(chan struct{})
}

// fireLocked fires every timer due at or before now, earliest first (ties
// in the order they were armed), so that what they wake runs in the order
// real timers would have.
func (m *Manual) fireLocked() (calls []func()) {
	var due []*manualTimer
	for t := range m.timers {
		if !t.due.After(m.now) {
			due = append(due, t)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if !due[i].due.Equal(due[j].due) {
			return due[i].due.Before(due[j].due)
		}
		return due[i].seq < due[j].seq
	})
	for _, t := range due {
		delete(m.timers, t)
		if t.f != nil {
			calls = append(calls, t.f)
			continue
		}
		t.send(t.due)
	}
	return calls
}

type manualTimer struct {
	m   *Manual
	c   chan time.Time
	f   func() // an AfterFunc timer's call (c is nil)
	due time.Time
	seq uint64
}

func (t *manualTimer) C() <-chan time.Time { return t.c }

// send delivers a tick unless one is still undelivered.
func (t *manualTimer) send(at time.Time) {
	if t.f != nil {
		go t.f()
		return
	}
	select {
	case t.c <- at:
	default:
	}
}

func (t *manualTimer) Stop() bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	pending := t.m.timers[t]
	delete(t.m.timers, t)
	return pending
}

func (t *manualTimer) Reset(d time.Duration) bool {
	t.m.mu.Lock()
	defer t.m.mu.Unlock()
	pending := t.m.timers[t]
	delete(t.m.timers, t)
	// As time.Timer since Go 1.23: a reset drops an undelivered tick.
	select {
	case <-t.c:
	default:
	}
	t.m.armLocked(t, d)
	return pending
}
