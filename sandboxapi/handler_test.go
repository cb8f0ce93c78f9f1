package sandboxapi

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/sandbox"
)

// world is a handler over a real local provider, with fates the test sets.
type world struct {
	p      *local.Provider
	tokens *Tokens
	clk    *clock.Manual
	h      *Handler

	mu      sync.Mutex
	fates   map[string]sandbox.Fate
	handles map[string]provider.Handle
}

func newWorld(t *testing.T) *world {
	t.Helper()
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: t.TempDir(), Isolation: local.IsolationNone, Overlay: local.OverlayOff, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Now())
	w := &world{p: p, tokens: newTokens(t, "test-secret", clk), clk: clk, fates: map[string]sandbox.Fate{}, handles: map[string]provider.Handle{}}
	w.h = &Handler{Provider: p, Tokens: w.tokens, Logger: log, MaxBody: 1 << 10, Resolve: func(id string) (provider.Handle, sandbox.Fate) {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.handles[id], w.fates[id]
	}}
	t.Cleanup(func() {
		for _, h := range w.handles {
			_ = p.Stop(context.Background(), h)
		}
	})
	return w
}

// sandbox starts a live sandbox and returns its id and a token for it.
func (w *world) sandbox(t *testing.T) (string, string) {
	t.Helper()
	h, err := w.p.Start(context.Background(), provider.Spec{Files: map[string]string{"notes": "one\n"}})
	if err != nil {
		t.Fatal(err)
	}
	w.mu.Lock()
	w.handles[h.SandboxID], w.fates[h.SandboxID] = h, sandbox.FateLive
	w.mu.Unlock()
	return h.SandboxID, w.tokens.Mint(h.SandboxID, w.clk.Now().Add(time.Hour))
}

func (w *world) setFate(id string, f sandbox.Fate) {
	w.mu.Lock()
	w.fates[id] = f
	w.mu.Unlock()
}

type reply struct {
	Status int
	Body   string
}

// do serves one request straight through Serve.
func (w *world) do(method, uri, token string, body []byte) reply {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod(method)
	ctx.Request.SetRequestURI(uri)
	if token != "" {
		ctx.Request.Header.Set("Authorization", "Bearer "+token)
	}
	ctx.Request.SetBody(body)
	w.h.Serve(&ctx)
	return reply{ctx.Response.StatusCode(), string(ctx.Response.Body())}
}

func errReply(status int, code string) reply {
	return reply{Status: status, Body: code}
}

// codeOf reduces an error reply to its code, checking the envelope.
func codeOf(t *testing.T, r reply) reply {
	t.Helper()
	if r.Status == 200 {
		return r
	}
	var env struct {
		Error struct {
			Code   string `json:"code"`
			Detail string `json:"detail"`
		} `json:"error"`
	}
	dec := json.NewDecoder(strings.NewReader(r.Body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil || env.Error.Code == "" || env.Error.Detail == "" {
		t.Errorf("status %d body %q is not the error envelope (%v)", r.Status, r.Body, err)
	}
	return reply{r.Status, env.Error.Code}
}

func TestExecWithAValidToken(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	r := w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(`{"command":"cat notes; echo err >&2; exit 3","env":{"A":"1"},"cwd":".","timeout_ms":60000}`))
	if r.Status != 200 {
		t.Fatalf("status %d: %s", r.Status, r.Body)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(r.Body), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"stdout": "one\n", "stderr": "err\n", "exit_code": 3.0, "truncated": false}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("exec reply (-want +got):\n%s", d)
	}
	r = w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(`{"command":"sleep 60","timeout_ms":100}`))
	if !strings.Contains(r.Body, `"timed_out":true`) || !strings.Contains(r.Body, `"exit_code":137`) {
		t.Errorf("timeout reply: %d %s", r.Status, r.Body)
	}
	r = w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(`{"command":"echo \"$A\""}`))
	if !strings.Contains(r.Body, `"stdout":"\n"`) {
		t.Errorf("env leaked from a previous request: %s", r.Body)
	}
}

func TestFilesWithAValidToken(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	base := "/sandboxes/" + id + "/files?path="
	if r := w.do("PUT", base+"dir/new.txt", token, []byte("hello")); r.Status != 200 || r.Body != `{"path":"dir/new.txt","size":5}` {
		t.Errorf("PUT: %d %s", r.Status, r.Body)
	}
	if r := w.do("GET", base+"/sandbox/dir/new.txt", token, nil); r != (reply{200, "hello"}) {
		t.Errorf("GET: %+v", r)
	}
	if r := w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(`{"command":"cat dir/new.txt"}`)); !strings.Contains(r.Body, `"stdout":"hello"`) {
		t.Errorf("a command does not see the PUT file: %s", r.Body)
	}
}

func TestSupersededEndedUnknownAndForgedTokens(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	other, otherToken := w.sandbox(t)
	exec := func(id, token string) reply {
		return codeOf(t, w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(`{"command":"echo > ran-`+id+`"}`)))
	}
	forger := newTokens(t, "not-the-secret", w.clk)
	cases := []struct {
		name  string
		id    string
		token string
		want  reply
	}{
		{"no token", id, "", errReply(401, "unauthorized")},
		{"garbage token", id, "garbage", errReply(401, "unauthorized")},
		{"forged with another secret", id, forger.Mint(id, w.clk.Now().Add(time.Hour)), errReply(401, "unauthorized")},
		{"another sandbox's token", id, otherToken, errReply(401, "unauthorized")},
		{"expired", id, w.tokens.Mint(id, w.clk.Now().Add(-time.Second)), errReply(401, "token_expired")},
		{"unknown sandbox", "sb-0000000000000000", w.tokens.Mint("sb-0000000000000000", w.clk.Now().Add(time.Hour)), errReply(404, "sandbox_not_found")},
	}
	for _, c := range cases {
		if got := exec(c.id, c.token); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// A restore superseded the sandbox: its (genuine) token answers 410,
	// and nothing runs in the old sandbox.
	w.setFate(id, sandbox.FateSuperseded)
	if got := exec(id, token); got != errReply(410, "superseded") {
		t.Errorf("superseded: %+v", got)
	}
	if got := codeOf(t, w.do("PUT", "/sandboxes/"+id+"/files?path=x", token, []byte("x"))); got != errReply(410, "superseded") {
		t.Errorf("superseded PUT: %+v", got)
	}
	w.setFate(other, sandbox.FateEnded)
	if got := exec(other, otherToken); got != errReply(410, "ended") {
		t.Errorf("ended: %+v", got)
	}
	for _, sb := range []string{id, other} {
		h := w.handles[sb]
		if _, err := w.p.ReadFile(context.Background(), h, "ran-"+sb); err == nil {
			t.Errorf("a refused request ran in %s", sb)
		}
	}
	// The header's scheme is checked.
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.SetRequestURI("/sandboxes/" + id + "/files?path=notes")
	ctx.Request.Header.Set("Authorization", "Basic "+token)
	w.h.Serve(&ctx)
	if ctx.Response.StatusCode() != 401 || len(ctx.Response.Header.Peek("WWW-Authenticate")) == 0 {
		t.Errorf("Basic scheme: %d", ctx.Response.StatusCode())
	}
}

func TestBadRequests(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	execURI := "/sandboxes/" + id + "/exec"
	filesURI := "/sandboxes/" + id + "/files?path="
	if r := w.do("POST", execURI, token, []byte(`{"command":"mkfifo fifo"}`)); !strings.Contains(r.Body, `"exit_code":0`) {
		t.Fatalf("mkfifo: %s", r.Body)
	}
	cases := []struct {
		name   string
		method string
		uri    string
		body   string
		want   reply
	}{
		{"malformed json", "POST", execURI, `{"command":`, errReply(422, "invalid_request")},
		{"not an object", "POST", execURI, `["ls"]`, errReply(422, "invalid_request")},
		{"empty body", "POST", execURI, ``, errReply(422, "invalid_request")},
		{"null body", "POST", execURI, `null`, errReply(422, "invalid_request")},
		{"trailing data", "POST", execURI, `{"command":"ls"} {}`, errReply(422, "invalid_request")},
		{"unknown field", "POST", execURI, `{"command":"ls","timeout":5}`, errReply(422, "invalid_request")},
		{"wrong type", "POST", execURI, `{"command":["ls"]}`, errReply(422, "invalid_request")},
		{"wrong env type", "POST", execURI, `{"command":"ls","env":{"A":1}}`, errReply(422, "invalid_request")},
		{"no command", "POST", execURI, `{"cwd":"."}`, errReply(422, "invalid_request")},
		{"negative timeout", "POST", execURI, `{"command":"ls","timeout_ms":-1}`, errReply(422, "invalid_request")},
		{"timeout that does not fit", "POST", execURI, `{"command":"ls","timeout_ms":9223372036854}`, errReply(422, "invalid_request")},
		{"timeout over the provider's cap", "POST", execURI, `{"command":"ls","timeout_ms":86400000}`, errReply(422, "invalid_request")},
		{"bad env key", "POST", execURI, `{"command":"ls","env":{"A=B":"1"}}`, errReply(422, "invalid_request")},
		{"cwd escape", "POST", execURI, `{"command":"ls","cwd":"../.."}`, errReply(400, "path_escape")},
		{"missing cwd", "POST", execURI, `{"command":"ls","cwd":"nope"}`, errReply(422, "invalid_cwd")},
		{"oversized exec body", "POST", execURI, `{"command":"` + strings.Repeat("x", 2000) + `"}`, errReply(413, "body_too_large")},
		{"oversized file", "PUT", filesURI + "big", strings.Repeat("x", 1025), errReply(413, "body_too_large")},
		{"file escape ..", "GET", filesURI + "../../etc/passwd", "", errReply(400, "path_escape")},
		{"file escape absolute", "PUT", filesURI + "/etc/evil", "x", errReply(400, "path_escape")},
		{"no path", "GET", filesURI, "", errReply(400, "bad_request")},
		{"missing file", "GET", filesURI + "nope", "", errReply(404, "file_not_found")},
		{"a directory", "GET", filesURI + ".", "", errReply(422, "is_a_directory")},
		{"write over a directory", "PUT", filesURI + ".", "x", errReply(422, "is_a_directory")},
		{"a file as a directory", "GET", filesURI + "notes/x", "", errReply(422, "not_a_directory")},
		{"write under a file", "PUT", filesURI + "notes/x", "x", errReply(422, "not_a_directory")},
		{"a name too long", "GET", filesURI + strings.Repeat("n", 300), "", errReply(400, "name_too_long")},
		{"write a name too long", "PUT", filesURI + strings.Repeat("n", 300), "x", errReply(400, "name_too_long")},
		{"a FIFO", "GET", filesURI + "fifo", "", errReply(422, "not_a_file")},
		{"cwd a file", "POST", execURI, `{"command":"ls","cwd":"notes"}`, errReply(422, "invalid_cwd")},
		{"exec by GET", "GET", execURI, "", errReply(405, "method_not_allowed")},
		{"files by DELETE", "DELETE", filesURI + "notes", "", errReply(405, "method_not_allowed")},
		{"unknown route", "POST", "/sandboxes/" + id + "/shell", "", errReply(404, "not_found")},
		{"no sandbox id", "POST", "/sandboxes//exec", "", errReply(404, "not_found")},
		{"bare prefix", "GET", "/sandboxes/", "", errReply(404, "not_found")},
	}
	for _, c := range cases {
		if got := codeOf(t, w.do(c.method, c.uri, token, []byte(c.body))); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
	// The oversized file was not written.
	if got := codeOf(t, w.do("GET", filesURI+"big", token, nil)); got != errReply(404, "file_not_found") {
		t.Errorf("an oversized PUT left a file: %+v", got)
	}
}

func TestSplitPath(t *testing.T) {
	cases := map[string][3]string{
		"/sandboxes/sb-1/exec":      {"sb-1", "exec", "true"},
		"/sandboxes/sb-1/files":     {"sb-1", "files", "true"},
		"/sandboxes/sb-1/files/x":   {"sb-1", "files/x", "true"},
		"/sandboxes/sb-1":           {"", "", "false"},
		"/sandboxes/sb-1/":          {"", "", "false"},
		"/sandboxes//exec":          {"", "", "false"},
		"/other/sb-1/exec":          {"", "", "false"},
		"/ng-rollout/k/sandboxes/x": {"", "", "false"},
	}
	for in, want := range cases {
		id, rest, ok := SplitPath(in)
		if got := [3]string{id, rest, map[bool]string{true: "true", false: "false"}[ok]}; got != want {
			t.Errorf("SplitPath(%q) = %v, want %v", in, got, want)
		}
	}
}

// Over a real (in-memory) fasthttp server, as an agent would call it, with
// the server's own body limit answering 413 too.
func TestOverAServer(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{
		Handler:            w.h.Serve,
		MaxRequestBodySize: 1 << 16,
		ErrorHandler: func(ctx *fasthttp.RequestCtx, err error) {
			ctx.SetStatusCode(fasthttp.StatusRequestEntityTooLarge)
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	client := &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}
	call := func(method, path string, body []byte) (int, []byte) {
		req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
		defer fasthttp.ReleaseRequest(req)
		defer fasthttp.ReleaseResponse(resp)
		req.Header.SetMethod(method)
		req.SetRequestURI("http://sandbox.test" + path)
		req.Header.Set("Authorization", "Bearer "+token)
		req.SetBody(body)
		if err := client.DoTimeout(req, resp, 30*time.Second); err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		return resp.StatusCode(), bytes.Clone(resp.Body())
	}
	if st, body := call("POST", "/sandboxes/"+id+"/exec", []byte(`{"command":"echo hi"}`)); st != 200 || !strings.Contains(string(body), `"stdout":"hi\n"`) {
		t.Errorf("exec over the wire: %d %s", st, body)
	}
	if st, body := call("GET", "/sandboxes/"+id+"/files?path=notes", nil); st != 200 || string(body) != "one\n" {
		t.Errorf("GET over the wire: %d %q", st, body)
	}
	// Over the server's own limit: announce a body past it and read the
	// answer before sending any of it (a client still writing the body when
	// the server closes the connection would see the close, not the 413).
	conn, err := ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /sandboxes/%s/files?path=x HTTP/1.1\r\nHost: sandbox.test\r\nAuthorization: Bearer %s\r\nContent-Length: %d\r\n\r\n", id, token, 1<<17)
	var resp fasthttp.Response
	if err := resp.Read(bufio.NewReader(conn)); err != nil {
		t.Fatalf("reading the answer to an oversized body: %v", err)
	}
	if resp.StatusCode() != 413 {
		t.Errorf("over the server's limit: %d", resp.StatusCode())
	}
}

func TestAnUnconfiguredHandlerAnswers500(t *testing.T) {
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/sandboxes/sb-1/exec")
	(&Handler{}).Serve(&ctx)
	if ctx.Response.StatusCode() != 500 || !strings.Contains(string(ctx.Response.Body()), `"code":"internal"`) {
		t.Errorf("%d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
}

// Exec calls and file writes pass the Admit hook and leave it when done;
// reads do not; a refusal is answered with its status and code.
func TestExecAndWritesAreAdmitted(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	var admitted, left []string
	var refuse error
	w.h.Admit = func(_ context.Context, sandboxID string) (func(), error) {
		if refuse != nil {
			return nil, refuse
		}
		admitted = append(admitted, sandboxID)
		return func() { left = append(left, sandboxID) }, nil
	}
	base := "/sandboxes/" + id
	w.do("POST", base+"/exec", token, []byte(`{"command":"true"}`))
	w.do("PUT", base+"/files?path=f", token, []byte("x"))
	w.do("GET", base+"/files?path=f", token, nil)
	if diff := cmp.Diff([]string{id, id}, admitted); diff != "" {
		t.Errorf("admitted (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(admitted, left); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
	refuse = control.ErrAdmissionClosed.With("closed")
	if got := codeOf(t, w.do("POST", base+"/exec", token, []byte(`{"command":"true"}`))); got != errReply(409, "admission_closed") {
		t.Errorf("refused exec: %+v", got)
	}
	refuse = errors.New("other")
	if got := codeOf(t, w.do("PUT", base+"/files?path=f", token, []byte("y"))); got != errReply(503, "unavailable") {
		t.Errorf("refused write: %+v", got)
	}
	if got := w.do("GET", base+"/files?path=f", token, nil); got != (reply{200, "x"}) {
		t.Errorf("a read while calls are refused: %+v", got)
	}
}

// A file read is streamed: the server holds a buffer at a time, not the
// file (four parallel reads of a 250 MB file used to take it to 3.3 GB),
// and a file over the provider's cap is 413 file_too_large.
func TestFileReadsAreStreamedAndCapped(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	const size = 32 << 20
	if r := w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(fmt.Sprintf(`{"command":"head -c %d /dev/zero > big; head -c %d /dev/zero > over"}`, size, local.DefaultMaxFileBytes+1))); r.Status != 200 {
		t.Fatalf("exec: %+v", r)
	}
	if got := codeOf(t, w.do("GET", "/sandboxes/"+id+"/files?path=over", token, nil)); got != errReply(413, "file_too_large") {
		t.Errorf("a file over the cap: %+v", got)
	}

	ln := fasthttputil.NewInmemoryListener()
	srv := &fasthttp.Server{Handler: w.h.Serve}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	conn, err := ln.Dial()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fmt.Fprintf(conn, "GET /sandboxes/%s/files?path=big HTTP/1.1\r\nHost: sandbox.test\r\nAuthorization: Bearer %s\r\n\r\n", id, token)
	br := bufio.NewReader(conn)
	var head fasthttp.ResponseHeader
	if err := head.Read(br); err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, io.LimitReader(br, int64(head.ContentLength())))
	runtime.ReadMemStats(&after)
	if err != nil || head.StatusCode() != 200 || n != size {
		t.Fatalf("GET big: status %d, %d bytes (%v)", head.StatusCode(), n, err)
	}
	// Reading the file whole allocates at least its size; streamed, the
	// copies' buffers (which -race keeps from being pooled) a third of it.
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > size/2 {
		t.Errorf("serving a %d-byte file allocated %d bytes: it was not streamed", size, alloc)
	}
}
