package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// labeller marks a session's sandbox spec as this owner's: its name,
// incarnation and the session in the metadata, and the default lease where
// the spec names none.
type labeller struct {
	owner, incarnation string
	defaultTTL         time.Duration
}

// spec returns spec with the labels (and extra) added.
func (l labeller) spec(spec provider.Spec, sessionID string, extra map[string]string) provider.Spec {
	md := make(map[string]string, len(spec.Metadata)+4)
	for k, v := range spec.Metadata {
		md[k] = v
	}
	md[LabelOwner] = l.owner
	md[LabelIncarnation] = l.incarnation
	md[LabelSession] = sessionID
	for k, v := range extra {
		md[k] = v
	}
	spec.Metadata = md
	if spec.TTLSeconds == 0 && l.defaultTTL > 0 {
		spec.TTLSeconds = l.defaultTTL.Seconds()
	}
	return spec
}

func (o *Owner) labeller() labeller { return labeller{o.name, o.incarnation, o.cfg.DefaultTTL} }

// labelled returns spec with the owner's labels added.
func (o *Owner) labelled(spec provider.Spec, sessionID string, extra map[string]string) provider.Spec {
	return o.labeller().spec(spec, sessionID, extra)
}

// StartSessionSandbox starts the session's sandbox on the shared provider,
// runs setup against it, and only then tracks it. A failed setup (or one
// returning anything but a JSON object of at most 64 KiB) stops the sandbox
// and tracks nothing. workdir "" means the sandbox's pwd after setup. A
// session that already has a sandbox gets sandbox.ErrExists, except a session
// a restore rebuilt: a replacement attempt gets the fork (Restored is set)
// and setup does not run again.
func (o *Owner) StartSessionSandbox(ctx context.Context, sessionID string, spec provider.Spec, setup sandbox.SetupFunc, workdir string) (sandbox.Sandbox, error) {
	if o.pools == nil {
		return o.startSession(ctx, sessionID, spec, setup, workdir, nil)
	}
	return o.startPooled(ctx, sessionID, spec, setup, workdir)
}

// startSession is StartSessionSandbox with launch, when set, making the
// sandbox in place of the provider's Start.
func (o *Owner) startSession(ctx context.Context, sessionID string, spec provider.Spec, setup sandbox.SetupFunc, workdir string, launch sandbox.LaunchFunc) (sandbox.Sandbox, error) {
	if o.prov == nil {
		return sandbox.Sandbox{}, fmt.Errorf("%w: server %q lends no sandboxes", provider.ErrUnsupported, o.name)
	}
	if sessionID == "" {
		return sandbox.Sandbox{}, fmt.Errorf("%w: empty session id", provider.ErrInvalidSpec)
	}
	spec = o.labelled(spec, sessionID, nil)
	if launch == nil {
		launch = o.launchNumbered
	}
	o.starting.Add(1)
	defer o.starting.Add(-1)
	m := newSeeding(sessionID, o.cfg.MaxSessions, messages.StartSandbox{Ctx: ctx, Spec: spec, Setup: setup, Workdir: workdir, Launch: launch})
	if err := o.run(ctx, m); err != nil {
		return sandbox.Sandbox{}, err
	}
	return m.sb, nil
}

// startNumbered starts labelled with the next LabelStart: a start that
// fails after the provider made its sandbox stops that sandbox, which no
// session tracks and nothing else would stop before the next start or
// sweep.
func (o *Owner) startNumbered(ctx context.Context, labelled provider.Spec) (sandbox.Launched, error) {
	n := o.startLabel()
	labelled.Metadata = maps.Clone(labelled.Metadata)
	labelled.Metadata[LabelStart] = n
	h, err := o.prov.Start(ctx, labelled)
	if err != nil {
		o.stopUnreported(LabelStart, n)
		return sandbox.Launched{}, err
	}
	return sandbox.Launched{Handle: h, StartedAt: o.clk.Now()}, nil
}

// SessionSandbox returns the session's sandbox, including one a restore
// rebuilt. ok is false when it holds none (unknown, in setup, ended).
func (o *Owner) SessionSandbox(ctx context.Context, sessionID string) (sandbox.Sandbox, bool) {
	sb, err := o.RequireSessionSandbox(ctx, sessionID)
	return sb, err == nil
}

// RequireSessionSandbox is SessionSandbox with sandbox.ErrNone when
// there is none, so that a resent verify is refused instead of graded 0.
func (o *Owner) RequireSessionSandbox(ctx context.Context, sessionID string) (sandbox.Sandbox, error) {
	// The session's actor publishes what it holds: read without a message.
	rep, err := o.ask.view(sessionID)
	if err != nil {
		return sandbox.Sandbox{}, err
	}
	if rep != nil && rep.Lost {
		return sandbox.Sandbox{}, fmt.Errorf("%w: session %q", sandbox.ErrLost, sessionID)
	}
	if rep == nil || !rep.Held {
		return sandbox.Sandbox{}, fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	return rep.Sandbox, nil
}

// SessionData is the session's setup object ({} when setup returned none or
// the session holds no sandbox).
func (o *Owner) SessionData(ctx context.Context, sessionID string) json.RawMessage {
	sb, ok := o.SessionSandbox(ctx, sessionID)
	if !ok || len(sb.Data) == 0 {
		return json.RawMessage("{}")
	}
	return sb.Data
}

// Do runs fn against the session's sandbox, serialised with the session's
// other operations (a stop or a snapshot never runs during it).
//
// An idle session lends its sandbox: fn then runs on the caller's goroutine
// under the permit its view holds, with no message unless the session
// recalled the permit meanwhile or fn found the sandbox gone.
func (o *Owner) Do(ctx context.Context, sessionID string, fn sandbox.DoFunc) error {
	pid, view, err := o.ask.lookupView(sessionID)
	if err != nil {
		return err
	}
	if pid == nil {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	// A Do whose context already ended runs nothing: the ask below
	// answers its error, as it did before sessions lent their sandboxes.
	if view != nil && ctx.Err() == nil && view.Borrow() {
		if rep := view.Load(); rep != nil && rep.Held {
			return o.doBorrowed(ctx, sessionID, pid, view, rep.Sandbox, fn)
		}
		// Lent but not held (lost, or stopped since): the session answers.
		if view.GiveBack() {
			o.ask.send(pid, &messages.DoReturned{})
		}
	}
	rep, err := o.ask.do(ctx, pid, fn)
	if gone(err) {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	if err != nil {
		return err
	}
	return doErr(sessionID, rep.Err)
}

// doBorrowed runs fn under the borrowed permit on an effect worker, which
// gives the permit back once fn returned, while the caller waits for its
// answer as for the session's (its context's end or the owner's close end
// the wait, not fn). A Do that found the sandbox gone keeps the permit from
// other callers and tells the session, which answers the caller once it
// marked the sandbox lost, as a Do through its mailbox would.
func (o *Owner) doBorrowed(ctx context.Context, sessionID string, pid *actor.PID, view *messages.SessionView, sb sandbox.Sandbox, fn sandbox.DoFunc) error {
	reply := o.ask.slot()
	o.effects.Go(func() {
		lost, err := actors.RunDo(ctx, o.prov, sb, fn)
		if lost || errors.Is(err, provider.ErrSandboxNotFound) {
			view.Withdraw()
			o.ask.send(pid, &messages.DoReturned{Lost: true, Err: err, Reply: reply})
			return
		}
		if view.GiveBack() {
			o.ask.send(pid, &messages.DoReturned{})
		}
		reply.Deliver(&messages.DoReply{Err: err})
	})
	v, err := o.ask.wait(ctx, pid, reply)
	if gone(err) {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	if err != nil {
		return err
	}
	return doErr(sessionID, v.(*messages.DoReply).Err)
}

// doErr is a Do's error as the caller sees it: the session's own reasons
// (no sandbox, lost) name the session.
func doErr(sessionID string, err error) error {
	if errors.Is(err, sandbox.ErrNone) {
		return fmt.Errorf("%w: session %q", sandbox.ErrNone, sessionID)
	}
	if errors.Is(err, sandbox.ErrLost) {
		return fmt.Errorf("%w: session %q", sandbox.ErrLost, sessionID)
	}
	return err
}

// EndSessionSandbox stops the session's sandbox and forgets the session.
// Ending a session without a sandbox is success. The session's snapshots
// stay until the checkpoints that name them are dropped (a release, or
// their checkpoint_dir gone).
func (o *Owner) EndSessionSandbox(ctx context.Context, sessionID string) error {
	_, err := o.stopSession(ctx, sessionID, messages.StopEnd)
	return err
}

// stopSession stops a session's sandbox for reason and reports the handle
// stopped (nil when none was held).
func (o *Owner) stopSession(ctx context.Context, sessionID string, reason messages.StopReason) (*provider.Handle, error) {
	pid, err := o.ask.lookup(sessionID)
	if err != nil || pid == nil {
		return nil, err
	}
	rep, err := o.ask.stop(ctx, pid, reason, time.Time{})
	if gone(err) {
		return nil, nil // ended meanwhile: nothing held
	}
	if err != nil {
		return nil, err
	}
	return rep.Stopped, rep.Err
}

// SessionCounts are how many sessions hold a sandbox (live, restored ones
// included), how many seeds are starting one (in setup), and how many hold
// one that was lost behind the owner's back and not yet ended.
func (o *Owner) SessionCounts() (live, inSetup, lost int) {
	live, lost = o.dir.Counts()
	return live, int(o.starting.Load()), lost
}

// Sessions lists the ids of the sessions the owner tracks.
func (o *Owner) Sessions() ([]string, error) {
	refs, err := o.ask.list()
	if err != nil {
		return nil, err
	}
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.SessionID
	}
	return ids, nil
}
