package opensandbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"maps"
	"net/http"
	"runtime"
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

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const key = "test-key"

// env is a fake server and a client on one manual clock: every wait of the
// client advances the clock instead of sleeping.
type env struct {
	clk    *clock.Manual
	srv    *opensandboxtest.Server
	p      *opensandbox.Provider
	popts  opensandbox.Options // p's, for another process's provider
	mu     sync.Mutex
	sleeps []time.Duration
}

func newEnv(t *testing.T, sopts opensandboxtest.Options, popts opensandbox.Options) *env {
	t.Helper()
	hangguard.Arm(t) // a poll loop that never sleeps would hang on the manual clock
	e := &env{clk: clock.NewManual(t0)}
	sopts.Clock, sopts.APIKey = e.clk, key
	if sopts.CreateLatency == 0 {
		sopts.CreateLatency = 3 * time.Second
	}
	if sopts.SnapshotLatency == 0 {
		sopts.SnapshotLatency = 5 * time.Second
	}
	e.srv = opensandboxtest.NewServer(sopts)
	t.Cleanup(e.srv.Close)
	popts.Domain, popts.APIKey, popts.Clock, popts.Seed = e.srv.Domain, key, e.clk, 1
	if popts.PollInterval == 0 {
		popts.PollInterval = time.Second
	}
	popts.Sleep = func(ctx context.Context, d time.Duration) error {
		e.mu.Lock()
		e.sleeps = append(e.sleeps, d)
		e.mu.Unlock()
		e.clk.Advance(d)
		runtime.Gosched()
		return ctx.Err()
	}
	p, err := opensandbox.New(popts)
	if err != nil {
		t.Fatal(err)
	}
	e.p, e.popts = p, popts
	t.Cleanup(func() {
		if v := e.srv.Violations(); len(v) > 0 {
			t.Errorf("requests that break the spec:\n%v", v)
		}
	})
	return e
}

func (e *env) start(t *testing.T, spec provider.Spec) provider.Handle {
	t.Helper()
	if spec.Image == "" {
		spec.Image = "python:3.11"
	}
	h, err := e.p.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	return h
}

func (e *env) exec(t *testing.T, h provider.Handle, cmd string) provider.ExecResult {
	t.Helper()
	res, err := e.p.Exec(context.Background(), h, provider.ExecRequest{Command: cmd})
	if err != nil {
		t.Fatalf("Exec(%q): %v", cmd, err)
	}
	return res
}

func TestStartExecFilesStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		lower bool
		proxy bool
	}{{"spec casing, direct", false, false}, {"lower-case states, server proxy", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, opensandboxtest.Options{LowerCaseStates: tc.lower}, opensandbox.Options{UseServerProxy: tc.proxy})
			md := map[string]string{"ng.owner": "notes", "ng.restore": "ckpt:1/with spaces"}
			h := e.start(t, provider.Spec{Files: map[string]string{"notes.txt": "hello\n"}, Metadata: md, TTLSeconds: 600})
			if h.Provider != opensandbox.Name || h.SandboxID == "" {
				t.Fatalf("handle %+v", h)
			}
			// Start waited through Pending: the sandbox was polled
			// more than once.
			if n := e.srv.Stats().Requests["GET /sandboxes/{id}"]; n < 2 {
				t.Errorf("polled %d times, want at least 2 (Pending, then Running)", n)
			}
			if got := e.exec(t, h, "cat notes.txt"); got.Stdout != "hello\n" || got.ExitCode != 0 {
				t.Errorf("cat = %+v", got)
			}
			if got := e.exec(t, h, "cat /workspace/missing"); got.ExitCode == 0 || got.Stderr == "" {
				t.Errorf("cat missing = %+v, want a failure with stderr", got)
			}
			if got := e.exec(t, h, "exit 3"); got.ExitCode != 3 {
				t.Errorf("exit 3 = %+v", got)
			}
			ctx := context.Background()
			if err := e.p.WriteFile(ctx, h, "sub/a.txt", []byte("A")); err != nil {
				t.Fatal(err)
			}
			if b, err := e.p.ReadFile(ctx, h, "/workspace/sub/a.txt"); err != nil || string(b) != "A" {
				t.Errorf("ReadFile = %q, %v", b, err)
			}
			if _, err := e.p.ReadFile(ctx, h, "nope"); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("ReadFile(missing) = %v, want fs.ErrNotExist", err)
			}
			if st, err := e.p.Status(ctx, h); err != nil || st != provider.StatusRunning {
				t.Errorf("Status = %v, %v", st, err)
			}
			// The labels come back as they were set, though one value
			// had to travel encoded.
			sbs, err := e.p.ListSandboxes(ctx)
			if err != nil || len(sbs) != 1 {
				t.Fatalf("ListSandboxes = %v, %v", sbs, err)
			}
			if diff := cmp.Diff(md, sbs[0].Metadata); diff != "" {
				t.Errorf("listed metadata (-want +got):\n%s", diff)
			}
			if want := t0.Add(600 * time.Second); !sbs[0].ExpiresAt.Equal(want) {
				t.Errorf("expiresAt %v, want %v (the spec's ttl)", sbs[0].ExpiresAt, want)
			}
			if err := e.p.Stop(ctx, h); err != nil {
				t.Fatal(err)
			}
			if err := e.p.Stop(ctx, h); err != nil {
				t.Errorf("second Stop = %v, want success (404 is gone)", err)
			}
			if _, err := e.p.Status(ctx, h); !errors.Is(err, provider.ErrSandboxNotFound) {
				t.Errorf("Status after Stop = %v", err)
			}
			if _, err := e.p.Exec(ctx, h, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrSandboxNotFound) {
				t.Errorf("Exec after Stop = %v, want ErrSandboxNotFound", err)
			}
			if _, err := e.p.ReadFile(ctx, h, "notes.txt"); !errors.Is(err, provider.ErrSandboxNotFound) {
				t.Errorf("ReadFile after Stop = %v, want ErrSandboxNotFound", err)
			}
			if n := e.srv.Stats().LiveSandboxes; n != 0 {
				t.Errorf("%d sandboxes left", n)
			}
		})
	}
}

// Every execd call carries the headers the endpoint answer names (a runtime
// whose execd has an access token) and, through the server proxy, the API
// key (for a gateway in front of the server that wants it): the fake refuses
// execd calls without them, the start's ping included.
func TestExecdCallsCarryTheEndpointsHeadersAndThroughTheProxyTheKey(t *testing.T) {
	token := map[string]string{"X-Execd-Access-Token": "tok"}
	// A header of a gateway: execd still wants the token the provider
	// gave it, besides.
	gateway := map[string]string{"X-Gateway": "g"}
	for _, tc := range []struct {
		name  string
		sopts opensandboxtest.Options
		proxy bool
	}{
		{"direct", opensandboxtest.Options{ExecdHeaders: token}, false},
		{"server proxy", opensandboxtest.Options{ExecdHeaders: token, ProxyNeedsAPIKey: true}, true},
		{"a gateway's header", opensandboxtest.Options{ExecdHeaders: gateway}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, tc.sopts, opensandbox.Options{UseServerProxy: tc.proxy})
			h := e.start(t, provider.Spec{})
			if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" || got.ExitCode != 0 {
				t.Errorf("echo = %+v", got)
			}
			ctx := context.Background()
			// What lend: direct hands out: the named headers, and the
			// sandbox's own token unless they name execd's.
			want := maps.Clone(tc.sopts.ExecdHeaders)
			if want["X-Execd-Access-Token"] == "" {
				want[opensandbox.ExecdTokenHeader] = e.srv.ExecdToken(h.SandboxID)
			}
			if _, hdr, err := e.p.Endpoint(ctx, h); err != nil || !cmp.Equal(want, hdr) {
				t.Errorf("Endpoint's headers = %v, %v; want %v", hdr, err, want)
			}
			if err := e.p.WriteFile(ctx, h, "a.txt", []byte("A")); err != nil {
				t.Fatal(err)
			}
			if b, err := e.p.ReadFile(ctx, h, "a.txt"); err != nil || string(b) != "A" {
				t.Errorf("ReadFile = %q, %v", b, err)
			}
		})
	}
}

// An exec sends execd its timeout in milliseconds, and no timeout without
// one.
func TestExecSendsItsTimeout(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	for _, tc := range []struct {
		timeout time.Duration
		want    any
	}{{0, nil}, {1500 * time.Millisecond, float64(1500)}} {
		if _, err := e.p.Exec(context.Background(), h, provider.ExecRequest{Command: "true", Timeout: tc.timeout}); err != nil {
			t.Fatal(err)
		}
		cmds := e.srv.Requests("execd (direct)")
		var body map[string]any
		if err := json.Unmarshal(cmds[len(cmds)-1], &body); err != nil {
			t.Fatal(err)
		}
		if got := body["timeout"]; got != tc.want {
			t.Errorf("an exec with a timeout of %v sent timeout %v, want %v", tc.timeout, got, tc.want)
		}
	}
}

// A file call answered by a proxy's 502 (execd never saw it) is tried
// again; execd's own answers are taken as they are.
func TestAFileCallAProxyFailedIsTriedAgain(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{Files: map[string]string{"a.txt": "A"}})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/direct/" + h.SandboxID + "/proxy/", Status: http.StatusBadGateway})
	if b, err := e.p.ReadFile(context.Background(), h, "a.txt"); err != nil || string(b) != "A" {
		t.Errorf("ReadFile after a 502 = %q, %v, want the file", b, err)
	}
}

// TestCreateRequest checks what a create sends: the image through the
// images map, our entrypoint, the timeout and resources.
func TestCreateRequest(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{
		Images: map[string]string{"notes": "registry.example/notes:1"}, CPU: "500m", Memory: "512Mi", TTL: 90 * time.Second,
	})
	h := e.start(t, provider.Spec{Image: "notes"})
	var seen map[string]any
	for _, r := range e.srv.Requests("POST /sandboxes") {
		if err := json.Unmarshal(r, &seen); err != nil {
			t.Fatal(err)
		}
	}
	if seen == nil {
		t.Fatal("no create request recorded")
	}
	delete(seen["metadata"].(map[string]any), "sandboxowner.io/create")
	// The execd token, in its env and its label (token_test.go).
	tok := seen["metadata"].(map[string]any)["sandboxowner.io/execd-token"]
	delete(seen["metadata"].(map[string]any), "sandboxowner.io/execd-token")
	want := map[string]any{
		"image":          map[string]any{"uri": "registry.example/notes:1"},
		"entrypoint":     []any{"tail", "-f", "/dev/null"},
		"timeout":        float64(90),
		"resourceLimits": map[string]any{"cpu": "500m", "memory": "512Mi"},
		"metadata":       map[string]any{},
		"env":            map[string]any{"EXECD_ACCESS_TOKEN": tok},
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("create body (-want +got):\n%s", diff)
	}
	// The workdir is made before anything runs in it.
	cmds := e.srv.Requests("execd (direct)")
	if len(cmds) == 0 || !strings.Contains(string(cmds[0]), `"command":"mkdir -p '/workspace'"`) || !strings.Contains(string(cmds[0]), `"cwd":"/"`) {
		t.Errorf("first execd command %q, want mkdir -p of the workdir from /", cmds)
	}
	// A spec's own resources win.
	e.start(t, provider.Spec{Image: "x", Resources: &provider.Resources{CPU: 1.5, MemoryMiB: 1024}})
	reqs := e.srv.Requests("POST /sandboxes")
	_ = json.Unmarshal(reqs[len(reqs)-1], &seen)
	if diff := cmp.Diff(map[string]any{"cpu": "1500m", "memory": "1024Mi"}, seen["resourceLimits"]); diff != "" {
		t.Errorf("resourceLimits (-want +got):\n%s", diff)
	}
	// A resource the spec leaves at 0 keeps the configured default.
	for _, tc := range []struct {
		res  provider.Resources
		want map[string]any
	}{
		{provider.Resources{MemoryMiB: 256}, map[string]any{"cpu": "500m", "memory": "256Mi"}},
		{provider.Resources{CPU: 2}, map[string]any{"cpu": "2000m", "memory": "512Mi"}},
	} {
		e.start(t, provider.Spec{Image: "x", Resources: &tc.res})
		reqs := e.srv.Requests("POST /sandboxes")
		seen = nil
		_ = json.Unmarshal(reqs[len(reqs)-1], &seen)
		if diff := cmp.Diff(tc.want, seen["resourceLimits"]); diff != "" {
			t.Errorf("resourceLimits of %+v (-want +got):\n%s", tc.res, diff)
		}
	}
	_ = h
}

func TestStartThatFailsIsDeleted(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	e.srv.FailNextCreates(1)
	if _, err := e.p.Start(context.Background(), provider.Spec{Image: "x"}); err == nil {
		t.Fatal("Start of a sandbox that fails succeeded")
	}
	st := e.srv.Stats()
	if st.Created != 1 || st.Deleted != 1 || st.LiveSandboxes != 0 {
		t.Errorf("created %d, deleted %d, live %d: want the failed sandbox deleted", st.Created, st.Deleted, st.LiveSandboxes)
	}
}

func TestStartPastReadyDeadlineIsDeleted(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{CreateLatency: time.Hour}, opensandbox.Options{ReadyTimeout: 30 * time.Second})
	_, err := e.p.Start(context.Background(), provider.Spec{Image: "x"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want a deadline error", err)
	}
	if st := e.srv.Stats(); st.LiveSandboxes != 0 || st.Deleted != 1 {
		t.Errorf("live %d, deleted %d: want the late sandbox deleted", st.LiveSandboxes, st.Deleted)
	}
	if now := e.clk.Now(); now.Sub(t0) > 32*time.Second {
		t.Errorf("gave up after %v, want about the 30s ready timeout", now.Sub(t0))
	}
}

func TestSnapshotForkDelete(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{ListLabels: map[string]string{"ng.owner": "me"}})
	ctx := context.Background()
	h := e.start(t, provider.Spec{Metadata: map[string]string{"ng.owner": "me", "ng.session": "s1"}})
	if err := e.p.WriteFile(ctx, h, "state.txt", []byte("before")); err != nil {
		t.Fatal(err)
	}
	sid, err := e.p.Snapshot(ctx, h, "ck-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := e.p.WriteFile(ctx, h, "state.txt", []byte("after")); err != nil {
		t.Fatal(err)
	}
	snaps, err := e.p.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := []provider.SnapshotInfo{{ID: sid, Name: "ck-1", SandboxID: h.SandboxID, Metadata: map[string]string{"ng.owner": "me", "ng.session": "s1"}, CreatedAt: snaps[0].CreatedAt}}
	if diff := cmp.Diff(want, snaps); diff != "" {
		t.Errorf("ListSnapshots (-want +got):\n%s", diff)
	}
	var forks []provider.Handle
	for i := 0; i < 2; i++ {
		f, err := e.p.Fork(ctx, provider.Spec{Metadata: map[string]string{"ng.owner": "me"}}, sid)
		if err != nil {
			t.Fatal(err)
		}
		forks = append(forks, f)
		if b, err := e.p.ReadFile(ctx, f, "state.txt"); err != nil || string(b) != "before" {
			t.Errorf("fork %d reads %q, %v; want the snapshot's contents", i, b, err)
		}
	}
	// While a fork lives, the server refuses the delete: the provider says
	// so at once instead of waiting for a fork it does not know to end.
	before := e.clk.Now()
	if err := e.p.DeleteSnapshot(ctx, sid); !errors.Is(err, provider.ErrSnapshotInUse) {
		t.Fatalf("DeleteSnapshot with live forks = %v, want ErrSnapshotInUse", err)
	}
	if waited := e.clk.Now().Sub(before); waited != 0 {
		t.Errorf("DeleteSnapshot of a snapshot in use waited %v", waited)
	}
	for _, f := range forks {
		if err := e.p.Stop(ctx, f); err != nil {
			t.Fatal(err)
		}
	}
	if err := e.p.DeleteSnapshot(ctx, sid); err != nil {
		t.Fatal(err)
	}
	if err := e.p.DeleteSnapshot(ctx, sid); err != nil {
		t.Errorf("second DeleteSnapshot = %v, want success", err)
	}
	if _, err := e.p.Fork(ctx, provider.Spec{}, sid); !errors.Is(err, provider.ErrSnapshotNotFound) {
		t.Errorf("Fork from a deleted snapshot = %v, want ErrSnapshotNotFound", err)
	}
	if n := e.srv.Stats().LiveSnapshots; n != 0 {
		t.Errorf("%d snapshots left", n)
	}
}

func TestFailedSnapshotIsAnErrorAndDeleted(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	e.srv.FailNextSnapshots(1)
	if _, err := e.p.Snapshot(context.Background(), h, "x"); err == nil {
		t.Fatal("a snapshot that failed was reported ready")
	}
	if n := e.srv.Stats().LiveSnapshots; n != 0 {
		t.Errorf("%d snapshots left, want the failed one deleted", n)
	}
	// Deleted at once, by one request: nothing was left to the
	// background.
	e.p.Wait()
	if n := e.srv.Stats().Requests["DELETE /snapshots/{id}"]; n != 1 {
		t.Errorf("%d deletes of the failed snapshot, want 1", n)
	}
}

func TestDeleteSnapshotWhileCreatingIsRetried(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{SnapshotLatency: time.Minute}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	sid := rawSnapshot(t, e.srv, h.SandboxID)
	if err := e.p.DeleteSnapshot(context.Background(), sid); err != nil {
		t.Fatal(err)
	}
	if n := e.srv.Stats().Requests["DELETE /snapshots/{id}"]; n < 2 {
		t.Errorf("%d deletes, want a refused one and a later one", n)
	}
	if ids := e.srv.SnapshotIDs(); len(ids) != 0 {
		t.Errorf("snapshots left: %v", ids)
	}
	if e.clk.Now().Sub(t0) < time.Minute {
		t.Error("deleted before the capture ended")
	}
}

// rawSnapshot asks for a snapshot directly, returning its id while it is
// still Creating.
func rawSnapshot(t *testing.T, srv *opensandboxtest.Server, sandboxID string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/sandboxes/"+sandboxID+"/snapshots", bytes.NewReader([]byte(`{}`)))
	req.Header.Set(opensandbox.APIKeyHeader, key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var doc struct {
		ID string `json:"id"`
	}
	if res.StatusCode != http.StatusAccepted || json.NewDecoder(res.Body).Decode(&doc) != nil {
		t.Fatalf("snapshot: %d", res.StatusCode)
	}
	return doc.ID
}

func TestRetriesHonourRetryAfter(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + h.SandboxID, Status: 503, RetryAfter: 7, Times: 2})
	e.mu.Lock()
	e.sleeps = nil
	e.mu.Unlock()
	if st, err := e.p.Status(context.Background(), h); err != nil || st != provider.StatusRunning {
		t.Fatalf("Status through two 503s = %v, %v", st, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.sleeps) != 2 || e.sleeps[0] < 7*time.Second || e.sleeps[1] < 7*time.Second {
		t.Errorf("waits %v, want two of at least Retry-After 7s", e.sleeps)
	}
}

func TestRetriesGiveUp(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxRetries: 2})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + h.SandboxID, Status: 500, Times: 5})
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	_, err := e.p.Status(context.Background(), h)
	var aerr *opensandbox.APIError
	if !errors.As(err, &aerr) || aerr.Status != 500 {
		t.Fatalf("Status = %v, want the last 500", err)
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n != 3 {
		t.Errorf("%d GETs, want 3 (1 + 2 retries)", n)
	}
}

// Only a 2xx answer is a success: a 300 (which Go's client does not follow)
// is the server's refusal, told with its status.
func TestA300AnswerIsAnAPIError(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + h.SandboxID, Status: http.StatusMultipleChoices})
	_, err := e.p.Status(context.Background(), h)
	var aerr *opensandbox.APIError
	if !errors.As(err, &aerr) || aerr.Status != http.StatusMultipleChoices {
		t.Fatalf("Status = %v, want the server's 300", err)
	}
}

// A create whose answer is lost after it took effect is not made twice.
func TestCreateRetryAdoptsTheFirstAttempt(t *testing.T) {
	for _, f := range []opensandboxtest.Fault{
		{Method: http.MethodPost, Path: "/v1/sandboxes", Status: 502, AfterEffect: true},
		{Method: http.MethodPost, Path: "/v1/sandboxes", Status: 503},
		{Method: http.MethodPost, Path: "/v1/sandboxes", Drop: true},
	} {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		e.srv.Inject(f)
		h := e.start(t, provider.Spec{})
		if ids := e.srv.SandboxIDs(); len(ids) != 1 || ids[0] != h.SandboxID {
			t.Errorf("fault %+v: sandboxes %v, want exactly the one returned (%s)", f, ids, h.SandboxID)
		}
	}
}

func TestSnapshotRetryAdoptsTheFirstAttempt(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/v1/sandboxes/" + h.SandboxID + "/snapshots", Status: 504, AfterEffect: true})
	sid, err := e.p.Snapshot(context.Background(), h, "n")
	if err != nil {
		t.Fatal(err)
	}
	if ids := e.srv.SnapshotIDs(); len(ids) != 1 || ids[0] != sid {
		t.Errorf("snapshots %v, want exactly %s", ids, sid)
	}
}

func TestCommandIsNeverResubmitted(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/direct/" + h.SandboxID + "/proxy/44772/command", Status: 503, AfterEffect: true})
	if _, err := e.p.Exec(context.Background(), h, provider.ExecRequest{Command: "echo hi > f"}); err == nil {
		t.Fatal("Exec through a 503 succeeded")
	}
	if n := e.srv.Stats().Requests["execd (direct)"]; n != 3 {
		// At start a ping and the workdir's mkdir, then the one command.
		t.Errorf("%d execd requests, want 3 (ping, mkdir, the one command)", n)
	}
}

func TestLeaseRenewAndExpiry(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{TTLSeconds: 60})
	if err := e.p.Renew(ctx, h, e.clk.Now().Add(120*time.Second)); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(100 * time.Second) // past the first lease, inside the renewed one
	if got := e.exec(t, h, "echo ok"); got.Stdout != "ok\n" {
		t.Errorf("after renewal: %+v", got)
	}
	e.clk.Advance(30 * time.Second)
	if err := e.p.Renew(ctx, h, e.clk.Now().Add(time.Minute)); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Renew after expiry = %v, want ErrSandboxNotFound", err)
	}
	if _, err := e.p.Exec(ctx, h, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Exec after expiry = %v, want ErrSandboxNotFound", err)
	}
	if _, err := e.p.Snapshot(ctx, h, "x"); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Snapshot after expiry = %v, want ErrSandboxNotFound", err)
	}
	if st := e.srv.Stats(); st.Expired != 1 {
		t.Errorf("expired %d, want 1", st.Expired)
	}
}

// TestARenewalFindsAnEndedSandboxLost: the server renews a sandbox whose
// entrypoint ended (every one after its runtime restarts) as it renews a
// running one, so Renew looks at its state: an ended sandbox is
// ErrSandboxNotFound, and its lease is left alone.
func TestARenewalFindsAnEndedSandboxLost(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{TTLSeconds: 60})
	other := e.start(t, provider.Spec{TTLSeconds: 60})
	e.srv.Terminate(h.SandboxID)
	renewals := func() int { return e.srv.Stats().Requests["POST /sandboxes/{id}/renew-expiration"] }
	if err := e.p.Renew(ctx, h, e.clk.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Renew of a Terminated sandbox = %v, want ErrSandboxNotFound", err)
	}
	if n := renewals(); n != 0 {
		t.Errorf("%d renewals sent, want none for an ended sandbox", n)
	}
	if err := e.p.Renew(ctx, other, e.clk.Now().Add(time.Hour)); err != nil || renewals() != 1 {
		t.Errorf("Renew of a running sandbox = %v with %d renewals sent, want nil and one", err, renewals())
	}
}

// TestARefusedRenewalIsAnError: a renewal the server refuses is an error;
// one it answers 404 (the sandbox went between the look at its state and
// the renewal) is ErrSandboxNotFound.
func TestARefusedRenewalIsAnError(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{TTLSeconds: 60})
	for status, lost := range map[int]bool{http.StatusConflict: false, http.StatusNotFound: true} {
		e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/v1/sandboxes/" + h.SandboxID + "/renew-expiration", Status: status})
		err := e.p.Renew(ctx, h, e.clk.Now().Add(time.Hour))
		if err == nil || errors.Is(err, provider.ErrSandboxNotFound) != lost {
			t.Errorf("Renew answered %d = %v, want an error (lost: %v)", status, err, lost)
		}
	}
}

func TestListPagesAndFiltersOnTheClient(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{CreateLatency: time.Millisecond}, opensandbox.Options{ListLabels: map[string]string{"ng.owner": "a"}})
	for i := 0; i < 103; i++ {
		e.start(t, provider.Spec{Metadata: map[string]string{"ng.owner": "a"}})
	}
	for i := 0; i < 2; i++ {
		e.start(t, provider.Spec{Metadata: map[string]string{"ng.owner": "b"}})
	}
	sbs, err := e.p.ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != 103 {
		t.Errorf("listed %d, want the 103 labelled ng.owner=a of 105", len(sbs))
	}
	if n := e.srv.Stats().Requests["GET /sandboxes"]; n != 2 {
		t.Errorf("%d list pages, want 2 of 100", n)
	}
}

func TestSnapshotsQueueInTheClient(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxConcurrentSnapshots: 2})
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for i := 0; i < 6; i++ {
		// One source each: the server refuses a second snapshot of a
		// source it is capturing.
		h := e.start(t, provider.Spec{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.p.Snapshot(context.Background(), h, "q")
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	st := e.srv.Stats()
	if st.SnapshotsCreated != 6 || st.PeakUnfinished > 2 || st.PeakCaptures > 2 {
		t.Errorf("created %d, peak unfinished %d, peak captures %d: want 6, at most 2 in flight", st.SnapshotsCreated, st.PeakUnfinished, st.PeakCaptures)
	}
}

func TestBadConfigAndHandles(t *testing.T) {
	for _, o := range []opensandbox.Options{
		{},
		{Domain: "http://x:1"},
		{Domain: "x:1", Protocol: "ftp"},
		{Domain: "x:1", TTL: 30 * time.Second},
	} {
		if _, err := opensandbox.New(o); !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("New(%+v) = %v, want ErrInvalidSpec", o, err)
		}
	}
	// The server's minimum itself is a lease it accepts.
	if _, err := opensandbox.New(opensandbox.Options{Domain: "x:1", TTL: opensandbox.MinTTL}); err != nil {
		t.Errorf("New with the minimum TTL %v: %v", opensandbox.MinTTL, err)
	}
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	for _, h := range []provider.Handle{{SandboxID: "x", Provider: "local"}, {SandboxID: "../x", Provider: opensandbox.Name}} {
		if err := e.p.Stop(ctx, h); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Stop(%v) = %v", h, err)
		}
	}
	if _, err := e.p.Start(ctx, provider.Spec{Image: "x", Metadata: map[string]string{"bad key!": "v"}}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("Start with a bad label key = %v, want ErrInvalidSpec", err)
	}
	if _, err := e.p.Start(ctx, provider.Spec{}); !errors.Is(err, provider.ErrInvalidSpec) {
		t.Errorf("Start without an image = %v, want ErrInvalidSpec", err)
	}
	if n := e.srv.Stats().Created; n != 0 {
		t.Errorf("%d sandboxes created from bad specs", n)
	}
}

// TestPollsLearnTheTypicalWait: a create like the ones before it sleeps
// through most of their wait instead of polling all along.
func TestPollsLearnTheTypicalWait(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{CreateLatency: 10 * time.Second}, opensandbox.Options{})
	polls := func() int { return e.srv.Stats().Requests["GET /sandboxes/{id}"] }
	e.start(t, provider.Spec{})
	first := polls()
	e.start(t, provider.Spec{})
	second := polls() - first
	// The second: at once, after most of the typical wait, then a few
	// short polls.
	if first < 8 || 2*second > first {
		t.Errorf("polls: first create %d, second %d; want many, then under half as many", first, second)
	}
}

func TestUnknownStatesAreWaitedThrough(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{PendingState: "Provisioning"}, opensandbox.Options{})
	h := e.start(t, provider.Spec{})
	if got := e.exec(t, h, "echo up"); got.Stdout != "up\n" {
		t.Errorf("exec = %+v", got)
	}
}

func TestCreatesQueueInTheClient(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxConcurrentCreates: 3})
	var wg sync.WaitGroup
	for i := 0; i < 9; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := e.p.Start(context.Background(), provider.Spec{Image: "x"}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if st := e.srv.Stats(); st.Created != 9 || st.PeakStarting > 3 {
		t.Errorf("created %d, peak starting %d: want 9, at most 3 at once", st.Created, st.PeakStarting)
	}
}

// TestSnapshotPastItsDeadline: a snapshot still Creating at its deadline is
// an error, and is deleted once the server allows it.
func TestSnapshotPastItsDeadline(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{SnapshotLatency: 90 * time.Second}, opensandbox.Options{SnapshotTimeout: time.Minute})
	h := e.start(t, provider.Spec{})
	if _, err := e.p.Snapshot(context.Background(), h, "slow"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Snapshot = %v, want a deadline error", err)
	}
	e.p.Wait()
	if st := e.srv.Stats(); st.SnapshotsCreated != 1 || st.LiveSnapshots != 0 {
		t.Errorf("created %d, left %d: want the late snapshot deleted", st.SnapshotsCreated, st.LiveSnapshots)
	}
}

// TestFailedCreateLeavesNothing: a create whose last attempt failed after it
// took effect deletes what it made.
func TestFailedCreateLeavesNothing(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxRetries: -1})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/v1/sandboxes", Status: 502, AfterEffect: true})
	if _, err := e.p.Start(context.Background(), provider.Spec{Image: "x"}); err == nil {
		t.Fatal("Start through a 502 with no retries succeeded")
	}
	if st := e.srv.Stats(); st.Created != 1 || st.LiveSandboxes != 0 {
		t.Errorf("created %d, live %d: want the sandbox the failed create made deleted", st.Created, st.LiveSandboxes)
	}
}

// TestFailedSnapshotRequestLeavesNothing: a snapshot request whose last
// attempt failed after it took effect deletes the snapshot it made (once
// its capture ends).
func TestFailedSnapshotRequestLeavesNothing(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxRetries: -1})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/v1/sandboxes/" + h.SandboxID + "/snapshots", Status: 500, AfterEffect: true})
	if _, err := e.p.Snapshot(context.Background(), h, "x"); err == nil {
		t.Fatal("Snapshot through a 500 with no retries succeeded")
	}
	e.p.Wait()
	if st := e.srv.Stats(); st.SnapshotsCreated != 1 || st.LiveSnapshots != 0 {
		t.Errorf("created %d, left %d: want the snapshot the failed request made deleted", st.SnapshotsCreated, st.LiveSnapshots)
	}
}

// TestUnreachableServerFailsFast: a lifecycle server that gives no answer
// is reported unreachable by name; while it is, a call is tried once (no
// backoff) and fails with provider.ErrUnavailable; an answer clears it.
func TestUnreachableServerFailsFast(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	e.srv.Inject(opensandboxtest.Fault{Path: "/v1/", Drop: true, Times: 1000})
	err := e.p.Probe(ctx)
	if !errors.Is(err, provider.ErrUnavailable) || !strings.Contains(err.Error(), e.srv.Domain) {
		t.Fatalf("Probe = %v, want ErrUnavailable naming %s", err, e.srv.Domain)
	}
	if u := e.p.Unreachable(); u == nil || !strings.Contains(u.Error(), e.srv.Domain) {
		t.Fatalf("Unreachable = %v, want the domain", u)
	}
	e.mu.Lock()
	e.sleeps = nil
	e.mu.Unlock()
	if _, err := e.p.Start(ctx, provider.Spec{Image: "python:3.11"}); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("Start while unreachable = %v, want ErrUnavailable", err)
	}
	if n := e.srv.Stats().Requests["POST /sandboxes"]; n != 1 {
		t.Errorf("%d create attempts while unreachable, want 1", n)
	}
	if len(e.sleeps) != 0 {
		t.Errorf("Start backed off %v while the server was known unreachable", e.sleeps)
	}
	e2 := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	e2.srv.Inject(opensandboxtest.Fault{Path: "/v1/", Drop: true, Times: 1})
	if err := e2.p.Probe(ctx); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("Probe = %v", err)
	}
	if err := e2.p.Probe(ctx); err != nil || e2.p.Unreachable() != nil {
		t.Fatalf("after an answer: Probe %v, Unreachable %v; want both nil", err, e2.p.Unreachable())
	}
}

// TestProbeSnapshots: the probe says whether the runtime takes snapshots
// (501 is provider.ErrUnsupported) and leaves nothing either way.
func TestProbeSnapshots(t *testing.T) {
	for _, tc := range []struct {
		name        string
		noSnapshots bool
		want        error
		snapshots   int
	}{
		{"a runtime with snapshots", false, nil, 1},
		{"a runtime without (501)", true, provider.ErrUnsupported, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, opensandboxtest.Options{NoSnapshots: tc.noSnapshots}, opensandbox.Options{})
			err := e.p.ProbeSnapshots(context.Background(), provider.Spec{Image: "debian"})
			if !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("probe: %v, want %v", err, tc.want)
			}
			st := e.srv.Stats()
			if st.LiveSandboxes+st.LiveSnapshots != 0 || st.Created != 1 || st.SnapshotsCreated != tc.snapshots {
				t.Errorf("after the probe: %+v, want one sandbox made, %d snapshots, nothing left", st, tc.snapshots)
			}
		})
	}
}
