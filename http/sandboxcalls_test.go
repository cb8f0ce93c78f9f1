package http_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
)

// TestSandboxCallsPassTheGate: a call an agent makes on its sandbox is
// admitted through the gate under its session's capture key and counted in
// flight until it leaves; the capture key of a session bound to no episode,
// of no session, or of a nil server is empty.
func TestSandboxCallsPassTheGate(t *testing.T) {
	h := newHarness(t)
	a, b := &agent{}, &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed r1")
	h.ok(h.post(b, "/seed_session", nil), "seed without an episode")
	got := []string{h.srv.CaptureKeyOf(sessionID(a)), h.srv.CaptureKeyOf(sessionID(b)), h.srv.CaptureKeyOf(""), (*httpapi.Server)(nil).CaptureKeyOf(sessionID(a))}
	if diff := cmp.Diff([]string{"r1", "", "", ""}, got); diff != "" {
		t.Errorf("capture keys of r1, an unbound session, none, a nil server (-want +got):\n%s", diff)
	}
	leave, err := h.srv.AdmitSandboxCall(context.Background(), sessionID(a))
	if err != nil {
		t.Fatal(err)
	}
	g := h.srv.Gate()
	if busy := g.Busy(); !cmp.Equal([]string{"r1"}, busy) || g.InflightOf(sessionID(a)) != 1 {
		t.Errorf("admitted: busy %v, in flight %d; want [r1], 1", busy, g.InflightOf(sessionID(a)))
	}
	leave()
	if busy := g.Busy(); len(busy) != 0 || g.Inflight() != 0 {
		t.Errorf("after leaving: busy %v, in flight %d", busy, g.Inflight())
	}
}

// TestSandboxCallsWithCheckpointingOff: without checkpointing there is no
// gate; a sandbox call is admitted at once and no session has a capture
// key.
func TestSandboxCallsWithCheckpointingOff(t *testing.T) {
	h := newHarness(t, checkpointOff())
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	if g := h.srv.Gate(); g != nil {
		t.Errorf("a gate with checkpointing off: %v", g)
	}
	if k := h.srv.CaptureKeyOf(sessionID(a)); k != "" {
		t.Errorf("capture key %q with checkpointing off", k)
	}
	leave, err := h.srv.AdmitSandboxCall(context.Background(), sessionID(a))
	if err != nil || leave == nil {
		t.Fatalf("AdmitSandboxCall: %v, leave %v", err, leave != nil)
	}
	leave()
}
