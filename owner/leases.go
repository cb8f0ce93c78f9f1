package owner

import (
	"context"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/sched"
)

// Tick asks every session to renew its sandbox's lease if a third of it
// has passed at now, and renews the warm pools' leases likewise. The
// simulation and tests call it with logical time.
func (o *Owner) Tick(now time.Time) error {
	o.PoolTick(now)
	refs, err := o.ask.list()
	if err != nil {
		return err
	}
	for _, r := range refs {
		o.ask.send(r.PID.(*actor.PID), &messages.RenewLease{Now: now})
	}
	return nil
}

func (o *Owner) renewLoop(every time.Duration) {
	o.tickLoop(every, func(now time.Time) time.Duration {
		if err := o.Tick(now); err != nil {
			o.log.WithError(err).Debug("lease renewal tick failed")
		}
		if _, err := o.ReapIdle(o.base, now); err != nil {
			o.log.WithError(err).Debug("idle reaping failed")
		}
		return every
	})
}

// tickLoop runs fn when a timer on the clock fires, first after wait and
// then after the wait fn returns, until the owner closes.
func (o *Owner) tickLoop(wait time.Duration, fn func(now time.Time) time.Duration) {
	t := o.clk.NewTimer(wait)
	defer t.Stop()
	for {
		o.rt.Await(context.Background(), func() bool { return len(t.C()) > 0 || sched.Closed(o.closed) })
		select {
		case <-o.closed:
			return
		case <-t.C():
			t.Reset(fn(o.clk.Now()))
		}
	}
}
