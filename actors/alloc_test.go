package actors

import (
	"log/slog"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/messages"
)

// TestSessionStepsAllocateOnlyWhatTheyAnswer: a new session's start, its
// completion, a Do and its completion allocate the session, the effects
// that carry their own data (the start, the Do, each reply) and the
// replies, nothing else: the effects buffer and the queue start inside the
// Session and are reused, so no step grows a slice of its own.
func TestSessionStepsAllocateOnlyWhatTheyAnswer(t *testing.T) {
	start := &messages.StartSandbox{}
	do := &messages.Do{}
	var started, done any = startDone{Seq: 0, Sandbox: sandboxOf("sb")}, doDone{Seq: 1}
	var sender any = "caller"
	steps := func() {
		s := NewSession("s")
		for _, in := range []any{start, started, do, done} {
			s.Step(in, sender)
		}
		if s.Stage != StageReady || s.Busy() {
			t.Fatalf("after start and Do: %v, busy %v", s.Stage, s.Busy())
		}
	}
	// The session, the start and its reply (the effect and the message),
	// the Do and its reply (the effect and the message).
	const want = 1 + 1 + 2 + 1 + 2
	if n := testing.AllocsPerRun(100, steps); n > want {
		t.Errorf("a session's start and Do: %v allocations, want at most %d", n, want)
	}
}

// TestSessionMakerSpawnsWithoutPropsOfTheirOwn: a session actor spawned
// from the maker's one Props allocates six objects fewer than one spawned
// from props of its own (the props and its options, the producer's and
// the mailbox producer's closures, the state func, the late requests apart
// from the mailbox), the spawn and the stop being the same.
func TestSessionMakerSpawnsWithoutPropsOfTheirOwn(t *testing.T) {
	sys := actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return slog.New(slog.DiscardHandler) }))
	defer sys.Shutdown()
	inline := actor.WithDispatcher(actor.NewSynchronizedDispatcher(300))
	env := &SessionEnv{Log: logs.Discard()}
	maker := NewSessionMaker(env, inline)
	spawn := func(props func(*messages.SessionView, *Session) *actor.Props) float64 {
		return testing.AllocsPerRun(200, func() {
			pid := sys.Root.Spawn(props(&messages.SessionView{}, NewSession("s")))
			if err := sys.Root.StopFuture(pid).Wait(); err != nil {
				t.Fatal(err)
			}
		})
	}
	own := spawn(func(v *messages.SessionView, s *Session) *actor.Props {
		return SessionPropsPublishing(env, v, func() *Session { return s }).Configure(inline)
	})
	shared := spawn(maker.Props)
	if shared > own-6 {
		t.Errorf("a spawn from the maker's props: %v allocations, from props of its own %v; want at least 6 fewer", shared, own)
	}
}
