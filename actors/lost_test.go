package actors

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// lostSession is an installed session whose sandbox the provider reported
// not found through how.
func lostSession(t *testing.T, how string) (*Session, []any) {
	t.Helper()
	s := NewInstalledSession("s1", sandboxOf("sb-1"))
	gone := fmt.Errorf("fake: sandbox sb-1: %w", provider.ErrSandboxNotFound)
	switch how {
	case "do error":
		s.Step(&messages.Do{}, "caller")
		return s, s.Step(doDone{Seq: 0, Err: gone}, nil)
	case "do swallowed":
		s.Step(&messages.Do{}, "caller")
		return s, s.Step(doDone{Seq: 0, Lost: true}, nil)
	case "renewal":
		s.renewSeq = 1
		return s, s.Step(renewDone{Seq: 1, Err: gone}, nil)
	case "snapshot":
		s.Step(&messages.TakeSnapshot{Round: 1}, "coordinator")
		return s, s.Step(snapshotDone{Seq: 0, Err: gone}, nil)
	}
	t.Fatalf("unknown way %q", how)
	return nil, nil
}

func TestLostSandbox(t *testing.T) {
	for _, how := range []string{"do error", "do swallowed", "renewal", "snapshot"} {
		t.Run(how, func(t *testing.T) {
			s, effects := lostSession(t, how)
			lost := 0
			for _, e := range effects {
				if _, ok := e.(effLost); ok {
					lost++
				}
				if r, ok := e.(effReply); ok {
					if d, ok := r.Msg.(*messages.DoReply); ok && !errors.Is(d.Err, sandbox.ErrLost) {
						t.Errorf("the call that found the loss got %v, want sandbox.ErrLost", d.Err)
					}
				}
			}
			if lost != 1 || !s.Lost {
				t.Fatalf("effLost %d times, Lost %v; want once and set", lost, s.Lost)
			}
			// Later calls are refused at once; nothing is exported; the view
			// says lost, not held; the loss is not reported again.
			var got []string
			got = append(got, kinds(s.Step(&messages.Do{}, "caller"))...)
			got = append(got, kinds(s.Step(&messages.TakeSnapshot{Round: 2}, "coordinator"))...)
			got = append(got, kinds(s.Step(&messages.RenewLease{Now: scriptT0.Add(1e15)}, nil))...)
			if diff := cmp.Diff([]string{"reply:do-err", "reply:snapshot-skipped"}, got); diff != "" {
				t.Errorf("effects after the loss (-want +got):\n%s", diff)
			}
			if v := s.view(); v.Held || !v.Lost {
				t.Errorf("view %+v, want lost and not held", v)
			}
			// A stop still ends it (the provider's stop of a gone sandbox
			// succeeds).
			if diff := cmp.Diff([]string{"stop:end"}, kinds(s.Step(&messages.StopSandbox{Reason: messages.StopEnd}, "caller"))); diff != "" {
				t.Errorf("stop of a lost session (-want +got):\n%s", diff)
			}
		})
	}
}
