package http_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	httpapi "github.com/sandboxowner/owner/http"
)

func TestMalformedBodiesAre422OnEveryDataRoute(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	for _, route := range []string{"/seed_session", "/ng-rollout/r2/seed_session", "/append_note", "/verify", "/close_session"} {
		for _, body := range []string{`{"x":`, `{"line":"a"}]`, `{"line":"a"} {}`, `["line"]`, `"line"`, `5`, `null`, "\x00"} {
			fresh := &agent{}
			h.want(h.post(fresh, route, body), 422, "invalid_request", route+" "+body)
			if fresh.cookie != "" {
				t.Errorf("%s %q: a refused body minted a session cookie", route, body)
			}
		}
	}
	// Nothing was started, and the seeded session is untouched.
	if ids, err := h.own.Sessions(); err != nil || len(ids) != 1 {
		t.Fatalf("sessions after refused bodies: %v, %v; want the one seeded", ids, err)
	}
	h.ok(h.post(a, "/append_note", map[string]any{"line": "still here"}), "append")
	// An empty body is still {}.
	h.ok(h.post(&agent{}, "/seed_session", ""), "seed with an empty body")
}

func TestControlBodyWithTrailingDataIs422(t *testing.T) {
	h := newHarness(t)
	d := h.deadline()
	for _, tail := range []string{"]", "}", "x", `{}`, `"s"`} {
		body := `{"checkpoint_id":"c1","deadline_ts":` + jsonNumber(d) + `}` + tail
		h.want(h.control("prepare", body), 422, "invalid_request", "prepare followed by "+tail)
	}
	if st := h.ok(h.control("status", nil), "status"); st["phase"] != "idle" {
		t.Fatalf("a refused prepare changed the phase: %v", st)
	}
	// Trailing whitespace is not data.
	h.ok(h.control("prepare", `{"checkpoint_id":"c1","deadline_ts":`+jsonNumber(d)+"}\n\t "), "prepare with trailing whitespace")
}

func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	h := newHarness(t)
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		r := h.do(nil, "GET", httpapi.ControlPrefix+"status", nil, map[string]string{"Authorization": scheme + " " + token})
		h.ok(r, "status with scheme "+scheme)
	}
	for _, bad := range []string{"Bearer" + token, "Basic " + token, "Bearers " + token, "bearer"} {
		r := h.do(nil, "GET", httpapi.ControlPrefix+"status", nil, map[string]string{"Authorization": bad})
		h.want(r, 401, "unauthorized", bad)
	}
}

func TestKeptCheckpointIDsFollowTheGrammar(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.checkpoint("ck1", "/ck/1")
	h.op("resume", "ck1", nil)
	for _, kept := range [][]string{{"../x", ""}, {""}, {"ck1", "a b"}, {"ck1", "/etc"}, {string(make([]byte, control.MaxIDLen+1))}} {
		h.want(h.control("release", map[string]any{"kept_checkpoint_ids": kept}), 422, "invalid_request", "release keeping "+strings.Join(kept, ","))
	}
	if _, err := h.own.Index().Checkpoint("ck1"); err != nil {
		t.Fatalf("a refused release dropped ck1: %v", err)
	}
	rep := h.ok(h.control("release", map[string]any{"kept_checkpoint_ids": []string{"ck1"}}), "release keeping ck1")
	if d := rep["dropped"].([]any); len(d) != 0 {
		t.Errorf("release keeping ck1 dropped %v", d)
	}
}

func TestPrepareWithAPastDeadlineLeavesAdmissionOpen(t *testing.T) {
	h := newHarness(t)
	past := control.UnixSeconds(h.clk.Now().Add(-time.Second))
	h.want(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": past}), 409, "deadline_exceeded", "prepare past its deadline")
	// Admission is open: a seed and a tool call go through at once.
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed after the refused prepare")
	h.ok(h.post(a, "/append_note", map[string]any{"line": "x"}), "append")
	if st := h.ok(h.control("status", nil), "status"); st["phase"] != "idle" {
		t.Fatalf("phase after a refused prepare: %v", st)
	}
	far := control.UnixSeconds(h.clk.Now().Add(control.DefaultMaxDeadline + time.Minute))
	h.want(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": far}), 422, "invalid_request", "prepare too far ahead")
	h.want(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": 1e18}), 422, "invalid_request", "prepare at 1e18")
	h.op("prepare", "ck1", nil)
}

func jsonNumber(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// TestRequestIDs: a client's X-Request-Id of up to 128 letters, digits and
// "-_.:" names its request and comes back on the reply; any other (longer,
// empty, another character) is replaced by 16 fresh lowercase hex digits,
// as is a missing one.
func TestRequestIDs(t *testing.T) {
	h := newHarness(t)
	id := func(sent string) string {
		t.Helper()
		var hdr map[string]string
		if sent != "" {
			hdr = map[string]string{httpapi.HeaderRequestID: sent}
		}
		return h.do(nil, "GET", "/health", nil, hdr).requestID
	}
	longest := strings.Repeat("r", 128)
	for _, kept := range []string{"azAZ09-_.:", "a", longest} {
		if got := id(kept); got != kept {
			t.Errorf("request id %q came back as %q", kept, got)
		}
	}
	made := map[string]bool{}
	for _, replaced := range []string{"", longest + "r", "a b", "a/b", "é", "a\tb"} {
		got := id(replaced)
		if len(got) != 16 || strings.Trim(got, "0123456789abcdef") != "" || made[got] || got == replaced {
			t.Errorf("request id %q came back as %q, want 16 fresh hex digits", replaced, got)
		}
		made[got] = true
	}
}

// TestControlBodyLimit: a control body of exactly MaxControlBody bytes is
// read; one byte more is refused (413) before it is decoded.
func TestControlBodyLimit(t *testing.T) {
	h := newHarness(t)
	release := `{"kept_checkpoint_ids":[]}`
	body := release + strings.Repeat(" ", httpapi.MaxControlBody-len(release))
	auth := map[string]string{"Authorization": "Bearer " + token}
	h.ok(h.do(nil, "POST", httpapi.ControlPrefix+"release", body, auth), "a release of exactly the limit")
	h.want(h.do(nil, "POST", httpapi.ControlPrefix+"release", body+" ", auth), 413, httpapi.CodeBodyTooLarge, "a release one byte over")
}

// TestAccessLogRoutes: each answered request has one access-log line naming
// its route as a bounded label (the route without the rollout prefix, a
// control operation by name, "other" for anything no route serves), its
// status and its session.
func TestAccessLogRoutes(t *testing.T) {
	h := newHarness(t, withAccessLog())
	a := &agent{}
	call := func(id, method, path string, body any) {
		t.Helper()
		hdr := map[string]string{httpapi.HeaderRequestID: id}
		if strings.HasPrefix(path, httpapi.ControlPrefix) {
			hdr["Authorization"] = "Bearer " + token
		}
		h.do(a, method, path, body, hdr)
	}
	call("seed", "POST", "/ng-rollout/r1/seed_session", nil)
	call("empty-key", "POST", "/ng-rollout//seed_session", nil)
	call("no-route", "POST", "/ng-rollout/r1", nil)
	call("tool", "POST", "/append_note", map[string]any{"line": "x"})
	call("health", "GET", "/health", nil)
	call("unknown", "GET", "/nope", nil)
	call("status", "GET", httpapi.ControlPrefix+"status", nil)
	call("bogus-op", "POST", httpapi.ControlPrefix+"bogus", nil)
	type line struct {
		Route   string
		Status  int
		Session bool
	}
	got := map[string]line{}
	for _, e := range h.log.AllEntries() {
		if e.Message != "request" {
			continue
		}
		id, _ := e.Data["request_id"].(string)
		route, _ := e.Data["route"].(string)
		status, _ := e.Data["status"].(int)
		sess, _ := e.Data["session_id"].(string)
		if _, dup := got[id]; dup {
			t.Errorf("two access-log lines for request %s", id)
		}
		got[id] = line{route, status, sess != "" && sess == sessionID(a)}
	}
	want := map[string]line{
		"seed":      {"/seed_session", 200, true},
		"empty-key": {"other", 404, false},
		"no-route":  {"other", 404, false},
		"tool":      {"/append_note", 200, true},
		"health":    {"/health", 200, false},
		"unknown":   {"other", 404, false},
		"status":    {httpapi.ControlPrefix + "status", 200, false},
		"bogus-op":  {"other", 404, false},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access-log lines by request id (-want +got):\n%s", diff)
	}
}

// TestBearerToken: the scheme's name is case-insensitive and the token is
// what follows "Bearer " (empty when nothing does); a header too short to
// hold the scheme, or of another scheme, has no token.
func TestBearerToken(t *testing.T) {
	type result struct {
		Token string
		OK    bool
	}
	var got []result
	for _, h := range []string{"Bearer abc", "bEaReR abc", "Bearer ", "Bearer", "Basic abc", ""} {
		tok, ok := httpapi.BearerToken([]byte(h))
		got = append(got, result{string(tok), ok})
	}
	want := []result{{"abc", true}, {"abc", true}, {"", true}, {"", false}, {"", false}, {"", false}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("tokens of Bearer, bEaReR, an empty token, no space, Basic, nothing (-want +got):\n%s", diff)
	}
}
