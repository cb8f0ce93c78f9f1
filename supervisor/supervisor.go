// Package supervisor is the actor that owns the session actors: it spawns one
// on seed (or on restore, already holding its fork), looks them up by session
// id, forgets them when their session ends, and lists the live set for the
// checkpoint coordinator.
//
// It is deliberately trivial: it does no I/O and holds only its Directory,
// because protoactor restarts a parent by stopping every child first: a
// supervisor that failed would end every session it holds.
// A session actor that panics is stopped, not restarted: the message that
// caused the panic is lost and its state is suspect, so the actor stops its
// sandbox on the way out (actors.sessionActor.abandon) and the session is
// forgotten; a later verify gets 409 instead of grading a half-state, and the
// controller restarts the episode.
package supervisor

import (
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// ErrSessionExists answers a SpawnSession with Install for a session that
// already has an actor.
var ErrSessionExists = fmt.Errorf("supervisor: session already exists")

// ErrNotPrepared answers a ListPrepared for a session no actor was made
// ahead for, or one made holding another sandbox: the asker spawns it.
var ErrNotPrepared = fmt.Errorf("supervisor: no actor made ahead for the session")

// PropsFunc makes the props of a session actor: empty, or holding a restored
// sandbox.
type PropsFunc func(sessionID string, install *sandbox.Sandbox) *actor.Props

// ViewPropsFunc is PropsFunc for session actors that publish their view in
// view (messages.SessionView), which the Directory hands readers. The
// supervisor calls it right before each spawn and uses the props for that
// spawn alone, so that one Props may serve every spawn
// (actors.SessionMaker).
type ViewPropsFunc func(sessionID string, install *sandbox.Sandbox, view *messages.SessionView) *actor.Props

// Props returns the supervisor's props.
func Props(sessionProps PropsFunc) *actor.Props {
	return PropsWithDirectory(sessionProps, nil)
}

// PropsWithDirectory is Props whose record of the sessions is dir (nil: one
// of its own).
func PropsWithDirectory(sessionProps PropsFunc, dir *Directory) *actor.Props {
	return PropsOn(sessionProps, dir, nil)
}

// PropsOn is PropsWithDirectory whose forget grace runs on clk (nil: the
// wall clock).
func PropsOn(sessionProps PropsFunc, dir *Directory, clk clock.Clock) *actor.Props {
	return PropsPublishing(func(id string, install *sandbox.Sandbox, _ *messages.SessionView) *actor.Props {
		return sessionProps(id, install)
	}, dir, clk)
}

// PropsPublishing is PropsOn whose session actors publish their views:
// each spawn gets a fresh view, which Directory.View returns for as long
// as the session is listed.
func PropsPublishing(sessionProps ViewPropsFunc, dir *Directory, clk clock.Clock) *actor.Props {
	if clk == nil {
		clk = clock.Real{}
	}
	if dir == nil {
		dir = NewDirectory()
	}
	return actor.PropsFromProducer(func() actor.Actor {
		dir.reset()
		return &supervisor{props: sessionProps, dir: dir, clk: clk}
	}, actor.WithSupervisor(actor.NewOneForOneStrategy(0, 0, func(any) actor.Directive {
		return actor.StopDirective
	})))
}

// Directory is the one record of which sessions exist and which sandbox
// each holds. Which sessions exist is the supervisor's own map, which it
// alone writes (inside its Receive); the sandbox a session holds is set
// with its actor when a restore installs it, and by the owner when a
// seed's start succeeds (Hold), and goes with the session: when its
// sandbox ends (Drop) or the session is forgotten, whichever comes first.
// The owner reads it without a round trip through the supervisor's mailbox
// on its per-request path, so a Lookup sees what a LookupSession processed
// at that instant would. It does not order after messages the caller sent
// the supervisor before; callers that need that (a spawn after a forget)
// still ask.
type Directory struct {
	mu   sync.RWMutex
	byID map[string]entry
	// sessionOf is the session of each actor in byID, by PID id.
	sessionOf map[string]string
	// children are every session actor still running, by PID id: those in
	// byID and the forgotten ones living out their grace.
	children map[string]*actor.PID
	// held are the sandboxes the sessions in byID hold, by sandbox id, and
	// heldBy the sandbox id of each holding session.
	held   map[string]Holding
	heldBy map[string]string
}

// Holding is a sandbox a session holds: what the directory keeps of it
// (the session's view has the rest). Kept small: a map value over 128
// bytes (a whole sandbox.Sandbox) is an allocation of its own on every
// seed's Hold, and every request's read copies it.
type Holding struct {
	SessionID string
	Handle    provider.Handle
	// FromSnapshot is the snapshot the sandbox was forked from, if any
	// (a copy-on-write fork may stand on it).
	FromSnapshot string
	// Lost: found gone behind the owner's back; the session has not ended.
	Lost bool
}

// NewDirectory returns an empty directory.
func NewDirectory() *Directory {
	return &Directory{
		byID: map[string]entry{}, sessionOf: map[string]string{}, children: map[string]*actor.PID{},
		held: map[string]Holding{}, heldBy: map[string]string{},
	}
}

// Hold records that the session holds sb, if the directory has the
// session (a session forgotten meanwhile holds nothing).
func (d *Directory) Hold(sessionID string, sb sandbox.Sandbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.byID[sessionID].pid != nil {
		d.holdLocked(sessionID, sb)
	}
}

func (d *Directory) holdLocked(sessionID string, sb sandbox.Sandbox) {
	d.dropLocked(sessionID)
	d.held[sb.Handle.SandboxID] = Holding{SessionID: sessionID, Handle: sb.Handle, FromSnapshot: sb.FromSnapshot}
	d.heldBy[sessionID] = sb.Handle.SandboxID
}

// Drop records that the sandbox is no longer held (its session stopped it).
func (d *Directory) Drop(sandboxID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.held[sandboxID]; ok {
		d.dropLocked(h.SessionID)
	}
}

// dropLocked forgets the sandbox the session holds.
func (d *Directory) dropLocked(sessionID string) {
	if id, ok := d.heldBy[sessionID]; ok {
		delete(d.held, id)
		delete(d.heldBy, sessionID)
	}
}

// MarkLost records that a held sandbox was found gone behind the owner's
// back (its session still holds it until it ends).
func (d *Directory) MarkLost(sandboxID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if h, ok := d.held[sandboxID]; ok {
		h.Lost = true
		d.held[sandboxID] = h
	}
}

// Holder is the holding of the sandbox, ok false when no session holds it.
func (d *Directory) Holder(sandboxID string) (h Holding, ok bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	h, ok = d.held[sandboxID]
	return h, ok
}

// Counts are how many sandboxes the sessions hold that are not lost, and
// how many that are.
func (d *Directory) Counts() (held, lost int) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	for _, h := range d.held {
		if h.Lost {
			lost++
		}
	}
	return len(d.held) - lost, lost
}

// Holdings lists what the sessions hold, in no particular order.
func (d *Directory) Holdings() []Holding {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]Holding, 0, len(d.held))
	for _, h := range d.held {
		out = append(out, h)
	}
	return out
}

// count is the number of sessions.
func (d *Directory) count() int {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return len(d.byID)
}

// list lists the sessions, sorted by id.
func (d *Directory) list() []messages.SessionRef {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]messages.SessionRef, 0, len(d.byID))
	for id, e := range d.byID {
		out = append(out, messages.SessionRef{SessionID: id, PID: e.pid})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SessionID < out[j].SessionID })
	return out
}

// session is the session whose live actor is pidID.
func (d *Directory) session(pidID string) (string, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	id, ok := d.sessionOf[pidID]
	return id, ok
}

// Lookup returns the session's actor, nil when the supervisor has none.
func (d *Directory) Lookup(sessionID string) *actor.PID {
	d.mu.RLock()
	defer d.mu.RUnlock()
	return d.byID[sessionID].pid
}

// View returns the session's actor and the view it publishes (nil, nil
// when the supervisor has none).
func (d *Directory) View(sessionID string) (*actor.PID, *messages.SessionView) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	e := d.byID[sessionID]
	return e.pid, e.view
}

// entry is a listed session: its actor and the view it publishes.
type entry struct {
	pid  *actor.PID
	view *messages.SessionView
}

// Children lists every session actor still running, forgotten ones
// living out their grace included, in no particular order.
func (d *Directory) Children() []*actor.PID {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]*actor.PID, 0, len(d.children))
	for _, pid := range d.children {
		out = append(out, pid)
	}
	return out
}

// addChild records a running actor that is not listed (made ahead).
func (d *Directory) addChild(pid *actor.PID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.children[pid.Id] = pid
}

func (d *Directory) terminated(pidID string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.children, pidID)
}

// set records the session's actor and the view it publishes, holding
// install when set (a restore's fork).
func (d *Directory) set(sessionID string, pid *actor.PID, view *messages.SessionView, install *sandbox.Sandbox) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.byID[sessionID] = entry{pid: pid, view: view}
	d.sessionOf[pid.Id] = sessionID
	d.children[pid.Id] = pid
	if install != nil {
		d.holdLocked(sessionID, *install)
	}
}

// remove forgets the session, if pid is its live actor.
func (d *Directory) remove(sessionID string, pid *actor.PID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if cur := d.byID[sessionID].pid; cur != nil && cur.Id == pid.Id {
		delete(d.byID, sessionID)
		delete(d.sessionOf, pid.Id)
		d.dropLocked(sessionID)
	}
}

func (d *Directory) reset() {
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.byID)
	clear(d.sessionOf)
	clear(d.children)
	clear(d.held)
	clear(d.heldBy)
}

// ForgetGrace is how long a forgotten session actor lives on, answering as
// ended, before it is stopped (and at most poisonEvery more: forgotten
// actors are poisoned in batches). An ask that reaches it after that gets what
// a dead letter gets (the session actor's mailbox answers what protoactor
// drops), which its asker reads as a session that has ended too; what the
// grace still covers is a checkpoint round that listed the session just
// before it was forgotten (the list and the round's requests are
// microseconds apart): asked within the grace, the actor answers "skipped"
// where a stopped one would fail the round. It is short because every
// forgotten actor is memory until it stops: at 30 s, a server seeding and
// closing 8,000 sessions a second held 240,000 of them, and its heap grew
// for the whole of a benchmark's run.
const ForgetGrace = time.Second

// poisonEvery is the least time between two poisonings of forgotten
// actors after the first: each poisons every actor whose grace has passed,
// so a server ending thousands of sessions a second arms a few timers a
// second, not one per session, and an actor outlives its grace by at most
// this much.
const poisonEvery = ForgetGrace / 8

// poisonDue tells the supervisor that the grace of its oldest forgotten
// actor has passed.
type poisonDue struct{}

// grave is a forgotten actor living out its grace, until due.
type grave struct {
	pid *actor.PID
	due time.Time
}

type supervisor struct {
	props ViewPropsFunc
	dir   *Directory
	clk   clock.Clock
	// next numbers incarnations: a session id may come back (re-seeded
	// after its end) before its old actor's name is released.
	next uint64
	// graves are the forgotten actors not yet poisoned, oldest first (the
	// grace is the same for all); armed: a poisonDue is on its way.
	graves []grave
	armed  bool
	// prepared are the actors made ahead for a restore (SpawnSession
	// with Unlisted), by session, until a ListPrepared lists or stops
	// them.
	prepared map[string]prepared
}

// prepared is an actor made ahead, holding install.
type prepared struct {
	pid     *actor.PID
	view    *messages.SessionView
	install *sandbox.Sandbox
}

func (s *supervisor) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.SpawnSession:
		if m.Unlisted {
			s.prepare(ctx, m)
			return
		}
		ref := s.spawn(ctx, m)
		m.Ref = ref
		if m.Start != nil && ref.Err == nil {
			// The seed's start goes straight to the actor, which answers
			// it: no round trip back to the seed in between.
			ctx.Send(ref.PID.(*actor.PID), m.Start)
			return
		}
		respond(ctx, m.Reply, ref)
	case *messages.LookupSession:
		ref := &messages.SessionRef{SessionID: m.SessionID}
		if pid := s.dir.Lookup(m.SessionID); pid != nil {
			ref.PID = pid
		}
		respond(ctx, m.Reply, ref)
	case *messages.ForgetSession:
		pid := s.dir.Lookup(m.SessionID)
		if pid == nil {
			return
		}
		if want, _ := m.PID.(*actor.PID); want != nil && want.Id != pid.Id {
			return
		}
		s.dir.remove(m.SessionID, pid)
		// The actor answers as ended from now on, and is poisoned only
		// after a grace period (see ForgetGrace): a request that looked the
		// session up just before the forget hears "ended" from it. One
		// that ended asked for itself and knows it already.
		if !m.Ended {
			ctx.Send(pid, &messages.SessionForgotten{})
		}
		now := s.clk.Now()
		s.graves = append(s.graves, grave{pid: pid, due: now.Add(ForgetGrace)})
		s.arm(ctx, now)
	case poisonDue:
		s.armed = false
		now := s.clk.Now()
		n := 0
		for ; n < len(s.graves) && !s.graves[n].due.After(now); n++ {
			// A poison pill, not a stop: requests already queued at the
			// session are still answered (a stop would drop them silently).
			ctx.Poison(s.graves[n].pid)
		}
		rest := copy(s.graves, s.graves[n:])
		clear(s.graves[rest:])
		s.graves = s.graves[:rest]
		s.arm(ctx, now)
	case *messages.ListPrepared:
		respond(ctx, m.Reply, s.listPrepared(ctx, m))
	case *messages.DiscardPrepared:
		s.discardPrepared(ctx)
	case *messages.ListSessions:
		respond(ctx, m.Reply, &messages.SessionList{Sessions: s.dir.list()})
	case *actor.Terminated:
		s.dir.terminated(m.Who.Id)
		// A child that stopped without being forgotten (it panicked).
		if id, ok := s.dir.session(m.Who.Id); ok {
			s.dir.remove(id, m.Who)
		}
		for id, p := range s.prepared {
			if p.pid.Id == m.Who.Id {
				delete(s.prepared, id)
			}
		}
	}
}

// spawn finds the session's actor, or makes it (holding m.Install when
// set) within m.Limit.
func (s *supervisor) spawn(ctx actor.Context, m *messages.SpawnSession) *messages.SessionRef {
	if pid := s.dir.Lookup(m.SessionID); pid != nil {
		ref := &messages.SessionRef{SessionID: m.SessionID, PID: pid}
		if m.Install != nil {
			ref.Err = ErrSessionExists
		}
		return ref
	}
	if m.Limit > 0 && s.dir.count() >= m.Limit {
		return &messages.SessionRef{SessionID: m.SessionID, Err: sandbox.ErrAtCapacity}
	}
	s.next++
	view := &messages.SessionView{}
	// The name written by hand: fmt boxed the number, a second allocation
	// on every seed.
	var name [24]byte
	pid, err := ctx.SpawnNamed(s.props(m.SessionID, m.Install, view), string(strconv.AppendUint(append(name[:0], 's'), s.next, 10)))
	if err != nil {
		return &messages.SessionRef{SessionID: m.SessionID, Err: err}
	}
	s.dir.set(m.SessionID, pid, view, m.Install)
	return &messages.SessionRef{SessionID: m.SessionID, PID: pid, Spawned: true}
}

// prepare makes an actor holding m.Install that nobody finds until a
// ListPrepared lists it. One made ahead for the session before is stopped.
func (s *supervisor) prepare(ctx actor.Context, m *messages.SpawnSession) {
	if m.Install == nil {
		return
	}
	if old, ok := s.prepared[m.SessionID]; ok {
		delete(s.prepared, m.SessionID)
		ctx.Poison(old.pid)
	}
	s.next++
	view := &messages.SessionView{}
	view.SetUnlisted(true)
	var name [24]byte
	pid, err := ctx.SpawnNamed(s.props(m.SessionID, m.Install, view), string(strconv.AppendUint(append(name[:0], 's'), s.next, 10)))
	if err != nil {
		return
	}
	s.dir.addChild(pid)
	if s.prepared == nil {
		s.prepared = map[string]prepared{}
	}
	s.prepared[m.SessionID] = prepared{pid: pid, view: view, install: m.Install}
}

// listPrepared lists the actors made ahead for m's sessions, in one turn:
// no seed comes between two of them.
func (s *supervisor) listPrepared(ctx actor.Context, m *messages.ListPrepared) *messages.PreparedListed {
	out := &messages.PreparedListed{Errs: make([]error, len(m.SessionIDs))}
	for i, id := range m.SessionIDs {
		p, ok := s.prepared[id]
		delete(s.prepared, id)
		switch {
		case !ok:
			out.Errs[i] = ErrNotPrepared
			continue
		case !sameSandbox(p.install, m.Sandboxes[i]):
			out.Errs[i] = ErrNotPrepared
		case s.dir.Lookup(id) != nil:
			out.Errs[i] = ErrSessionExists
		default:
			p.view.SetUnlisted(false)
			s.dir.set(id, p.pid, p.view, p.install)
			continue
		}
		ctx.Poison(p.pid)
	}
	s.discardPrepared(ctx)
	return out
}

// sameSandbox: a and b are the same fork with the same lease.
func sameSandbox(a, b *sandbox.Sandbox) bool {
	return b != nil && a.Handle.SandboxID == b.Handle.SandboxID && a.ExpiresAt.Equal(b.ExpiresAt)
}

// discardPrepared stops every actor made ahead and not listed; they stop
// unlisted, so their sandboxes are left to the restore.
func (s *supervisor) discardPrepared(ctx actor.Context) {
	for id, p := range s.prepared {
		ctx.Poison(p.pid)
		delete(s.prepared, id)
	}
}

// arm sets the timer that poisons the oldest forgotten actor once its grace
// has passed, unless one is set or none is waiting; it waits at least
// poisonEvery, so that it finds others due with it.
func (s *supervisor) arm(ctx actor.Context, now time.Time) {
	if s.armed || len(s.graves) == 0 {
		return
	}
	s.armed = true
	wait := max(s.graves[0].due.Sub(now), poisonEvery)
	self, root := ctx.Self(), ctx.ActorSystem().Root
	s.clk.AfterFunc(wait, func() { root.Send(self, poisonDue{}) })
}

// respond answers a request in its reply slot, or to its sender when it
// carries none.
func respond(ctx actor.Context, reply messages.ReplyTo, msg any) {
	if reply != nil {
		reply.Deliver(msg)
		return
	}
	ctx.Respond(msg)
}
