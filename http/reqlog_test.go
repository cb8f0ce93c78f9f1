package http_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/resources/notes"
)

// TestToolLinesCarryTheRequest: a line a tool logs through its session's
// logger names the server, the session, the request (its X-Request-Id) and,
// for a session bound to an episode, the episode's capture key; a session
// bound to none has no episode field.
func TestToolLinesCarryTheRequest(t *testing.T) {
	h := newHarness(t, withResources(loggingTool{notes.New(notes.Options{})}))
	bound, unbound := &agent{}, &agent{}
	h.ok(h.post(bound, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	h.ok(h.post(unbound, "/seed_session", map[string]any{}), "seed")
	h.ok(h.do(bound, "POST", "/log_me", map[string]any{}, map[string]string{httpapi.HeaderRequestID: "call-bound"}), "log_me, bound")
	h.ok(h.do(unbound, "POST", "/log_me", map[string]any{}, map[string]string{httpapi.HeaderRequestID: "call-unbound"}), "log_me, unbound")
	got := map[string]logrus.Fields{}
	for _, e := range h.log.AllEntries() {
		if e.Message == "the tool ran" {
			id, _ := e.Data["request_id"].(string)
			got[id] = e.Data
		}
	}
	want := map[string]logrus.Fields{
		"call-bound":   {"server": "notes", "session_id": "s-1", "request_id": "call-bound", "episode": "r7"},
		"call-unbound": {"server": "notes", "session_id": sessionID(unbound), "request_id": "call-unbound"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the tool's lines by request id (-want +got):\n%s", diff)
	}
}
