package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/clock"
	ctl "github.com/sandboxowner/owner/control"
	httpapi "github.com/sandboxowner/owner/http"
)

// seededSandbox seeds a session of a and returns its sandbox's access,
// the admission gate, and the sandbox's name among a prepare's blockers:
// its episode's capture key.
func seededSandbox(t *testing.T, a *app.App) (descriptorOf, *ctl.Gate, string) {
	t.Helper()
	s, body, cookie := post(t, a.Addr().String(), "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	d := sandboxAccess(t, a, cookie).Connection.Descriptor
	return d, a.Server().Gate(), "r1"
}

// descriptorOf is what /sandbox_access hands an agent.
type descriptorOf = struct {
	SandboxID string `json:"sandbox_id"`
	Endpoint  string `json:"endpoint"`
	Token     string `json:"token"`
}

// sandboxCall sends one call to the sandbox API and returns its status and
// body.
func sandboxCall(t *testing.T, method, url, token, body string) (int, string) {
	t.Helper()
	r, err := send(method, url, body, "Authorization", "Bearer "+token)
	if err != nil {
		return 0, err.Error()
	}
	return r.status, r.body
}

// checkpointOp calls the checkpoint control plane.
func checkpointOp(t *testing.T, a *app.App, op string, body map[string]any) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(body)
	r, err := send("POST", "http://"+a.Addr().String()+httpapi.ControlPrefix+op, string(b), "Authorization", "Bearer tok")
	if err != nil {
		t.Fatalf("%s: %v", op, err)
	}
	var out map[string]any
	_ = json.Unmarshal([]byte(r.body), &out)
	return r.status, out
}

// waitGate waits until cond holds of the admission gate.
func waitGate(t *testing.T, g *ctl.Gate, cond func() bool) {
	t.Helper()
	bound := time.After(brokenTestBound)
	for ch := g.Changed(); !cond(); ch = g.Changed() {
		select {
		case <-ch:
		case <-bound:
			t.Fatal("the admission gate never got there")
		}
	}
}

// brokenTestBound bounds a wait that only a broken test (or server) makes
// long: it is not a synchronisation, and no outcome depends on it.
const brokenTestBound = 30 * time.Second

// receive is the next value of ch, failing the test if none comes within
// brokenTestBound.
func receive[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(brokenTestBound):
		t.Fatalf("%s never came", what)
		panic("unreachable")
	}
}

// An exec in flight used to be invisible to a checkpoint: prepare said
// ready and the snapshot caught the command half done; file writes went
// through a prepared checkpoint. Now both pass the admission gate.
//
// The server runs on a clock that stands still, so a prepare whose deadline
// is that instant answers at once, however slow the machine, with the
// readiness it found.
func TestSandboxCallsPassTheAdmissionGate(t *testing.T) {
	t.Parallel()
	clk := clock.NewManual(time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC))
	a := startLocalWith(t, t.TempDir(), app.Deps{Clock: clk, LeaseTick: -1})
	defer a.Stop(context.Background())
	d, gate, label := seededSandbox(t, a)

	// A command that runs until the test writes the file "go". Its
	// timeout bounds a broken test: the server's stop waits for it.
	execDone := make(chan string, 1)
	go func() {
		s, body := sandboxCall(t, "POST", d.Endpoint+"/exec", d.Token, `{"command":"while [ ! -e go ]; do sleep 0.01; done; echo finished","timeout_ms":60000}`)
		execDone <- fmt.Sprint(s, " ", body)
	}()
	waitGate(t, gate, func() bool { return slices.Contains(gate.Busy(), label) })

	// Prepare is not ready while it runs, and names the sandbox.
	now := ctl.UnixSeconds(clk.Now())
	s2, prep := checkpointOp(t, a, "prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": now})
	if s2 != 200 || prep["phase"] != "preparing" {
		t.Fatalf("prepare with an exec in flight: %d %v", s2, prep)
	}
	report, _ := prep["report"].(map[string]any)
	if blockers, _ := report["blockers"].([]any); !slices.Contains(blockers, any(label)) {
		t.Errorf("prepare's blockers %v do not name %s", report["blockers"], label)
	}

	// A write waits while the checkpoint is open; a read does not.
	wrote := make(chan string, 1)
	go func() {
		s, body := sandboxCall(t, "PUT", d.Endpoint+"/files?path=go", d.Token, "x")
		wrote <- fmt.Sprint(s, " ", body)
	}()
	waitGate(t, gate, func() bool { return gate.Waiting() == 1 })
	if s, body := sandboxCall(t, "GET", d.Endpoint+"/files?path=.seed_token", d.Token, ""); s != 200 {
		t.Errorf("a read while the checkpoint is open: %d %s", s, body)
	}
	select {
	case got := <-wrote:
		t.Fatalf("a write went through an open checkpoint: %s", got)
	case got := <-execDone:
		t.Fatalf("the exec ended before the write: %s", got)
	default:
	}
	if s, r := checkpointOp(t, a, "resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": now}); s != 200 {
		t.Fatalf("resume: %d %v", s, r)
	}
	if got := receive(t, wrote, "the held write's reply"); !strings.HasPrefix(got, "200 ") {
		t.Errorf("the held write: %s", got)
	}
	if got := receive(t, execDone, "the exec's reply"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "finished") {
		t.Errorf("the exec: %s", got)
	}

	// With nothing in flight, prepare is ready; an exec then waits for the
	// resume.
	if s, r := checkpointOp(t, a, "prepare", map[string]any{"checkpoint_id": "ck2", "deadline_ts": now}); s != 200 || r["phase"] != "prepared" {
		t.Fatalf("prepare with nothing in flight: %d %v", s, r)
	}
	go func() {
		s, body := sandboxCall(t, "POST", d.Endpoint+"/exec", d.Token, `{"command":"echo later"}`)
		execDone <- fmt.Sprint(s, " ", body)
	}()
	waitGate(t, gate, func() bool { return gate.Waiting() == 1 })
	if s, r := checkpointOp(t, a, "resume", map[string]any{"checkpoint_id": "ck2", "deadline_ts": now}); s != 200 {
		t.Fatalf("resume: %d %v", s, r)
	}
	if got := receive(t, execDone, "the held exec's reply"); !strings.HasPrefix(got, "200 ") || !strings.Contains(got, "later") {
		t.Errorf("the held exec: %s", got)
	}
}

// An exec whose client went away used to run on to its timeout; one that
// gave no timeout_ms (the provider's default applies) still did.
func TestAnExecWhoseClientGoesAwayIsKilled(t *testing.T) {
	t.Parallel()
	for name, cmd := range map[string]string{
		"its own timeout":     `{"command":"exec sleep 300","timeout_ms":600000}`,
		"the default timeout": `{"command":"exec sleep 300"}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			a := startLocal(t, t.TempDir())
			defer a.Stop(context.Background())
			d, gate, label := seededSandbox(t, a)
			conn, err := net.Dial("tcp", a.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(conn, "POST /sandboxes/%s/exec HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", d.SandboxID, d.Token, len(cmd), cmd)
			waitGate(t, gate, func() bool { return slices.Contains(gate.Busy(), label) })
			conn.Close()
			waitGate(t, gate, func() bool { return !slices.Contains(gate.Busy(), label) })
		})
	}
}
