package supervisor_test

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/supervisor"
)

// The directory follows the supervisor's own map: set on spawn, cleared on
// forget (of the live incarnation only) and when a child stops unforgotten.
func TestDirectoryFollowsTheSupervisor(t *testing.T) {
	h := newHarness(t)
	dir := supervisor.NewDirectory()
	sup := h.sys.Root.Spawn(supervisor.PropsWithDirectory(h.props, dir))
	t.Cleanup(func() { _ = h.sys.Root.PoisonFuture(sup).Wait() })

	if dir.Lookup("s1") != nil {
		t.Fatal("an empty directory found a session")
	}
	a := h.ask(t, sup, &messages.SpawnSession{SessionID: "s1"}).(*messages.SessionRef)
	if got := dir.Lookup("s1"); got == nil || got.Id != a.PID.(*actor.PID).Id {
		t.Fatalf("after the spawn was answered the directory has %v, want %v", got, a.PID)
	}
	h.sys.Root.Send(sup, &messages.ForgetSession{SessionID: "s1", PID: actor.NewPID("nonhost", "stale")})
	h.ask(t, sup, &messages.ListSessions{}) // the forget is processed
	if dir.Lookup("s1") == nil {
		t.Fatal("a stale forget cleared the directory")
	}
	h.sys.Root.Send(sup, &messages.ForgetSession{SessionID: "s1"})
	h.ask(t, sup, &messages.ListSessions{})
	if got := dir.Lookup("s1"); got != nil {
		t.Fatalf("after the forget the directory still has %v", got)
	}

	// A child that stops without being forgotten (a panic) leaves it too.
	b := h.ask(t, sup, &messages.SpawnSession{SessionID: "s2"}).(*messages.SessionRef)
	h.sys.Root.Send(b.PID.(*actor.PID), (*messages.StartSandbox)(nil))
	for dir.Lookup("s2") != nil {
		h.ask(t, sup, &messages.ListSessions{}) // wait for the Terminated notice
	}
}
