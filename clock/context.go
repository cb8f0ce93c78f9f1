package clock

import (
	"context"
	"sync"
	"time"
)

// WithDeadline is context.WithDeadline on clk: the context ends with
// context.DeadlineExceeded once clk reaches at. On the wall clock it is
// context.WithDeadline's context made lazily (see wallDeadline); on a
// Manual clock it ends when the test moves the clock there.
func WithDeadline(parent context.Context, clk Clock, at time.Time) (context.Context, context.CancelFunc) {
	if _, ok := clk.(Real); ok {
		if cur, ok := parent.Deadline(); ok && cur.Before(at) {
			// The parent ends first: what context.WithDeadline returns.
			return context.WithCancel(parent)
		}
		c := &wallDeadline{parent: parent, at: at}
		return c, c.cancel
	}
	ctx, cancel := context.WithCancelCause(parent)
	c := &deadlineCtx{Context: ctx}
	t := clk.AfterFunc(at.Sub(clk.Now()), func() {
		c.expire()
		cancel(context.DeadlineExceeded)
	})
	return c, func() {
		t.Stop()
		cancel(context.Canceled)
	}
}

// WithTimeout is WithDeadline(parent, clk, clk.Now().Add(d)).
func WithTimeout(parent context.Context, clk Clock, d time.Duration) (context.Context, context.CancelFunc) {
	return WithDeadline(parent, clk, clk.Now().Add(d))
}

// deadlineCtx reports DeadlineExceeded (not Canceled) as its error once
// its clock's deadline ended it. It reports no Deadline of its own: that
// would be a time on its clock, which callers would read as wall time.
type deadlineCtx struct {
	context.Context
	mu      sync.Mutex
	expired bool
}

// expire marks the context as ended by its deadline, unless it has
// already ended otherwise: the timer is not stopped when the parent ends,
// and Err must not change once it has reported an error.
func (c *deadlineCtx) expire() {
	c.mu.Lock()
	if c.Context.Err() == nil {
		c.expired = true
	}
	c.mu.Unlock()
}

func (c *deadlineCtx) Err() error {
	err := c.Context.Err()
	if err == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.expired {
		return context.DeadlineExceeded
	}
	return err
}

// wallDeadline is context.WithDeadline(parent, at) that arms nothing until
// someone waits on its Done: a bound most calls never reach (a session's
// stop, two minutes) cost a timer armed and stopped, a registration with
// the parent under the parent's lock (the owner's, shared by every
// session) and three allocations, for calls that only read Err. Err reads
// the parent and the wall clock instead; the first Done arms the timer and
// the parent's AfterFunc, as context.WithDeadline does at once.
type wallDeadline struct {
	parent context.Context
	at     time.Time
	mu     sync.Mutex
	// err is set once, when the context is found or made ended, and
	// never changes; done is made by the first Done and closed with err.
	err  error
	done chan struct{}
	// timer and unhook undo what the first Done armed.
	timer  *time.Timer
	unhook func() bool
}

func (c *wallDeadline) Deadline() (time.Time, bool) { return c.at, true }

func (c *wallDeadline) Value(key any) any { return c.parent.Value(key) }

func (c *wallDeadline) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.check()
}

// check ends the context if its parent or its deadline has (the parent's
// error when both have by the first look), and returns its error. Under
// mu.
func (c *wallDeadline) check() error {
	if c.err != nil {
		return c.err
	}
	if err := c.parent.Err(); err != nil {
		c.endLocked(err)
	} else if !time.Now().Before(c.at) {
		c.endLocked(context.DeadlineExceeded)
	}
	return c.err
}

func (c *wallDeadline) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil {
		return c.done
	}
	c.done = make(chan struct{})
	if c.err != nil {
		// Found ended by an Err before.
		close(c.done)
		return c.done
	}
	if c.check() != nil {
		return c.done // closed as it ended
	}
	c.timer = time.AfterFunc(time.Until(c.at), func() { c.end(context.DeadlineExceeded) })
	c.unhook = context.AfterFunc(c.parent, func() { c.end(c.parent.Err()) })
	return c.done
}

func (c *wallDeadline) cancel() { c.end(context.Canceled) }

func (c *wallDeadline) end(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.endLocked(err)
}

// endLocked ends the context with err unless it has ended already, and
// undoes what a Done armed. Under mu.
func (c *wallDeadline) endLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	if c.done != nil {
		close(c.done)
	}
	if c.timer != nil {
		c.timer.Stop()
		c.unhook()
	}
}
