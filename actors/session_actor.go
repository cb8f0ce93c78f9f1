package actors

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
)

// MaxSessionData bounds the JSON object a setup may return.
const MaxSessionData = 64 << 10

// SessionEnv is what every session actor shares: the provider, the clock,
// the logger, the checkpoint limiter and the owner's callback for ended
// sandboxes.
type SessionEnv struct {
	Provider provider.Provider
	Clock    clock.Clock
	Log      logrus.FieldLogger
	Limiter  *Limiter
	// OnEnded is told (from an actor goroutine) when a session's sandbox is
	// gone for good; the owner keeps it to answer "ended" to stale agent
	// tokens. It must be safe for concurrent use.
	OnEnded func(sessionID string, stopped *provider.Handle, reason messages.StopReason)
	// OnHeld is told when a session's start succeeded, before the reply.
	OnHeld func(sessionID string, sb sandbox.Sandbox)
	// OnLost is told once when a session's sandbox is found gone behind
	// the owner's back. It must be safe for concurrent use.
	OnLost func(sessionID string, sb sandbox.Sandbox)
	// StopTimeout bounds a Stop call (default 2 minutes).
	StopTimeout time.Duration
	// Context, when set, bounds every provider call the session makes on
	// its own (snapshots, stops, renewals); the owner cancels it when it is
	// dropped, as a crash would end those calls.
	Context context.Context
	// Runtime runs the effects (provider calls) beside the mailbox; nil is
	// goroutines.
	Runtime sched.Runtime
}

func (e *SessionEnv) goRun(fn func()) { sched.Or(e.Runtime).Go(fn) }

func (e *SessionEnv) base() context.Context {
	if e.Context == nil {
		return context.Background()
	}
	return e.Context
}

// sessionActor is the protoactor shell around Session: it translates
// messages into Step calls and performs the effects Step returns, running
// provider calls on goroutines and feeding their outcomes back as messages.
type sessionActor struct {
	env *SessionEnv
	s   *Session
	// view, when set, is where the actor publishes the session's view
	// after every message that changes it; shown is what it last
	// published.
	view  *messages.SessionView
	shown viewKey
	// late answers the requests protoactor drops once the actor stopped.
	late *lateRequests
	// feed sends an effect's outcome back to the actor's own mailbox.
	feed func(any)
}

// SessionProps returns the props of a session actor starting from state.
// The producer has no side effects (protoactor runs it even when a spawn
// fails).
func SessionProps(env *SessionEnv, state func() *Session) *actor.Props {
	return SessionPropsPublishing(env, nil, state)
}

// SessionPropsPublishing is SessionProps whose actor publishes its view in
// view (when not nil): the initial one as the actor is made, before the
// spawn returns, then each change before the replies of the message that
// made it, so that a caller who heard a reply loads what followed it. The
// only side effect of the producer is that first store, which a failed
// spawn leaves in a view nobody reads.
func SessionPropsPublishing(env *SessionEnv, view *messages.SessionView, state func() *Session) *actor.Props {
	late := &lateRequests{}
	return actor.PropsFromProducer(func() actor.Actor {
		s := state()
		// A session that publishes its view lends its sandbox through it.
		s.lends = view != nil
		a := &sessionActor{env: env, s: s, view: view, late: late}
		a.publish(true)
		return a
	}, actor.WithMailbox(mailboxWith(late)))
}

// SessionMaker makes session actors from one Props, made once: props of
// their own (the props, the producer's and the mailbox's closures, the
// state func, the late requests' record) were five allocations of every
// seed's spawn. Props names what the next spawn makes; the spawner calls
// it right before each spawn, one spawn at a time (the supervisor, within
// its Receive), and protoactor runs the producers within that spawn.
type SessionMaker struct {
	env   *SessionEnv
	props *actor.Props
	// next and view are what the next spawn makes; box is the mailbox
	// its actor's producer made for the mailbox producer to hand on.
	next *Session
	view *messages.SessionView
	box  *sessionBox
}

// sessionBox is a session actor's mailbox with its late requests, one
// allocation.
type sessionBox struct {
	mailbox
	late lateRequests
}

// NewSessionMaker returns a maker of session actors sharing env, their
// props configured with opts.
func NewSessionMaker(env *SessionEnv, opts ...actor.PropsOption) *SessionMaker {
	m := &SessionMaker{env: env}
	m.props = actor.PropsFromProducer(m.produce, actor.WithMailbox(m.mailbox)).Configure(opts...)
	return m
}

// Props returns the props whose next spawn makes the actor of s,
// publishing its view in view (when not nil), as SessionPropsPublishing's
// do: use them for that one spawn, before the next call.
func (m *SessionMaker) Props(view *messages.SessionView, s *Session) *actor.Props {
	m.next, m.view = s, view
	return m.props
}

func (m *SessionMaker) produce() actor.Actor {
	s, view := m.next, m.view
	m.next, m.view = nil, nil
	box := &sessionBox{}
	box.init(&box.late)
	m.box = box
	// A session that publishes its view lends its sandbox through it.
	s.lends = view != nil
	a := &sessionActor{env: m.env, s: s, view: view, late: &box.late}
	a.publish(true)
	return a
}

func (m *SessionMaker) mailbox() actor.Mailbox {
	box := m.box
	m.box = nil
	return &box.mailbox
}

// lateRequests answers the requests that reach a session actor's mailbox
// after the actor stopped. protoactor drops those without a word (a message
// sent once the actor is gone is a dead letter, which the owner answers,
// but one queued behind the stop is not), so their askers would wait out
// their whole timeout; they get what a dead letter gets instead.
// The actor's mailbox tells it of every user message after the actor was
// given it, dropped ones included.
type lateRequests struct {
	// stopped is set by the actor as it handles actor.Stopped, the last
	// message it is given.
	stopped atomic.Bool
}

// MessageReceived answers m's reply slot, if m has one and the actor had
// stopped before it was given m.
func (l *lateRequests) MessageReceived(m any) {
	if !l.stopped.Load() {
		return
	}
	if r := messages.ReplySlot(m); r != nil {
		r.Deliver(messages.Undelivered{})
	}
}

// viewKey is what a view shows that a message can change: the sandbox
// itself is only ever replaced as it becomes held or stops being held (a
// start, an end) and its lease with a change of expiry. A stage that shows
// the same (a stop under way still holds the sandbox) publishes nothing.
type viewKey struct {
	held, starting, lost bool
	expires              time.Time
}

// publish stores the session's view when what it shows changed since the
// last store (or always, when force).
func (a *sessionActor) publish(force bool) {
	if a.view == nil {
		return
	}
	held, starting, lost := a.s.shows()
	k := viewKey{held: held, starting: starting, lost: lost}
	if held || lost {
		// A lease shows only with the sandbox it is of.
		k.expires = a.s.Sandbox.ExpiresAt
	}
	if !force && k == a.shown {
		return
	}
	a.shown = k
	if k == (viewKey{}) {
		a.view.Store(nothingShown)
		return
	}
	a.view.Store(a.s.view())
}

// nothingShown is the view of every session that shows nothing of a
// sandbox (none held, starting or lost): one value all of them
// publish, instead of a copy of a few hundred bytes each at its spawn, its
// end and its stop. Readers take nothing from such a view but that.
var nothingShown = &messages.GetSandboxReply{}

func (a *sessionActor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *actor.Started, *actor.Stopping, *actor.Restarting:
		return
	case *actor.Stopped:
		// A stopped actor answers nothing itself: readers of its view see
		// a session that holds no sandbox, as an ask would have found, and
		// requests still queued get what a dead letter gets.
		if a.late != nil {
			a.late.stopped.Store(true)
		}
		if a.view != nil {
			a.view.Close()
			a.view.Store(nothingShown)
		}
		a.abandon()
		return
	case startDone, doDone, snapshotDone, stopDone, renewDone:
		a.step(ctx, m, nil)
	case *messages.DoReturned:
		a.step(ctx, m, m.Reply)
	default:
		// An asker outside the actor system waits on the slot its request
		// carries; an actor (the coordinator) on its PID.
		var sender any = ctx.Sender()
		if r := messages.ReplySlot(m); r != nil {
			sender = r
		}
		if stop, ok := m.(*messages.StopSandbox); ok && !stop.IdleSince.IsZero() && a.view != nil {
			// An idle stop is decided against the last use, which the
			// requests touched in the view, not by message.
			if used := a.view.Used(); !used.IsZero() {
				a.s.touch(used)
			}
			// A caller running a Do on the lent permit uses it now.
			if a.view.Lent() {
				a.s.touch(a.env.Clock.Now())
			}
		}
		a.step(ctx, m, sender)
	}
}

// step feeds one input to the session, publishes the view it leaves, then
// performs the effects (the replies among them). A permit recalled free is
// fed back as the next input once they are performed (a recall is its
// step's last effect): Step's effects live in the session's buffer, which
// a step run from within perform would overwrite.
func (a *sessionActor) step(ctx actor.Context, in, sender any) {
	for {
		effects := a.s.Step(in, sender)
		a.publish(false)
		if !a.perform(ctx, effects) {
			return
		}
		in, sender = recalled{}, nil
	}
}

// abandon runs when the actor stops. A session stopped for a panic (the
// supervisor's decision) still holds its sandbox: stop it, so that nothing
// leaks and no checkpoint exports a session whose state is suspect.
func (a *sessionActor) abandon() {
	if a.s.Stage != StageReady && a.s.Stage != StageStopping {
		return
	}
	// Made ahead for a restore that never installed it: the restore
	// stops its fork, or leaves it to the next start's sweep.
	if a.view != nil && a.view.Unlisted() {
		return
	}
	h := a.s.Sandbox.Handle
	a.log().WithField("sandbox_id", h.SandboxID).Warn("session actor stopped while holding a sandbox; stopping it")
	a.env.goRun(func() {
		ctx, cancel := context.WithTimeout(a.env.base(), a.stopTimeout())
		defer cancel()
		if err := a.env.Provider.Stop(ctx, h); err != nil {
			a.log().WithError(err).Warn("stopping an abandoned sandbox failed; its lease will reap it")
		}
		if a.env.OnEnded != nil {
			a.env.OnEnded(a.s.ID, &h, messages.StopEnd)
		}
	})
}

// log is the session's logger, made when a line is logged: every actor
// made its own at spawn (a logrus entry and a copy of its fields), a
// quarter of a spawn's cost and of a restore's installs, for lines that
// most sessions never log.
func (a *sessionActor) log() logrus.FieldLogger { return a.env.Log.WithField("session_id", a.s.ID) }

func (a *sessionActor) stopTimeout() time.Duration {
	if a.env.StopTimeout > 0 {
		return a.env.StopTimeout
	}
	return 2 * time.Minute
}

// perform performs effects in order; it reports a recall that found the
// permit free, which the session must hear as recalled.
func (a *sessionActor) perform(ctx actor.Context, effects []any) (recalledFree bool) {
	if a.feed == nil {
		// Made once: a closure made here for each message was an
		// allocation on every message the session handled.
		root, self := ctx.ActorSystem().Root, ctx.Self()
		a.feed = func(msg any) { root.Send(self, msg) }
	}
	feed := a.feed
	for _, e := range effects {
		switch e := e.(type) {
		case effReply:
			switch to := e.To.(type) {
			case messages.ReplyTo:
				to.Deliver(e.Msg)
			case *actor.PID:
				if to != nil {
					ctx.Send(to, e.Msg)
				}
			}
		case effStart:
			a.env.goRun(func() { a.start(e, feed) })
		case effDo:
			a.env.goRun(func() { a.do(e, feed) })
		case effSnapshot:
			a.env.goRun(func() { a.snapshot(e, feed) })
		case effStop:
			a.env.goRun(func() { a.stop(e, feed) })
		case effRenew:
			a.env.goRun(func() { a.renew(e, feed) })
		case effLend:
			a.view.Open()
		case effRecall:
			recalledFree = a.view.Recall()
		case effHeld:
			if a.env.OnHeld != nil {
				a.env.OnHeld(a.s.ID, a.s.Sandbox)
			}
		case effLost:
			a.log().WithFields(logrus.Fields{"sandbox_id": e.Sandbox.Handle.SandboxID, "cause": fmt.Sprint(e.Cause)}).
				Warn("the session's sandbox is gone behind the owner's back: its calls and verify are refused (sandbox_lost) and no checkpoint exports it")
			if a.env.OnLost != nil {
				a.env.OnLost(a.s.ID, e.Sandbox)
			}
		case effEnded:
			if a.env.OnEnded != nil {
				a.env.OnEnded(a.s.ID, e.Stopped, e.Reason)
			}
			if parent := ctx.Parent(); parent != nil {
				ctx.Send(parent, &messages.ForgetSession{SessionID: a.s.ID, PID: ctx.Self(), Ended: true})
			}
		}
	}
	// Performed: the buffer keeps no reply, context or function alive
	// until the session's next message.
	clear(effects)
	return recalledFree
}

// guard turns a panic in a resources server's code into an error, so that a
// bad setup or tool call fails its request instead of the session.
func guard(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("panic: %v\n%s", r, debug.Stack())
	}
}

func orBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

func (a *sessionActor) start(e effStart, feed func(any)) {
	ctx := orBackground(e.Ctx)
	p := a.env.Provider
	l, err := a.launch(ctx, e)
	if err != nil {
		feed(startDone{Seq: e.Seq, Err: fmt.Errorf("start sandbox: %w", err)})
		return
	}
	h := l.Handle
	sb := sandbox.Sandbox{Handle: h, Spec: e.Spec, Workdir: e.Workdir, FromSnapshot: l.FromSnapshot}
	if sb.Workdir == "" {
		sb.Workdir = l.Workdir
	}
	if ttl := e.Spec.TTL(); ttl > 0 {
		sb.ExpiresAt = l.StartedAt.Add(ttl)
	}
	data, err := a.runSetup(ctx, e.Setup, sb)
	if err == nil && sb.Workdir == "" {
		sb.Workdir, err = WorkdirOf(ctx, p, h)
	}
	if err != nil {
		// Nothing is tracked for a failed setup: stop what was started,
		// retrying, since nothing else would stop it.
		stopCtx, cancel := context.WithTimeout(a.env.base(), a.stopTimeout())
		defer cancel()
		if serr := provider.StopRetrying(stopCtx, p, h); serr != nil {
			a.log().WithError(serr).WithField("sandbox_id", h.SandboxID).Warn("stopping the sandbox of a failed setup failed")
		}
		feed(startDone{Seq: e.Seq, Err: err})
		return
	}
	sb.Data = data
	feed(startDone{Seq: e.Seq, Sandbox: sb, At: a.env.Clock.Now()})
}

// launch makes the sandbox: e's Launch when it has one, else the
// provider's Start. StartedAt is when its lease began.
func (a *sessionActor) launch(ctx context.Context, e effStart) (sandbox.Launched, error) {
	if e.Launch == nil {
		h, err := a.env.Provider.Start(ctx, e.Spec)
		return sandbox.Launched{Handle: h, StartedAt: a.env.Clock.Now()}, err
	}
	l, err := e.Launch(ctx, e.Spec)
	if err == nil && l.StartedAt.IsZero() {
		l.StartedAt = a.env.Clock.Now()
	}
	return l, err
}

func (a *sessionActor) runSetup(ctx context.Context, setup sandbox.SetupFunc, sb sandbox.Sandbox) (data json.RawMessage, err error) {
	if setup == nil {
		return json.RawMessage("{}"), nil
	}
	err = func() (err error) {
		defer guard(&err)
		data, err = setup(ctx, a.env.Provider, sb)
		return err
	}()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", sandbox.ErrSetup, err)
	}
	return ValidateSessionData(data)
}

// ValidateSessionData accepts a JSON object of at most MaxSessionData bytes
// (nil or empty means {}).
func ValidateSessionData(data json.RawMessage) (json.RawMessage, error) {
	if len(data) == 0 {
		return json.RawMessage("{}"), nil
	}
	if len(data) > MaxSessionData {
		return nil, fmt.Errorf("%w: session data is %d bytes, more than %d", sandbox.ErrSetup, len(data), MaxSessionData)
	}
	// Checked, not decoded: every seed's setup returns its data, and a
	// decode into a map allocated the map and each of its values.
	if !json.Valid(data) || !bytes.HasPrefix(bytes.TrimLeft(data, " \t\r\n"), []byte("{")) {
		return nil, fmt.Errorf("%w: session data must be a JSON object", sandbox.ErrSetup)
	}
	return append(json.RawMessage(nil), data...), nil
}

// WorkdirOf is the sandbox's working directory: its pwd, bounded by the
// command's own timeout as well as ctx. pwd changes nothing, so one the
// provider answered unavailable (a remote execd's stream cut short, say) is
// run once more.
func WorkdirOf(ctx context.Context, p provider.Provider, h provider.Handle) (string, error) {
	req := provider.ExecRequest{Command: "pwd", Timeout: 30 * time.Second}
	res, err := p.Exec(ctx, h, req)
	if errors.Is(err, provider.ErrUnavailable) && ctx.Err() == nil {
		res, err = p.Exec(ctx, h, req)
	}
	if err != nil {
		return "", fmt.Errorf("find workdir: %w", err)
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("find workdir: pwd exited %d: %s", res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(res.Stdout), nil
}

func (a *sessionActor) do(e effDo, feed func(any)) {
	lost, err := RunDo(e.Ctx, a.env.Provider, e.Sandbox, e.Fn)
	feed(doDone{Seq: e.Seq, Err: err, Lost: lost})
}

// RunDo runs fn against sb on the calling goroutine, as a session runs a
// Do: a panic is its error, and lost reports a call on sb that p answered
// "not found" (even when fn went on without it). A caller that borrowed
// the session's permit (messages.SessionView.Borrow) runs its Do so.
func RunDo(ctx context.Context, p provider.Provider, sb sandbox.Sandbox, fn sandbox.DoFunc) (lost bool, err error) {
	w := &lostWatch{Provider: p, id: sb.Handle.SandboxID}
	err = func() (err error) {
		defer guard(&err)
		return fn(orBackground(ctx), w, sb)
	}()
	return w.lost.Load(), err
}

// lostWatch is the provider a DoFunc works through: it notes a call on the
// session's sandbox that the provider answered "not found", so that the
// sandbox is known lost even when the DoFunc carries on without it (a grader
// that scores what it could read would grade an empty sandbox).
type lostWatch struct {
	provider.Provider
	id   string
	lost atomic.Bool
}

// Capabilities are the flags of the provider watched, and none of its
// interfaces: their calls would go around the watch.
func (w *lostWatch) Capabilities() provider.Capabilities {
	c := w.Provider.Capabilities()
	return provider.Capabilities{RegularFiles: c.RegularFiles, HostTools: c.HostTools}
}

func (w *lostWatch) note(h provider.Handle, err error) {
	if err != nil && h.SandboxID == w.id && errors.Is(err, provider.ErrSandboxNotFound) {
		w.lost.Store(true)
	}
}

func (w *lostWatch) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	res, err := w.Provider.Exec(ctx, h, req)
	w.note(h, err)
	return res, err
}

func (w *lostWatch) WriteFile(ctx context.Context, h provider.Handle, path string, data []byte) error {
	err := w.Provider.WriteFile(ctx, h, path, data)
	w.note(h, err)
	return err
}

func (w *lostWatch) ReadFile(ctx context.Context, h provider.Handle, path string) ([]byte, error) {
	b, err := w.Provider.ReadFile(ctx, h, path)
	w.note(h, err)
	return b, err
}

func (w *lostWatch) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	st, err := w.Provider.Status(ctx, h)
	w.note(h, err)
	return st, err
}

func (a *sessionActor) snapshot(e effSnapshot, feed func(any)) {
	ctx := a.env.base()
	if !e.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = clock.WithDeadline(ctx, a.env.Clock, e.Deadline)
		defer cancel()
	}
	snap := a.env.Provider.Capabilities().Snapshotter
	if snap == nil {
		feed(snapshotDone{Seq: e.Seq, Err: fmt.Errorf("provider %q cannot snapshot: %w", a.env.Provider.Name(), provider.ErrUnsupported)})
		return
	}
	if err := a.env.Limiter.Acquire(ctx); err != nil {
		feed(snapshotDone{Seq: e.Seq, Err: fmt.Errorf("waiting to snapshot: %w", err)})
		return
	}
	// A slot freed by a call that ended at the deadline can be won after
	// it: a snapshot begun then could only be deleted again.
	if err := ctx.Err(); err != nil {
		a.env.Limiter.Release()
		feed(snapshotDone{Seq: e.Seq, Err: fmt.Errorf("waiting to snapshot: %w", err)})
		return
	}
	id, err := snap.Snapshot(ctx, e.Sandbox.Handle, e.Name)
	if err != nil {
		err = fmt.Errorf("session %q could not be snapshotted: %w", a.s.ID, err)
	}
	feed(snapshotDone{Seq: e.Seq, SnapshotID: id, At: a.env.Clock.Now(), Err: err})
	// The slot is freed once the feed returned. The owner's mailboxes run
	// on the goroutine that feeds them, so this completion's step (and the
	// coordinator's, when idle) runs first, for microseconds; on a
	// dispatcher, freed last, the next waiter ran ahead of those runs.
	a.env.Limiter.Release()
}

func (a *sessionActor) stop(e effStop, feed func(any)) {
	ctx, cancel := clock.WithTimeout(a.env.base(), a.env.Clock, a.stopTimeout())
	defer cancel()
	if e.Reason != messages.StopEnd {
		// Parks and retires come in bulk from the control plane: bound them
		// like the other checkpoint calls.
		if err := a.env.Limiter.Acquire(ctx); err != nil {
			feed(stopDone{Seq: e.Seq, Err: err})
			return
		}
		defer a.env.Limiter.Release()
	}
	err := a.env.Provider.Stop(ctx, e.Handle)
	if err != nil {
		err = fmt.Errorf("stop sandbox %s: %w", e.Handle.SandboxID, err)
	}
	feed(stopDone{Seq: e.Seq, Err: err})
}

func (a *sessionActor) renew(e effRenew, feed func(any)) {
	l := a.env.Provider.Capabilities().Leaser
	if l == nil {
		feed(renewDone{Seq: e.Seq, Err: provider.ErrUnsupported})
		return
	}
	ctx, cancel := context.WithTimeout(a.env.base(), timeouts.ProviderCall)
	defer cancel()
	err := l.Renew(ctx, e.Handle, e.Until)
	if err != nil {
		a.log().WithError(err).WithField("sandbox_id", e.Handle.SandboxID).Warn("lease renewal failed")
	}
	feed(renewDone{Seq: e.Seq, Until: e.Until, Err: err})
}
