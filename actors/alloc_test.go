package actors

import (
	"testing"

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
