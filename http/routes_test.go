package http_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

func TestRetireThenACallOfThatAttemptIsStale(t *testing.T) {
	h := newHarness(t)
	a, other := &agent{}, &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed r1")
	h.ok(h.post(other, "/ng-rollout/r2/seed_session", nil), "seed r2")
	sb := h.sandboxID(a)
	ret := h.ok(h.control("retire", map[string]any{"checkpoint_id": "c0", "deadline_ts": h.deadline(), "episode_ids": []any{ep("r1", 0)}}), "retire")
	if diff := cmp.Diff([]any{"r1"}, ret["retired"]); diff != "" {
		t.Errorf("retired (-want +got):\n%s", diff)
	}
	if h.live(sb) {
		t.Errorf("retired sandbox %s still runs", sb)
	}
	h.want(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "x"}), 409, "stale_attempt", "prefixed call of the retired attempt")
	h.want(h.post(a, "/append_note", map[string]any{"line": "x"}), 409, "stale_attempt", "unprefixed call of the retired session")
	h.want(h.post(a, "/ng-rollout/r1-a1/seed_session", nil), 409, "stale_attempt", "a seed of the retired session under the next attempt")
	h.want(h.post(&agent{}, "/ng-rollout/r1/seed_session", nil), 409, "stale_attempt", "a new seed of the retired attempt")
	h.ok(h.post(other, "/ng-rollout/r2/append_note", map[string]any{"line": "x"}), "another rollout goes on")
	// /close_session is never refused.
	h.ok(h.post(a, "/close_session", nil), "close of a retired session")

	st := h.ok(h.control("status", nil), "status")
	if st["retired_rollouts"] != 1.0 {
		t.Errorf("retired_rollouts %v, want 1", st["retired_rollouts"])
	}
	// The next attempt is not fenced.
	b := &agent{}
	h.ok(h.post(b, "/ng-rollout/r1-a1/seed_session", nil), "seed of the next attempt")
	h.ok(h.control("forget", map[string]any{"checkpoint_id": "c0", "deadline_ts": h.deadline(), "rollout_ids": []string{"r1"}}), "forget")
	if st := h.ok(h.control("status", nil), "status"); st["retired_rollouts"] != 0.0 {
		t.Errorf("retired_rollouts %v after forget, want 0", st["retired_rollouts"])
	}
	h.ok(h.post(&agent{}, "/ng-rollout/r1/seed_session", nil), "seed of attempt 0 after forget")
}

func TestRestartOnly(t *testing.T) {
	clk := clock.NewManual(t0)
	h := newHarness(t, withProvider(fake.NewWithoutSnapshots(fake.Options{Clock: clk})))
	a := &agent{}
	seed := h.post(a, "/ng-rollout/r1/seed_session", nil)
	h.ok(seed, "seed")
	if diff := cmp.Diff(map[string]string{httpapi.HeaderVerify: "wait", httpapi.HeaderRestart: "1"}, seed.header); diff != "" {
		t.Errorf("seed headers (-want +got):\n%s", diff)
	}
	// A request in flight through the checkpoint.
	done, release := h.heldAppend(a, "/ng-rollout/r1/append_note")
	defer release()

	prep := h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "prepare")
	report := prep["report"].(map[string]any)
	if prep["phase"] != "prepared" || report["counts"].(map[string]any)["inflight"] != 0.0 {
		t.Fatalf("prepare in restart_only: %v", prep)
	}
	if diff := cmp.Diff([]any{"r1"}, report["restarts"]); diff != "" {
		t.Errorf("restarts (-want +got):\n%s", diff)
	}
	h.want(h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/d", "episode_ids": []any{ep("r1", 0)}}), 409, "restart_in_scope", "commit naming a restart")
	commit := h.ok(h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"}), "commit")
	if commit["manifest"].(map[string]any)["record_count"] != 0.0 || len(commit["episode_ids"].([]any)) != 0 {
		t.Errorf("restart_only commit recorded something: %v", commit)
	}
	if cks, err := h.own.Checkpoints(); err != nil || len(cks) != 0 {
		t.Errorf("checkpoints %v, %v; want none", cks, err)
	}
	// Non-seed requests are not held by an open checkpoint here.
	release()
	h.ok(<-done, "the in-flight append")
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "two"}), "append during the checkpoint")
	if st := h.ok(h.control("status", nil), "status"); st["mode"] != "restart_only" || st["phase"] != "committed" {
		t.Errorf("status: %v", st)
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "resume")
}

// A restore in restart_only installs nothing, but a checkpoint directory
// that is not there is refused as any unreadable checkpoint is.
func TestRestartOnlyRestoreNeedsItsDirectory(t *testing.T) {
	clk := clock.NewManual(t0)
	h := newHarness(t, withProvider(fake.NewWithoutSnapshots(fake.Options{Clock: clk})))
	body := func(dir string) map[string]any {
		return map[string]any{"checkpoint_id": "rs1", "deadline_ts": h.deadline(), "checkpoint_dir": dir, "episode_ids": []any{ep("r1", 0)}}
	}
	h.want(h.control("restore", body(t.TempDir()+"/gone")), 422, "invalid_checkpoint_state", "restore of a missing directory")
	r := h.ok(h.control("restore", body(t.TempDir())), "restore of an existing directory")
	if diff := cmp.Diff(map[string]any{"phase": "restored", "source_checkpoint_id": "", "restored": []any{}}, r); diff != "" {
		t.Errorf("restart_only restore (-want +got):\n%s", diff)
	}
	h.op("resume", "rs1", nil)
}

// Every data reply carries the session's cookie, not only a new session's.
func TestEveryDataReplyCarriesTheSessionCookie(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	first := h.post(a, "/ng-rollout/r1/seed_session", nil)
	h.ok(first, "seed")
	for _, path := range []string{"/ng-rollout/r1/append_note", "/sandbox_access"} {
		r := h.post(a, path, map[string]any{"line": "x"})
		if r.cookie != first.cookie {
			t.Errorf("%s: Set-Cookie %q, want the session's %q", path, r.cookie, first.cookie)
		}
	}
}

func TestAdmissionWaitsWhileACheckpointIsOpen(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.op("prepare", "ck1", nil)
	done := h.waitingAppend(a, "/ng-rollout/r1/append_note")
	select {
	case r := <-done:
		t.Fatalf("a data request was served while the checkpoint was open: %d %s", r.status, r.body)
	default:
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "resume")
	h.ok(<-done, "the waiting append")
}

func TestPreparePastItsDeadlineReportsBlockers(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r7-a2/seed_session", nil), "seed")
	done, release := h.heldAppend(a, "/ng-rollout/r7-a2/append_note")
	defer release()

	body := map[string]any{"checkpoint_id": "ck1", "deadline_ts": control.UnixSeconds(h.clk.Now().Add(5 * time.Second))}
	prepared := make(chan reply)
	g := h.srv.Gate()
	ch := g.Changed()
	go func() { prepared <- h.control("prepare", body) }()
	for ; g.IsOpen(); ch = g.Changed() {
		<-ch // the prepare closes admission before its deadline
	}
	// Logical time passes the deadline; the machine looks again.
	h.clk.Advance(6 * time.Second)
	h.srv.Machine().Notify()
	prep := h.ok(<-prepared, "prepare")
	report := prep["report"].(map[string]any)
	if prep["phase"] != "preparing" || report["ready"] != false || report["blocker_count"] != 1.0 {
		t.Fatalf("prepare past its deadline: %v", prep)
	}
	if diff := cmp.Diff([]any{"r7-a2"}, report["blockers"]); diff != "" {
		t.Errorf("blockers (-want +got):\n%s", diff)
	}
	release()
	h.ok(<-done, "the in-flight append")
	body["deadline_ts"] = h.deadline()
	if prep := h.ok(h.control("prepare", body), "prepare again"); prep["phase"] != "prepared" {
		t.Fatalf("prepare once idle: %v", prep)
	}
	h.want(h.control("prepare", map[string]any{"checkpoint_id": "ck2", "deadline_ts": h.deadline()}), 409, "checkpoint_conflict", "another checkpoint")
}

// A session seeded without a rollout prefix runs no episode: no checkpoint
// exports it, so its request in flight holds up no prepare, and no blocker
// is ever a name a controller cannot retire.
func TestAnUnboundSessionsRequestIsNoBlocker(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed without a prefix")
	done, release := h.heldAppend(a, "/append_note")
	defer release()
	prep := h.op("prepare", "ck1", nil)
	want := map[string]any{"phase": "prepared", "report": map[string]any{"ready": true, "blockers": []any{}, "blocker_count": 0.0, "restarts": []any{}, "counts": map[string]any{"inflight": 0.0, "sessions": 0.0}}}
	if diff := cmp.Diff(want, prep); diff != "" {
		t.Errorf("prepare with an unbound request in flight (-want +got):\n%s", diff)
	}
	release()
	h.ok(<-done, "the in-flight append")
	h.op("resume", "ck1", nil)
}

func TestControlAuth(t *testing.T) {
	h := newHarness(t)
	for _, tc := range []struct {
		name, method, route string
		headers             map[string]string
	}{
		{"status without a token", "GET", "status", nil},
		{"status with a wrong token", "GET", "status", map[string]string{"Authorization": "Bearer nope"}},
		{"not a bearer", "GET", "status", map[string]string{"Authorization": token}},
		{"prepare without a token", "POST", "prepare", nil},
		{"release with a prefix of the token", "POST", "release", map[string]string{"Authorization": "Bearer " + token[:5]}},
	} {
		r := h.do(nil, tc.method, httpapi.ControlPrefix+tc.route, `{"checkpoint_id":"c","deadline_ts":1}`, tc.headers)
		h.want(r, 401, "unauthorized", tc.name)
	}
	h.ok(h.control("status", nil), "status with the token")
	h.want(h.do(nil, "POST", httpapi.ControlPrefix+"status", nil, map[string]string{"Authorization": "Bearer " + token}), 405, httpapi.CodeMethod, "POST status")
	h.want(h.control("nosuch", map[string]any{}), 404, httpapi.CodeNotFound, "unknown control route")
}

func TestControlPlaneAbsentWithCheckpointingOff(t *testing.T) {
	h := newHarness(t, checkpointOff())
	h.want(h.control("status", nil), 404, httpapi.CodeNotFound, "status with checkpointing off")
	a := &agent{}
	seed := h.post(a, "/ng-rollout/r1/seed_session", nil)
	h.ok(seed, "seed")
	if diff := cmp.Diff(map[string]string{httpapi.HeaderVerify: "wait"}, seed.header); diff != "" {
		t.Errorf("seed headers (-want +got):\n%s", diff)
	}
	h.ok(h.post(a, "/append_note", map[string]any{"line": "x"}), "append")
}

func TestCloseSession(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	cookie := a.cookie
	r := h.post(a, "/close_session", nil)
	if diff := cmp.Diff(map[string]any{"closed": true}, h.ok(r, "close")); diff != "" {
		t.Errorf("close reply (-want +got):\n%s", diff)
	}
	if r.cookie != "-" || a.cookie != "" {
		t.Errorf("close did not delete the cookie: %q", r.cookie)
	}
	if h.live(sb) {
		t.Errorf("closed session's sandbox %s still runs", sb)
	}
	old := &agent{cookie: cookie}
	h.ok(h.post(old, "/close_session", ""), "close again")
	old.cookie = cookie
	h.want(h.post(old, "/ng-rollout/r1/seed_session", nil), 409, httpapi.CodeSessionClosed, "seed of a closed session")
	h.ok(h.post(&agent{}, "/close_session", "{}"), "close of a session never seeded")

	// The typed form names the session.
	b := &agent{}
	h.ok(h.post(b, "/ng-rollout/r2/seed_session", nil), "seed b")
	sbB := h.sandboxID(b)
	id := sessionID(b)
	typed := h.ok(h.post(&agent{}, "/close_session", map[string]any{"resources_session_id": id, "episode_id": ep("r2", 0)}), "typed close")
	if diff := cmp.Diff(map[string]any{"resources_session_id": id}, typed); diff != "" {
		t.Errorf("typed close reply (-want +got):\n%s", diff)
	}
	if h.live(sbB) {
		t.Errorf("typed close left %s running", sbB)
	}
	for _, body := range []string{`{"resources_session_id": 5}`, `{"resources_session_id": ""}`, `[1]`, `{`, `{"resources_session_id":"x","episode_id":{"rollout_id":"r-a1"}}`} {
		h.want(h.post(&agent{}, "/close_session", body), 422, "invalid_request", "close with "+body)
	}
	// A closed session is never exported.
	h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline()}), "prepare")
	c := h.ok(h.control("commit", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"}), "commit")
	if c["manifest"].(map[string]any)["record_count"] != 0.0 {
		t.Errorf("closed sessions were exported: %v", c)
	}
}

func TestVerifyWithoutASandboxIs409(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	r := h.post(a, "/verify", map[string]any{"expected_notes": []string{}})
	h.want(r, 409, httpapi.CodeNoSessionSandbox, "verify before seed")
	if strings.Contains(string(r.body), "reward") {
		t.Errorf("a refused verify carries a reward: %s", r.body)
	}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	h.ok(h.post(a, "/verify", map[string]any{"expected_notes": []string{}}), "verify")
	h.want(h.post(a, "/verify", map[string]any{"expected_notes": []string{}}), 409, httpapi.CodeNoSessionSandbox, "resent verify")
	h.want(h.post(a, "/append_note", map[string]any{"line": "x"}), 409, httpapi.CodeNoSessionSandbox, "tool call without a sandbox")
}

func TestSandboxAccess(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.want(h.post(a, "/sandbox_access", nil), 404, httpapi.CodeNoSandboxAccess, "access before seed")
	h.ok(h.post(a, "/seed_session", nil), "seed")
	got := h.ok(h.post(a, "/sandbox_access", nil), "access")
	want := map[string]any{
		"connection": map[string]any{"kind": "direct", "provider_config_ref": "sandbox", "descriptor": map[string]any{"sandbox_id": "sb-1", "workdir": fake.DefaultWorkdir}},
		"workdir":    fake.DefaultWorkdir,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("access (-want +got):\n%s", diff)
	}
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, withMaxBody(4096))
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	d := h.deadline()
	cases := []struct {
		name, path string
		body       any
		status     int
		code       string
	}{
		{"malformed JSON", "/append_note", `{"line":`, 422, "invalid_request"},
		{"wrong type", "/append_note", `{"line": 5}`, 422, "invalid_request"},
		{"missing field", "/append_note", `{}`, 422, "invalid_request"},
		{"not an object", "/append_note", `["one"]`, 422, "invalid_request"},
		{"verify with a string", "/verify", `{"expected_notes": "one"}`, 422, "invalid_request"},
		{"unknown route", "/nope", `{}`, 404, httpapi.CodeNotFound},
		{"bad capture key", "/ng-rollout/r-a0/append_note", `{"line":"x"}`, 400, httpapi.CodeInvalidCapture},
		{"control: unknown field", httpapi.ControlPrefix + "prepare", map[string]any{"checkpoint_id": "c1", "deadline_ts": d, "bogus": 1}, 422, "invalid_request"},
		{"control: wrong type", httpapi.ControlPrefix + "prepare", map[string]any{"checkpoint_id": 5, "deadline_ts": d}, 422, "invalid_request"},
		{"control: malformed", httpapi.ControlPrefix + "prepare", `{`, 422, "invalid_request"},
		{"control: empty body", httpapi.ControlPrefix + "resume", ``, 422, "invalid_request"},
		{"control: trailing data", httpapi.ControlPrefix + "resume", `{"checkpoint_id":"c1","deadline_ts":1e10} {}`, 422, "invalid_request"},
		{"control: bad id", httpapi.ControlPrefix + "prepare", map[string]any{"checkpoint_id": "a b", "deadline_ts": d}, 422, "invalid_request"},
		{"control: unknown field in an episode", httpapi.ControlPrefix + "retire", map[string]any{"checkpoint_id": "c1", "deadline_ts": d, "episode_ids": []any{map[string]any{"rollout_id": "r", "x": 1}}}, 422, "invalid_request"},
		{"control: fractional attempt", httpapi.ControlPrefix + "retire", map[string]any{"checkpoint_id": "c1", "deadline_ts": d, "episode_ids": []any{map[string]any{"rollout_id": "r", "attempt": 1.5}}}, 422, "invalid_request"},
		{"release without kept ids", httpapi.ControlPrefix + "release", `{}`, 422, "invalid_request"},
	}
	for _, tc := range cases {
		var r reply
		if strings.HasPrefix(tc.path, httpapi.ControlPrefix) {
			r = h.control(strings.TrimPrefix(tc.path, httpapi.ControlPrefix), tc.body)
		} else {
			r = h.post(a, tc.path, tc.body)
		}
		h.want(r, tc.status, tc.code, tc.name)
	}
	h.want(h.do(a, "GET", "/append_note", nil, nil), 405, httpapi.CodeMethod, "GET of a POST route")
	// A body past the limit: announced, and the answer read once its first
	// byte is sent (the server reads that one before it looks at the
	// length). (A client still writing the body when the server answers and
	// closes sees the close instead of the 413: the test flaked on it.)
	conn, err := h.ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "POST /append_note HTTP/1.1\r\nHost: notes\r\nCookie: %s=%s\r\nContent-Length: 5000\r\n\r\n{", h.cookieName, a.cookie)
	var big fasthttp.Response
	if err := big.Read(bufio.NewReader(conn)); err != nil {
		t.Fatalf("reading the answer to an oversized body: %v", err)
	}
	h.want(reply{status: big.StatusCode(), body: bytes.Clone(big.Body())}, 413, httpapi.CodeBodyTooLarge, "oversized body")
	// Data routes ignore unknown fields.
	h.ok(h.post(a, "/append_note", map[string]any{"line": "ok", "responses_create_params": map[string]any{"x": 1}}), "unknown data fields")
	if st := h.ok(h.control("status", nil), "status"); st["phase"] != "idle" {
		t.Errorf("refused control bodies changed the phase: %v", st)
	}
}

func TestForgedCookieIsANewSession(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	id := sessionID(a)
	for _, forged := range []string{
		id,                                // no signature
		id + ".AAAA",                      // a wrong one
		id + "x" + a.cookie[len(id):],     // another id under a's signature
		a.cookie[:len(a.cookie)-2] + "zz", // tampered signature
	} {
		m := &agent{cookie: forged}
		r := h.post(m, "/sandbox_access", nil)
		h.want(r, 404, httpapi.CodeNoSandboxAccess, "access with a forged cookie")
		if r.cookie == "" || strings.HasPrefix(r.cookie, id+".") {
			t.Errorf("forged cookie %q got cookie %q, want a new session", forged, r.cookie)
		}
	}
	h.sandboxID(a) // the genuine cookie still works
}

// boom is the notes server with a tool that panics.
type boom struct{ *notes.Server }

func (b boom) Tools() map[string]resources.ToolFunc {
	tools := b.Server.Tools()
	tools["/boom"] = func(ctx context.Context, sess *resources.Session, body []byte) (any, error) { panic("boom") }
	// A tool failing with each status: its body names it.
	tools["/fail"] = func(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
		var req struct{ Status int }
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		if req.Status == 0 {
			return nil, errors.New("broke") // unexpected: a 500
		}
		err := problem.Errorf(req.Status, "failed", "failed with %d", req.Status)
		if req.Status == 429 {
			err.RetryAfter = "7"
		}
		return nil, err
	}
	return tools
}

// TestUnexpectedFailuresLogged: a request that fails with a 5xx other than
// 503 (the server's own fault) is logged as an error with its status; a
// 503 (retry later) or a 4xx (the client's) is not.
func TestUnexpectedFailuresLogged(t *testing.T) {
	h := newHarness(t, withResources(boom{notes.New(notes.Options{})}))
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	for _, status := range []int{0, 499, 500, 502, 503} {
		body := map[string]any{"Status": status}
		if status == 0 {
			body = map[string]any{}
		}
		h.post(a, "/fail", body)
	}
	var logged []int
	for _, e := range h.log.AllEntries() {
		if e.Message == "request failed" {
			st, _ := e.Data["status"].(int)
			logged = append(logged, st)
		}
	}
	if diff := cmp.Diff([]int{500, 500, 502}, logged); diff != "" {
		t.Errorf("statuses of the failures logged (-want +got):\n%s", diff)
	}
}

func TestPanicIs500AndTheServerLives(t *testing.T) {
	h := newHarness(t, withResources(boom{notes.New(notes.Options{})}))
	h.want(h.post(&agent{}, "/ng-rollout/r1/boom", nil), 500, httpapi.CodeInternal, "panicking tool")
	found := false
	for _, e := range h.log.AllEntries() {
		if e.Message == "request handler panicked" {
			found = true
		}
	}
	if !found {
		t.Error("the panic was not logged")
	}
	h.ok(h.do(nil, "GET", "/health", nil, nil), "health after a panic")
	// The panicking request left the gate: a prepare is ready.
	if p := h.ok(h.control("prepare", map[string]any{"checkpoint_id": "c", "deadline_ts": h.deadline()}), "prepare"); p["phase"] != "prepared" {
		t.Errorf("prepare after a panic: %v", p)
	}
}

func TestCommitWithStopParks(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline()}), "prepare")
	c := h.ok(h.control("commit", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline(), "checkpoint_dir": "/d", "stop": true}), "commit")
	if diff := cmp.Diff([]any{"r1"}, c["parked"]); diff != "" {
		t.Errorf("parked (-want +got):\n%s", diff)
	}
	if h.live(sb) {
		t.Errorf("stop commit left %s running", sb)
	}
	if n := h.fake().Stats().LiveSnapshots; n != 1 {
		t.Errorf("%d snapshots, want the checkpoint's one", n)
	}
	// A retry of the commit returns the recorded reply.
	again := h.ok(h.control("commit", map[string]any{"checkpoint_id": "ck", "deadline_ts": h.deadline(), "checkpoint_dir": "/d", "stop": true}), "commit retry")
	if diff := cmp.Diff(c, again); diff != "" {
		t.Errorf("retried commit (-first +again):\n%s", diff)
	}
}

func TestRestoreRefusals(t *testing.T) {
	h := newHarness(t)
	h.want(h.control("restore", map[string]any{"checkpoint_id": "rs", "deadline_ts": h.deadline(), "checkpoint_dir": "/none", "episode_ids": []any{}}), 422, "invalid_checkpoint_state", "restore of an unknown checkpoint_dir")
	h.want(h.control("restore", map[string]any{"checkpoint_id": "rs2", "deadline_ts": h.deadline(), "source_checkpoint_id": "nope", "episode_ids": []any{}}), 422, "invalid_checkpoint_state", "restore of an unknown checkpoint")
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.want(h.control("restore", map[string]any{"checkpoint_id": "rs3", "deadline_ts": h.deadline(), "checkpoint_dir": "/d", "episode_ids": []any{}}), 409, "invalid_phase", "restore into a process with sessions")
	// Admission reopened after each refusal.
	h.ok(h.post(a, "/append_note", map[string]any{"line": "x"}), "append after refused restores")
}

func TestSessionSecret(t *testing.T) {
	dir := t.TempDir()
	s1, gen, err := httpapi.LoadSessionSecret("", dir)
	if err != nil || gen {
		t.Fatalf("first load: %v (generated %v)", err, gen)
	}
	s2, _, err := httpapi.LoadSessionSecret("", dir)
	if err != nil || string(s1) != string(s2) {
		t.Fatalf("second load differs: %v", err)
	}
	if fi, err := os.Stat(filepath.Join(dir, httpapi.SecretFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("secret file: %v %v", fi, err)
	}
	if s, _, err := httpapi.LoadSessionSecret("configured-secret-1234", dir); err != nil || string(s) != "configured-secret-1234" {
		t.Errorf("configured secret: %q %v", s, err)
	}
	if _, _, err := httpapi.LoadSessionSecret("short", ""); !errors.Is(err, httpapi.ErrSecret) {
		t.Errorf("short secret: %v", err)
	}
	p1, gen, _ := httpapi.LoadSessionSecret("", "")
	p2, _, _ := httpapi.LoadSessionSecret("", "")
	if !gen || string(p1) == string(p2) {
		t.Error("per-process secrets are not fresh")
	}
	sg, _ := httpapi.NewSigner("notes___notes", s1)
	other, _ := httpapi.NewSigner("swebench___notes", s1)
	v := sg.Sign("abc")
	if id, ok := sg.Verify(v); !ok || id != "abc" {
		t.Errorf("Verify(Sign) = %q %v", id, ok)
	}
	if _, ok := other.Verify(v); ok {
		t.Error("a cookie of one server is valid for another")
	}
}

func TestStatusShape(t *testing.T) {
	h := newHarness(t)
	st := h.ok(h.control("status", nil), "status")
	raw, _ := json.Marshal(st)
	var got map[string]any
	_ = json.Unmarshal(raw, &got)
	want := map[string]any{
		"kind": "resources", "instance": "notes", "phase": "idle", "checkpoint_id": nil, "lease_expires_at": nil,
		"retired_rollouts": 0.0, "retiring": 0.0, "mode": "exported", "verify": "wait", "retired_sessions": 0.0,
		"report": map[string]any{"ready": true, "blockers": []any{}, "blocker_count": 0.0, "restarts": []any{}, "counts": map[string]any{"inflight": 0.0, "sessions": 0.0}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("status (-want +got):\n%s", diff)
	}
}

// TestControlTokenComparedInFull: wrong tokens whose digests share the
// right token's first byte, or its last, are refused; so are the token
// with a byte more or less.
func TestControlTokenComparedInFull(t *testing.T) {
	h := newHarness(t)
	want := sha256.Sum256([]byte(token))
	var sameFirst, sameLast string
	for i := 0; sameFirst == "" || sameLast == ""; i++ {
		cand := fmt.Sprintf("wrong-%d", i)
		sum := sha256.Sum256([]byte(cand))
		if sameFirst == "" && sum[0] == want[0] {
			sameFirst = cand
		}
		if sameLast == "" && sum[31] == want[31] {
			sameLast = cand
		}
	}
	for name, tok := range map[string]string{
		"digest shares the first byte": sameFirst,
		"digest shares the last byte":  sameLast,
		"one byte more":                token + "x",
		"one byte less":                token[:len(token)-1],
	} {
		r := h.do(nil, "GET", httpapi.ControlPrefix+"status", nil, map[string]string{"Authorization": "Bearer " + tok})
		h.want(r, 401, "unauthorized", name)
	}
	h.ok(h.control("status", nil), "status with the token")
}

// TestClosedSessionIDRetention: a closed session's id is refused a new seed
// for the closed-id retention (an hour by default) and seeded again from
// exactly then.
func TestClosedSessionIDRetention(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	cookie := a.cookie
	h.ok(h.post(a, "/close_session", nil), "close")
	h.clk.Advance(time.Hour - time.Nanosecond)
	h.want(h.post(&agent{cookie: cookie}, "/seed_session", nil), 409, httpapi.CodeSessionClosed, "seed a moment before the retention ends")
	h.clk.Advance(time.Nanosecond)
	h.ok(h.post(&agent{cookie: cookie}, "/seed_session", nil), "seed once the retention ended")
}

// TestRetryAfterOfAnError: an error that says when to retry answers with
// that Retry-After; one that does not answers without any.
func TestRetryAfterOfAnError(t *testing.T) {
	h := newHarness(t, withResources(boom{notes.New(notes.Options{})}))
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	got := map[int]string{}
	for _, status := range []int{429, 409} {
		got[status] = h.post(a, "/fail", map[string]any{"Status": status}).header["Retry-After"]
	}
	if diff := cmp.Diff(map[int]string{429: "7", 409: ""}, got); diff != "" {
		t.Errorf("Retry-After by status (-want +got):\n%s", diff)
	}
}
