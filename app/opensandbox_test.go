package app_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// startOpenSandbox starts a notes server on the fake OpenSandbox server; stop
// stops it (once; the test's cleanup calls it too).
func startOpenSandbox(t *testing.T, srv *opensandboxtest.Server, lend string) (a *app.App, stop func()) {
	return startOpenSandboxIn(t, srv, lend, "")
}

// startOpenSandboxIn is startOpenSandbox with checkpointing on in stateDir
// (unless it is "").
func startOpenSandboxIn(t *testing.T, srv *opensandboxtest.Server, lend, stateDir string) (a *app.App, stop func()) {
	t.Helper()
	cfg := app.Defaults()
	if stateDir != "" {
		cfg.Checkpoint.Enabled, cfg.Checkpoint.StateDir, cfg.Checkpoint.ControlAuthToken = true, stateDir, "tok"
	}
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

// TestOpenSandboxSkipSnapshotProbe: with skip_snapshot_probe the server
// starts no sandbox at startup and trusts the runtime to take snapshots: it
// runs exported even on a lifecycle server that would answer 501.
func TestOpenSandboxSkipSnapshotProbe(t *testing.T) {
	t.Parallel()
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "env-key", NoSnapshots: true})
	t.Cleanup(srv.Close)
	cfg := app.Defaults()
	cfg.Checkpoint.Enabled, cfg.Checkpoint.StateDir, cfg.Checkpoint.ControlAuthToken = true, t.TempDir(), "tok"
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Provider = "opensandbox"
	cfg.Sandbox.OpenSandbox.Domain, cfg.Sandbox.OpenSandbox.APIKey = srv.Domain, "env-key"
	cfg.Sandbox.OpenSandbox.SkipSnapshotProbe = true
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	if got := a.Owner().Mode(); got != owner.ModeExported {
		t.Errorf("mode %s, want %s", got, owner.ModeExported)
	}
	if st := srv.Stats(); st.Created != 0 {
		t.Errorf("at startup: %+v, want no sandbox made", st)
	}
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
	// The lifecycle server names no execd headers; the descriptor names
	// the sandbox's own execd token, which its execd wants.
	if !strings.HasPrefix(dd.Endpoint, "http://"+srv.Domain+"/") || dd.Token != "" {
		t.Fatalf("direct access %s: want execd's endpoint, no token", body)
	}
	tok := srv.ExecdToken(dd.SandboxID)
	if diff := cmp.Diff(map[string]string{"X-EXECD-ACCESS-TOKEN": tok}, dd.Headers); diff != "" || tok == "" {
		t.Errorf("direct access headers (-want +got):\n%s", diff)
	}
	for _, lent := range []bool{true, false} {
		req, _ := http.NewRequest(http.MethodPost, dd.Endpoint+"/command", strings.NewReader(`{"command":"cat /workspace/.seed_token"}`))
		req.Header.Set("Content-Type", "application/json")
		if lent {
			for k, v := range dd.Headers {
				req.Header.Set(k, v)
			}
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if want := map[bool]int{true: 200, false: 401}[lent]; res.StatusCode != want {
			t.Errorf("execd with the lent headers %v: %d, want %d", lent, res.StatusCode, want)
		}
	}
	stopB()
	if n := srv.Stats().LiveSandboxes; n != 0 {
		t.Errorf("%d sandboxes left after the servers stopped", n)
	}
}

// TestOpenSandboxSupersededSandboxAnswers410: after a crash and a restore, the
// token of the superseded OpenSandbox sandbox answers 410 on this server's
// sandbox API, the fork's token works, and the superseded sandbox is deleted
// on the OpenSandbox server.
func TestOpenSandboxSupersededSandboxAnswers410(t *testing.T) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "env-key"})
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	a, _ := startOpenSandboxIn(t, srv, app.LendServer, dir)
	s, body, cookie := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	d := sandboxAccess(t, a, cookie).Connection.Descriptor
	if s, body := execAs(t, d.Endpoint, d.Token, "echo hi > agent.txt"); s != 200 || !strings.Contains(body, `"exit_code":0`) {
		t.Fatalf("exec: %d %s", s, body)
	}
	if _, err := a.Owner().Commit(context.Background(), owner.CommitRequest{CheckpointID: "ck1"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Owner().Abandon(); err != nil {
		t.Fatal(err)
	}
	_ = a.Server().Shutdown(context.Background())

	b, _ := startOpenSandboxIn(t, srv, app.LendServer, dir)
	if _, err := b.Owner().Restore(context.Background(), owner.RestoreRequest{CheckpointID: "ck1"}); err != nil {
		t.Fatal(err)
	}
	old := strings.Replace(d.Endpoint, a.Addr().String(), b.Addr().String(), 1)
	if s, body := execAs(t, old, d.Token, "true"); s != 410 || !strings.Contains(body, "superseded") {
		t.Fatalf("token of the superseded sandbox: %d %s, want 410 superseded", s, body)
	}
	if _, live := srv.SandboxMetadata(d.SandboxID); live {
		t.Errorf("the superseded sandbox %s still runs on the OpenSandbox server", d.SandboxID)
	}
	if s, body, _ := post(t, b.Addr().String(), "/seed_session", cookie, "{}"); s != 200 {
		t.Fatalf("re-seed: %d %s", s, body)
	}
	d2 := sandboxAccess(t, b, cookie).Connection.Descriptor
	if s, body := execAs(t, d2.Endpoint, d2.Token, "cat agent.txt"); s != 200 || !strings.Contains(body, "hi") {
		t.Fatalf("exec in the fork: %d %s", s, body)
	}
}

// TestOpenSandboxLeaseRunsOut: a sandbox whose lease ran out on the
// OpenSandbox server (nobody renewed it) is found gone: verify answers 409
// sandbox_lost, never a reward.
func TestOpenSandboxLeaseRunsOut(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "env-key", Clock: clk})
	t.Cleanup(srv.Close)
	cfg := app.Defaults()
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Provider = "opensandbox"
	cfg.Sandbox.OpenSandbox.Domain = srv.Domain
	cfg.Sandbox.OpenSandbox.APIKey = "env-key"
	cfg.Sandbox.OpenSandbox.TTLSeconds = 60
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Clock: clk, LeaseTick: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	_, _, cookie := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}")
	if s, body, _ := post(t, a.Addr().String(), "/append_note", cookie, `{"line":"one"}`); s != 200 {
		t.Fatalf("append_note: %d %s", s, body)
	}
	clk.Advance(61 * time.Second) // the owner is not ticked: nothing renews
	s, body, _ := post(t, a.Addr().String(), "/verify", cookie, `{"expected_notes":["one"]}`)
	if s != 409 || !strings.Contains(body, "sandbox_lost") {
		t.Errorf("verify after the lease ran out: %d %s, want 409 sandbox_lost", s, body)
	}
	if st := srv.Stats(); st.Expired != 1 {
		t.Errorf("expired %d, want the one sandbox", st.Expired)
	}
}

// TestOpenSandboxUnreachable: a server whose lifecycle server gives no
// answer says so at startup in one line naming its domain, /health answers
// 503 provider_unreachable, and a seed is 503 provider_unavailable with
// Retry-After, never 500; once the lifecycle server answers, seeds work and
// /health is ok again.
func TestOpenSandboxUnreachable(t *testing.T) {
	t.Parallel()
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "k"})
	t.Cleanup(srv.Close)
	srv.Inject(opensandboxtest.Fault{Path: "/v1/", Drop: true, Times: 1 << 20})
	lg, hook := logtest.NewNullLogger()
	cfg := app.Defaults()
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Provider = "opensandbox"
	cfg.Sandbox.OpenSandbox.Domain = srv.Domain
	cfg.Sandbox.OpenSandbox.APIKey = "k"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	var errs []string
	for _, e := range hook.AllEntries() {
		if e.Level <= logrus.ErrorLevel {
			errs = append(errs, e.Message)
		}
	}
	if len(errs) != 1 || !strings.Contains(errs[0], srv.Domain) || !strings.Contains(errs[0], "unreachable") {
		t.Errorf("startup errors %q, want one line naming %s unreachable", errs, srv.Domain)
	}
	addr := a.Addr().String()
	if st, body := get(t, addr, "/health"); st != 503 || !strings.Contains(body, `"status":"provider_unreachable"`) {
		t.Errorf("/health: %d %s, want 503 provider_unreachable", st, body)
	}
	r, err := send("POST", "http://"+addr+"/ng-rollout/r1/seed_session", "{}")
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 503 || !strings.Contains(r.body, `"provider_unavailable"`) || string(r.header.Peek("Retry-After")) == "" {
		t.Errorf("seed while unreachable: %d %s (Retry-After %q), want 503 provider_unavailable with Retry-After", r.status, r.body, r.header.Peek("Retry-After"))
	}
	srv.ClearFaults()
	if st, body, _ := post(t, addr, "/ng-rollout/r2/seed_session", "", "{}"); st != 200 {
		t.Fatalf("seed once the server answers: %d %s", st, body)
	}
	if st, body := get(t, addr, "/health"); st != 200 || !strings.Contains(body, `"status":"ok"`) {
		t.Errorf("/health once the server answers: %d %s", st, body)
	}
}

// TestOpenSandboxWithoutSnapshots: a lifecycle server whose runtime answers
// snapshots 501 is found out at startup; the server runs restart_only (a
// commit records nothing and succeeds, instead of every commit failing),
// and the probe leaves nothing on the lifecycle server. One that takes
// snapshots runs exported.
func TestOpenSandboxWithoutSnapshots(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noSnapshots bool
		want        owner.Mode
	}{
		{"501", true, owner.ModeRestartOnly},
		{"snapshots", false, owner.ModeExported},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "env-key", NoSnapshots: tc.noSnapshots})
			t.Cleanup(srv.Close)
			a, _ := startOpenSandboxIn(t, srv, app.LendServer, t.TempDir())
			if got := a.Owner().Mode(); got != tc.want {
				t.Fatalf("mode %s, want %s", got, tc.want)
			}
			if st := srv.Stats(); st.LiveSandboxes+st.LiveSnapshots != 0 || st.Created != 1 {
				t.Errorf("after the startup probe: %+v, want one sandbox made and nothing left", st)
			}
			if s, body, _ := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}"); s != 200 {
				t.Fatalf("seed: %d %s", s, body)
			}
			res, err := a.Owner().Commit(context.Background(), owner.CommitRequest{CheckpointID: "ck1"})
			if err != nil || res.Mode != tc.want {
				t.Errorf("commit: %+v, %v; want mode %s", res, err, tc.want)
			}
		})
	}
}
