package app_test

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/owner"
)

// startLocal starts a notes server on the local provider (the embedded
// default) with checkpointing on, in a state dir shared across restarts.
func startLocal(t *testing.T, stateDir string) *app.App {
	t.Helper()
	return startLocalWith(t, stateDir, app.Deps{})
}

// startLocalWith is startLocal with deps (a Listener on 127.0.0.1 unless
// they give one).
func startLocalWith(t *testing.T, stateDir string, deps app.Deps) *app.App {
	t.Helper()
	cfg := app.Defaults()
	cfg.Port = 0
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Local.Isolation = "none" // bwrap's own tests cover isolation
	cfg.Checkpoint.Enabled = true
	cfg.Checkpoint.StateDir = stateDir
	cfg.Checkpoint.ControlAuthToken = "tok"
	if deps.Listener == nil {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		deps.Listener = ln
	}
	a, err := app.Start(context.Background(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

type access struct {
	Connection struct {
		Descriptor struct {
			SandboxID string `json:"sandbox_id"`
			Endpoint  string `json:"endpoint"`
			Token     string `json:"token"`
		} `json:"descriptor"`
	} `json:"connection"`
}

func sandboxAccess(t *testing.T, a *app.App, cookie string) access {
	t.Helper()
	s, body, _ := post(t, a.Addr().String(), "/sandbox_access", cookie, "")
	if s != 200 {
		t.Fatalf("sandbox_access: %d %s", s, body)
	}
	var acc access
	if err := json.Unmarshal([]byte(body), &acc); err != nil {
		t.Fatal(err)
	}
	if acc.Connection.Descriptor.Endpoint == "" || acc.Connection.Descriptor.Token == "" {
		t.Fatalf("descriptor without endpoint and token: %s", body)
	}
	return acc
}

// execAs runs a command through the sandbox exec API with a token.
func execAs(t *testing.T, endpoint, token, command string) (int, string) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"command": command})
	r, err := send("POST", endpoint+"/exec", string(b), "Authorization", "Bearer "+token)
	if err != nil {
		t.Fatal(err)
	}
	return r.status, r.body
}

func TestAgentsWorkInTheirSandboxWithFencedTokens(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	a := startLocal(t, dir)
	s, body, cookie := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	acc := sandboxAccess(t, a, cookie)
	d := acc.Connection.Descriptor
	if !strings.HasSuffix(d.Endpoint, "/sandboxes/"+d.SandboxID) {
		t.Fatalf("endpoint %q does not name sandbox %s", d.Endpoint, d.SandboxID)
	}
	if s, body := execAs(t, d.Endpoint, d.Token, "cat .seed_token && echo hi > agent.txt"); s != 200 || !strings.Contains(body, `"exit_code":0`) {
		t.Fatalf("exec with a valid token: %d %s", s, body)
	}
	if s, _ := execAs(t, d.Endpoint, d.Token+"x", "true"); s != 401 {
		t.Fatalf("forged token: %d, want 401", s)
	}
	if s, _ := execAs(t, d.Endpoint, "", "true"); s != 401 {
		t.Fatalf("missing token: %d, want 401", s)
	}

	// Commit, then crash; a fresh server restores and supersedes the box.
	if _, err := a.Owner().Commit(context.Background(), owner.CommitRequest{CheckpointID: "ck1"}); err != nil {
		t.Fatal(err)
	}
	sessions, _ := a.Owner().Sessions()
	if err := a.Abandon(); err != nil {
		t.Fatal(err)
	}

	b := startLocal(t, dir)
	defer b.Stop(context.Background())
	if _, err := b.Owner().Restore(context.Background(), owner.RestoreRequest{CheckpointID: "ck1"}); err != nil {
		t.Fatal(err)
	}
	oldEndpoint := strings.Replace(d.Endpoint, a.Addr().String(), b.Addr().String(), 1)
	if s, body := execAs(t, oldEndpoint, d.Token, "true"); s != 410 || !strings.Contains(body, "superseded") {
		t.Fatalf("token of the superseded sandbox: %d %s, want 410 superseded", s, body)
	}
	// The fork holds the agent's work; its own token works, until the
	// session ends.
	if s, body, _ := post(t, b.Addr().String(), "/seed_session", cookie, "{}"); s != 200 {
		t.Fatalf("re-seed of the restored session: %d %s", s, body)
	}
	acc2 := sandboxAccess(t, b, cookie)
	fresh, tok := acc2.Connection.Descriptor.Endpoint, acc2.Connection.Descriptor.Token
	if acc2.Connection.Descriptor.SandboxID == d.SandboxID {
		t.Fatal("sandbox_access after the restore names the superseded sandbox")
	}
	if s, body := execAs(t, fresh, tok, "cat agent.txt"); s != 200 || !strings.Contains(body, "hi") {
		t.Fatalf("exec in the fork: %d %s", s, body)
	}
	if err := b.Owner().EndSessionSandbox(context.Background(), sessions[0]); err != nil {
		t.Fatal(err)
	}
	if s, body := execAs(t, fresh, tok, "true"); s != 410 || !strings.Contains(body, "ended") {
		t.Fatalf("token after the session ended: %d %s, want 410 ended", s, body)
	}
}

// TestStopRightAfterStartReturns: a stop that comes before the server's
// Serve goroutine has begun still ends it. Serve is held back until the
// listener closes, which only the stop does.
func TestStopRightAfterStartReturns(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &closeSignal{Listener: ln, closed: make(chan struct{})}
	gaveUp := make(chan struct{})
	defer close(gaveUp)
	a := startLocalWith(t, t.TempDir(), app.WithBeforeServe(app.Deps{Listener: cl}, func() {
		select {
		case <-cl.closed:
		case <-gaveUp:
		}
	}))
	stopped := make(chan error, 1)
	go func() { stopped <- a.Stop(context.Background()) }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("stop: %v", err)
		}
	case <-time.After(time.Minute): // a guard against the hang, not a wait
		t.Fatal("the stop did not return: a Serve that began after it accepts forever")
	}
}

// closeSignal is a listener that says when it is closed.
type closeSignal struct {
	net.Listener
	once   sync.Once
	closed chan struct{}
}

func (l *closeSignal) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}
