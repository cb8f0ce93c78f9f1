package supervisor_test

import (
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
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

// What a session holds goes with the session: set with a restore's
// install, by Hold for a seed, and gone with its Drop or its forget; a
// Hold for a session the directory lacks records nothing.
func TestDirectoryHoldingsGoWithTheirSession(t *testing.T) {
	h := newHarness(t)
	dir := supervisor.NewDirectory()
	sup := h.sys.Root.Spawn(supervisor.PropsWithDirectory(h.props, dir))
	t.Cleanup(func() { _ = h.sys.Root.PoisonFuture(sup).Wait() })
	type held struct {
		Session, Sandbox, From string
		Lost                   bool
	}
	holdings := func() map[string]held {
		out := map[string]held{}
		for _, x := range dir.Holdings() {
			out[x.Handle.SandboxID] = held{x.SessionID, x.Handle.SandboxID, x.FromSnapshot, x.Lost}
			if got, ok := dir.Holder(x.Handle.SandboxID); !ok || got.SessionID != x.SessionID {
				t.Errorf("Holder(%s) = %+v, %v; Holdings says %s", x.Handle.SandboxID, got, ok, x.SessionID)
			}
		}
		return out
	}
	fork := sandbox.Sandbox{Handle: provider.Handle{SandboxID: "fork1"}, FromSnapshot: "snap1", Data: []byte("{}")}
	h.ask(t, sup, &messages.SpawnSession{SessionID: "r1", Install: &fork})
	h.ask(t, sup, &messages.SpawnSession{SessionID: "s1"})
	dir.Hold("s1", sandbox.Sandbox{Handle: provider.Handle{SandboxID: "sb1"}})
	dir.Hold("nobody", sandbox.Sandbox{Handle: provider.Handle{SandboxID: "stray"}})
	dir.MarkLost("sb1")
	want := map[string]held{
		"fork1": {"r1", "fork1", "snap1", false},
		"sb1":   {"s1", "sb1", "", true},
	}
	if diff := cmp.Diff(want, holdings()); diff != "" {
		t.Fatalf("holdings (-want +got):\n%s", diff)
	}
	if held, lost := dir.Counts(); held != 1 || lost != 1 {
		t.Errorf("Counts = %d held, %d lost; want 1, 1", held, lost)
	}

	dir.Drop("sb1")
	h.sys.Root.Send(sup, &messages.ForgetSession{SessionID: "r1"})
	h.ask(t, sup, &messages.ListSessions{}) // the forget is processed
	if got := holdings(); len(got) != 0 {
		t.Fatalf("after a drop and a forget the directory still holds %v", got)
	}
	if _, ok := dir.Holder("fork1"); ok {
		t.Error("a forgotten session's fork is still held")
	}
}

// TestDirectoryHoldWithoutAnAllocation: a seed's Hold keeps only what the
// directory answers with (its session, handle and fork), small enough to
// live in the map itself: no allocation of its own, where a whole
// sandbox.Sandbox (over 128 bytes) was one.
func TestDirectoryHoldWithoutAnAllocation(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocation counts differ under -race")
	}
	h := newHarness(t)
	dir := supervisor.NewDirectory()
	sup := h.sys.Root.Spawn(supervisor.PropsWithDirectory(h.props, dir))
	t.Cleanup(func() { _ = h.sys.Root.PoisonFuture(sup).Wait() })
	h.ask(t, sup, &messages.SpawnSession{SessionID: "s1"})
	sbs := [2]sandbox.Sandbox{
		{Handle: provider.Handle{SandboxID: "sb1", Provider: "fake"}, Workdir: "/w", Data: []byte("{}")},
		{Handle: provider.Handle{SandboxID: "sb2", Provider: "fake"}, Workdir: "/w", Data: []byte("{}")},
	}
	i := 0
	if n := testing.AllocsPerRun(100, func() {
		i++
		dir.Hold("s1", sbs[i%2]) // replaces the one held before
	}); n != 0 {
		t.Fatalf("%v allocations a Hold, want 0", n)
	}
	if got, ok := dir.Holder(sbs[i%2].Handle.SandboxID); !ok || got.SessionID != "s1" || got.Handle.SandboxID != sbs[i%2].Handle.SandboxID {
		t.Fatalf("Holder = %+v, %v", got, ok)
	}
}
