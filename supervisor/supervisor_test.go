package supervisor_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/supervisor"
)

type harness struct {
	sys   *actor.ActorSystem
	sup   *actor.PID
	props supervisor.PropsFunc
	fk    *fake.Provider
	ended chan string
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	h := &harness{sys: actor.NewActorSystem(), fk: fake.New(fake.Options{}), ended: make(chan string, 16)}
	env := &actors.SessionEnv{
		Provider: h.fk, Clock: clock.Real{}, Log: lg, Limiter: actors.NewLimiter(4),
		OnEnded: func(sid string, stopped *provider.Handle, _ messages.StopReason) {
			if stopped != nil {
				h.ended <- stopped.SandboxID
			}
		},
	}
	props := func(sid string, install *sandbox.Sandbox) *actor.Props {
		return actors.SessionProps(env, func() *actors.Session {
			if install != nil {
				return actors.NewInstalledSession(sid, *install)
			}
			return actors.NewSession(sid)
		})
	}
	h.props = props
	h.sup = h.sys.Root.Spawn(supervisor.Props(props))
	t.Cleanup(func() {
		_ = h.sys.Root.PoisonFuture(h.sup).Wait()
		h.sys.Shutdown()
	})
	return h
}

func (h *harness) ask(t *testing.T, pid *actor.PID, msg any) any {
	t.Helper()
	v, err := h.sys.Root.RequestFuture(pid, msg, 10*time.Second).Result()
	if err != nil {
		t.Fatalf("ask %T: %v", msg, err)
	}
	return v
}

func TestPanickingSessionIsStoppedWithItsSandbox(t *testing.T) {
	h := newHarness(t)
	hd, err := h.fk.Start(context.Background(), provider.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	sb := sandbox.Sandbox{Handle: hd, Data: []byte("{}")}
	ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1", Install: &sb}).(*messages.SessionRef)
	pid := ref.PID.(*actor.PID)
	other := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s2"}).(*messages.SessionRef)

	// A malformed message makes the session's Receive panic.
	h.sys.Root.Send(pid, (*messages.StartSandbox)(nil))

	if got := <-h.ended; got != hd.SandboxID {
		t.Fatalf("stopped %s, want %s", got, hd.SandboxID)
	}
	if n := h.fk.Stats().LiveSandboxes; n != 0 {
		t.Fatalf("%d sandboxes still live after the panic", n)
	}
	// The supervisor forgot it once it terminated, and kept its sibling.
	for {
		list := h.ask(t, h.sup, &messages.ListSessions{}).(*messages.SessionList)
		if len(list.Sessions) == 1 {
			if list.Sessions[0].SessionID != "s2" || list.Sessions[0].PID.(*actor.PID).Id != other.PID.(*actor.PID).Id {
				t.Fatalf("live set %+v", list.Sessions)
			}
			break
		}
		// The Terminated notice is in flight: wait for the supervisor to
		// process it (each ask is a full mailbox round trip).
	}
	// A new seed of the session spawns a fresh actor.
	again := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1"}).(*messages.SessionRef)
	if !again.Spawned {
		t.Fatal("re-seed after the panic did not spawn a new actor")
	}
}

func TestSpawnLookupForget(t *testing.T) {
	h := newHarness(t)
	a := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1"}).(*messages.SessionRef)
	b := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1"}).(*messages.SessionRef)
	if !a.Spawned || b.Spawned || a.PID.(*actor.PID).Id != b.PID.(*actor.PID).Id {
		t.Fatalf("get-or-create: %+v then %+v", a, b)
	}
	sb := sandbox.Sandbox{Data: []byte("{}")}
	if c := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1", Install: &sb}).(*messages.SessionRef); c.Err == nil {
		t.Fatal("installing over a live session succeeded")
	}
	// Forgetting another incarnation's pid leaves the live one alone.
	stale := actor.NewPID("nonhost", "stale")
	h.sys.Root.Send(h.sup, &messages.ForgetSession{SessionID: "s1", PID: stale})
	if l := h.ask(t, h.sup, &messages.LookupSession{SessionID: "s1"}).(*messages.SessionRef); l.PID == nil {
		t.Fatal("a stale forget removed the live session")
	}
	h.sys.Root.Send(h.sup, &messages.ForgetSession{SessionID: "s1"})
	if l := h.ask(t, h.sup, &messages.LookupSession{SessionID: "s1"}).(*messages.SessionRef); l.PID != nil {
		t.Fatal("forget left the session")
	}
}

// TestSpawnRefusedAtCapacity: with a positive Limit a new session is
// refused once that many live, while a live one is still found; without a
// limit nothing is refused.
func TestSpawnRefusedAtCapacity(t *testing.T) {
	h := newHarness(t)
	for _, sid := range []string{"s1", "s2"} {
		if ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: sid, Limit: 2}).(*messages.SessionRef); ref.Err != nil || !ref.Spawned {
			t.Fatalf("spawn %s under the limit: %+v", sid, ref)
		}
	}
	if ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s3", Limit: 2}).(*messages.SessionRef); !errors.Is(ref.Err, sandbox.ErrAtCapacity) || ref.PID != nil {
		t.Errorf("spawn at capacity: %+v, want ErrAtCapacity", ref)
	}
	if ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s1", Limit: 2}).(*messages.SessionRef); ref.Err != nil || ref.PID == nil {
		t.Errorf("a live session at capacity: %+v", ref)
	}
	if ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s3", Limit: 3}).(*messages.SessionRef); ref.Err != nil || !ref.Spawned {
		t.Errorf("spawn under a higher limit: %+v", ref)
	}
	if ref := h.ask(t, h.sup, &messages.SpawnSession{SessionID: "s4"}).(*messages.SessionRef); ref.Err != nil || !ref.Spawned {
		t.Errorf("spawn without a limit: %+v", ref)
	}
}

// TestListAndReplySlots: the list is sorted by session id; requests that
// carry a reply slot are answered there.
func TestListAndReplySlots(t *testing.T) {
	h := newHarness(t)
	for _, sid := range []string{"s3", "s1", "s2"} {
		slot := make(messages.ReplyTo, 1)
		h.sys.Root.Send(h.sup, &messages.SpawnSession{SessionID: sid, Reply: slot})
		if ref := (<-slot).(*messages.SessionRef); !ref.Spawned {
			t.Fatalf("spawn %s: %+v", sid, ref)
		}
	}
	slot := make(messages.ReplyTo, 1)
	h.sys.Root.Send(h.sup, &messages.ListSessions{Reply: slot})
	var got []string
	for _, ref := range (<-slot).(*messages.SessionList).Sessions {
		got = append(got, ref.SessionID)
	}
	if diff := cmp.Diff([]string{"s1", "s2", "s3"}, got); diff != "" {
		t.Errorf("list (-want +got):\n%s", diff)
	}
	slot = make(messages.ReplyTo, 1)
	h.sys.Root.Send(h.sup, &messages.LookupSession{SessionID: "s2", Reply: slot})
	if ref := (<-slot).(*messages.SessionRef); ref.PID == nil {
		t.Errorf("lookup through a reply slot: %+v", ref)
	}
}

// A spawn carrying a start hands it to the session's actor, a new one or
// the one there is, whose StartReply answers the spawn; Ref names that
// actor. A refusal (at capacity) is answered with the ref itself.
func TestSpawnHandsItsStartToTheActor(t *testing.T) {
	h := newHarness(t)
	spawnStart := func(sid string) (any, *messages.SessionRef) {
		slot := make(messages.ReplyTo, 1)
		m := &messages.SpawnSession{SessionID: sid, Limit: 1, Start: &messages.StartSandbox{ReqID: 7, Reply: slot}, Reply: slot}
		h.sys.Root.Send(h.sup, m)
		select {
		case v := <-slot:
			return v, m.Ref
		case <-time.After(time.Minute): // a hang guard only
			t.Fatalf("no answer to the spawn of %s", sid)
			return nil, nil
		}
	}
	v, ref := spawnStart("s1")
	if rep, ok := v.(*messages.StartReply); !ok || rep.ReqID != 7 || rep.Err != nil || rep.Sandbox.Handle.SandboxID == "" {
		t.Fatalf("spawn with a start answered %#v, want the actor's StartReply with its sandbox", v)
	}
	live := h.ask(t, h.sup, &messages.LookupSession{SessionID: "s1"}).(*messages.SessionRef).PID.(*actor.PID)
	if !ref.Spawned || ref.PID.(*actor.PID).Id != live.Id {
		t.Errorf("ref %+v, want the new actor %s", ref, live.Id)
	}
	v, ref = spawnStart("s1")
	if rep, ok := v.(*messages.StartReply); !ok || !errors.Is(rep.Err, sandbox.ErrExists) {
		t.Errorf("a second start answered %#v, want the actor's ErrExists", v)
	}
	if ref.Spawned || ref.PID.(*actor.PID).Id != live.Id {
		t.Errorf("ref %+v, want the actor there was, %s", ref, live.Id)
	}
	v, ref = spawnStart("s2")
	if got, ok := v.(*messages.SessionRef); !ok || got != ref || !errors.Is(got.Err, sandbox.ErrAtCapacity) || got.PID != nil {
		t.Errorf("a start past the limit answered %#v (ref %+v), want the refusal", v, ref)
	}
}

// TestPreparedActorsAreListedInOneTurn: actors made ahead for a restore
// (SpawnSession with Unlisted) are found by nobody until a ListPrepared
// lists those holding the sandbox it names; a session that has an actor
// already is refused as exists, one made holding another sandbox or not
// made at all is answered not prepared, and every other made ahead is
// stopped, leaving its sandbox alone. A DiscardPrepared stops those made
// since, alike; a listed actor stops its sandbox when it stops.
func TestPreparedActorsAreListedInOneTurn(t *testing.T) {
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	sys := actor.NewActorSystem()
	fk := fake.New(fake.Options{})
	ended := make(chan string, 16)
	env := &actors.SessionEnv{
		Provider: fk, Clock: clock.Real{}, Log: lg, Limiter: actors.NewLimiter(4),
		OnEnded: func(sid string, stopped *provider.Handle, _ messages.StopReason) {
			if stopped != nil {
				ended <- stopped.SandboxID
			}
		},
		// An actor's stop of its sandbox happens before its Terminated.
		Runtime: inline{},
	}
	dir := supervisor.NewDirectory()
	sup := sys.Root.Spawn(supervisor.PropsPublishing(func(sid string, install *sandbox.Sandbox, view *messages.SessionView) *actor.Props {
		return actors.SessionPropsPublishing(env, view, func() *actors.Session {
			if install != nil {
				return actors.NewInstalledSession(sid, *install)
			}
			return actors.NewSession(sid)
		})
	}, dir, nil))
	t.Cleanup(func() {
		_ = sys.Root.PoisonFuture(sup).Wait()
		sys.Shutdown()
	})
	ask := func(msg any) any {
		t.Helper()
		v, err := sys.Root.RequestFuture(sup, msg, 10*time.Second).Result()
		if err != nil {
			t.Fatalf("ask %T: %v", msg, err)
		}
		return v
	}
	sbs := map[string]*sandbox.Sandbox{}
	for _, sid := range []string{"s1", "s2", "s3", "s4", "s6"} {
		h, err := fk.Start(context.Background(), provider.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		sbs[sid] = &sandbox.Sandbox{Handle: h, Data: []byte("{}"), ExpiresAt: time.Unix(100, 0)}
	}
	live := ask(&messages.SpawnSession{SessionID: "s3"}).(*messages.SessionRef).PID.(*actor.PID)
	for _, sid := range []string{"s1", "s2", "s3", "s4"} {
		sys.Root.Send(sup, &messages.SpawnSession{SessionID: sid, Install: sbs[sid], Unlisted: true})
	}
	// Made ahead but not listed: nobody finds them.
	if l := ask(&messages.LookupSession{SessionID: "s1"}).(*messages.SessionRef); l.PID != nil || dir.Lookup("s1") != nil {
		t.Fatal("an actor made ahead was found before it was listed")
	}
	if n := len(dir.Children()); n != 5 {
		t.Fatalf("%d children, want 5 (s3's live actor and four made ahead)", n)
	}
	otherLease := *sbs["s2"]
	otherLease.ExpiresAt = time.Unix(200, 0)
	got := ask(&messages.ListPrepared{
		SessionIDs: []string{"s1", "s2", "s3", "s5"},
		Sandboxes:  []*sandbox.Sandbox{sbs["s1"], &otherLease, sbs["s3"], {}},
	}).(*messages.PreparedListed)
	want := []error{nil, supervisor.ErrNotPrepared, supervisor.ErrSessionExists, supervisor.ErrNotPrepared}
	if diff := cmp.Diff(want, got.Errs, cmp.Comparer(func(a, b error) bool { return errors.Is(a, b) })); diff != "" {
		t.Fatalf("listed (-want +got):\n%s", diff)
	}
	if dir.Lookup("s1") == nil || dir.Lookup("s2") != nil || dir.Lookup("s4") != nil || dir.Lookup("s3").Id != live.Id {
		t.Fatalf("after the listing: s1 %v s2 %v s3 %v s4 %v; want s1 listed, s3 its own actor, no other", dir.Lookup("s1"), dir.Lookup("s2"), dir.Lookup("s3"), dir.Lookup("s4"))
	}
	if h, ok := dir.Holder(sbs["s1"].Handle.SandboxID); !ok || h.SessionID != "s1" {
		t.Fatalf("s1's fork held by %+v (%v), want s1", h, ok)
	}
	// The three not listed stop (each ask is a mailbox round trip that
	// lets their Terminated through), their sandboxes left alone.
	for len(dir.Children()) != 2 {
		ask(&messages.ListSessions{})
	}
	sys.Root.Send(sup, &messages.SpawnSession{SessionID: "s6", Install: sbs["s6"], Unlisted: true})
	for len(dir.Children()) != 3 {
		ask(&messages.ListSessions{})
	}
	sys.Root.Send(sup, &messages.DiscardPrepared{})
	for len(dir.Children()) != 2 {
		ask(&messages.ListSessions{})
	}
	// One made ahead that stops on its own (it panicked) is not listed.
	sys.Root.Send(sup, &messages.SpawnSession{SessionID: "s6", Install: sbs["s6"], Unlisted: true})
	for len(dir.Children()) != 3 {
		ask(&messages.ListSessions{})
	}
	for _, pid := range dir.Children() {
		if pid.Id != live.Id && pid.Id != dir.Lookup("s1").Id {
			sys.Root.Send(pid, (*messages.StartSandbox)(nil))
		}
	}
	for len(dir.Children()) != 2 {
		ask(&messages.ListSessions{})
	}
	again := ask(&messages.ListPrepared{SessionIDs: []string{"s6"}, Sandboxes: []*sandbox.Sandbox{sbs["s6"]}}).(*messages.PreparedListed)
	if !errors.Is(again.Errs[0], supervisor.ErrNotPrepared) || dir.Lookup("s6") != nil {
		t.Fatalf("listing an actor made ahead that stopped: %v, found %v; want not prepared and none", again.Errs[0], dir.Lookup("s6"))
	}
	if n := fk.Stats().LiveSandboxes; n != 5 {
		t.Fatalf("%d sandboxes live after the unlisted actors stopped, want all 5", n)
	}
	select {
	case id := <-ended:
		t.Fatalf("an unlisted actor stopped sandbox %s", id)
	default:
	}
	// Listed, s1's actor stops its fork as it stops.
	s1 := dir.Lookup("s1")
	if err := sys.Root.StopFuture(s1).Wait(); err != nil {
		t.Fatal(err)
	}
	if id := <-ended; id != sbs["s1"].Handle.SandboxID {
		t.Fatalf("s1's actor stopped %s, want its fork %s", id, sbs["s1"].Handle.SandboxID)
	}
}

// inline runs each effect on the caller's goroutine (the actor's).
type inline struct{}

func (inline) Go(fn func())                       { fn() }
func (inline) Await(context.Context, func() bool) {}
