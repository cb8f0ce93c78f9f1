// Package lazyctx is a cancellable context, with an optional wall-clock
// deadline and one value, that arms nothing until someone waits on its
// Done. context.WithCancel and context.WithDeadline register the child
// with its parent at once (under the parent's lock: a server's, or an
// owner's, shared by every request or session) and arm the deadline's
// timer, for contexts most of which are only ever read through Err: a
// request answered without waiting, a provider call that returns at once.
// Ctx reads its parent and the clock in Err instead; its first Done makes
// the standard context it stands for (context.WithCancel or
// context.WithDeadline of its parent) and is that context's from then on.
package lazyctx

import (
	"context"
	"sync"
	"time"
)

// Ctx is a context.Context ended by Cancel, by its parent's end or by its
// deadline (when it has one), whichever comes first; its error never
// changes once set. Until its first Done, it is one allocation and its
// parent knows nothing of it; when more than one of those has happened by
// the first look (an Err or a Done), the parent's error is reported.
type Ctx struct {
	parent context.Context
	at     time.Time // zero: no deadline of its own
	// key and val are the value it carries (none when key is nil).
	key, val any

	mu sync.Mutex
	// err is set when the context was found or made ended before any
	// Done, and then never changes.
	err error
	// inner is the standard context the first Done made (while err is
	// nil), which Err and Done follow from then on.
	inner       context.Context
	cancelInner context.CancelFunc
	// derived is inner when inner is made from the parent (not when it is
	// only a closed channel for a context that had ended already).
	derived context.Context
}

// WithCancel returns a context ended by its Cancel or by parent's end.
func WithCancel(parent context.Context) *Ctx { return &Ctx{parent: parent} }

// WithDeadline is WithCancel that also ends, with
// context.DeadlineExceeded, once the wall clock reaches at. A parent
// with an earlier deadline makes it end no later than that, as
// context.WithDeadline's does.
func WithDeadline(parent context.Context, at time.Time) *Ctx {
	if cur, ok := parent.Deadline(); ok && cur.Before(at) {
		return &Ctx{parent: parent}
	}
	return &Ctx{parent: parent, at: at}
}

// WithValue is WithCancel carrying val under key (as context.WithValue).
func WithValue(parent context.Context, key, val any) *Ctx {
	return &Ctx{parent: parent, key: key, val: val}
}

// Deadline is its own deadline, or its parent's.
func (c *Ctx) Deadline() (time.Time, bool) {
	if !c.at.IsZero() {
		return c.at, true
	}
	return c.parent.Deadline()
}

// Value is the value it carries under key, or its parent's. Once a Done
// made the standard context it stands for, that context answers the
// others: the context package finds a cancellable ancestor through Value,
// so that a context made from this one registers with that standard
// context, cancelled with it at once, instead of a goroutine of its own
// waiting on Done.
func (c *Ctx) Value(key any) any {
	if c.key != nil && key == c.key {
		return c.val
	}
	c.mu.Lock()
	in := c.derived
	c.mu.Unlock()
	if in != nil {
		return in.Value(key)
	}
	return c.parent.Value(key)
}

// Err is nil until the context ends, then why it ended.
func (c *Ctx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err == nil && c.inner != nil {
		return c.inner.Err()
	}
	return c.check()
}

// check ends the context if its parent or its deadline has, and returns
// its error. Under mu, before any Done made inner.
func (c *Ctx) check() error {
	if c.err != nil {
		return c.err
	}
	if err := c.parent.Err(); err != nil {
		c.err = err
	} else if !c.at.IsZero() && !time.Now().Before(c.at) {
		c.err = context.DeadlineExceeded
	}
	return c.err
}

// Done is closed when the context ends. The first call makes the
// standard context (registered with the parent, its deadline's timer
// armed) that it stands for from then on.
func (c *Ctx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inner == nil {
		switch {
		case c.check() != nil:
			// Ended already: a context ended as well, for its channel.
			c.inner, c.cancelInner = context.WithCancel(context.Background())
			c.cancelInner()
		case c.at.IsZero():
			c.inner, c.cancelInner = context.WithCancel(c.parent)
			c.derived = c.inner
		default:
			c.inner, c.cancelInner = context.WithDeadline(c.parent, c.at)
			c.derived = c.inner
		}
	}
	return c.inner.Done()
}

// Cancel ends the context with context.Canceled (unless it has ended) and
// releases what a Done made.
func (c *Ctx) Cancel() {
	c.mu.Lock()
	cancelInner := c.cancelInner
	if cancelInner == nil && c.err == nil {
		c.err = context.Canceled
	}
	c.mu.Unlock()
	// Outside the lock: the standard contexts made from this one reach
	// it (Value) as they go.
	if cancelInner != nil {
		cancelInner()
	}
}
