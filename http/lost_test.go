package http_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/provider/local"
)

// lostLogs counts the owner's "sandbox lost" lines for a session.
func (h *harness) lostLogs(sid string) int {
	n := 0
	for _, e := range h.log.AllEntries() {
		if e.Data["session_id"] == sid && strings.Contains(e.Message, "gone behind the owner's back") {
			n++
		}
	}
	return n
}

// TestSandboxDeletedBehindTheOwnerIsRefusedNeverGraded: a session whose
// sandbox the provider no longer has answers 409 sandbox_lost to its tool
// calls and its verify (no reward), is logged once, and is left out of the
// next checkpoint; the other session goes on and is exported.
func TestSandboxDeletedBehindTheOwnerIsRefusedNeverGraded(t *testing.T) {
	h := newHarness(t)
	lost, kept := &agent{}, &agent{}
	h.ok(h.post(lost, "/ng-rollout/r1/seed_session", nil), "seed r1")
	h.ok(h.post(kept, "/ng-rollout/r2/seed_session", nil), "seed r2")
	h.ok(h.post(lost, "/append_note", map[string]any{"line": "one"}), "append before the loss")
	sb, ok := h.own.SessionSandbox(context.Background(), sessionID(lost))
	if !ok {
		t.Fatal("no sandbox")
	}
	// Behind the owner's back: the provider stops it directly.
	if err := h.fake().Stop(context.Background(), sb.Handle); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		r := h.post(lost, "/append_note", map[string]any{"line": "two"})
		h.want(r, 409, httpapi.CodeSandboxLost, "append on a lost sandbox")
		r = h.post(lost, "/verify", map[string]any{"expected_notes": []string{"one"}})
		h.want(r, 409, httpapi.CodeSandboxLost, "verify of a lost sandbox")
		if strings.Contains(string(r.body), "reward") {
			t.Fatalf("a lost sandbox was graded: %s", r.body)
		}
	}
	if n := h.lostLogs(sessionID(lost)); n != 1 {
		t.Errorf("the loss was logged %d times, want once", n)
	}
	h.ok(h.post(kept, "/append_note", map[string]any{"line": "ok"}), "the other session goes on")

	c := h.checkpoint("ck1", "/ck/1")
	if eps := c["episode_ids"].([]any); len(eps) != 1 || eps[0] != "r2" {
		t.Fatalf("checkpoint exported %v, want only r2", eps)
	}
	ck, err := h.own.Index().Checkpoint("ck1")
	if err != nil || len(ck.Records) != 1 || ck.Records[0].SessionID != sessionID(kept) {
		t.Fatalf("records of ck1: %+v, %v", ck.Records, err)
	}
	h.op("resume", "ck1", nil)
	// Ending the lost session works and forgets it.
	h.ok(h.post(lost, "/close_session", nil), "close the lost session")
	h.want(h.post(lost, "/append_note", map[string]any{"line": "three"}), 409, httpapi.CodeNoSessionSandbox, "append after the close")
	rep := h.ok(h.post(kept, "/verify", map[string]any{"expected_notes": []string{"ok"}}), "verify the other session")
	if rep["reward"] != 1.0 {
		t.Fatalf("the other session's reward: %v", rep)
	}
}

// TestLocalSandboxRemovedOutOfBandIsLost: on the local provider, a sandbox
// whose directory another process removed is sandbox_lost, and the answer
// carries no host path.
func TestLocalSandboxRemovedOutOfBandIsLost(t *testing.T) {
	root := t.TempDir()
	p, err := local.New(local.Options{Root: root, Templates: map[string]string{"notes": ""}, Isolation: local.IsolationNone, Overlay: local.OverlayOff})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, withProvider(p), checkpointOff())
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	h.ok(h.post(a, "/append_note", map[string]any{"line": "one"}), "append")
	if err := os.RemoveAll(filepath.Join(root, "sandboxes", h.sandboxID(a))); err != nil {
		t.Fatal(err)
	}
	r := h.post(a, "/verify", map[string]any{"expected_notes": []string{"one"}})
	h.want(r, 409, httpapi.CodeSandboxLost, "verify of a removed sandbox")
	if strings.Contains(string(r.body), root) {
		t.Fatalf("the answer carries a host path: %s", r.body)
	}
	h.want(h.post(a, "/append_note", map[string]any{"line": "two"}), 409, httpapi.CodeSandboxLost, "append on a removed sandbox")
}
