package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
)

// kinds names the effects Step returned, so that tests read as a script.
func kinds(effects []any) []string {
	var out []string
	for _, e := range effects {
		switch e := e.(type) {
		case effStart:
			out = append(out, "start")
		case effDo:
			out = append(out, "do")
		case effSnapshot:
			out = append(out, "snapshot")
		case effStop:
			out = append(out, "stop:"+string(e.Reason))
		case effRenew:
			out = append(out, "renew")
		case effHeld:
			out = append(out, "held")
		case effEnded:
			out = append(out, "ended:"+string(e.Reason))
		case effReply:
			switch m := e.Msg.(type) {
			case *messages.StartReply:
				switch {
				case m.Err != nil:
					out = append(out, "reply:start-err")
				case m.Existing:
					out = append(out, "reply:start-existing")
				default:
					out = append(out, "reply:start-ok")
				}
			case *messages.DoReply:
				if m.Err != nil {
					out = append(out, "reply:do-err")
				} else {
					out = append(out, "reply:do-ok")
				}
			case *messages.SnapshotReply:
				switch {
				case m.Skipped:
					out = append(out, "reply:snapshot-skipped")
				case m.Err != nil:
					out = append(out, "reply:snapshot-err")
				default:
					out = append(out, "reply:snapshot-ok")
				}
			case *messages.StopReply:
				if m.Err != nil {
					out = append(out, "reply:stop-err")
				} else {
					out = append(out, "reply:stop-ok")
				}
			case *messages.GetSandboxReply:
				out = append(out, "reply:view")
			}
		}
	}
	return out
}

func sandbox(id string) messages.Sandbox {
	return messages.Sandbox{Handle: provider.Handle{SandboxID: id, Provider: "fake"}, Workdir: "/w", Data: []byte("{}")}
}

type step struct {
	in   any
	want []string
}

func run(t *testing.T, s *Session, steps []step) {
	t.Helper()
	for i, st := range steps {
		got := kinds(s.Step(st.in, "caller"))
		if diff := cmp.Diff(st.want, got, cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("step %d (%T): effects (-want +got):\n%s", i, st.in, diff)
		}
	}
}

func TestSessionSerialisesStopBehindStart(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		// A stop arriving during the start waits for it.
		{&messages.StopSandbox{ReqID: 2, Reason: messages.StopEnd}, nil},
		{&messages.Do{ReqID: 3}, nil},
		{startDone{Seq: 0, Sandbox: sandbox("sb-1")}, []string{"held", "reply:start-ok", "stop:end"}},
		{stopDone{Seq: 1}, []string{"ended:end", "reply:stop-ok", "reply:do-err"}},
	})
	if s.Phase != PhaseEnded {
		t.Fatalf("phase %s", s.Phase)
	}
}

func TestSessionIgnoresStaleCompletions(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		{startDone{Seq: 7, Sandbox: sandbox("sb-x")}, nil},
		{doDone{Seq: 0}, nil},
		{startDone{Seq: 0, Sandbox: sandbox("sb-1")}, []string{"held", "reply:start-ok"}},
		{startDone{Seq: 0, Sandbox: sandbox("sb-dup")}, nil},
	})
	if s.Sandbox.Handle.SandboxID != "sb-1" {
		t.Fatalf("a stale completion changed the sandbox to %s", s.Sandbox.Handle.SandboxID)
	}
}

func TestSessionFailedStartAndStop(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		{startDone{Seq: 0, Err: errors.New("no capacity")}, []string{"reply:start-err"}},
		{&messages.StartSandbox{ReqID: 2}, []string{"start"}},
		{startDone{Seq: 1, Sandbox: sandbox("sb-2")}, []string{"held", "reply:start-ok"}},
		{&messages.StartSandbox{ReqID: 3}, []string{"reply:start-err"}},
		{&messages.StopSandbox{ReqID: 4, Reason: messages.StopRetire}, []string{"stop:retire"}},
		// A failed stop keeps the session, so a retry stops it.
		{stopDone{Seq: 2, Err: errors.New("api down")}, []string{"reply:stop-err"}},
		{&messages.StopSandbox{ReqID: 5, Reason: messages.StopRetire}, []string{"stop:retire"}},
		{stopDone{Seq: 3}, []string{"ended:retire", "reply:stop-ok"}},
		// Stopping again is idempotent; starting again needs a new actor.
		{&messages.StopSandbox{ReqID: 6}, []string{"reply:stop-ok"}},
		{&messages.StartSandbox{ReqID: 7}, []string{"reply:start-err"}},
	})
}

func TestSessionSnapshotRules(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		// Empty and in setup: skipped at once, never queued behind setup.
		{&messages.TakeSnapshot{Round: 1}, []string{"reply:snapshot-skipped"}},
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		{&messages.TakeSnapshot{Round: 2}, []string{"reply:snapshot-skipped"}},
		{startDone{Seq: 0, Sandbox: sandbox("sb-1")}, []string{"held", "reply:start-ok"}},
		// Ready: a snapshot waits for a running tool call.
		{&messages.Do{ReqID: 2}, []string{"do"}},
		{&messages.TakeSnapshot{Round: 3}, nil},
		{&messages.GetSandbox{}, []string{"reply:view"}},
		{doDone{Seq: 1}, []string{"reply:do-ok", "snapshot"}},
		{snapshotDone{Seq: 2, SnapshotID: "snap-1"}, []string{"reply:snapshot-ok"}},
		{&messages.TakeSnapshot{Round: 4}, []string{"snapshot"}},
		{snapshotDone{Seq: 3, SnapshotID: "snap-2"}, []string{"reply:snapshot-ok"}},
		{&messages.SnapshotsDiscarded{SnapshotIDs: []string{"snap-2"}}, nil},
	})
	if diff := cmp.Diff([]string{"snap-1"}, s.Snapshots); diff != "" {
		t.Fatalf("snapshots (-want +got):\n%s", diff)
	}
}

func TestRestoredSessionReseedReusesFork(t *testing.T) {
	sb := sandbox("fork-1")
	sb.Restored = true
	sb.Data = nil
	s := NewInstalledSession("s1", sb, []string{"snap-1"})
	if string(s.Sandbox.Data) != "{}" {
		t.Fatalf("installed data %q, want {}", s.Sandbox.Data)
	}
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"reply:start-existing"}},
		{&messages.StartSandbox{ReqID: 2}, []string{"reply:start-existing"}},
	})
}

func TestSessionLeaseRenewal(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sb := sandbox("sb-1")
	sb.Spec.TTLSeconds = 100
	sb.ExpiresAt = t0.Add(100 * time.Second)
	s := NewInstalledSession("s1", sb, nil)
	run(t, s, []step{
		{&messages.RenewLease{Now: t0.Add(10 * time.Second)}, nil}, // not due
		{&messages.RenewLease{Now: t0.Add(60 * time.Second)}, []string{"renew"}},
		{&messages.RenewLease{Now: t0.Add(61 * time.Second)}, nil}, // one at a time
		// A renewal does not block the session's operations.
		{&messages.Do{ReqID: 1}, []string{"do"}},
		{renewDone{Seq: 1, Until: t0.Add(160 * time.Second)}, nil},
		{doDone{Seq: 0}, []string{"reply:do-ok"}},
	})
	if want := t0.Add(160 * time.Second); !s.Sandbox.ExpiresAt.Equal(want) {
		t.Fatalf("lease %v, want %v", s.Sandbox.ExpiresAt, want)
	}
	// A renewal's completion never completes an operation.
	run(t, s, []step{
		{&messages.Do{ReqID: 2}, []string{"do"}},
		{renewDone{Seq: 1}, nil},
	})
	if !s.Busy() {
		t.Fatal("a renewal completion finished a tool call")
	}
}

// Found by the simulation, seed 220 (step 23): the stop's reply went out
// before the supervisor was told to forget the session, so right after
// EndSessionSandbox returned, Sessions still listed it and a commit could ask
// the actor on its way out (and fail). The forget must come first.
func TestSessionIsForgottenBeforeItsStopIsAnswered(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		{startDone{Seq: 0, Sandbox: sandbox("sb-1")}, []string{"held", "reply:start-ok"}},
		{&messages.StopSandbox{ReqID: 2, Reason: messages.StopEnd}, []string{"stop:end"}},
		{stopDone{Seq: 1}, []string{"ended:end", "reply:stop-ok"}},
	})
	e := NewSession("s2")
	run(t, e, []step{
		{&messages.StopSandbox{ReqID: 1, Reason: messages.StopEnd}, []string{"ended:end", "reply:stop-ok"}},
	})
}

func TestForgottenSessionAnswersAsEnded(t *testing.T) {
	s := NewSession("s1")
	run(t, s, []step{
		{&messages.StartSandbox{ReqID: 1}, []string{"start"}},
		{startDone{Seq: 0, Err: errors.New("no capacity")}, []string{"reply:start-err"}},
		{&messages.SessionForgotten{}, nil},
		// A start that looked the actor up before the forget is sent to a
		// new actor, never run in this one.
		{&messages.StartSandbox{ReqID: 2}, []string{"reply:start-err"}},
		{&messages.Do{ReqID: 3}, []string{"reply:do-err"}},
		{&messages.StopSandbox{ReqID: 4}, []string{"reply:stop-ok"}},
	})
	if s.Phase != PhaseEnded {
		t.Fatalf("phase %s, want ended", s.Phase)
	}
}
