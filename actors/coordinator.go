package actors

import (
	"sort"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/messages"
)

// Round is the pure state of one snapshot round: which sessions were asked,
// which answered, and how. It does no I/O. A round is done when no session is
// still waited for; it succeeded when, in addition, none failed.
type Round struct {
	ID uint64
	// waiting holds the sessions still to answer; byPID maps a session
	// actor's PID id to its session id (for Terminated).
	waiting map[string]bool
	// draining holds the sessions given up on at the deadline whose answer
	// is still awaited: a snapshot call in flight at the deadline may still
	// take a snapshot, and the round's owner must delete it before it
	// reports the commit failed.
	draining map[string]bool
	byPID    map[string]string
	Taken    []messages.SnapshotReply
	Skipped  []string
	// Failed maps a session id to why it did not deliver a snapshot.
	Failed map[string]string
}

// NewRound starts a round over the given sessions.
func NewRound(id uint64, sessions []messages.SessionRef) *Round {
	r := &Round{ID: id, waiting: map[string]bool{}, draining: map[string]bool{}, byPID: map[string]string{}, Failed: map[string]string{}}
	for _, s := range sessions {
		if pid, ok := s.PID.(*actor.PID); ok && pid != nil {
			r.waiting[s.SessionID] = true
			r.byPID[pid.Id] = s.SessionID
		}
	}
	return r
}

// Reply takes a session's answer. It reports false for a reply the round
// did not wait for (stale round, unknown or duplicate session); a stale reply
// that carries a snapshot is the caller's to clean up.
func (r *Round) Reply(m *messages.SnapshotReply) bool {
	sid := m.SessionID
	if m.Round != r.ID {
		return false
	}
	if r.draining[sid] {
		// Already failed at the deadline; only a snapshot it took matters.
		delete(r.draining, sid)
		if m.SnapshotID != "" {
			r.Taken = append(r.Taken, *m)
		}
		return true
	}
	if !r.waiting[sid] {
		return false
	}
	delete(r.waiting, sid)
	switch {
	case m.Err != nil:
		r.Failed[sid] = m.Err.Error()
		if m.SnapshotID != "" {
			// The provider said both: keep the id so the snapshot is
			// cleaned up with the others.
			r.Taken = append(r.Taken, *m)
		}
	case m.Skipped:
		r.Skipped = append(r.Skipped, sid)
	default:
		r.Taken = append(r.Taken, *m)
	}
	return true
}

// Terminated fails a session whose actor stopped before answering.
func (r *Round) Terminated(pidID string) {
	sid, ok := r.byPID[pidID]
	if !ok {
		return
	}
	delete(r.draining, sid)
	if r.waiting[sid] {
		delete(r.waiting, sid)
		r.Failed[sid] = "session stopped during the checkpoint"
	}
}

// Timeout fails every session still waited for. Their answers are still
// awaited (Draining) so that a snapshot taken just after the deadline is
// reported for cleanup instead of outliving the failed commit.
func (r *Round) Timeout() {
	for sid := range r.waiting {
		r.Failed[sid] = "no snapshot before the checkpoint's deadline"
		delete(r.waiting, sid)
		r.draining[sid] = true
	}
}

// GiveUp stops awaiting the sessions failed at the deadline; a snapshot
// one of them still delivers is an orphan.
func (r *Round) GiveUp() { clear(r.draining) }

// Draining reports whether the round has failed sessions whose answers are
// still awaited.
func (r *Round) Draining() bool { return len(r.draining) > 0 }

// Done reports whether every session answered (or was given up on).
func (r *Round) Done() bool { return len(r.waiting) == 0 && len(r.draining) == 0 }

// OK reports whether the round can be committed.
func (r *Round) OK() bool { return r.Done() && len(r.Failed) == 0 }

// Result is the round's outcome, sorted by session id.
func (r *Round) Result() *RoundResult {
	res := &RoundResult{Round: r.ID, Taken: append([]messages.SnapshotReply(nil), r.Taken...),
		Skipped: append([]string(nil), r.Skipped...), Failed: map[string]string{}}
	for k, v := range r.Failed {
		res.Failed[k] = v
	}
	sort.Slice(res.Taken, func(i, j int) bool { return res.Taken[i].SessionID < res.Taken[j].SessionID })
	sort.Strings(res.Skipped)
	return res
}

// StartRound asks the coordinator to snapshot Sessions. Names gives each
// session's snapshot name. The coordinator answers with a *RoundResult.
type StartRound struct {
	ID       uint64
	Sessions []messages.SessionRef
	Names    map[string]string
	Deadline time.Time
	// Reply, when set, gets the RoundResult (else the sender does).
	Reply messages.ReplyTo
}

// RoundResult is the outcome of a round. Taken includes snapshots of
// sessions that also failed (an error after the effect); a commit that fails
// must delete all of them.
type RoundResult struct {
	Round   uint64
	Taken   []messages.SnapshotReply
	Skipped []string
	Failed  map[string]string
	// Busy is set when another round was running; nothing was asked.
	Busy bool
}

type roundTimeout struct{ Round uint64 }

// drainTimeout ends the wait for sessions that were given up on at a
// round's deadline.
type drainTimeout struct{ Round uint64 }

// DrainGrace is how long a round that missed its deadline still waits for
// the answers of its late sessions (whose provider calls end with the
// deadline's context) before it reports.
const DrainGrace = 30 * time.Second

// CoordinatorEnv is what the coordinator needs from the owner.
type CoordinatorEnv struct {
	Log logrus.FieldLogger
	// Clock times the round's deadline and drain grace (default the wall
	// clock).
	Clock clock.Clock
}

// OrphanSnapshot is what the coordinator publishes on its actor system's
// event stream when a snapshot arrives after its round ended (the round
// timed out): no checkpoint names it, and whoever keeps the snapshots
// deletes it. The coordinator reports it and calls no one; subscribers run
// on the coordinator's goroutine and must not block.
type OrphanSnapshot struct {
	// Coordinator is the coordinator that gave up on the snapshot: an
	// actor system may hold more than one.
	Coordinator           *actor.PID
	SessionID, SnapshotID string
}

// coordinator runs one snapshot round at a time: it fans TakeSnapshot out to
// every session of the round, watches them, and gathers the replies until
// every session answered, stopped, or the round's deadline passed. It never
// blocks its mailbox.
type coordinator struct {
	env    *CoordinatorEnv
	cur    *Round
	asker  *actor.PID
	reply  messages.ReplyTo
	cancel func()
	pids   []*actor.PID
}

// CoordinatorProps returns the coordinator's props.
func CoordinatorProps(env *CoordinatorEnv) *actor.Props {
	return actor.PropsFromProducer(func() actor.Actor { return &coordinator{env: env} })
}

func (c *coordinator) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *StartRound:
		if c.cur != nil {
			if m.Reply != nil {
				m.Reply.Deliver(&RoundResult{Round: m.ID, Busy: true})
			} else {
				ctx.Respond(&RoundResult{Round: m.ID, Busy: true})
			}
			return
		}
		c.cur = NewRound(m.ID, m.Sessions)
		c.asker, c.reply = ctx.Sender(), m.Reply
		c.pids = c.pids[:0]
		// Armed before any session is asked, so that a test which sees a
		// snapshot begin knows the deadline is already on the clock.
		c.cancel = sendAfter(ctx, c.clock(), m.Deadline.Sub(c.clock().Now()), &roundTimeout{Round: m.ID})
		for _, s := range m.Sessions {
			pid, ok := s.PID.(*actor.PID)
			if !ok || pid == nil {
				continue
			}
			c.pids = append(c.pids, pid)
			ctx.Watch(pid)
			ctx.Request(pid, &messages.TakeSnapshot{Round: m.ID, Name: m.Names[s.SessionID], Deadline: m.Deadline})
		}
		c.maybeFinish(ctx)
	case *messages.SnapshotReply:
		if c.cur != nil && c.cur.Reply(m) {
			c.maybeFinish(ctx)
			return
		}
		if m.SnapshotID != "" {
			ctx.ActorSystem().EventStream.Publish(&OrphanSnapshot{Coordinator: ctx.Self(), SessionID: m.SessionID, SnapshotID: m.SnapshotID})
		}
	case *actor.Terminated:
		if c.cur != nil {
			c.cur.Terminated(m.Who.Id)
			c.maybeFinish(ctx)
		}
	case *roundTimeout:
		if c.cur != nil && c.cur.ID == m.Round {
			c.cur.Timeout()
			if c.cur.Draining() {
				c.cancel = sendAfter(ctx, c.clock(), DrainGrace, &drainTimeout{Round: m.Round})
			}
			c.maybeFinish(ctx)
		}
	case *drainTimeout:
		if c.cur != nil && c.cur.ID == m.Round {
			c.cur.GiveUp()
			c.maybeFinish(ctx)
		}
	}
}

func (c *coordinator) clock() clock.Clock {
	if c.env.Clock == nil {
		return clock.Real{}
	}
	return c.env.Clock
}

// sendAfter sends msg to the actor itself once d has passed on clk; the
// returned func cancels it. The actor must still check that msg is current:
// a cancel can race a timer that already fired.
func sendAfter(ctx actor.Context, clk clock.Clock, d time.Duration, msg any) func() {
	self, root := ctx.Self(), ctx.ActorSystem().Root
	t := clk.AfterFunc(d, func() { root.Send(self, msg) })
	return func() { t.Stop() }
}

func (c *coordinator) maybeFinish(ctx actor.Context) {
	if c.cur == nil || !c.cur.Done() {
		return
	}
	if c.cancel != nil {
		c.cancel()
		c.cancel = nil
	}
	for _, pid := range c.pids {
		ctx.Unwatch(pid)
	}
	res := c.cur.Result()
	c.cur = nil
	switch {
	case c.reply != nil:
		c.reply.Deliver(res)
	case c.asker != nil:
		ctx.Send(c.asker, res)
	}
	c.asker, c.reply = nil, nil
}
