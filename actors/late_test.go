package actors_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
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
	slots := []messages.ReplyTo{make(messages.ReplyTo, 1), make(messages.ReplyTo, 1), make(messages.ReplyTo, 1), make(messages.ReplyTo, 1)}
	sys.Root.Send(pid, &messages.Do{ReqID: 2, Reply: slots[0]})
	sys.Root.Send(pid, &messages.StopSandbox{ReqID: 3, Reply: slots[1]})
	sys.Root.Send(pid, &messages.StartSandbox{ReqID: 4, Reply: slots[2]})
	// The return of a lent Do that found the sandbox gone, whose caller
	// waits for the session's answer.
	sys.Root.Send(pid, &messages.DoReturned{Lost: true, Reply: slots[3]})
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

// The session's warnings name it (and its sandbox) once each: its logger
// is made when a line is logged, from the shared one.
func TestASessionsWarningNamesItsSessionAndSandbox(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	s := newShell(t, fake.New(fake.Options{Clock: clock.NewManual(shellT0)}))
	// Before the first message: the actor reads it after.
	s.env.Log = log.WithField("server", "notes")
	rep := s.start(nil, provider.Spec{Workdir: "/w"})
	if rep.Err != nil {
		t.Fatal(rep.Err)
	}
	lostErr := fmt.Errorf("exec: %w", provider.ErrSandboxNotFound)
	if err := s.do(func(context.Context, provider.Provider, sandbox.Sandbox) error { return lostErr }); !errors.Is(err, sandbox.ErrLost) {
		t.Fatalf("do: %v, want ErrLost", err)
	}
	var got []logrus.Fields
	for _, e := range hook.AllEntries() {
		got = append(got, e.Data)
	}
	want := []logrus.Fields{{"server": "notes", "session_id": "s1", "sandbox_id": rep.Sandbox.Handle.SandboxID, "cause": lostErr.Error()}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("warnings' fields (-want +got):\n%s", diff)
	}
}
