package owner

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/messages"
)

// Touch records that the session was used now (a request named it), which
// defers its idle end. A session the owner does not hold is ignored.
//
// It is on every request's path, so it sends nothing: it raises the last
// use the session's actor publishes its view beside, which the actor reads
// when it decides an idle stop.
func (o *Owner) Touch(sessionID string) {
	o.ask.touch(sessionID, o.clk.Now())
}

// ReapIdle ends the sessions unused for IdleTimeout at now (sandbox
// stopped, snapshots kept until a release drops the checkpoints naming
// them) and returns their ids. A session with an operation running or
// queued is not idle. The renewal loop calls it at every tick; tests and
// the simulation call it with logical time.
func (o *Owner) ReapIdle(ctx context.Context, now time.Time) ([]string, error) {
	if o.cfg.IdleTimeout <= 0 {
		return nil, nil
	}
	// Not during a commit, restore, retire or release: an end racing a
	// commit fails it. The next tick reaps instead.
	if !o.ctl.TryLock() {
		return nil, nil
	}
	defer o.ctl.Unlock()
	refs, err := o.ask.list()
	if err != nil {
		return nil, err
	}
	since := now.Add(-o.cfg.IdleTimeout)
	ended, failed := o.eachOutcome(ctx, len(refs), false, func(i int) (string, error) {
		sid := refs[i].SessionID
		rep, err := o.ask.stop(ctx, refs[i].PID.(*actor.PID), messages.StopIdle, since)
		if gone(err) {
			return "", nil
		}
		if err != nil {
			return sid, err
		}
		if rep.NotIdle || (rep.Err == nil && rep.Stopped == nil) {
			return "", nil
		}
		if rep.Err != nil {
			return sid, rep.Err
		}
		o.log.WithFields(logrus.Fields{"session_id": sid, "sandbox_id": rep.Stopped.SandboxID, "idle_timeout": o.cfg.IdleTimeout.String()}).
			Warn("session ended: no request for the idle timeout (its snapshots stay until a release)")
		return sid, nil
	})
	for _, sid := range slices.Sorted(maps.Keys(failed)) {
		o.log.WithFields(logrus.Fields{"session_id": sid, "error": failed[sid]}).Warn("could not end an idle session; the next tick retries")
	}
	return ended, nil
}
