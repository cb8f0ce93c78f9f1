package supervisor_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/supervisor"
)

// A forgotten session actor lives out its grace on the supervisor's clock,
// not the wall clock: it is a child (Children lists it) until that clock
// passes ForgetGrace, and then it is stopped and gone.
func TestForgottenActorLivesOutItsGraceOnTheClock(t *testing.T) {
	det := sched.NewDet(1, time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	t.Cleanup(det.Close)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	on := actor.WithDispatcher(det)
	env := &actors.SessionEnv{Provider: fake.New(fake.Options{Clock: det, Runtime: det}), Clock: det, Log: logs.Discard(), Limiter: actors.NewLimiterOn(1, det), Runtime: det}
	props := func(sid string, _ *sandbox.Sandbox) *actor.Props {
		return actors.SessionProps(env, func() *actors.Session { return actors.NewSession(sid) }).Configure(on)
	}
	dir := supervisor.NewDirectory()
	sup := sys.Root.Spawn(supervisor.PropsOn(props, dir, det).Configure(on))

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
