package actors_test

import (
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sched"
)

// A request queued behind a session actor's stop reaches an actor that is
// gone, which protoactor drops without a word: its asker hears what a dead
// letter gets (messages.Undelivered) instead of waiting out its timeout.
// Each request is queued before the actor runs at all (the dispatcher is a
// deterministic scheduler), so the poison pill is handled first.
func TestRequestsQueuedBehindAStopAreAnsweredUndelivered(t *testing.T) {
	det := sched.NewDet(1, shellT0)
	t.Cleanup(det.Close)
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	env := &actors.SessionEnv{Provider: fake.New(fake.Options{Clock: det, Runtime: det}), Clock: det, Log: logs.Discard(), Limiter: actors.NewLimiterOn(1, det), Runtime: det}
	pid := sys.Root.Spawn(actors.SessionProps(env, func() *actors.Session { return actors.NewSession("s1") }).Configure(actor.WithDispatcher(det)))
	det.Settle()

	before := make(messages.ReplyTo, 1)
	sys.Root.Send(pid, &messages.Do{ReqID: 1, Reply: before})
	sys.Root.Poison(pid)
	slots := []messages.ReplyTo{make(messages.ReplyTo, 1), make(messages.ReplyTo, 1), make(messages.ReplyTo, 1)}
	sys.Root.Send(pid, &messages.Do{ReqID: 2, Reply: slots[0]})
	sys.Root.Send(pid, &messages.StopSandbox{ReqID: 3, Reply: slots[1]})
	sys.Root.Send(pid, &messages.StartSandbox{ReqID: 4, Reply: slots[2]})
	det.Settle()

	// The request before the pill is the actor's to answer (a session
	// without a sandbox).
	if got, ok := receive(before).(*messages.DoReply); !ok || got.Err == nil {
		t.Fatalf("the request before the stop: %#v, want the session's answer (no sandbox)", got)
	}
	for i, slot := range slots {
		if got := receive(slot); got != (messages.Undelivered{}) {
			t.Errorf("request %d queued behind the stop: %#v, want messages.Undelivered", i, got)
		}
	}
}

// receive takes what a slot holds now, nil when it is empty.
func receive(slot messages.ReplyTo) any {
	select {
	case v := <-slot:
		return v
	default:
		return nil
	}
}
