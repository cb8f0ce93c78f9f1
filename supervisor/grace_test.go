package supervisor_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/supervisor"
)

// detSupervisor is a supervisor of session actors run by det, its grace
// on clk.
func detSupervisor(det *sched.Det, clk clock.Clock) (*actor.ActorSystem, *actor.PID, *supervisor.Directory) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	on := actor.WithDispatcher(det)
	env := &actors.SessionEnv{Provider: fake.New(fake.Options{Clock: det, Runtime: det}), Clock: det, Log: logs.Discard(), Limiter: actors.NewLimiterOn(1, det), Runtime: det}
	props := func(sid string, _ *sandbox.Sandbox) *actor.Props {
		return actors.SessionProps(env, func() *actors.Session { return actors.NewSession(sid) }).Configure(on)
	}
	dir := supervisor.NewDirectory()
	return sys, sys.Root.Spawn(supervisor.PropsOn(props, dir, clk).Configure(on)), dir
}

// A forgotten session actor lives out its grace on the supervisor's clock,
// not the wall clock: it is a child (Children lists it) until that clock
// passes ForgetGrace, and then it is stopped and gone.
func TestForgottenActorLivesOutItsGraceOnTheClock(t *testing.T) {
	det := sched.NewDet(1, time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	t.Cleanup(det.Close)
	sys, sup, dir := detSupervisor(det, det)

	reply := make(messages.ReplyTo, 1)
	sys.Root.Send(sup, &messages.SpawnSession{SessionID: "s1", Reply: reply})
	det.RunUntil(func() bool { return len(reply) > 0 })
	pid := (<-reply).(*messages.SessionRef).PID.(*actor.PID)
	alive := func() bool { _, ok := sys.ProcessRegistry.GetLocal(pid.Id); return ok }
	children := func() int { return len(dir.Children()) }

	sys.Root.Send(sup, &messages.ForgetSession{SessionID: "s1"})
	det.Advance(supervisor.ForgetGrace - time.Millisecond)
	if dir.Lookup("s1") != nil || !alive() || children() != 1 {
		t.Fatalf("inside its grace: looked up %v, alive %v, children %d; want forgotten, alive, a child", dir.Lookup("s1"), alive(), children())
	}
	det.Advance(time.Millisecond)
	if alive() || children() != 0 {
		t.Fatalf("past its grace: alive %v, children %d; want stopped and gone", alive(), children())
	}
}

// countingClock counts the timers armed through AfterFunc.
type countingClock struct {
	clock.Clock
	armed int
}

func (c *countingClock) AfterFunc(d time.Duration, f func()) clock.Timer {
	c.armed++
	return c.Clock.AfterFunc(d, f)
}

// Actors forgotten one after another are poisoned in batches: one timer
// for the first, whose grace runs in full, and one for all those whose
// grace passed within the next poisonEvery; not a timer each. None is
// stopped before its grace has passed.
func TestForgottenActorsArePoisonedTogether(t *testing.T) {
	det := sched.NewDet(1, time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	t.Cleanup(det.Close)
	clk := &countingClock{Clock: det}
	sys, sup, dir := detSupervisor(det, clk)

	const n = 10
	// pids[n] is a session that is not forgotten: it lives on, and the
	// supervisor with it.
	pids := make([]*actor.PID, n+1)
	for i := range pids {
		reply := make(messages.ReplyTo, 1)
		sys.Root.Send(sup, &messages.SpawnSession{SessionID: fmt.Sprint("s", i), Reply: reply})
		det.RunUntil(func() bool { return len(reply) > 0 })
		pids[i] = (<-reply).(*messages.SessionRef).PID.(*actor.PID)
	}
	alive := func() (live []int) {
		for i, pid := range pids {
			if _, ok := sys.ProcessRegistry.GetLocal(pid.Id); ok {
				live = append(live, i)
			}
		}
		return live
	}
	const apart = 10 * time.Millisecond
	for i := range pids[:n] {
		sys.Root.Send(sup, &messages.ForgetSession{SessionID: fmt.Sprint("s", i), PID: pids[i]})
		det.Advance(apart)
	}
	// The first was forgotten n·apart ago.
	det.Advance(supervisor.ForgetGrace - n*apart - time.Millisecond)
	if diff := cmp.Diff([]int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, n}, alive()); diff != "" {
		t.Fatalf("inside the first's grace, alive (-want +got):\n%s", diff)
	}
	det.Advance(time.Millisecond)
	if diff := cmp.Diff([]int{1, 2, 3, 4, 5, 6, 7, 8, 9, n}, alive()); diff != "" {
		t.Fatalf("the first's grace passed, alive (-want +got):\n%s", diff)
	}
	det.Advance(supervisor.ForgetGrace / 8)
	if diff := cmp.Diff([]int{n}, alive()); diff != "" {
		t.Fatalf("every grace passed, alive (-want +got):\n%s", diff)
	}
	if dir.Lookup(fmt.Sprint("s", n)) == nil {
		t.Error("the session not forgotten is no longer listed")
	}
	if clk.armed != 2 {
		t.Errorf("%d timers armed for %d forgotten actors, want 2", clk.armed, n)
	}
}

// recorder is a session actor that records what it is sent.
type recorder struct{ got chan<- any }

func (r recorder) Receive(ctx actor.Context) {
	switch m := ctx.Message().(type) {
	case *messages.SessionForgotten, string:
		r.got <- m
	}
}

// An actor that asks to be forgotten as its session ended is told nothing
// back; one the owner has forgotten hears it.
func TestAnEndedActorIsNotToldItWasForgotten(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	got := make(chan any, 4)
	props := func(string, *sandbox.Sandbox) *actor.Props {
		return actor.PropsFromProducer(func() actor.Actor { return recorder{got: got} })
	}
	sup := sys.Root.Spawn(supervisor.Props(props))
	t.Cleanup(func() {
		_ = sys.Root.PoisonFuture(sup).Wait()
		sys.Shutdown()
	})
	spawn := func(sid string) *actor.PID {
		reply := make(messages.ReplyTo, 1)
		sys.Root.Send(sup, &messages.SpawnSession{SessionID: sid, Reply: reply})
		return (<-reply).(*messages.SessionRef).PID.(*actor.PID)
	}
	for _, ended := range []bool{true, false} {
		pid := spawn(fmt.Sprint("ended-", ended))
		sys.Root.Send(sup, &messages.ForgetSession{SessionID: fmt.Sprint("ended-", ended), PID: pid, Ended: ended})
		// Once the supervisor answered a later request, whatever it sent
		// the actor for the forget is in the actor's mailbox, ahead of
		// the probe.
		reply := make(messages.ReplyTo, 1)
		sys.Root.Send(sup, &messages.ListSessions{Reply: reply})
		<-reply
		sys.Root.Send(pid, "probe")
		var seen []string
		for m := range got {
			seen = append(seen, fmt.Sprintf("%T", m))
			if m == "probe" {
				break
			}
		}
		want := []string{"*messages.SessionForgotten", "string"}
		if ended {
			want = want[1:]
		}
		if diff := cmp.Diff(want, seen); diff != "" {
			t.Errorf("forget with Ended %v: the actor got (-want +got):\n%s", ended, diff)
		}
	}
}
