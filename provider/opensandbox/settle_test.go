package opensandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/hangguard"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// cutExecd is an execd whose command streams end after the init event,
// cleanly, while the command still runs for its first statuses: what a
// proxy between the provider and execd may do (execd itself ends a stream
// only once the command has ended). statuses are its answers to GET
// /command/status/{id} in turn (the last one repeats).
type cutExecd struct {
	mu       sync.Mutex
	noInit   bool
	statuses []string
	calls    []string
}

func (x *cutExecd) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	x.mu.Lock()
	x.calls = append(x.calls, r.Method+" "+r.URL.Path)
	x.mu.Unlock()
	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/command":
		if !x.noInit {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprint(w, `{"type":"init","text":"cmd-1","timestamp":1}`+"\n\n")
		}
	case r.Method == http.MethodGet && r.URL.Path == "/command/status/cmd-1":
		x.mu.Lock()
		st := x.statuses[0]
		if len(x.statuses) > 1 {
			x.statuses = x.statuses[1:]
		}
		x.mu.Unlock()
		if st == "" {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":"INVALID_REQUEST_BODY","message":"command not found: cmd-1"}`)
			return
		}
		fmt.Fprint(w, st)
	case r.Method == http.MethodDelete && r.URL.Path == "/command":
	default:
		http.NotFound(w, r)
	}
}

// commandCalls are the execd calls about commands so far.
func (x *cutExecd) commandCalls() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return append([]string(nil), x.calls...)
}

// onCutExecd is a provider, on a manual clock, of one sandbox served by x.
func onCutExecd(t *testing.T, x *cutExecd) (*opensandbox.Provider, provider.Handle) {
	t.Helper()
	return onCutExecdSleeping(t, x, func() {})
}

// onCutExecdSleeping is onCutExecd whose provider calls slept each time it
// waits.
func onCutExecdSleeping(t *testing.T, x *cutExecd, slept func()) (*opensandbox.Provider, provider.Handle) {
	t.Helper()
	hangguard.Arm(t)
	execd := httptest.NewServer(x)
	t.Cleanup(execd.Close)
	const id = "cut"
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", id, opensandbox.ExecdPort):
			_ = json.NewEncoder(w).Encode(map[string]any{"endpoint": strings.TrimPrefix(execd.URL, "http://")})
		case "/v1/sandboxes/" + id:
			_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "status": map[string]any{"state": "Running"}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(stub.Close)
	clk := clock.NewManual(t0)
	p, err := opensandbox.New(opensandbox.Options{Domain: strings.TrimPrefix(stub.URL, "http://"), Clock: clk, PollInterval: time.Second,
		Sleep: func(ctx context.Context, d time.Duration) error { clk.Advance(d); slept(); return ctx.Err() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Wait)
	desc, _ := json.Marshal(map[string]string{"sandbox_id": id, "workdir": "/w"})
	return p, provider.Handle{SandboxID: id, Provider: opensandbox.Name, Descriptor: desc}
}

const (
	running = `{"id":"cmd-1","running":true,"started_at":"2026-06-01T12:00:00Z"}`
	exited3 = `{"id":"cmd-1","running":false,"exit_code":3,"error":"exit status 3","started_at":"2026-06-01T12:00:00Z","finished_at":"2026-06-01T12:00:01Z"}`
)

// A stream cut after its init: Exec asks execd's status of the command until
// it has ended, never sends it again, and answers ErrUnavailable naming how
// it ended.
func TestExecStreamCutWaitsForTheCommand(t *testing.T) {
	x := &cutExecd{statuses: []string{running, running, exited3}}
	p, h := onCutExecd(t, x)
	_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "make test", Timeout: time.Minute})
	if !errors.Is(err, provider.ErrUnavailable) || !errors.Is(err, provider.ErrOutcomeLost) || !strings.Contains(err.Error(), "exit code 3 (exit status 3)") {
		t.Fatalf("Exec = %v, want ErrUnavailable naming exit code 3", err)
	}
	p.Wait()
	// Ended, it is not interrupted.
	want := []string{"POST /command", "GET /command/status/cmd-1", "GET /command/status/cmd-1", "GET /command/status/cmd-1"}
	if diff := cmp.Diff(want, x.commandCalls()); diff != "" {
		t.Errorf("execd calls (-want +got):\n%s", diff)
	}
}

// A stream cut before its init: nothing can be asked about the command, and
// it is not sent again.
func TestExecStreamCutBeforeInit(t *testing.T) {
	x := &cutExecd{noInit: true, statuses: []string{exited3}}
	p, h := onCutExecd(t, x)
	_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "make test"})
	if !errors.Is(err, provider.ErrUnavailable) || !errors.Is(err, provider.ErrOutcomeLost) {
		t.Fatalf("Exec = %v, want ErrUnavailable and ErrOutcomeLost", err)
	}
	if diff := cmp.Diff([]string{"POST /command"}, x.commandCalls()); diff != "" {
		t.Errorf("execd calls (-want +got):\n%s", diff)
	}
}

// execd that does not know the command (it restarted): ErrUnavailable.
func TestExecStreamCutStatusUnknown(t *testing.T) {
	x := &cutExecd{statuses: []string{""}}
	p, h := onCutExecd(t, x)
	_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "make test"})
	if !errors.Is(err, provider.ErrUnavailable) || !errors.Is(err, provider.ErrOutcomeLost) || !strings.Contains(err.Error(), "status of command cmd-1 is unknown") {
		t.Fatalf("Exec = %v, want ErrUnavailable saying the status is unknown", err)
	}
}

// A command still running at the call's bound (its timeout and a minute)
// is interrupted, and the answer is ErrUnavailable.
func TestExecStreamCutPastTheBound(t *testing.T) {
	x := &cutExecd{statuses: []string{running}}
	p, h := onCutExecd(t, x)
	_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "sleep 1000", Timeout: time.Second})
	if !errors.Is(err, provider.ErrUnavailable) || !errors.Is(err, provider.ErrOutcomeLost) || !strings.Contains(err.Error(), "still ran at the call's bound") {
		t.Fatalf("Exec = %v, want ErrUnavailable saying it still ran", err)
	}
	p.Wait()
	calls := x.commandCalls()
	if calls[0] != "POST /command" || calls[len(calls)-1] != "DELETE /command" || strings.Count(strings.Join(calls, ","), "POST") != 1 {
		t.Errorf("execd calls %v, want one POST, status polls, then the interrupt", calls)
	}
}

// The provider's own mkdir of the workdir, idempotent, is run once more
// after a cut stream; Start succeeds.
func TestStartProbeRunsAgainAfterACutStream(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	e.srv.CutNextCommandStreams(1, 1)
	e.start(t, provider.Spec{Image: "img", TTLSeconds: 600})
	if n := commandsSent(e.srv); n != 2 {
		t.Errorf("%d commands sent, want the mkdir twice", n)
	}
}

// A caller that goes away while Exec waits for a cut stream's command has
// the command interrupted, as one that goes away mid-stream.
func TestExecStreamCutCallerGone(t *testing.T) {
	x := &cutExecd{statuses: []string{running}}
	ctx, cancel := context.WithCancel(context.Background())
	sleeps := 0
	p, h := onCutExecdSleeping(t, x, func() {
		if sleeps++; sleeps == 2 {
			cancel()
		}
	})
	_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "make test", Timeout: time.Minute})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Exec = %v, want context.Canceled", err)
	}
	p.Wait()
	want := []string{"POST /command", "GET /command/status/cmd-1", "GET /command/status/cmd-1", "DELETE /command"}
	if diff := cmp.Diff(want, x.commandCalls()); diff != "" {
		t.Errorf("execd calls (-want +got):\n%s", diff)
	}
}
