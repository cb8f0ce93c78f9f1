package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/fake"
)

func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	status, body, err := fasthttp.GetTimeout(nil, "http://"+addr+path, 30*time.Second)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return status, string(body)
}

// startFake starts a notes server on the fake provider with checkpointing
// on, the access log to hook.
func startFake(t *testing.T, dir string, prov *fake.Provider, deps app.Deps, mods ...func(*app.Config)) (*app.App, *logtest.Hook, func() error) {
	t.Helper()
	cfg := app.Defaults()
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Checkpoint.Enabled = true
	cfg.Checkpoint.StateDir = dir
	cfg.Checkpoint.ControlAuthToken = "tok"
	for _, m := range mods {
		m(&cfg)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lg, hook := logtest.NewNullLogger()
	deps.Logger, deps.Listener, deps.Provider = lg, ln, prov
	a, err := app.Start(context.Background(), cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	stop := sync.OnceValue(func() error { return a.Stop(context.Background()) })
	t.Cleanup(func() { _ = stop() })
	return a, hook, stop
}

func control(t *testing.T, addr, op, body string) {
	t.Helper()
	controlReply(t, addr, op, body)
}

// controlReply makes a control call that must succeed and decodes its
// reply.
func controlReply(t *testing.T, addr, op, body string) map[string]any {
	t.Helper()
	return controlAs(t, addr, op, "", body)
}

// controlAs is controlReply with the request id requestID ("": none sent).
func controlAs(t *testing.T, addr, op, requestID, body string) map[string]any {
	t.Helper()
	r, err := send("POST", "http://"+addr+"/ng-control/v1/checkpoint/"+op, body, "Authorization", "Bearer tok", "X-Request-Id", requestID)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != 200 {
		t.Fatalf("%s: %d %s", op, r.status, r.body)
	}
	var out map[string]any
	if err := json.Unmarshal([]byte(r.body), &out); err != nil {
		t.Fatalf("%s: %v: %s", op, err, r.body)
	}
	return out
}

// series finds one series of a family by its labels.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f, ok := fams[name]
	if !ok {
		t.Fatalf("no family %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range labels {
			if have[k] != v {
				continue next
			}
		}
		return m
	}
	t.Errorf("%s has no series %v", name, labels)
	return &dto.Metric{}
}

// scrape reads /metrics with Prometheus' text parser.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	status, text := get(t, addr, "/metrics")
	if status != 200 {
		t.Fatalf("/metrics: %d %s", status, text)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return fams
}

type check struct {
	what      string
	got, want float64
}

func (c check) verify(t *testing.T) {
	t.Helper()
	if c.got != c.want {
		t.Errorf("%s: %v, want %v", c.what, c.got, c.want)
	}
}

func counter(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	return series(t, fams, name, labels).GetCounter().GetValue()
}

func gauge(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	return series(t, fams, name, labels).GetGauge().GetValue()
}

func histCount(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	return float64(series(t, fams, name, labels).GetHistogram().GetSampleCount())
}

// TestMetricsCountWhatHappened: after a seed (and a refused one), a tool
// call and a commit, and in the next process a restore, /metrics (parsed
// with Prometheus' text parser) has every family with the counts those
// requests caused.
func TestMetricsCountWhatHappened(t *testing.T) {
	t.Parallel()
	dir, prov := t.TempDir(), fake.New(fake.Options{})
	a, hook, stop := startFake(t, dir, prov, app.Deps{AccessLog: true})
	addr := a.Addr().String()
	s, body, cookie := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	if s, body, _ := post(t, addr, "/seed_session", "", `{"resources_session_id":"x","extra":1}`); s != 422 {
		t.Fatalf("bad typed seed: %d %s", s, body)
	}
	if s, body, _ := post(t, addr, "/ng-rollout/r1/append_note", cookie, `{"line":"one"}`); s != 200 {
		t.Fatalf("append: %d %s", s, body)
	}
	d := time.Now().Add(time.Minute).Unix()
	control(t, addr, "prepare", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	control(t, addr, "commit", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d,"checkpoint_dir":%q,"episode_ids":[{"rollout_id":"r1","attempt":0}]}`, d, filepath.Join(dir, "ck1")))
	control(t, addr, "resume", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))

	fams := scrape(t, addr)
	ctl := "/ng-control/v1/checkpoint/"
	for _, c := range []check{
		{"seeds ok", counter(t, fams, "sandboxowner_seeds_total", map[string]string{"outcome": "ok"}), 1},
		{"seeds refused", counter(t, fams, "sandboxowner_seeds_total", map[string]string{"outcome": "refused"}), 1},
		{"seed requests", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/seed_session", "code": "200"}), 1},
		{"refused seed requests", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/seed_session", "code": "422"}), 1},
		{"tool requests", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/append_note", "code": "200"}), 1},
		{"commit requests", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": ctl + "commit", "code": "200"}), 1},
		{"tool request durations", histCount(t, fams, "sandboxowner_http_request_duration_seconds", map[string]string{"route": "/append_note", "code": "200"}), 1},
		{"prepares", counter(t, fams, "sandboxowner_checkpoint_operations_total", map[string]string{"op": "prepare", "outcome": "ok"}), 1},
		{"commits", counter(t, fams, "sandboxowner_checkpoint_operations_total", map[string]string{"op": "commit", "outcome": "ok"}), 1},
		{"commit durations", histCount(t, fams, "sandboxowner_checkpoint_operation_duration_seconds", map[string]string{"op": "commit", "outcome": "ok"}), 1},
		{"sandbox starts", counter(t, fams, "sandboxowner_provider_calls_total", map[string]string{"provider": "fake", "op": "start", "outcome": "ok"}), 1},
		{"snapshots taken", counter(t, fams, "sandboxowner_provider_calls_total", map[string]string{"provider": "fake", "op": "snapshot", "outcome": "ok"}), 1},
		{"snapshot durations", histCount(t, fams, "sandboxowner_provider_call_duration_seconds", map[string]string{"provider": "fake", "op": "snapshot", "outcome": "ok"}), 1},
		{"live sessions", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "live"}), 1},
		{"sessions in setup", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "in_setup"}), 0},
		{"lost sessions", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "lost"}), 0},
		{"snapshots", gauge(t, fams, "sandboxowner_snapshots", nil), 1},
		{"admission waiting", gauge(t, fams, "sandboxowner_admission_waiting", nil), 0},
	} {
		c.verify(t)
	}
	if _, ok := fams["sandboxowner_checkpoint_operations_total"]; ok {
		for _, m := range fams["sandboxowner_checkpoint_operations_total"].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "op" && l.GetValue() == "resume" {
					t.Errorf("resume is counted as a checkpoint operation")
				}
			}
		}
	}
	for name, typ := range map[string]dto.MetricType{
		"sandboxowner_checkpoint_operations_total":   dto.MetricType_COUNTER,
		"sandboxowner_sessions":                      dto.MetricType_GAUGE,
		"sandboxowner_http_request_duration_seconds": dto.MetricType_HISTOGRAM,
		"go_goroutines":                              dto.MetricType_GAUGE,
		"process_cpu_seconds_total":                  dto.MetricType_COUNTER,
	} {
		if f, ok := fams[name]; !ok || f.GetType() != typ {
			t.Errorf("family %s: %v, want a %v", name, f.GetType(), typ)
		}
	}
	// The notes server grades nothing in sandboxes: no SWE-bench family.
	for _, name := range []string{"sandboxowner_grading_duration_seconds", "sandboxowner_gradings_waiting", "sandboxowner_environments_preparing"} {
		if _, ok := fams[name]; ok {
			t.Errorf("the notes server exports %s", name)
		}
	}

	// The access log: one line per request, with its session.
	sid := strings.TrimPrefix(cookie[:strings.LastIndexByte(cookie, '.')], "notes___notes=")
	var lines []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if e.Message == "request" {
			lines = append(lines, e)
		}
	}
	if len(lines) != 7 { // two seeds, a tool call, three control calls, the scrape
		t.Errorf("%d access log lines, want 7", len(lines))
	}
	found := false
	for _, e := range lines {
		if e.Data["route"] == "/append_note" {
			found = true
			if e.Data["method"] != "POST" || e.Data["status"] != 200 || e.Data["session_id"] != sid {
				t.Errorf("access log line %v, want POST /append_note 200 of session %s", e.Data, sid)
			}
			if d, ok := e.Data["duration"].(float64); !ok || d <= 0 {
				t.Errorf("access log duration %v", e.Data["duration"])
			}
		}
	}
	if !found {
		t.Errorf("no access log line for the tool call")
	}

	// The next process restores the checkpoint.
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, _, _ := startFake(t, dir, prov, app.Deps{})
	addr = b.Addr().String()
	control(t, addr, "restore", fmt.Sprintf(`{"checkpoint_id":"rs1","deadline_ts":%d,"source_checkpoint_id":"ck1","episode_ids":[{"rollout_id":"r1","attempt":0}]}`, d))
	control(t, addr, "resume", fmt.Sprintf(`{"checkpoint_id":"rs1","deadline_ts":%d}`, d))
	fams = scrape(t, addr)
	for _, c := range []check{
		{"restores", counter(t, fams, "sandboxowner_checkpoint_operations_total", map[string]string{"op": "restore", "outcome": "ok"}), 1},
		{"restore durations", histCount(t, fams, "sandboxowner_checkpoint_operation_duration_seconds", map[string]string{"op": "restore", "outcome": "ok"}), 1},
		{"restore requests", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": ctl + "restore", "code": "200"}), 1},
		{"forks", counter(t, fams, "sandboxowner_provider_calls_total", map[string]string{"provider": "fake", "op": "fork", "outcome": "ok"}), 1},
		{"restored sessions live", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "live"}), 1},
		{"snapshots after the restore", gauge(t, fams, "sandboxowner_snapshots", nil), 1},
	} {
		c.verify(t)
	}
	for _, m := range fams["sandboxowner_seeds_total"].GetMetric() {
		if m.GetCounter().GetValue() != 0 {
			t.Errorf("seeds counted in a process that served none: %v", fams["sandboxowner_seeds_total"].GetMetric())
		}
	}
}

// TestPprofOnlyWhenAsked: /debug/pprof/ is served with -pprof and is a 404
// without; the access log is off unless asked.
func TestPprofOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	with, _, _ := startFake(t, t.TempDir(), fake.New(fake.Options{}), app.Deps{Pprof: true})
	if s, _ := get(t, with.Addr().String(), "/debug/pprof/"); s != 200 {
		t.Errorf("-pprof: /debug/pprof/ answered %d", s)
	}
	without, hook, _ := startFake(t, t.TempDir(), fake.New(fake.Options{}), app.Deps{})
	if s, _ := get(t, without.Addr().String(), "/debug/pprof/"); s != 404 {
		t.Errorf("without -pprof: /debug/pprof/ answered %d", s)
	}
	for _, e := range hook.AllEntries() {
		if e.Message == "request" {
			t.Errorf("access log line without -access-log: %v", e.Data)
		}
	}
}

// TestUnknownPathsShareOneLabel: paths no route serves are counted as
// route "other", so a client cannot grow the label set; a malformed control
// operation is counted as refused.
func TestUnknownPathsShareOneLabel(t *testing.T) {
	t.Parallel()
	a, _, _ := startFake(t, t.TempDir(), fake.New(fake.Options{}), app.Deps{})
	addr := a.Addr().String()
	for _, p := range []string{"/nope-1", "/nope-2", "/ng-rollout/r1/nope", "/ng-control/v1/checkpoint/nope"} {
		if s, _, _ := post(t, addr, p, "", "{}"); s < 400 {
			t.Fatalf("%s: %d", p, s)
		}
	}
	// A refused control operation is counted as refused.
	if r, err := send("POST", "http://"+addr+"/ng-control/v1/checkpoint/prepare", "{", "Authorization", "Bearer tok"); err != nil || r.status != 422 {
		t.Fatalf("malformed prepare: %v %+v", err, r)
	}
	fams := scrape(t, addr)
	check{"refused prepares", counter(t, fams, "sandboxowner_checkpoint_operations_total", map[string]string{"op": "prepare", "outcome": "refused"}), 1}.verify(t)
	if got := counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "other", "code": "404"}); got != 3 {
		t.Errorf("unknown data paths: %v, want 3", got)
	}
	for _, m := range fams["sandboxowner_http_requests_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if strings.Contains(l.GetValue(), "nope") {
				t.Errorf("a path became a label: %v", m.GetLabel())
			}
		}
	}
}

// TestRunFlagsReachTheServer: -access-log and -pprof on the command line
// turn both on in the server Run starts.
func TestRunFlagsReachTheServer(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- app.Run(ctx, []string{"-port", "0", "-sandbox.provider", "fake", "-log-format", "json", "-access-log", "-pprof"}, io.Discard, pw)
		pw.Close()
	}()
	entries := make(chan map[string]any, 64)
	go func() {
		defer close(entries)
		lines := bufio.NewScanner(pr)
		for lines.Scan() {
			var e map[string]any
			if json.Unmarshal(lines.Bytes(), &e) != nil {
				e = map[string]any{"not json": lines.Text()}
			}
			entries <- e
		}
	}()
	addr := ""
	for e := range entries {
		if e["not json"] != nil {
			t.Fatalf("log line is not JSON: %v", e["not json"])
		}
		if addr, _ = e["addr"].(string); addr != "" {
			break
		}
	}
	if addr == "" {
		t.Fatal("no startup line")
	}
	if s, _ := get(t, addr, "/debug/pprof/"); s != 200 {
		t.Errorf("-pprof: /debug/pprof/ answered %d", s)
	}
	cancel()
	logged := false
	for e := range entries {
		if e["msg"] == "request" && e["route"] == "/debug/pprof/" && e["status"] == 200.0 {
			logged = true
		}
	}
	if !logged {
		t.Error("no access log line for the request")
	}
	if code := <-done; code != 0 {
		t.Errorf("exit %d", code)
	}
}

// TestStateGaugesFollowTheServer: a seed held at its sandbox's start is in
// setup, then live; a seed held at a closed admission gate is waiting.
func TestStateGaugesFollowTheServer(t *testing.T) {
	t.Parallel()
	fk := fake.New(fake.Options{})
	a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{})
	addr := a.Addr().String()
	state := func(name string, labels map[string]string) float64 {
		return gauge(t, scrape(t, addr), name, labels)
	}
	entered, out := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpStart && c.Phase == fake.PhaseBegin {
			once.Do(func() { close(entered); <-out })
		}
	})
	seeded := make(chan int, 2)
	go func() { s, _, _ := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}"); seeded <- s }()
	<-entered
	check{"in setup while the start is held", state("sandboxowner_sessions", map[string]string{"state": "in_setup"}), 1}.verify(t)
	check{"live while the start is held", state("sandboxowner_sessions", map[string]string{"state": "live"}), 0}.verify(t)
	close(out)
	if s := <-seeded; s != 200 {
		t.Fatalf("seed: %d", s)
	}
	check{"in setup after the seed", state("sandboxowner_sessions", map[string]string{"state": "in_setup"}), 0}.verify(t)
	check{"live after the seed", state("sandboxowner_sessions", map[string]string{"state": "live"}), 1}.verify(t)

	d := time.Now().Add(time.Minute).Unix()
	control(t, addr, "prepare", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	gate := a.Server().Gate()
	changed := gate.Changed()
	go func() { s, _, _ := post(t, addr, "/ng-rollout/r2/seed_session", "", "{}"); seeded <- s }()
	for gate.Waiting() == 0 {
		<-changed
		changed = gate.Changed()
	}
	check{"waiting at the closed gate", state("sandboxowner_admission_waiting", nil), 1}.verify(t)
	control(t, addr, "resume", fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, d))
	if s := <-seeded; s != 200 {
		t.Fatalf("seed after resume: %d", s)
	}
	check{"waiting after resume", state("sandboxowner_admission_waiting", nil), 0}.verify(t)
	check{"live after both seeds", state("sandboxowner_sessions", map[string]string{"state": "live"}), 2}.verify(t)
}

// TestLostSessionsAreCounted: a session whose sandbox was stopped behind
// the owner's back is counted lost, not live, until it is closed.
func TestLostSessionsAreCounted(t *testing.T) {
	t.Parallel()
	fk := fake.New(fake.Options{})
	a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{})
	addr := a.Addr().String()
	_, _, lost := post(t, addr, "/seed_session", "", "{}")
	if s, body, _ := post(t, addr, "/seed_session", "", "{}"); s != 200 {
		t.Fatalf("second seed: %d %s", s, body)
	}
	sid := strings.TrimPrefix(lost[:strings.LastIndexByte(lost, '.')], "notes___notes=")
	sb, ok := a.Owner().SessionSandbox(context.Background(), sid)
	if !ok {
		t.Fatal("no sandbox")
	}
	if err := fk.Stop(context.Background(), sb.Handle); err != nil {
		t.Fatal(err)
	}
	if s, body, _ := post(t, addr, "/append_note", lost, `{"line":"x"}`); s != 409 || !strings.Contains(body, "sandbox_lost") {
		t.Fatalf("tool call on the lost sandbox: %d %s", s, body)
	}
	fams := scrape(t, addr)
	check{"lost", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "lost"}), 1}.verify(t)
	check{"live", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "live"}), 1}.verify(t)
	if s, body, _ := post(t, addr, "/close_session", lost, ""); s != 200 {
		t.Fatalf("close of the lost session: %d %s", s, body)
	}
	fams = scrape(t, addr)
	check{"lost after the close", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "lost"}), 0}.verify(t)
	check{"live after the close", gauge(t, fams, "sandboxowner_sessions", map[string]string{"state": "live"}), 1}.verify(t)
}

// TestSandboxExecAndFilesAreRoutesApart: the sandbox API's exec and files
// calls are counted under routes of their own (without the sandbox id), not
// together under the mount's prefix.
func TestSandboxExecAndFilesAreRoutesApart(t *testing.T) {
	t.Parallel()
	a := startLocal(t, t.TempDir())
	defer a.Stop(context.Background())
	d, _, _ := seededSandbox(t, a)
	if s, body := sandboxCall(t, "POST", d.Endpoint+"/exec", d.Token, `{"command":"true"}`); s != 200 {
		t.Fatalf("exec: %d %s", s, body)
	}
	for range 2 {
		if s, body := sandboxCall(t, "GET", d.Endpoint+"/files?path=.seed_token", d.Token, ""); s != 200 {
			t.Fatalf("files: %d %s", s, body)
		}
	}
	if s, _ := sandboxCall(t, "GET", d.Endpoint+"/nope", d.Token, ""); s != 404 {
		t.Fatalf("unknown sandbox route: %d", s)
	}
	fams := scrape(t, a.Addr().String())
	for _, c := range []check{
		{"exec", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/sandboxes/{id}/exec", "code": "200"}), 1},
		{"files", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/sandboxes/{id}/files", "code": "200"}), 2},
		{"other sandbox paths", counter(t, fams, "sandboxowner_http_requests_total", map[string]string{"route": "/sandboxes/", "code": "404"}), 1},
	} {
		c.verify(t)
	}
}

// TestRequestIDsAndAccessLines: every reply carries X-Request-Id (the
// client's when usable, one made otherwise) and the access line of the
// request names it, with the remote address; a rollout route's line names
// its capture key and session, a sandbox API line its sandbox and the
// session holding it.
func TestRequestIDsAndAccessLines(t *testing.T) {
	t.Parallel()
	cfg := app.Defaults()
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Local.Isolation = "none"
	cfg.Sandbox.Local.Root = filepath.Join(t.TempDir(), "root")
	// With checkpointing a session is bound to its episode, which the
	// sandbox API's lines name by its capture key.
	cfg.Checkpoint.Enabled = true
	cfg.Checkpoint.StateDir = t.TempDir()
	cfg.Checkpoint.ControlAuthToken = "tok"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lg, hook := logtest.NewNullLogger()
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Logger: lg, AccessLog: true})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Stop(context.Background())
	addr := a.Addr().String()

	call := func(method, url, requestID, token, body string) string {
		t.Helper()
		auth := ""
		if token != "" {
			auth = "Bearer " + token
		}
		r, err := send(method, url, body, "X-Request-Id", requestID, "Authorization", auth)
		if err != nil {
			t.Fatal(err)
		}
		return string(r.header.Peek("X-Request-Id"))
	}
	if got := call("GET", "http://"+addr+"/health", "client-id-1", "", ""); got != "client-id-1" {
		t.Errorf("a usable client id came back as %q", got)
	}
	made := call("GET", "http://"+addr+"/health", "", "", "")
	if len(made) != 16 {
		t.Errorf("a made request id: %q, want 16 hex digits", made)
	}
	for _, bad := range []string{strings.Repeat("x", 129), "two words", "a/b"} {
		if got := call("GET", "http://"+addr+"/health", bad, "", ""); got == bad || len(got) != 16 {
			t.Errorf("client id %q came back as %q, want a made one", bad, got)
		}
	}

	s, body, cookie := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	d := sandboxAccess(t, a, cookie).Connection.Descriptor
	sid := strings.TrimPrefix(cookie[:strings.LastIndexByte(cookie, '.')], "notes___notes=")
	execID := call("POST", d.Endpoint+"/exec", "exec-call-7", d.Token, `{"command":"true"}`)
	call("GET", d.Endpoint+"/files?path=missing.txt", "read-call-8", d.Token, "")

	lines := map[string]logrus.Fields{}
	for _, e := range hook.AllEntries() {
		if e.Message == "request" {
			if id, _ := e.Data["request_id"].(string); id != "" {
				lines[id] = e.Data
			} else {
				t.Errorf("access line without a request id: %v", e.Data)
			}
			if ra, _ := e.Data["remote_addr"].(string); !strings.HasPrefix(ra, "127.0.0.1:") {
				t.Errorf("access line remote_addr %q", ra)
			}
		}
	}
	if l := lines["client-id-1"]; l == nil || l["route"] != "/health" {
		t.Errorf("the client's id does not name its access line: %v", l)
	}
	if l := lines[execID]; l == nil || l["route"] != "/sandboxes/{id}/exec" || l["sandbox_id"] != d.SandboxID || l["session_id"] != sid || l["capture_key"] != "r1" {
		t.Errorf("the sandbox API's access line: %v, want sandbox %s of session %s, capture key r1", l, d.SandboxID, sid)
	}
	// A line the handler logs for a request names it as its access line does.
	var failed logrus.Fields
	for _, e := range hook.AllEntries() {
		if e.Message == "sandboxapi: provider call failed" {
			failed = e.Data
		}
	}
	want := logrus.Fields{"request_id": "read-call-8", "session_id": sid, "sandbox_id": d.SandboxID, "capture_key": "r1", "code": "file_not_found"}
	for k, v := range want {
		if failed[k] != v {
			t.Errorf("the failed read's line: %s = %v, want %v (line %v)", k, failed[k], v, failed)
		}
	}
	var seedLine logrus.Fields
	for _, l := range lines {
		if l["route"] == "/seed_session" {
			seedLine = l
		}
	}
	if seedLine == nil || seedLine["capture_key"] != "r1" || seedLine["session_id"] != sid {
		t.Errorf("the seed's access line: %v, want capture key r1 and session %s", seedLine, sid)
	}
}

// TestVerifiesAreInTheMetrics: a notes server counts its verifies by
// outcome, sums their rewards and counts the resolved ones (a full reward)
// under resources="notes", from zero at startup.
func TestVerifiesAreInTheMetrics(t *testing.T) {
	t.Parallel()
	a, _, _ := startFake(t, t.TempDir(), fake.New(fake.Options{}), app.Deps{})
	addr := a.Addr().String()
	notes := map[string]string{"resources": "notes"}
	if v := counter(t, scrape(t, addr), "sandboxowner_verifies_total", map[string]string{"resources": "notes", "outcome": "rewarded"}); v != 0 {
		t.Fatalf("rewarded verifies at start: %v", v)
	}
	episode := func(rollout, note, expected string) {
		t.Helper()
		s, body, cookie := post(t, addr, "/ng-rollout/"+rollout+"/seed_session", "", "{}")
		if s != 200 {
			t.Fatalf("seed: %d %s", s, body)
		}
		if s, body, _ := post(t, addr, "/ng-rollout/"+rollout+"/append_note", cookie, `{"line":"`+note+`"}`); s != 200 {
			t.Fatalf("append: %d %s", s, body)
		}
		if s, body, _ := post(t, addr, "/ng-rollout/"+rollout+"/verify", cookie, `{"expected_notes":["`+expected+`"]}`); s != 200 {
			t.Fatalf("verify: %d %s", s, body)
		}
	}
	episode("r1", "one", "one")
	episode("r2", "one", "two")
	episode("r3", "x", "x")
	fams := scrape(t, addr)
	for _, c := range []check{
		{"rewarded", counter(t, fams, "sandboxowner_verifies_total", map[string]string{"resources": "notes", "outcome": "rewarded"}), 2},
		{"unrewarded", counter(t, fams, "sandboxowner_verifies_total", map[string]string{"resources": "notes", "outcome": "unrewarded"}), 1},
		{"masked", counter(t, fams, "sandboxowner_verifies_total", map[string]string{"resources": "notes", "outcome": "masked"}), 0},
		{"rewards", counter(t, fams, "sandboxowner_rewards_total", notes), 2},
		{"resolved", counter(t, fams, "sandboxowner_resolved_total", notes), 2},
	} {
		c.verify(t)
	}
}
