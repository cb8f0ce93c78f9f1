package app_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// startOpenSandbox starts a notes server on the fake OpenSandbox server; stop
// stops it (once; the test's cleanup calls it too).
func startOpenSandbox(t *testing.T, srv *opensandboxtest.Server, lend string) (a *app.App, stop func()) {
	t.Helper()
	cfg := app.Defaults()
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Provider = "opensandbox"
	cfg.Sandbox.OpenSandbox.Domain = srv.Domain
	cfg.Sandbox.OpenSandbox.Lend = lend
	t.Setenv("OPEN_SANDBOX_API_KEY", "env-key") // no api_key in the config: the variable is used
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err = app.Start(context.Background(), cfg, app.Deps{Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			if err := a.Stop(context.Background()); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(stop)
	return a, stop
}

// TestOpenSandboxLending: by default agents get this server's sandbox API
// (which forwards to execd); lend: direct hands them execd's endpoint and
// headers instead.
func TestOpenSandboxLending(t *testing.T) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "env-key"})
	t.Cleanup(srv.Close) // after the servers' own cleanups: they stop their sandboxes there

	a, stopA := startOpenSandbox(t, srv, app.LendServer)
	s, body, cookie := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	d := sandboxAccess(t, a, cookie).Connection.Descriptor
	if !strings.HasPrefix(d.Endpoint, "http://"+a.Addr().String()+"/sandboxes/") {
		t.Errorf("endpoint %q is not this server's sandbox API", d.Endpoint)
	}
	if s, body := execAs(t, d.Endpoint, d.Token, "cat .seed_token"); s != 200 || !strings.Contains(body, `"exit_code":0`) {
		t.Fatalf("exec through the sandbox API: %d %s", s, body)
	}
	if s, _ := execAs(t, d.Endpoint, d.Token+"x", "true"); s != 401 {
		t.Errorf("forged token: %d, want 401", s)
	}
	if md, ok := srv.SandboxMetadata(d.SandboxID); !ok || md["ng.owner"] != "notes" || md["ng.session"] == "" {
		t.Errorf("sandbox labels %v, want the owner's", md)
	}

	stopA()
	b, stopB := startOpenSandbox(t, srv, app.LendDirect)
	s, body, cookie = post(t, b.Addr().String(), "/ng-rollout/r2/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	_, body, _ = post(t, b.Addr().String(), "/sandbox_access", cookie, "")
	var acc struct {
		Connection struct {
			Descriptor struct {
				SandboxID string            `json:"sandbox_id"`
				Endpoint  string            `json:"endpoint"`
				Headers   map[string]string `json:"headers"`
				Token     string            `json:"token"`
			} `json:"descriptor"`
		} `json:"connection"`
	}
	if err := json.Unmarshal([]byte(body), &acc); err != nil {
		t.Fatal(err)
	}
	dd := acc.Connection.Descriptor
	if !strings.HasPrefix(dd.Endpoint, "http://"+srv.Domain+"/") || dd.Headers[opensandboxtest.ExecdTokenHeader] == "" || dd.Token != "" {
		t.Fatalf("direct access %s: want execd's endpoint and headers, no token", body)
	}
	req, _ := http.NewRequest(http.MethodPost, dd.Endpoint+"/command", strings.NewReader(`{"command":"cat /workspace/.seed_token"}`))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range dd.Headers {
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("execd with the lent headers: %d", res.StatusCode)
	}
	stopB()
	if n := srv.Stats().LiveSandboxes; n != 0 {
		t.Errorf("%d sandboxes left after the servers stopped", n)
	}
}
