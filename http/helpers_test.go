package http_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/internal/replytest"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

const token = "test-control-token"

var t0 = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

// harness is one server process: an owner and its HTTP server on an
// in-memory listener. restart makes a fresh one on the same state_dir and
// provider, as a process started after a crash.
type harness struct {
	t    *testing.T
	opts options
	prov provider.Provider
	dir  string
	// ckdirs holds the controller's checkpoint directories; they outlive
	// restarts of the server.
	ckdirs *records.MemFS
	clk    *clock.Manual
	log    *logtest.Hook

	own *owner.Owner
	srv *httpapi.Server
	// cookieName is read by requests, which may race a stop that drops srv.
	cookieName string
	ln         *fasthttputil.InmemoryListener
	cl         *fasthttp.Client
	wg         sync.WaitGroup
}

type options struct {
	checkpoint bool
	prov       provider.Provider
	res        resources.Resources
	maxBody    int
	accessLog  bool
	// owner adjusts the owner's config.
	owner func(*owner.Config)
	// config adjusts the server's config.
	config func(*httpapi.Config)
}

type opt func(*options)

func checkpointOff() opt                      { return func(o *options) { o.checkpoint = false } }
func withProvider(p provider.Provider) opt    { return func(o *options) { o.prov = p } }
func withResources(r resources.Resources) opt { return func(o *options) { o.res = r } }
func withMaxBody(n int) opt                   { return func(o *options) { o.maxBody = n } }
func withAccessLog() opt                      { return func(o *options) { o.accessLog = true } }
func withOwner(f func(*owner.Config)) opt     { return func(o *options) { o.owner = f } }
func withConfig(f func(*httpapi.Config)) opt  { return func(o *options) { o.config = f } }

func newHarness(t *testing.T, opts ...opt) *harness {
	t.Helper()
	o := options{checkpoint: true}
	for _, f := range opts {
		f(&o)
	}
	clk := clock.NewManual(t0)
	if o.prov == nil {
		o.prov = fake.New(fake.Options{Clock: clk, Seed: 1})
	}
	if o.res == nil {
		o.res = notes.New(notes.Options{})
	}
	h := &harness{t: t, opts: o, prov: o.prov, dir: t.TempDir(), ckdirs: records.NewMemFS(), clk: clk}
	h.start()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) fake() *fake.Provider {
	switch p := h.prov.(type) {
	case *fake.Provider:
		return p
	case *fake.NoSnapshots:
		return p.Fake()
	}
	h.t.Fatalf("provider %T is not a fake", h.prov)
	return nil
}

func (h *harness) start() {
	h.t.Helper()
	lg, hook := logtest.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	h.log = hook
	ocfg := owner.Config{
		Name:     "notes",
		Provider: h.prov,
		// The controller's directories ("/d") are in memory.
		Checkpoint: owner.CheckpointConfig{Enabled: h.opts.checkpoint, StateDir: h.dir, Parallelism: 4, Records: h.ckdirs},
		Clock:      h.clk,
		Logger:     lg,
	}
	if h.opts.owner != nil {
		h.opts.owner(&ocfg)
	}
	own, err := owner.New(context.Background(), ocfg)
	if err != nil {
		h.t.Fatalf("owner.New: %v", err)
	}
	secret, _, err := httpapi.LoadSessionSecret("", h.dir)
	if err != nil {
		h.t.Fatal(err)
	}
	cfg := httpapi.Config{
		Owner:            own,
		Resources:        h.opts.res,
		Logger:           lg,
		Clock:            h.clk,
		SessionSecret:    secret,
		ControlAuthToken: token,
		MaxBodyBytes:     h.opts.maxBody,
		AccessLog:        h.opts.accessLog,
		LeaseTick:        -1,
	}
	if h.opts.config != nil {
		h.opts.config(&cfg)
	}
	srv, err := httpapi.New(cfg)
	if err != nil {
		h.t.Fatalf("http.New: %v", err)
	}
	h.own, h.srv, h.cookieName = own, srv, srv.CookieName()
	h.ln = fasthttputil.NewInmemoryListener()
	h.cl = &fasthttp.Client{Dial: func(string) (net.Conn, error) { return h.ln.Dial() }}
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		_ = srv.Serve(h.ln)
	}()
}

// stop shuts the server down cleanly (idempotent).
func (h *harness) stop() {
	if h.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	h.wg.Wait()
	_ = h.own.Close()
	h.srv = nil
}

// crash drops the owner as a crash would (nothing stopped, the index not
// cleaned up) and takes the server down with it.
func (h *harness) crash() {
	if err := h.own.Abandon(); err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_ = h.srv.Shutdown(ctx)
	h.wg.Wait()
	h.srv = nil
}

// restart is a fresh process on the same state_dir and provider.
func (h *harness) restart() {
	h.t.Helper()
	h.stopIfRunning()
	h.start()
}

func (h *harness) stopIfRunning() {
	if h.srv != nil {
		h.crash()
	}
}

// agent is one client with its cookie jar.
type agent struct {
	cookie string
}

type reply struct {
	status int
	body   []byte
	header map[string]string
	// cookie is what Set-Cookie said ("" when nothing, "-" when deleted).
	cookie string
	// requestID is the reply's X-Request-Id.
	requestID string
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	return replytest.Object(t, r.status, r.body)
}

// code is the envelope's error code ("" for none).
func (r reply) code() string { return replytest.Code(r.body) }

func (h *harness) do(a *agent, method, path string, body any, headers map[string]string) reply {
	h.t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://notes" + path)
	req.Header.SetMethod(method)
	raw, err := replytest.Encode(body)
	if err != nil {
		h.t.Fatal(err)
	}
	req.SetBody(raw)
	if a != nil && a.cookie != "" {
		req.Header.SetCookie(h.cookieName, a.cookie)
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	if err := h.cl.DoTimeout(req, resp, 30*time.Second); err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	r := reply{status: resp.StatusCode(), body: append([]byte(nil), resp.Body()...), header: map[string]string{}, requestID: string(resp.Header.Peek(httpapi.HeaderRequestID))}
	for _, k := range []string{httpapi.HeaderVerify, httpapi.HeaderRestart, "Retry-After"} {
		if v := resp.Header.Peek(k); v != nil {
			r.header[k] = string(v)
		}
	}
	c := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(c)
	c.SetKey(h.cookieName)
	if resp.Header.Cookie(c) {
		r.cookie = string(c.Value())
		if c.Expire().Equal(fasthttp.CookieExpireDelete) {
			r.cookie = "-"
		}
	}
	if a != nil && r.cookie != "" {
		a.cookie = r.cookie
		if r.cookie == "-" {
			a.cookie = ""
		}
	}
	return r
}

func (h *harness) post(a *agent, path string, body any) reply {
	h.t.Helper()
	return h.do(a, "POST", path, body, nil)
}

// control calls a control route with the right token.
func (h *harness) control(op string, body any) reply {
	h.t.Helper()
	method := "POST"
	if op == "status" {
		method = "GET"
	}
	return h.do(nil, method, httpapi.ControlPrefix+op, body, map[string]string{"Authorization": "Bearer " + token})
}

// deadline is a deadline_ts a minute ahead on the harness's clock.
func (h *harness) deadline() float64 { return control.UnixSeconds(h.clk.Now().Add(time.Minute)) }

func (h *harness) ok(r reply, what string) map[string]any {
	h.t.Helper()
	if r.status != 200 {
		h.t.Fatalf("%s: status %d: %s", what, r.status, r.body)
	}
	return r.json(h.t)
}

func (h *harness) want(r reply, status int, code, what string) {
	h.t.Helper()
	if r.status != status || r.code() != code {
		h.t.Fatalf("%s: got %d %q (%s), want %d %q", what, r.status, r.code(), r.body, status, code)
	}
}

// sandboxID is the session's current sandbox, from /sandbox_access.
func (h *harness) sandboxID(a *agent) string {
	h.t.Helper()
	m := h.ok(h.post(a, "/sandbox_access", nil), "sandbox_access")
	return m["connection"].(map[string]any)["descriptor"].(map[string]any)["sandbox_id"].(string)
}

func (h *harness) live(id string) bool {
	for _, s := range h.fake().LiveSandboxIDs() {
		if s == id {
			return true
		}
	}
	return false
}

// sessionID is the id part of an agent's cookie.
func sessionID(a *agent) string { return a.cookie[:strings.LastIndexByte(a.cookie, '.')] }

func ep(rollout string, attempt int) map[string]any {
	return map[string]any{"rollout_id": rollout, "attempt": attempt}
}

// blockOn makes the fake hold the next call of op at its start until the
// returned release is called; entered is closed once it is held.
func blockOn(fk *fake.Provider, op fake.Op) (entered <-chan struct{}, release func()) {
	in, out := make(chan struct{}), make(chan struct{})
	var once, rel sync.Once
	fk.SetHook(func(c fake.Call) {
		if c.Op != op || c.Phase != fake.PhaseBegin {
			return
		}
		first := false
		once.Do(func() { first = true })
		if !first {
			return
		}
		close(in)
		<-out
	})
	return in, func() { rel.Do(func() { close(out) }) }
}

// op calls a phased control route with checkpoint_id, a deadline and extra
// fields, and wants a 200.
func (h *harness) op(op, id string, extra map[string]any) map[string]any {
	h.t.Helper()
	body := map[string]any{"checkpoint_id": id, "deadline_ts": h.deadline()}
	for k, v := range extra {
		body[k] = v
	}
	return h.ok(h.control(op, body), op+" "+id)
}

// checkpoint prepares and commits id with dir (admission stays closed
// until a resume).
func (h *harness) checkpoint(id, dir string) map[string]any {
	h.t.Helper()
	if p := h.op("prepare", id, nil); p["phase"] != "prepared" {
		h.t.Fatalf("prepare %s: %v", id, p)
	}
	return h.op("commit", id, map[string]any{"checkpoint_dir": dir})
}

// waitingAppend sends an append that the closed gate holds, and returns
// once it waits there.
func (h *harness) waitingAppend(a *agent, path string) <-chan reply {
	h.t.Helper()
	done := make(chan reply, 1)
	go func() { done <- h.post(a, path, map[string]any{"line": "one"}) }()
	g := h.srv.Gate()
	for ch := g.Changed(); g.Waiting() != 1; ch = g.Changed() {
		<-ch
	}
	return done
}

// heldAppend sends an append that the provider holds in flight (at its
// read) until release is called, and returns once it is held.
func (h *harness) heldAppend(a *agent, path string) (<-chan reply, func()) {
	h.t.Helper()
	entered, release := blockOn(h.fake(), fake.OpReadFile)
	done := make(chan reply, 1)
	go func() { done <- h.post(a, path, map[string]any{"line": "one"}) }()
	<-entered
	return done, release
}
