package http_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/resources/notes"
)

// TestHealthReportsTheSandboxing: /health names the isolation, the seccomp
// filter and the limits it was configured with, and leaves out the ones it
// was not given (rather than answering them empty).
func TestHealthReportsTheSandboxing(t *testing.T) {
	pick := func(m map[string]any) map[string]any {
		out := map[string]any{}
		for _, k := range []string{"isolation", "seccomp", "limits"} {
			if v, ok := m[k]; ok {
				out[k] = v
			}
		}
		return out
	}
	set := newHarness(t, withConfig(func(c *httpapi.Config) {
		c.Isolation, c.Seccomp, c.Limits = "container", "default", "memory=512M"
	}))
	got := pick(set.ok(set.do(nil, "GET", httpapi.RouteHealth, nil, nil), "health"))
	want := map[string]any{"isolation": "container", "seccomp": "default", "limits": "memory=512M"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("health of a configured server (-want +got):\n%s", diff)
	}
	unset := newHarness(t)
	got = pick(unset.ok(unset.do(nil, "GET", httpapi.RouteHealth, nil, nil), "health"))
	if diff := cmp.Diff(map[string]any{}, got); diff != "" {
		t.Errorf("health of an unconfigured server (-want +got):\n%s", diff)
	}
}

// TestMetricsCountRequests: with metrics configured (and no access log),
// GET /metrics serves the registry, and the requests answered before it are
// counted by route and status.
func TestMetricsCountRequests(t *testing.T) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, withConfig(func(c *httpapi.Config) { c.Metrics = m }))
	h.ok(h.do(nil, "GET", httpapi.RouteHealth, nil, nil), "health")
	r := h.do(nil, "GET", httpapi.RouteMetrics, nil, nil)
	if r.status != 200 {
		t.Fatalf("GET /metrics: %d %s", r.status, r.body)
	}
	var got []string
	for _, line := range strings.Split(string(r.body), "\n") {
		if strings.HasPrefix(line, metrics.Namespace+"_http_requests_total{") {
			got = append(got, line)
		}
	}
	want := []string{metrics.Namespace + `_http_requests_total{code="200",route="/health"} 1`}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests counted (-want +got):\n%s", diff)
	}
}

// keepsNoSandbox is the notes server saying it lends no sandbox.
type keepsNoSandbox struct{ *notes.Server }

func (keepsNoSandbox) LendsSandboxes() bool { return false }

// TestExportedOwnerWithoutSandboxesRestartsOnly: an owner that could export
// snapshots serves resources that lend no sandbox: nothing a session holds
// could be exported, so the server runs restart_only; the same owner with
// resources that lend sandboxes exports.
func TestExportedOwnerWithoutSandboxesRestartsOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []opt
		want string
	}{
		{"lends none", []opt{withResources(keepsNoSandbox{notes.New(notes.Options{})})}, "restart_only"},
		{"lends", nil, "exported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.opts...)
			health := h.ok(h.do(nil, "GET", httpapi.RouteHealth, nil, nil), "health")
			status := h.ok(h.control("status", nil), "status")
			got := []any{health["mode"], status["mode"]}
			if diff := cmp.Diff([]any{tc.want, tc.want}, got); diff != "" {
				t.Errorf("mode in /health and status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCloseWithCheckpointingOff: a session closes (and stays closed) on a
// server without checkpointing, where no episode is ever bound.
func TestCloseWithCheckpointingOff(t *testing.T) {
	h := newHarness(t, checkpointOff())
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	got := h.ok(h.post(a, "/close_session", nil), "close")
	if diff := cmp.Diff(map[string]any{"closed": true}, got); diff != "" {
		t.Errorf("close (-want +got):\n%s", diff)
	}
	if h.live(sb) {
		t.Errorf("sandbox %s still live after the close", sb)
	}
}

// TestMCPCallLeavesTheGate: a finished MCP tool call is no longer counted
// in flight, so it blocks no checkpoint.
func TestMCPCallLeavesTheGate(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	seed := h.ok(h.post(a, "/seed_session", typedSeed("s-1", ep("r7", 0), "notes", "t1")), "typed seed")
	tok, _ := seed["resources_tools"].(map[string]any)["headers"].(map[string]any)[httpapi.HeaderMCPSession].(string)
	call := h.ok(h.do(nil, "POST", "/mcp", map[string]any{"jsonrpc": "2.0", "id": 1, "method": "tools/call",
		"params": map[string]any{"name": "append_note", "arguments": map[string]any{"line": "over mcp"}}},
		map[string]string{httpapi.HeaderMCPSession: tok}), "tools/call")
	if res, _ := call["result"].(map[string]any); res == nil || res["isError"] != false {
		t.Fatalf("tools/call: %v", call)
	}
	report, _ := h.ok(h.control("status", nil), "status")["report"].(map[string]any)
	got := map[string]any{"ready": report["ready"], "counts": report["counts"]}
	want := map[string]any{"ready": true, "counts": map[string]any{"inflight": 0.0, "sessions": 1.0}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("readiness after the call (-want +got):\n%s", diff)
	}
}

// TestLeaseTickerDefaultsToOneSecond: a server given no lease tick checks
// the checkpoint lease every second of its clock, so a prepared checkpoint
// whose lease lapses is resumed without any request arriving.
func TestLeaseTickerDefaultsToOneSecond(t *testing.T) {
	h := newHarness(t, withConfig(func(c *httpapi.Config) { c.LeaseTick = 0 }))
	// The guard only stops a hang; nothing waits on it to proceed.
	guard := time.After(30 * time.Second)
	for {
		armed := h.clk.Armed()
		if at, ok := h.clk.Next(); ok && at.Equal(t0.Add(time.Second)) {
			break
		}
		select {
		case <-armed:
		case <-guard:
			t.Fatal("no timer armed one second ahead: the lease ticker is not waiting on its default tick")
		}
	}
	if p := h.op("prepare", "c1", nil); p["phase"] != "prepared" {
		t.Fatalf("prepare: %v", p)
	}
	g := h.srv.Gate()
	if g.IsOpen() {
		t.Fatal("admission open after prepare")
	}
	// Past the lease (the deadline plus its grace).
	changed := g.Changed()
	h.clk.Advance(time.Minute + 601*time.Second)
	for !g.IsOpen() {
		select {
		case <-changed:
			changed = g.Changed()
		case <-guard:
			t.Fatal("the lapsed lease was never resumed")
		}
	}
}

// TestMetricsLabelMountsAndSeeds: a path two mounts' prefixes match goes to
// the longer prefix; a mount's request is labelled by the route its handler
// names (RouteValue), else by its prefix; only a POST to /seed_session counts
// as a seed.
func TestMetricsLabelMountsAndSeeds(t *testing.T) {
	m, err := metrics.New(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	mounts := map[string]fasthttp.RequestHandler{
		"/a/": func(ctx *fasthttp.RequestCtx) {
			ctx.SetUserValue(httpapi.RouteValue, "/a/{id}/x")
			ctx.SetStatusCode(200)
		},
		"/a/b/": func(ctx *fasthttp.RequestCtx) { ctx.SetStatusCode(201) },
	}
	h := newHarness(t, withConfig(func(c *httpapi.Config) { c.Metrics = m; c.Mounts = mounts }))
	if r := h.do(nil, "GET", "/a/1/x", nil, nil); r.status != 200 {
		t.Errorf("GET /a/1/x: %d, want the /a/ mount's 200", r.status)
	}
	if r := h.do(nil, "GET", "/a/b/c", nil, nil); r.status != 201 {
		t.Errorf("GET /a/b/c: %d, want the /a/b/ mount's 201", r.status)
	}
	a := &agent{}
	h.ok(h.post(a, "/seed_session", map[string]any{}), "seed")
	h.ok(h.post(a, "/append_note", map[string]any{"line": "x"}), "append_note")
	h.ok(h.post(a, "/append_note", map[string]any{"line": "y"}), "append_note")
	r := h.do(nil, "GET", httpapi.RouteMetrics, nil, nil)
	var got []string
	for _, line := range strings.Split(string(r.body), "\n") {
		if strings.HasPrefix(line, metrics.Namespace+"_http_requests_total{") || strings.HasPrefix(line, metrics.Namespace+"_seeds_total{") {
			got = append(got, line)
		}
	}
	want := []string{
		metrics.Namespace + `_http_requests_total{code="200",route="/a/{id}/x"} 1`,
		metrics.Namespace + `_http_requests_total{code="200",route="/append_note"} 2`,
		metrics.Namespace + `_http_requests_total{code="200",route="/seed_session"} 1`,
		metrics.Namespace + `_http_requests_total{code="201",route="/a/b/"} 1`,
		metrics.Namespace + `_seeds_total{outcome="failed"} 0`,
		metrics.Namespace + `_seeds_total{outcome="ok"} 1`,
		metrics.Namespace + `_seeds_total{outcome="refused"} 0`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests and seeds counted (-want +got):\n%s", diff)
	}
}
