package actors_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// send sends a request carrying a fresh reply slot without waiting for its
// answer; after a later ask returns, the actor has handled it (one mailbox,
// in order).
func (s *shell) send(build func(messages.ReplyTo) any) messages.ReplyTo {
	slot := make(messages.ReplyTo, 1)
	s.sys.Root.Send(s.pid, build(slot))
	return slot
}

// handled returns once the actor handled every message sent before: a
// GetSandbox is answered at once, in mailbox order.
func (s *shell) handled() *messages.GetSandboxReply {
	slot := make(messages.ReplyTo, 1)
	r, _ := s.ask(&messages.GetSandbox{Reply: slot}, slot).(*messages.GetSandboxReply)
	return r
}

// started is a shell whose session started its sandbox.
func started(t *testing.T) *shell {
	t.Helper()
	s := newShell(t, fake.New(fake.Options{}))
	if rep := s.start(nil, provider.Spec{Workdir: "/w"}); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	return s
}

// TestShellLendsItsSandboxWhileIdle: a session lends nothing before it
// holds a sandbox; once it does and is idle, one caller at a time borrows
// it; a stop waits for the borrowed permit (recalled), runs once it is
// back, and the ended session lends nothing.
func TestShellLendsItsSandboxWhileIdle(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	if s.view.Borrow() {
		t.Fatal("a session without a sandbox lent it")
	}
	if rep := s.start(nil, provider.Spec{Workdir: "/w"}); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	// Opened before the start's answer.
	if !s.view.Borrow() {
		t.Fatal("an idle session holding its sandbox lent nothing")
	}
	if s.view.Borrow() {
		t.Fatal("the permit was lent twice")
	}
	if recalled := s.view.GiveBack(); recalled {
		t.Fatal("a permit nobody recalled was given back as recalled")
	}
	if !s.view.Borrow() {
		t.Fatal("a permit given back was not lent again")
	}
	stop := s.stopHeldBack(p)
	if recalled := s.view.GiveBack(); !recalled {
		t.Fatal("the stop did not recall the permit")
	}
	s.sys.Root.Send(s.pid, &messages.DoReturned{})
	stopped(t, stop)
	if s.view.Borrow() {
		t.Fatal("an ended session lent its sandbox")
	}
}

// TestShellLostOnALentPermit: a caller whose Do found the sandbox gone
// withdraws the permit and tells the session, which marks the sandbox lost
// (published before its answer), answers sandbox_lost and lends nothing
// more.
func TestShellLostOnALentPermit(t *testing.T) {
	s := started(t)
	if !s.view.Borrow() {
		t.Fatal("an idle session holding its sandbox lent nothing")
	}
	s.view.Withdraw()
	slot := make(messages.ReplyTo, 1)
	rep, _ := s.ask(&messages.DoReturned{Lost: true, Reply: slot}, slot).(*messages.DoReply)
	if rep == nil || rep.Err == nil {
		t.Fatalf("a lost Do's return answered %+v, want sandbox_lost", rep)
	}
	if v := s.view.Load(); v == nil || !v.Lost || v.Held {
		t.Fatalf("view after the loss: %+v, want lost and not held", v)
	}
	if s.view.Borrow() {
		t.Fatal("a session whose sandbox is lost lent it")
	}
}

// TestShellIdleStopSparesALentPermit: a caller running a Do on the permit
// uses the session now, so an idle stop decided meanwhile does not happen
// (it would otherwise wait for the Do and then stop the sandbox).
func TestShellIdleStopSparesALentPermit(t *testing.T) {
	s := started(t)
	s.clk.Advance(time.Hour)
	if !s.view.Borrow() {
		t.Fatal("an idle session holding its sandbox lent nothing")
	}
	stop := s.send(func(r messages.ReplyTo) any {
		return &messages.StopSandbox{Reason: messages.StopIdle, IdleSince: shellT0.Add(time.Minute), Reply: r}
	})
	s.handled()
	if rep, _ := receive(stop).(*messages.StopReply); rep == nil || !rep.NotIdle {
		t.Fatalf("idle stop during a lent Do: %+v, want NotIdle at once", rep)
	}
	if s.view.GiveBack() {
		t.Fatal("the idle stop recalled the permit")
	}
}

// TestShellStoppedActorLendsNothing: an actor that stops closes its permit
// with its view.
func TestShellStoppedActorLendsNothing(t *testing.T) {
	s := started(t)
	if err := s.sys.Root.StopFuture(s.pid).Wait(); err != nil {
		t.Fatal(err)
	}
	if s.view.Borrow() {
		t.Fatal("a stopped actor's view lent its sandbox")
	}
}

// TestShellStopWaitsForAWithdrawnPermit: a caller whose Do found the
// sandbox gone withdraws the permit before it tells the session; a stop
// that arrives between the two finds the permit neither free nor lent and
// waits for that caller's return, which marks the sandbox lost and
// answers sandbox_lost, and only then stops the sandbox.
func TestShellStopWaitsForAWithdrawnPermit(t *testing.T) {
	p := fake.New(fake.Options{})
	s := newShell(t, p)
	if rep := s.start(nil, provider.Spec{Workdir: "/w"}); rep.Err != nil {
		t.Fatal(rep.Err)
	}
	if !s.view.Borrow() {
		t.Fatal("an idle session holding its sandbox lent nothing")
	}
	s.view.Withdraw()
	stop := s.stopHeldBack(p)
	slot := make(messages.ReplyTo, 1)
	if rep, _ := s.ask(&messages.DoReturned{Lost: true, Reply: slot}, slot).(*messages.DoReply); rep == nil || !errors.Is(rep.Err, sandbox.ErrLost) {
		t.Fatalf("the lost Do's return answered %+v, want sandbox_lost", rep)
	}
	stopped(t, stop)
	// A stop begun before the return would have left the loss untold (a
	// stopping session loses nothing).
	if diff := cmp.Diff([]string{"held s1", "lost s1", "ended s1 end stopped=true"}, s.noted()); diff != "" {
		t.Fatalf("the owner was told (-want +got):\n%s", diff)
	}
}

// stopHeldBack sends the session a stop (end) while its permit is out, and
// checks that the stop neither answered nor stopped the sandbox.
func (s *shell) stopHeldBack(p *fake.Provider) messages.ReplyTo {
	s.t.Helper()
	stop := s.send(func(r messages.ReplyTo) any {
		return &messages.StopSandbox{Reason: messages.StopEnd, Reply: r}
	})
	s.handled()
	if v := receive(stop); v != nil {
		s.t.Fatalf("the stop was answered (%+v) while the permit was out", v)
	}
	if live := p.LiveSandboxIDs(); len(live) != 1 {
		s.t.Fatalf("live sandboxes while the permit is out: %v, want the session's", live)
	}
	return stop
}

// stopped waits for the stop's answer once the permit is back: the sandbox
// stopped.
func stopped(t *testing.T, stop messages.ReplyTo) {
	t.Helper()
	select {
	case v := <-stop:
		if r, _ := v.(*messages.StopReply); r == nil || r.Err != nil || r.Stopped == nil {
			t.Fatalf("stop: %+v", v)
		}
	case <-time.After(time.Minute): // a hang guard only
		t.Fatal("the stop was not answered once the permit was back")
	}
}

// TestShellInstalledSessionLends: a session actor holding a restored
// sandbox, made from the maker's props or from props of its own, lends it
// through its view once its first operation (a Do) is done and it is idle.
func TestShellInstalledSessionLends(t *testing.T) {
	s := newShell(t, fake.New(fake.Options{}))
	for name, props := range map[string]func(*messages.SessionView, *actors.Session) *actor.Props{
		"maker": actors.NewSessionMaker(s.env).Props,
		"own": func(v *messages.SessionView, sess *actors.Session) *actor.Props {
			return actors.SessionPropsPublishing(s.env, v, func() *actors.Session { return sess })
		},
	} {
		view := &messages.SessionView{}
		pid := s.sys.Root.Spawn(props(view, actors.NewInstalledSession("r1", sandbox.Sandbox{Handle: provider.Handle{SandboxID: "sb-r1"}})))
		slot := make(messages.ReplyTo, 1)
		s.sys.Root.Send(pid, &messages.Do{ReqID: 1, Fn: func(context.Context, provider.Provider, sandbox.Sandbox) error { return nil }, Reply: slot})
		if r, _ := (<-slot).(*messages.DoReply); r == nil || r.Err != nil {
			t.Fatalf("%s: the Do answered %v", name, r)
		}
		if !view.Borrow() {
			t.Errorf("%s: an idle installed session lent nothing", name)
		}
	}
}
