package clock

import (
	"context"
	"sync"
	"time"

	"github.com/sandboxowner/owner/internal/lazyctx"
)

// WithDeadline is context.WithDeadline on clk: the context ends with
// context.DeadlineExceeded once clk reaches at. On the wall clock it is
// context.WithDeadline's context made lazily (lazyctx: a bound most calls
// never wait on, such as a session's stop's, arms no timer and takes no
// lock of its parent's); on a Manual clock it ends when the test moves the
// clock there.
func WithDeadline(parent context.Context, clk Clock, at time.Time) (context.Context, context.CancelFunc) {
	if _, ok := clk.(Real); ok {
		c := lazyctx.WithDeadline(parent, at)
		return c, c.Cancel
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
