package actors

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// Errors a session replies with.
var (
	// ErrSessionEnded: the session is over and its actor on its way out;
	// a new start must go to a new actor.
	ErrSessionEnded = errors.New("session ended")
)

// Stage is where a session is in its life (not to be confused with a
// checkpoint's control.Phase).
type Stage int

// Stages. A session moves Empty → Starting → Ready → Stopping → Ended; a
// failed start goes back to Empty, a failed stop back to Ready (so a retry
// stops it), and a restore installs a session directly in Ready.
const (
	StageEmpty Stage = iota
	StageStarting
	StageReady
	StageStopping
	StageEnded
)

func (p Stage) String() string {
	return [...]string{"empty", "starting", "ready", "stopping", "ended"}[p]
}

// request is a message with the party to answer.
type request struct {
	msg    any
	sender any
}

// Effects the session logic asks its shell to perform. Each carries the
// operation's sequence number; the shell feeds the outcome back as the
// matching *Done input with the same Seq.
type (
	// effStart: start the sandbox, run setup, find the workdir.
	effStart struct {
		Seq     uint64
		Ctx     context.Context
		Spec    provider.Spec
		Setup   sandbox.SetupFunc
		Workdir string
		Launch  sandbox.LaunchFunc
	}
	// effDo: run a DoFunc against the sandbox.
	effDo struct {
		Seq     uint64
		Ctx     context.Context
		Fn      sandbox.DoFunc
		Sandbox sandbox.Sandbox
	}
	// effSnapshot: snapshot the sandbox.
	effSnapshot struct {
		Seq      uint64
		Name     string
		Round    uint64
		Deadline time.Time
		Sandbox  sandbox.Sandbox
	}
	// effStop: stop the sandbox.
	effStop struct {
		Seq    uint64
		Handle provider.Handle
		Reason messages.StopReason
	}
	// effRenew: move the sandbox's lease to Until.
	effRenew struct {
		Seq    uint64
		Handle provider.Handle
		Until  time.Time
	}
	// effReply: answer To with Msg.
	effReply struct {
		To  any
		Msg any
	}
	// effHeld: the session now holds its Sandbox (the owner indexes it).
	// It names no sandbox: only a start's completion replaces the
	// session's, so the shell reads it from the session (a copy in the
	// effect was a few hundred bytes on every seed).
	effHeld struct{}
	// effLost: the session's sandbox was found gone (once per session).
	effLost struct {
		Sandbox sandbox.Sandbox
		Cause   error
	}
	// effEnded: the session is over; the supervisor may forget it.
	effEnded struct {
		Stopped *provider.Handle
		Reason  messages.StopReason
	}
	// effLend: open the permit (the session is idle and holds its
	// sandbox): a caller may run a Do without a message.
	effLend struct{}
	// effRecall: take the permit back before an operation starts; the
	// shell feeds recalled when no caller held it, and the caller that
	// held it sends a DoReturned.
	effRecall struct{}
)

// Completions of effects, fed back into Step.
type (
	startDone struct {
		Seq     uint64
		Sandbox sandbox.Sandbox
		At      time.Time // when the start ended
		Err     error
	}
	doDone struct {
		Seq uint64
		Err error
		// Lost: the provider said the sandbox is not found during the
		// operation, even if the operation went on.
		Lost bool
	}
	snapshotDone struct {
		Seq        uint64
		SnapshotID string
		At         time.Time
		Err        error
	}
	stopDone struct {
		Seq uint64
		Err error
	}
	renewDone struct {
		Seq   uint64
		Until time.Time
		Err   error
	}
	// recalled: the permit was free when the session recalled it.
	recalled struct{}
)

// Session is the pure state of one session: what it holds and which
// operation runs. It performs no I/O; Step returns the effects to perform.
// Operations are serialised: while one effect is outstanding, later requests
// queue, so a stop never races its own start and a snapshot never races a
// tool call.
type Session struct {
	ID      string
	Stage   Stage
	Sandbox sandbox.Sandbox
	// Lost is set once the sandbox is found gone behind the owner's back:
	// the session still holds its handle (a stop of it succeeds) but runs
	// and exports nothing.
	Lost bool
	// LastUse is when the session was last used (a Touch, its start, its
	// restore): an idle reaper ends it once that is long enough ago.
	LastUse time.Time

	seq uint64
	// running is the request whose effect is outstanding, when busy.
	running request
	busy    bool
	queue   []request
	// out holds the effects of the current Step: one buffer the session
	// keeps, where a slice of each step's own was several allocations on
	// every message. It starts in outs, and the queue in queued: a seed
	// and close makes a session whose few steps fit in them, so neither
	// grows a slice of its own.
	out    []any
	outs   [4]any
	queued [1]request
	// renewSeq is the outstanding lease renewal, if any; renewals do not
	// serialise with other operations (they do not touch the sandbox's
	// contents), but only one runs at a time.
	renewSeq     uint64
	renewCounter uint64
	// forgotten: the supervisor forgot this actor; a start must go to a new
	// one.
	forgotten bool
	// lends: the session lends its sandbox to callers while idle (its
	// shell publishes a view with a permit).
	lends bool
	// lent: the permit is open or a caller holds it; no operation starts
	// until it is back (recalled, or a DoReturned). recalling: asked.
	lent, recalling bool
}

// NewSession returns an empty session.
func NewSession(id string) *Session { return &Session{ID: id} }

// NewInstalledSession returns a session holding a sandbox a restore forked.
func NewInstalledSession(id string, sb sandbox.Sandbox) *Session {
	if len(sb.Data) == 0 {
		sb.Data = json.RawMessage("{}")
	}
	return &Session{ID: id, Stage: StageReady, Sandbox: sb}
}

// Busy reports whether an operation is outstanding.
func (s *Session) Busy() bool { return s.busy }

// Step takes one input (a request with its sender, or an effect's
// completion) and returns the effects to perform, in order. A permit opened
// goes first, before the replies: a caller who heard its answer finds the
// sandbox lent for its next Do. The slice returned is the session's own
// buffer: it holds until the next Step, which reuses it.
func (s *Session) Step(in any, sender any) []any {
	if s.out == nil {
		s.out, s.queue = s.outs[:0], s.queued[:0]
	}
	clear(s.out)
	// Slot 0 is the permit's: next opens it there (see lend).
	s.out = append(s.out[:0], nil)
	s.step(in, sender)
	if s.out[0] == nil {
		return s.out[1:]
	}
	return s.out
}

// lend emits effLend first among the step's effects, in the slot Step
// keeps for it.
func (s *Session) lend() { s.out[0] = effLend{} }

// emit adds an effect to the current Step's.
func (s *Session) emit(e any) { s.out = append(s.out, e) }

// reply emits an answer to to.
func (s *Session) reply(to, msg any) { s.emit(effReply{To: to, Msg: msg}) }

func (s *Session) step(in any, sender any) {
	switch m := in.(type) {
	case startDone, doDone, snapshotDone, stopDone:
		s.complete(m)
		return
	case renewDone:
		if m.Seq != s.renewSeq {
			return
		}
		s.renewSeq = 0
		if m.Err == nil && s.Stage == StageReady {
			s.Sandbox.ExpiresAt = m.Until
		}
		if s.Stage == StageReady && errors.Is(m.Err, provider.ErrSandboxNotFound) {
			s.lose(m.Err)
		}
		return
	case *messages.GetSandbox:
		// Answered at once, even while an operation runs: it reads state.
		s.reply(sender, s.view())
		return
	case *messages.SessionForgotten:
		s.forgotten = true
		if s.Stage == StageEmpty && !s.busy {
			s.Stage = StageEnded
		}
		return
	case *messages.RenewLease:
		s.renew(m.Now)
		return
	case *messages.Touch:
		s.touch(m.At)
		return
	case recalled:
		s.returned(nil)
		return
	case *messages.DoReturned:
		s.returned(m)
		return
	case *messages.StopSandbox:
		// A conditional (idle) stop is decided now, against what is
		// running and queued, so that a request that just arrived keeps
		// the session.
		if !m.IdleSince.IsZero() && (s.Stage != StageReady || s.busy || len(s.queue) > 0 || s.LastUse.After(m.IdleSince)) {
			s.reply(sender, &messages.StopReply{ReqID: m.ReqID, SessionID: s.ID, NotIdle: true})
			return
		}
	case *messages.TakeSnapshot:
		if s.Stage == StageStarting || s.Stage == StageEmpty || s.Stage == StageEnded || s.Lost {
			// Nothing to export, and waiting for a setup to finish would
			// hold the whole commit: answer at once.
			s.reply(sender, &messages.SnapshotReply{Round: m.Round, SessionID: s.ID, Skipped: true})
			return
		}
	}
	s.queue = append(s.queue, request{msg: in, sender: sender})
	s.next()
}

func (s *Session) view() *messages.GetSandboxReply {
	held, starting, lost := s.shows()
	return &messages.GetSandboxReply{SessionID: s.ID, Sandbox: s.Sandbox, Held: held, Starting: starting, Lost: lost}
}

// shows is what the session's view says of its sandbox.
func (s *Session) shows() (held, starting, lost bool) {
	return (s.Stage == StageReady || s.Stage == StageStopping) && !s.Lost, s.Stage == StageStarting, s.Lost && s.Stage == StageReady
}

// next starts queued requests until one needs an effect, recalling the
// permit first when it is lent; an idle session that holds its sandbox
// lends it. A recall is the last effect of its step (the shell relies on
// it: it feeds recalled once the others are done).
func (s *Session) next() {
	for !s.busy && len(s.queue) > 0 {
		if s.lent {
			if !s.recalling {
				s.recalling = true
				s.emit(effRecall{})
			}
			return
		}
		r := s.pop()
		s.begin(r)
	}
	if s.lends && !s.lent && !s.busy && s.Stage == StageReady && !s.Lost {
		s.lent = true
		s.lend()
	}
}

// pop takes the first queued request. The queue is nearly always one
// request long: emptied, it keeps its array for the next.
func (s *Session) pop() request {
	r := s.queue[0]
	s.queue[0] = request{}
	if len(s.queue) == 1 {
		s.queue = s.queue[:0]
	} else {
		s.queue = s.queue[1:]
	}
	return r
}

// returned takes the permit back: free when recalled (ret nil), or from
// the caller that held it. A caller whose Do found the sandbox gone is
// answered once the session knows it lost.
func (s *Session) returned(ret *messages.DoReturned) {
	if ret != nil && (ret.Lost || errors.Is(ret.Err, provider.ErrSandboxNotFound)) {
		s.lose(ret.Err)
		s.reply(ret.Reply, &messages.DoReply{Err: sandbox.ErrLost})
	}
	if !s.lent {
		return // not lent: no permit to take back
	}
	s.lent, s.recalling = false, false
	s.next()
}

// begin decides what a request does in the current phase.
func (s *Session) begin(r request) {
	reply := func(msg any) { s.reply(r.sender, msg) }
	switch m := r.msg.(type) {
	case *messages.StartSandbox:
		switch s.Stage {
		case StageReady:
			if s.Sandbox.Restored {
				// A replacement attempt re-seeding a restored session
				// gets the fork; setup does not run again.
				reply(&messages.StartReply{ReqID: m.ReqID, Sandbox: s.Sandbox, Existing: true})
				return
			}
			reply(&messages.StartReply{ReqID: m.ReqID, Err: sandbox.ErrExists})
		case StageEmpty:
			if s.forgotten {
				s.Stage = StageEnded
				reply(&messages.StartReply{ReqID: m.ReqID, Err: ErrSessionEnded})
				return
			}
			s.Stage = StageStarting
			s.run(r, effStart{Seq: s.seq, Ctx: m.Ctx, Spec: m.Spec, Setup: m.Setup, Workdir: m.Workdir, Launch: m.Launch})
		case StageEnded:
			reply(&messages.StartReply{ReqID: m.ReqID, Err: ErrSessionEnded})
		default:
			reply(&messages.StartReply{ReqID: m.ReqID, Err: sandbox.ErrExists})
		}
	case *messages.Do:
		if s.Lost && s.Stage == StageReady {
			reply(&messages.DoReply{ReqID: m.ReqID, Err: sandbox.ErrLost})
			return
		}
		if s.Stage != StageReady {
			reply(&messages.DoReply{ReqID: m.ReqID, Err: sandbox.ErrNone})
			return
		}
		s.run(r, effDo{Seq: s.seq, Ctx: m.Ctx, Fn: m.Fn, Sandbox: s.Sandbox})
	case *messages.TakeSnapshot:
		if s.Stage != StageReady || s.Lost {
			reply(&messages.SnapshotReply{Round: m.Round, SessionID: s.ID, Skipped: true})
			return
		}
		s.run(r, effSnapshot{Seq: s.seq, Name: m.Name, Round: m.Round, Deadline: m.Deadline, Sandbox: s.Sandbox})
	case *messages.StopSandbox:
		if s.Stage != StageReady {
			// Nothing held: stopping is idempotent. An ended session is
			// forgotten before the caller hears of it (see stopDone).
			if s.Stage == StageEmpty {
				s.Stage = StageEnded
				s.emit(effEnded{Reason: m.Reason})
			}
			reply(&messages.StopReply{ReqID: m.ReqID, SessionID: s.ID})
			return
		}
		s.Stage = StageStopping
		s.run(r, effStop{Seq: s.seq, Handle: s.Sandbox.Handle, Reason: m.Reason})
	}
}

func (s *Session) run(r request, eff any) {
	s.running, s.busy = r, true
	s.emit(eff)
}

// complete applies an effect's outcome, answers the request that caused it
// and starts the next queued one.
func (s *Session) complete(done any) {
	if !s.busy || seqOf(done) != s.seq || !answers(done, s.running.msg) {
		return // stale: not the outstanding operation
	}
	r := s.running
	s.running, s.busy = request{}, false
	s.seq++
	reply := func(msg any) { s.reply(r.sender, msg) }
	switch d := done.(type) {
	case startDone:
		m := r.msg.(*messages.StartSandbox)
		if d.Err != nil {
			s.Stage = StageEmpty
			reply(&messages.StartReply{ReqID: m.ReqID, Err: d.Err})
			break
		}
		s.Stage = StageReady
		s.Sandbox = d.Sandbox
		s.touch(d.At)
		s.emit(effHeld{})
		reply(&messages.StartReply{ReqID: m.ReqID, Sandbox: s.Sandbox})
	case doDone:
		err := d.Err
		if d.Lost || errors.Is(err, provider.ErrSandboxNotFound) {
			s.lose(err)
			err = sandbox.ErrLost
		}
		reply(&messages.DoReply{ReqID: r.msg.(*messages.Do).ReqID, Err: err})
	case snapshotDone:
		m := r.msg.(*messages.TakeSnapshot)
		if errors.Is(d.Err, provider.ErrSandboxNotFound) {
			s.lose(d.Err)
		}
		reply(&messages.SnapshotReply{Round: m.Round, SessionID: s.ID, SnapshotID: d.SnapshotID, Sandbox: s.Sandbox, At: d.At, Err: d.Err})
	case stopDone:
		m := r.msg.(*messages.StopSandbox)
		if d.Err != nil {
			// Keep the session so that a retry stops it.
			s.Stage = StageReady
			reply(&messages.StopReply{ReqID: m.ReqID, SessionID: s.ID, Err: d.Err})
			break
		}
		h := s.Sandbox.Handle
		s.Stage = StageEnded
		// Forget first: once the caller hears the stop succeeded, the
		// supervisor no longer lists the session (so a commit right after
		// an end does not ask an actor on its way out).
		s.emit(effEnded{Stopped: &h, Reason: m.Reason})
		reply(&messages.StopReply{ReqID: m.ReqID, SessionID: s.ID, Stopped: &h})
	}
	s.next()
}

// renew asks for a lease renewal once a third of the lease has passed, so
// that two renewals can fail before the lease runs out.
func (s *Session) renew(now time.Time) {
	ttl := s.Sandbox.Spec.TTL()
	if s.Stage != StageReady || s.Lost || ttl <= 0 || s.renewSeq != 0 || s.Sandbox.ExpiresAt.IsZero() {
		return
	}
	if s.Sandbox.ExpiresAt.Sub(now) > ttl*2/3 {
		return
	}
	// Renewals count on their own, so that one never matches an
	// operation's completion.
	s.renewCounter++
	s.renewSeq = s.renewCounter
	s.emit(effRenew{Seq: s.renewSeq, Handle: s.Sandbox.Handle, Until: now.Add(ttl)})
}

// answers reports whether a completion is of the kind the request's effect
// produces: a completion of another kind with a matching seq is a bug
// elsewhere, not a reason to misread it.
func answers(done, req any) bool {
	switch done.(type) {
	case startDone:
		_, ok := req.(*messages.StartSandbox)
		return ok
	case doDone:
		_, ok := req.(*messages.Do)
		return ok
	case snapshotDone:
		_, ok := req.(*messages.TakeSnapshot)
		return ok
	case stopDone:
		_, ok := req.(*messages.StopSandbox)
		return ok
	}
	return false
}

func seqOf(done any) uint64 {
	switch d := done.(type) {
	case startDone:
		return d.Seq
	case doDone:
		return d.Seq
	case snapshotDone:
		return d.Seq
	case stopDone:
		return d.Seq
	}
	return 0
}

// touch records a use at at (uses may be reported out of order).
func (s *Session) touch(at time.Time) {
	if at.After(s.LastUse) {
		s.LastUse = at
	}
}

// lose marks the session's sandbox lost; effLost is emitted the first time
// only, so that the owner logs it once.
func (s *Session) lose(cause error) {
	if s.Lost || s.Stage != StageReady {
		return
	}
	s.Lost = true
	s.emit(effLost{Sandbox: s.Sandbox, Cause: cause})
}
