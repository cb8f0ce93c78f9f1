package swebench

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources"
)

// client drives an http.Server's handler directly, keeping its cookie.
type client struct {
	t      *testing.T
	srv    *httpapi.Server
	cookie string
}

type reply struct {
	status int
	body   []byte
	header map[string]string
}

func (c *client) post(path string, body []byte) reply {
	c.t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI(path)
	ctx.Request.Header.SetContentType("application/json")
	if c.cookie != "" {
		ctx.Request.Header.SetCookie(c.srv.CookieName(), c.cookie)
	}
	ctx.Request.SetBody(body)
	c.srv.Handler()(&ctx)
	ck := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(ck)
	ck.SetKey(c.srv.CookieName())
	if ctx.Response.Header.Cookie(ck) {
		c.cookie = string(ck.Value())
	}
	r := reply{status: ctx.Response.StatusCode(), body: append([]byte(nil), ctx.Response.Body()...), header: map[string]string{}}
	for _, h := range []string{httpapi.HeaderVerify, httpapi.HeaderRestart, "Retry-After"} {
		r.header[h] = string(ctx.Response.Header.Peek(h))
	}
	return r
}

func (r reply) code(t *testing.T) string {
	t.Helper()
	var env struct {
		Error struct{ Code string } `json:"error"`
	}
	if err := json.Unmarshal(r.body, &env); err != nil {
		t.Fatalf("reply %d %s is not the error envelope: %v", r.status, r.body, err)
	}
	return env.Error.Code
}

func newHTTP(t *testing.T, own *owner.Owner, res resources.Resources) *client {
	t.Helper()
	srv, err := httpapi.New(httpapi.Config{
		Owner: own, Resources: res, Logger: testLogger(t), SessionSecret: []byte("a-test-session-secret-of-32-bytes"),
		ControlAuthToken: "control-token", LeaseTick: -1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return &client{t: t, srv: srv}
}

func TestOverHTTP(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	c := newHTTP(t, w.own, w.srv)
	row := mustJSON(t, tk.multilingualRow("example__calc-1"))

	r := c.post("/ng-rollout/r-1/seed_session", row)
	if r.status != 200 || r.header[httpapi.HeaderVerify] != "wait" || r.header[httpapi.HeaderRestart] != "" {
		t.Fatalf("seed: %d %s %v", r.status, r.body, r.header)
	}
	var seed SeedResult
	if err := json.Unmarshal(r.body, &seed); err != nil || seed.SandboxHandle == nil {
		t.Fatalf("seed reply %s: %v", r.body, err)
	}
	r = c.post("/sandbox_access", nil)
	var access httpapi.Access
	if err := json.Unmarshal(r.body, &access); err != nil || r.status != 200 {
		t.Fatalf("sandbox_access: %d %s", r.status, r.body)
	}
	if access.Workdir != "/testbed" || access.Connection.Descriptor["sandbox_id"] != *seed.SandboxHandle {
		t.Errorf("sandbox_access %+v, want sandbox %s at /testbed", access, *seed.SandboxHandle)
	}
	w.applyAsAgent(*seed.SandboxHandle, tk.patch)

	r = c.post("/ng-rollout/r-1/verify", row)
	var res VerifyResult
	if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
	wantResolved(t, res)
	// A resent verify is refused, never graded 0.
	if r = c.post("/verify", row); r.status != 409 || r.code(t) != httpapi.CodeNoSessionSandbox {
		t.Errorf("second verify: %d %s, want 409 no_session_sandbox", r.status, r.body)
	}
	bad := tk.row("example__calc-1")
	bad["FAIL_TO_PASS"] = "[]"
	if r = c.post("/seed_session", mustJSON(t, bad)); r.status != 422 || r.code(t) != CodeInvalidRow {
		t.Errorf("seed of a row without FAIL_TO_PASS: %d %s, want 422 invalid_row", r.status, r.body)
	}
}

func TestGoldenOverHTTPLendsNothing(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	_, own, srv := newGolden(t, tk)
	c := newHTTP(t, own, srv)
	row := mustJSON(t, tk.row("example__calc-1"))
	r := c.post("/ng-rollout/r-1/seed_session", row)
	if r.status != 200 || r.header[httpapi.HeaderRestart] != "1" {
		t.Fatalf("golden seed: %d %s %v, want 200 with x-ng-checkpoint-restart: 1", r.status, r.body, r.header)
	}
	if r = c.post("/sandbox_access", nil); r.status != 404 || r.code(t) != httpapi.CodeNoSandboxAccess {
		t.Errorf("golden sandbox_access: %d %s, want 404", r.status, r.body)
	}
	r = c.post("/ng-rollout/r-1/verify", row)
	var res VerifyResult
	if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 {
		t.Fatalf("golden verify: %d %s", r.status, r.body)
	}
	wantResolved(t, res)
}

func TestAnUnavailableInstanceOverHTTP(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	_, own, srv := newGolden(t, tk, func(c *Config, _ *provider.Provider) {
		c.TemplateDir = t.TempDir()
		c.EnvSetup = map[string][]string{taskRepo: {"echo no index here >&2; exit 3"}}
	})
	c := newHTTP(t, own, srv)
	row := mustJSON(t, tk.row("example__calc-1"))
	r := c.post("/ng-rollout/r-1/seed_session", row)
	if r.status != 503 || r.code(t) != CodeEnvironmentUnavailable || !strings.Contains(string(r.body), "no index here") {
		t.Fatalf("seed: %d %s, want 503 environment_unavailable with the step's output", r.status, r.body)
	}
	r = c.post("/ng-rollout/r-1/verify", row)
	var res VerifyResult
	if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
	wantMaskedEnvironmentError(t, res, "exited 3")
}

func TestHealthCountsTheGradings(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	_, own, srv := newGolden(t, tk, func(c *Config, _ *provider.Provider) { c.MaxConcurrentGradings = 3 })
	c := newHTTP(t, own, srv)
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.SetRequestURI(httpapi.RouteHealth)
	c.srv.Handler()(&ctx)
	var got struct {
		Status   string         `json:"status"`
		Gradings map[string]int `json:"gradings"`
	}
	if err := json.Unmarshal(ctx.Response.Body(), &got); err != nil || ctx.Response.StatusCode() != 200 {
		t.Fatalf("/health: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	want := map[string]int{"running": 0, "waiting": 0, "max_concurrent": 3}
	if got.Status != "ok" || !cmp.Equal(got.Gradings, want) {
		t.Errorf("/health: %s, want the gradings %v", ctx.Response.Body(), want)
	}
}
