// Package messages holds every message exchanged between the owner's actors:
// plain structs, no behaviour. A round's messages carry its Round, which the
// replies echo, so that the coordinator drops a stale or duplicate reply
// instead of acting on it. A session request's ReqID is echoed too, but the
// owner leaves it zero: each of its calls waits on a reply channel of its
// own, so no reply can be taken for another's.
//
// Function-typed fields (Setup, Fn) are the owner's way to run a resources
// server's code against a sandbox; they are executed off the actor's mailbox.
package messages

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// StopReason says why a session's sandbox is stopped.
type StopReason string

// Stop reasons.
const (
	StopEnd    StopReason = "end"    // the episode is over (verify, close)
	StopRetire StopReason = "retire" // the attempt was discarded
	StopPark   StopReason = "park"   // a commit with stop: true parked it
	StopIdle   StopReason = "idle"   // no request for session_idle_timeout
)

// --- replies to askers outside the actor system ---

// ReplyTo is where an asker that is not an actor waits for its request's one
// answer: a channel with room for it (capacity 1), so that the answering
// actor never blocks. A request whose ReplyTo is nil is answered to its
// protoactor sender instead.
type ReplyTo chan any

// Deliver puts the answer in the slot, or drops it if the slot already
// holds one (which a correct actor never causes).
func (r ReplyTo) Deliver(msg any) {
	select {
	case r <- msg:
	default:
	}
}

// Undelivered is what a ReplyTo receives when its request reached no actor
// (the actor had stopped): the request was not acted on.
type Undelivered struct{}

// ReplySlot returns the ReplyTo a request carries (nil for a message that
// carries none).
func ReplySlot(msg any) ReplyTo {
	switch m := msg.(type) {
	case *StartSandbox:
		return m.Reply
	case *Do:
		return m.Reply
	case *DoReturned:
		return m.Reply
	case *GetSandbox:
		return m.Reply
	case *StopSandbox:
		return m.Reply
	case *SpawnSession:
		return m.Reply
	case *LookupSession:
		return m.Reply
	case *ListSessions:
		return m.Reply
	}
	return nil
}

// --- session actor requests ---

// StartSandbox asks a session to start its sandbox and run setup.
type StartSandbox struct {
	// Ctx bounds the start and the setup; nil means no bound.
	Ctx     context.Context
	ReqID   uint64
	Spec    provider.Spec
	Setup   sandbox.SetupFunc
	Workdir string
	// Launch, when set, makes the sandbox in place of the provider's
	// Start: a fork of a template, or one a warm pool started earlier.
	Launch sandbox.LaunchFunc
	Reply  ReplyTo
}

// StartReply answers StartSandbox.
type StartReply struct {
	ReqID   uint64
	Sandbox sandbox.Sandbox
	// Existing is true when the session already held a sandbox that a
	// restore installed: setup did not run again.
	Existing bool
	Err      error
}

// Do asks a session to run Fn against its sandbox.
type Do struct {
	// Ctx bounds Fn; nil means no bound.
	Ctx   context.Context
	ReqID uint64
	Fn    sandbox.DoFunc
	Reply ReplyTo
}

// DoReply answers Do.
type DoReply struct {
	ReqID uint64
	Err   error
}

// DoReturned gives a session back the permit its SessionView lent a caller
// (see SessionView.Borrow), once that caller's function returned: sent when
// the session recalled the permit meanwhile, or when the function found the
// sandbox gone (Lost, or an Err wrapping provider.ErrSandboxNotFound). A
// lost return carries Reply and is answered with a DoReply once the session
// marked its sandbox lost; Err is the function's error.
type DoReturned struct {
	Lost  bool
	Err   error
	Reply ReplyTo
}

// GetSandbox asks a session for its sandbox.
type GetSandbox struct {
	Reply ReplyTo
}

// GetSandboxReply answers GetSandbox.
type GetSandboxReply struct {
	SessionID string
	Sandbox   sandbox.Sandbox
	// Held is false when the session holds no sandbox (before setup
	// returned, after it ended).
	Held bool
	// Starting is true while the sandbox is starting or in setup.
	Starting bool
	// Lost is true when the sandbox is gone behind the owner's back.
	Lost bool
}

// SessionView is where a session actor publishes what GetSandbox would
// answer, as an immutable value swapped whole after each message that
// changes it: a read on every request's path (an agent's /sandbox_access,
// a verify) loads it without a round trip through the session's mailbox.
// Only the actor stores into it. A session that shows nothing of a
// sandbox (none held, starting or lost) publishes one empty value shared
// by all such sessions, without its id.
//
// It also carries the session's last use the other way: a request's Touch
// raises it without a message (one per request was a mailbox send on every
// request's path), and the actor reads it when it decides an idle stop.
//
// And it lends the sandbox: while the session is idle (ready, not lost,
// nothing running or queued) its actor leaves a permit open, which one
// caller at a time takes to run a Do on its own goroutine with no message at
// all (a Do through the mailbox was four goroutine hand-offs: the mailbox,
// an effect worker, the mailbox again, the caller). Before the actor starts
// anything else it recalls the permit; a caller that holds it tells the
// actor when it is done (DoReturned), and the actor waits for that, as it
// waits for a Do of its own.
type SessionView struct {
	p atomic.Pointer[GetSandboxReply]
	// unlisted: the actor was made ahead for a restore that has not
	// installed it (see SpawnSession.Unlisted).
	unlisted atomic.Bool
	// used is the latest use touched, in Unix nanoseconds; 0 for none.
	used atomic.Int64
	// permit is one of the permit states below.
	permit atomic.Int32
}

// The states of a SessionView's permit.
const (
	// permitClosed: the actor lends nothing (it runs or queued an
	// operation, holds no sandbox, or a caller withdrew the permit and
	// its DoReturned is on the way).
	permitClosed int32 = iota
	// permitOpen: a caller may take it.
	permitOpen
	// permitLent: a caller runs a Do.
	permitLent
	// permitRecalled: a caller runs a Do and the actor waits for it.
	permitRecalled
)

// Borrow takes the session's permit, which lets the caller run one Do
// against the sandbox this view holds; false when the session lends
// nothing now (the caller then asks the actor). A caller that borrowed
// must GiveBack or Withdraw.
func (v *SessionView) Borrow() bool { return v.permit.CompareAndSwap(permitOpen, permitLent) }

// GiveBack returns a borrowed permit. recalled is true when the actor
// recalled it meanwhile: the caller must then send it a DoReturned, which
// it waits for.
func (v *SessionView) GiveBack() (recalled bool) {
	if v.permit.CompareAndSwap(permitLent, permitOpen) {
		return false
	}
	v.permit.Store(permitClosed)
	return true
}

// Withdraw keeps a borrowed permit from every other caller: the caller's
// Do found the sandbox gone and sends the actor a DoReturned saying so.
func (v *SessionView) Withdraw() { v.permit.Store(permitClosed) }

// Lent reports whether a caller holds the permit.
func (v *SessionView) Lent() bool {
	p := v.permit.Load()
	return p == permitLent || p == permitRecalled
}

// Open lets callers borrow the sandbox (the actor's, once it is idle and
// has published the view that holds it).
func (v *SessionView) Open() { v.permit.Store(permitOpen) }

// Close ends the lending for good (the actor's, as it stops): a caller
// that holds the permit is not waited for.
func (v *SessionView) Close() { v.permit.Store(permitClosed) }

// Recall takes the permit back (the actor's). free is true when no caller
// held it; otherwise one does, or did and withdrew it, and its DoReturned
// is on the way.
func (v *SessionView) Recall() (free bool) {
	for {
		if v.permit.CompareAndSwap(permitOpen, permitClosed) {
			return true
		}
		if v.permit.CompareAndSwap(permitLent, permitRecalled) {
			return false
		}
		if p := v.permit.Load(); p == permitClosed || p == permitRecalled {
			return false
		}
	}
}

// Unlisted reports whether the actor was made ahead for a restore that
// has not installed it: its sandbox is then the restore's, which stops it
// if the restore fails, and the actor stopping leaves it alone.
func (v *SessionView) Unlisted() bool { return v.unlisted.Load() }

// SetUnlisted marks the actor made ahead for a restore (true), or
// installed (false): the supervisor's.
func (v *SessionView) SetUnlisted(b bool) { v.unlisted.Store(b) }

// Touch records a use at at. Uses may be reported out of order: the
// latest stays.
func (v *SessionView) Touch(at time.Time) {
	n := at.UnixNano()
	for {
		cur := v.used.Load()
		if n <= cur || v.used.CompareAndSwap(cur, n) {
			return
		}
	}
}

// Used is the latest use touched; the zero time when none was.
func (v *SessionView) Used() time.Time {
	n := v.used.Load()
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

// Load returns the last view published (nil before the first). The reply
// is shared: callers must not change it.
func (v *SessionView) Load() *GetSandboxReply { return v.p.Load() }

// Store publishes r, which must not be changed afterwards.
func (v *SessionView) Store(r *GetSandboxReply) { v.p.Store(r) }

// StopSandbox asks a session to stop its sandbox.
type StopSandbox struct {
	ReqID  uint64
	Reason StopReason
	// IdleSince, when set, makes the stop conditional: it happens only if
	// the session holds a sandbox, has not been used since IdleSince, and
	// has no operation running or queued; otherwise the reply says NotIdle.
	IdleSince time.Time
	Reply     ReplyTo
}

// StopReply answers StopSandbox. Stopped lists the sandbox that was stopped,
// if any.
type StopReply struct {
	ReqID     uint64
	SessionID string
	Stopped   *provider.Handle
	// NotIdle answers a conditional stop that did not happen.
	NotIdle bool
	Err     error
}

// Touch tells a session it was used at At, which defers its idle end. The
// owner touches a session's SessionView instead; this is the same input to
// the session's state machine, for its scripts.
type Touch struct {
	At time.Time
}

// TakeSnapshot asks a session for a snapshot of its sandbox as part of
// commit round Round.
type TakeSnapshot struct {
	Round uint64
	Name  string
	// Deadline ends the snapshot call (the commit round's deadline).
	Deadline time.Time
}

// SnapshotReply answers TakeSnapshot. Skipped is set when the session had
// nothing to export (still in setup, already ended).
type SnapshotReply struct {
	Round      uint64
	SessionID  string
	Skipped    bool
	SnapshotID string
	Sandbox    sandbox.Sandbox
	At         time.Time
	Err        error
}

// RenewLease asks a session to renew its sandbox's lease if it is due.
type RenewLease struct {
	Now time.Time
}

// --- supervisor requests ---

// SpawnSession asks the supervisor for the session's actor, spawning it
// (empty, or holding Install) when there is none.
type SpawnSession struct {
	SessionID string
	// Install, when set, is the sandbox a restore forked for the session.
	Install *sandbox.Sandbox
	// Unlisted, with Install, makes the actor ahead of a restore's
	// install, as its fork returns, while the other forks run: nobody
	// finds it until a ListPrepared lists it, and it is not answered (a
	// spawn that failed is found missing by the ListPrepared).
	Unlisted bool
	// Limit, when positive, refuses a new actor while the supervisor
	// holds that many sessions (max_sessions; a restore passes none).
	Limit int
	// Start, when set, is handed to the session's actor (the new one, or
	// the one the supervisor has) instead of an answer: its StartReply,
	// in Start.Reply (the same slot as Reply), answers the spawn. Only a
	// refusal (at capacity, a failed spawn) is answered with the
	// SessionRef.
	Start *StartSandbox
	// Ref is the SessionRef the supervisor sets before it hands Start on
	// (or answers): read it once an answer came, not before.
	Ref   *SessionRef
	Reply ReplyTo
}

// ListPrepared lists the actors made ahead (SpawnSession.Unlisted) for
// the sessions, all in one turn of the supervisor: each holding exactly
// the sandbox named at the same index (its id and lease), unless the
// session has an actor already (ErrSessionExists, as a spawn's install).
// Those it does not list, and any other made ahead, it stops, leaving
// their sandboxes alone. Answered with a PreparedListed.
type ListPrepared struct {
	SessionIDs []string
	Sandboxes  []*sandbox.Sandbox
	Reply      ReplyTo
}

// PreparedListed answers ListPrepared: Errs is index-aligned with its
// sessions, nil where the session's actor was listed.
type PreparedListed struct {
	Errs []error
}

// DiscardPrepared stops every actor made ahead and not listed, leaving
// their sandboxes alone (a failed restore stops its forks itself).
type DiscardPrepared struct{}

// LookupSession asks the supervisor for a session's actor.
type LookupSession struct {
	SessionID string
	Reply     ReplyTo
}

// SessionRef answers SpawnSession and LookupSession. PID is nil when the
// session is unknown. Its type is any so that this package does not import
// protoactor; the actors package stores *actor.PID in it.
type SessionRef struct {
	SessionID string
	PID       any
	// Spawned is true when SpawnSession created the actor.
	Spawned bool
	Err     error
}

// ForgetSession asks the supervisor to stop a session's actor once its
// sandbox is gone.
type ForgetSession struct {
	SessionID string
	// PID, when set, names the incarnation to forget: a newer actor of the
	// same session is left alone.
	PID any
	// Ended: the actor asks for itself, its session over; it answers as
	// ended already, so the supervisor sends it no SessionForgotten.
	Ended bool
}

// SessionForgotten tells a session actor that the supervisor forgot it:
// from now on it answers as an ended session (a start must go to a new
// actor) until its poison pill arrives.
type SessionForgotten struct{}

// ListSessions asks the supervisor for the live set.
type ListSessions struct {
	Reply ReplyTo
}

// SessionList answers ListSessions, sorted by session id.
type SessionList struct {
	Sessions []SessionRef
}
