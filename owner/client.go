package owner

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/supervisor"
)

// client is the owner's side of its actors: one typed method per request.
// Each sends its message with a reply slot and waits for the answer, the
// caller's context's end or the owner's close: no future, no goroutine. A
// request that reached no actor fails with actor.ErrDeadLetter (see gone).
type client struct {
	root       *actor.RootContext
	sup, coord *actor.PID
	dir        *supervisor.Directory
	closed     <-chan struct{}
	rt         sched.Runtime
	// replies recycles the reply slots of answered requests (a slot whose
	// asker gave up is dropped: its answer may still come).
	replies chan messages.ReplyTo
	// bound is the context that bounds waits for the supervisor.
	bound atomic.Pointer[bound]
}

// maxFreeReplies bounds the reply slots kept for reuse.
const maxFreeReplies = 4096

func newClient(root *actor.RootContext, sup, coord *actor.PID, dir *supervisor.Directory, closed <-chan struct{}, rt sched.Runtime) *client {
	return &client{root: root, sup: sup, coord: coord, dir: dir, closed: closed, rt: rt, replies: make(chan messages.ReplyTo, maxFreeReplies)}
}

// ask sends the request build makes around a reply slot to pid and waits
// for its answer, of type R.
func ask[R any](ctx context.Context, c *client, pid *actor.PID, build func(messages.ReplyTo) any) (R, error) {
	var zero R
	r := c.slot()
	v, err := c.call(ctx, pid, build(r), r)
	if err != nil {
		return zero, err
	}
	return v.(R), nil
}

// askSupervisor is ask for the supervisor, which answers at once: the wait
// is bounded even for a caller without a deadline.
func askSupervisor[R any](c *client, build func(messages.ReplyTo) any) (R, error) {
	return ask[R](c.bounded(), c, c.sup, build)
}

// bounded is a context that ends between timeouts.Reply and twice that
// from now, shared by the waits it bounds: a seed and a close each ask the
// supervisor, and a context and timer of their own per ask were a good
// part of their allocations, to guard against a lost reply, not a slow
// one.
func (c *client) bounded() context.Context {
	now := time.Now()
	if b := c.bound.Load(); b != nil && b.until.Sub(now) >= timeouts.Reply {
		return b
	}
	b := newBound(now.Add(2 * timeouts.Reply))
	c.bound.Store(b)
	return b
}

// bound is a context that ends at its deadline and no sooner: the waits
// that share it cannot cancel it for one another.
type bound struct {
	until time.Time
	done  chan struct{}
}

func newBound(until time.Time) *bound {
	b := &bound{until: until, done: make(chan struct{})}
	time.AfterFunc(time.Until(until), func() { close(b.done) })
	return b
}

func (b *bound) Deadline() (time.Time, bool) { return b.until, true }
func (b *bound) Done() <-chan struct{}       { return b.done }
func (b *bound) Value(any) any               { return nil }

func (b *bound) Err() error {
	select {
	case <-b.done:
		return context.DeadlineExceeded
	default:
		return nil
	}
}

// spawnStart asks the supervisor for the session's actor (a new one within
// limit, 0: none, or the one it has) and has it hand start to that actor,
// whose answer comes back here. ref is the actor asked (nil when no answer
// came; PID nil and Err set when the supervisor refused).
func (c *client) spawnStart(ctx context.Context, sessionID string, limit int, start messages.StartSandbox) (ref *messages.SessionRef, rep *messages.StartReply, err error) {
	r := c.slot()
	start.Reply = r
	m := &messages.SpawnSession{SessionID: sessionID, Limit: limit, Start: &start, Reply: r}
	v, err := c.call(ctx, c.sup, m, r)
	if err != nil && !gone(err) {
		// No answer: the supervisor may be setting Ref still.
		return nil, nil, err
	}
	// An answer came (a dead letter's too): Ref was set before it, unless
	// the supervisor itself was gone.
	if err != nil {
		return m.Ref, nil, err
	}
	if rep, ok := v.(*messages.StartReply); ok {
		return m.Ref, rep, nil
	}
	return v.(*messages.SessionRef), nil, nil
}

// errNoAnswer: the supervisor did not answer a spawn in time.
var errNoAnswer = errors.New("the supervisor did not answer")

// prepare has the supervisor make the session's actor ahead of the
// install, unlisted: a restore's thousand spawns after its last fork held
// it for milliseconds, and made now they run while other forks wait on the
// provider. No answer: install finds out which were made.
func (c *client) prepare(s RestoredSession) {
	c.send(c.sup, &messages.SpawnSession{SessionID: s.SessionID, Install: &s.Sandbox, Unlisted: true})
}

// discardPrepared has the supervisor stop the actors made ahead, leaving
// their sandboxes alone (a failed restore stops its forks).
func (c *client) discardPrepared() { c.send(c.sup, &messages.DiscardPrepared{}) }

// install gives each session a session actor holding its sandbox: the
// actors made ahead are listed all in one turn of the supervisor, and
// those not made (or made holding another sandbox) are spawned, all at
// once, sharing one reply slot with room for every answer, and the answers
// are then collected: one round trip per session would hold a restore
// that long. errs is index-aligned with sessions: nil where the session was
// installed, errNoAnswer where no answer came.
func (c *client) install(sessions []RestoredSession) (errs []error, err error) {
	select {
	case <-c.closed:
		return nil, ErrClosed
	default:
	}
	errs = make([]error, len(sessions))
	ids := make([]string, len(sessions))
	sbs := make([]*sandbox.Sandbox, len(sessions))
	for i := range sessions {
		ids[i], sbs[i], errs[i] = sessions[i].SessionID, &sessions[i].Sandbox, errNoAnswer
	}
	wait, cancel := context.WithTimeout(context.Background(), timeouts.Reply)
	defer cancel()
	r := c.slot()
	v, err := c.call(wait, c.sup, &messages.ListPrepared{SessionIDs: ids, Sandboxes: sbs, Reply: r}, r)
	if err != nil {
		// Whatever answers are missing count as not installed.
		return errs, nil
	}
	listed := v.(*messages.PreparedListed).Errs
	replies := make(messages.ReplyTo, len(sessions))
	at := map[string]int{}
	for i := range sessions {
		if errs[i] = listed[i]; !errors.Is(errs[i], supervisor.ErrNotPrepared) {
			continue
		}
		s := &sessions[i]
		at[s.SessionID], errs[i] = i, errNoAnswer
		c.send(c.sup, &messages.SpawnSession{SessionID: s.SessionID, Install: &s.Sandbox, Reply: replies})
	}
	for range at {
		v, err := c.await(wait, c.sup, replies)
		if err != nil {
			// Whatever answers are missing count as not installed.
			break
		}
		ref := v.(*messages.SessionRef)
		errs[at[ref.SessionID]] = ref.Err
	}
	return errs, nil
}

// list lists the sessions the supervisor holds.
func (c *client) list() ([]messages.SessionRef, error) {
	l, err := askSupervisor[*messages.SessionList](c, func(r messages.ReplyTo) any { return &messages.ListSessions{Reply: r} })
	if err != nil {
		return nil, err
	}
	return l.Sessions, nil
}

// forget tells the supervisor to forget the session's actor pid.
func (c *client) forget(sessionID string, pid *actor.PID) {
	c.root.Send(c.sup, &messages.ForgetSession{SessionID: sessionID, PID: pid})
}

// lookup finds the session's actor in the supervisor's directory, without a
// round trip through its mailbox (this is on every request's path). The
// actor found may stop before it is asked, as its session ends: see gone.
func (c *client) lookup(sessionID string) (*actor.PID, error) {
	select {
	case <-c.closed:
		return nil, ErrClosed
	default:
	}
	return c.dir.Lookup(sessionID), nil
}

// lookupView is lookup with the view the session's actor publishes.
func (c *client) lookupView(sessionID string) (*actor.PID, *messages.SessionView, error) {
	select {
	case <-c.closed:
		return nil, nil, ErrClosed
	default:
	}
	pid, v := c.dir.View(sessionID)
	return pid, v, nil
}

// view is what the session's actor last published of its sandbox, nil
// when the supervisor lists no actor for it: no message, no wait.
func (c *client) view(sessionID string) (*messages.GetSandboxReply, error) {
	select {
	case <-c.closed:
		return nil, ErrClosed
	default:
	}
	_, v := c.dir.View(sessionID)
	if v == nil {
		return nil, nil
	}
	return v.Load(), nil
}

// touch records a use of the session at at in the view its actor
// publishes: no message, no wait. A session without an actor is ignored.
func (c *client) touch(sessionID string, at time.Time) {
	select {
	case <-c.closed:
		return
	default:
	}
	if _, v := c.dir.View(sessionID); v != nil {
		v.Touch(at)
	}
}

// do runs fn against a session's sandbox.
func (c *client) do(ctx context.Context, pid *actor.PID, fn sandbox.DoFunc) (*messages.DoReply, error) {
	return ask[*messages.DoReply](ctx, c, pid, func(r messages.ReplyTo) any { return &messages.Do{Ctx: ctx, Fn: fn, Reply: r} })
}

// stop asks a session to stop its sandbox for reason (an idle stop only
// if the session has been unused since idleSince).
func (c *client) stop(ctx context.Context, pid *actor.PID, reason messages.StopReason, idleSince time.Time) (*messages.StopReply, error) {
	// Not through ask: its build closure was an allocation of every close.
	r := c.slot()
	v, err := c.call(ctx, pid, &messages.StopSandbox{Reason: reason, IdleSince: idleSince, Reply: r}, r)
	if err != nil {
		return nil, err
	}
	return v.(*messages.StopReply), nil
}

// round hands a round to the coordinator and waits for its result.
func (c *client) round(ctx context.Context, m actors.StartRound) (*actors.RoundResult, error) {
	rr, err := ask[*actors.RoundResult](ctx, c, c.coord, func(r messages.ReplyTo) any { m.Reply = r; return &m })
	if err != nil {
		return nil, err
	}
	if rr.Busy {
		return nil, errors.New("another round is running")
	}
	return rr, nil
}

// send tells pid msg, expecting no answer.
func (c *client) send(pid *actor.PID, msg any) { c.root.Send(pid, msg) }

// slot is a reply slot for one request, reused or new; call recycles it
// once answered.
func (c *client) slot() messages.ReplyTo {
	select {
	case r := <-c.replies:
		return r
	default:
		return make(messages.ReplyTo, 1)
	}
}

func (c *client) recycle(r messages.ReplyTo) {
	select {
	case c.replies <- r:
	default:
	}
}

// call sends msg, which carries reply (from slot), to pid and waits for
// the answer.
func (c *client) call(ctx context.Context, pid *actor.PID, msg any, reply messages.ReplyTo) (any, error) {
	select {
	case <-c.closed:
		return nil, ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.root.Send(pid, msg)
	return c.wait(ctx, pid, reply)
}

// wait waits for the answer in reply (from slot) and recycles it once
// answered.
func (c *client) wait(ctx context.Context, pid *actor.PID, reply messages.ReplyTo) (any, error) {
	v, err := c.await(ctx, pid, reply)
	if err == nil {
		c.recycle(reply)
	}
	return v, err
}

// await waits for the next answer in reply (a request to pid carried it).
func (c *client) await(ctx context.Context, pid *actor.PID, reply messages.ReplyTo) (any, error) {
	// Not on the real runtime, whose Await does nothing: the closure
	// would cost every request an allocation.
	if _, real := c.rt.(sched.Real); !real {
		c.rt.Await(ctx, func() bool { return len(reply) > 0 || sched.Closed(c.closed) })
	}
	// When more than one is ready, the answer wins, then the close: a
	// fixed order, where select would pick at random.
	var v any
	select {
	case v = <-reply:
	default:
		select {
		case v = <-reply:
		case <-c.closed:
			return nil, ErrClosed
		case <-ctx.Done():
			if sched.Closed(c.closed) {
				return nil, ErrClosed
			}
			return nil, ctx.Err()
		}
	}
	if _, ok := v.(messages.Undelivered); ok {
		return nil, fmt.Errorf("actor %s: %w", pid.Id, actor.ErrDeadLetter)
	}
	return v, nil
}

// gone reports an ask that reached no actor: the session's actor stopped
// between the lookup and the ask, so its session is over.
func gone(err error) bool { return errors.Is(err, actor.ErrDeadLetter) }
