package opensandboxtest_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// TestWireScripts runs the exchanges of testdata/wire/*.txt against the
// fake, each on a new server with a manual clock: what a client sends and
// what it must get back, one line each.
//
//	# a comment
//	options create=2s snapshot=10s lower   (before the first request)
//	POST /v1/sandboxes {"image":...}       (a request; @name is a captured value; a path
//	                                        without its leading / is host:port/..., an endpoint)
//	=> 202 status.state=Running id->a      (the answer: status, then checks)
//	upload @a /w/x.txt hello               (execd's multipart upload of one file)
//	advance 10s | failcreates 1 | failsnapshots 1 | terminate @a
//	token T | token -                       (X-EXECD-ACCESS-TOKEN on the requests that follow, or none)
//	reassign @a @b                          (b's execd answers at a's direct endpoint)
//	options runtimetoken=T                  (the endpoints name execd's token T, as a runtime that set it)
//	fault POST /v1/sandboxes status=503 retry=2 times=2 after drop
//	stats Created=2 Requests.POST\ /sandboxes=3   (the server's counters)
//	bodies POST /sandboxes 2                      (JSON bodies recorded on a route)
//	violations 1                                  (departures from the spec recorded)
//
// A check is path=value (a dotted path into the JSON answer, an index for
// an array; the value as JSON would print it, strings bare), path#=n (the
// length of an array or object), !path (absent), h.Name=value (a header),
// path->name (captures a string), or ~text, the rest of the line, which the
// raw answer must contain. "=> dropped" expects the connection closed.
func TestWireScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/wire/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".txt"), func(t *testing.T) { runWire(t, f) })
	}
}

type wire struct {
	t    *testing.T
	srv  *opensandboxtest.Server
	clk  *clock.Manual
	opts opensandboxtest.Options
	vars map[string]string
	// token goes in X-EXECD-ACCESS-TOKEN ("" for none).
	token string
	// last answer
	status  int
	dropped bool
	header  http.Header
	raw     []byte
	body    any
}

func runWire(t *testing.T, name string) {
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &wire{t: t, clk: clock.NewManual(t0), vars: map[string]string{}}
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		w.step(fmt.Sprintf("%s:%d", name, n), line)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

func (w *wire) server() *opensandboxtest.Server {
	if w.srv == nil {
		w.opts.Clock, w.opts.APIKey = w.clk, key
		w.srv = opensandboxtest.NewServer(w.opts)
		w.t.Cleanup(w.srv.Close)
	}
	return w.srv
}

// captured is @name: a value a check captured.
var captured = regexp.MustCompile(`@[a-z0-9]+`)

func (w *wire) expand(s string) string {
	return captured.ReplaceAllStringFunc(s, func(name string) string {
		v, ok := w.vars[name[1:]]
		if !ok {
			w.t.Fatalf("%s is not captured", name)
		}
		return v
	})
}

func (w *wire) step(at, line string) {
	t := w.t
	verb, rest, _ := strings.Cut(line, " ")
	switch verb {
	case "options":
		if w.srv != nil {
			t.Fatalf("%s: options after the first request", at)
		}
		for _, o := range strings.Fields(rest) {
			k, v, _ := strings.Cut(o, "=")
			switch k {
			case "create":
				w.opts.CreateLatency = duration(t, at, v)
			case "snapshot":
				w.opts.SnapshotLatency = duration(t, at, v)
			case "lower":
				w.opts.LowerCaseStates = true
			case "runtimetoken":
				w.opts.ExecdHeaders = map[string]string{opensandboxtest.ExecdTokenHeader: v}
			default:
				t.Fatalf("%s: unknown option %q", at, k)
			}
		}
	case "GET", "POST", "DELETE", "PATCH", "PUT":
		path, body, _ := strings.Cut(w.expand(rest), " ")
		w.do(at, verb, path, "application/json", []byte(body))
	case "upload":
		args := strings.SplitN(w.expand(rest), " ", 3)
		if len(args) != 3 {
			t.Fatalf("%s: upload SANDBOX PATH CONTENT", at)
		}
		var buf bytes.Buffer
		mw := multipart.NewWriter(&buf)
		meta, _ := json.Marshal(map[string]string{"path": args[1]})
		p, _ := mw.CreateFormFile("metadata", "metadata")
		p.Write(meta)
		p, _ = mw.CreateFormFile("file", "file")
		p.Write([]byte(args[2]))
		mw.Close()
		w.do(at, "POST", "/direct/"+args[0]+"/proxy/44772/files/upload", mw.FormDataContentType(), buf.Bytes())
	case "=>":
		w.expect(at, strings.Fields(w.expandChecks(rest)))
	case "advance":
		w.server()
		w.clk.Advance(duration(t, at, rest))
	case "failcreates", "failsnapshots":
		n, err := strconv.Atoi(rest)
		if err != nil {
			t.Fatalf("%s: %v", at, err)
		}
		if verb == "failcreates" {
			w.server().FailNextCreates(n)
		} else {
			w.server().FailNextSnapshots(n)
		}
	case "terminate":
		w.server().Terminate(strings.Fields(w.expand(rest))...)
	case "token":
		w.token = w.expand(rest)
		if w.token == "-" {
			w.token = ""
		}
	case "reassign":
		ids := strings.Fields(w.expand(rest))
		if len(ids) != 2 {
			t.Fatalf("%s: reassign FROM TO", at)
		}
		w.server().Reassign(ids[0], ids[1])
	case "fault":
		fs := strings.Fields(rest)
		if len(fs) < 2 {
			t.Fatalf("%s: fault METHOD PATH ...", at)
		}
		f := opensandboxtest.Fault{Path: fs[1]}
		if fs[0] != "*" {
			f.Method = fs[0]
		}
		for _, o := range fs[2:] {
			k, v, _ := strings.Cut(o, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "status":
				f.Status = n
			case "retry":
				f.RetryAfter = n
			case "times":
				f.Times = n
			case "after":
				f.AfterEffect = true
			case "drop":
				f.Drop = true
			default:
				t.Fatalf("%s: unknown fault option %q", at, k)
			}
		}
		w.server().Inject(f)
	case "stats":
		b, _ := json.Marshal(w.server().Stats())
		var m any
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.UseNumber()
		_ = dec.Decode(&m)
		for _, c := range splitEscaped(rest) {
			w.check(at, m, c)
		}
	case "bodies":
		i := strings.LastIndexByte(rest, ' ')
		route, n := rest[:max(i, 0)], rest[i+1:]
		if got := len(w.server().Requests(route)); strconv.Itoa(got) != n {
			t.Errorf("%s: %d bodies recorded on %q, want %s", at, got, route, n)
		}
	case "violations":
		if got := w.server().Violations(); strconv.Itoa(len(got)) != rest {
			t.Errorf("%s: violations %q, want %s", at, got, rest)
		}
	default:
		t.Fatalf("%s: unknown step %q", at, verb)
	}
}

func duration(t *testing.T, at, s string) time.Duration {
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Fatalf("%s: %v", at, err)
	}
	return d
}

// splitEscaped splits on spaces not escaped by a backslash.
func splitEscaped(s string) []string {
	var out []string
	var cur strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '\\' && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case s[i] == ' ':
			if cur.Len() > 0 {
				out = append(out, cur.String())
				cur.Reset()
			}
		default:
			cur.WriteByte(s[i])
		}
	}
	if cur.Len() > 0 {
		out = append(out, cur.String())
	}
	return out
}

// expandChecks expands @name in the values of checks, but not in the
// "->name" of a capture.
func (w *wire) expandChecks(s string) string {
	if i := strings.Index(s, "~"); i >= 0 {
		return w.expand(s[:i]) + s[i:]
	}
	return w.expand(s)
}

func (w *wire) do(at, method, path, contentType string, body []byte) {
	srv := w.server()
	url := srv.URL + path
	if !strings.HasPrefix(path, "/") {
		url = "http://" + path // an endpoint as the server hands it out
	}
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		w.t.Fatalf("%s: %v", at, err)
	}
	req.Header.Set(opensandboxtest.APIKeyHeader, key)
	if len(body) > 0 {
		req.Header.Set("Content-Type", contentType)
	}
	if w.token != "" {
		req.Header.Set(opensandboxtest.ExecdTokenHeader, w.token)
	}
	w.status, w.dropped, w.header, w.raw, w.body = 0, false, nil, nil, nil
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		w.dropped = true
		return
	}
	defer res.Body.Close()
	w.status, w.header = res.StatusCode, res.Header
	w.raw, _ = io.ReadAll(res.Body)
	if len(w.raw) > 0 && (w.raw[0] == '{' || w.raw[0] == '[') {
		dec := json.NewDecoder(bytes.NewReader(w.raw))
		dec.UseNumber()
		if err := dec.Decode(&w.body); err != nil {
			w.body = nil
		}
	}
}

func (w *wire) expect(at string, checks []string) {
	t := w.t
	if len(checks) == 0 {
		t.Fatalf("%s: => needs a status", at)
	}
	if checks[0] == "dropped" {
		if !w.dropped {
			t.Errorf("%s: answered %d %s, want the connection dropped", at, w.status, w.raw)
		}
		return
	}
	if w.dropped || strconv.Itoa(w.status) != checks[0] {
		t.Errorf("%s: status %d (dropped %v), want %s; answer %s", at, w.status, w.dropped, checks[0], w.raw)
	}
	for i, c := range checks[1:] {
		if strings.HasPrefix(c, "~") {
			text := strings.Join(checks[i+1:], " ")[1:]
			if !bytes.Contains(w.raw, []byte(text)) {
				t.Errorf("%s: answer %s does not contain %s", at, w.raw, text)
			}
			return
		}
		if h, ok := strings.CutPrefix(c, "h."); ok {
			k, v, _ := strings.Cut(h, "=")
			if got := w.header.Get(k); got != v {
				t.Errorf("%s: header %s %q, want %q", at, k, got, v)
			}
			continue
		}
		w.check(at, w.body, c)
	}
}

// check tests one check on v.
func (w *wire) check(at string, v any, c string) {
	t := w.t
	if p, name, ok := strings.Cut(c, "->"); ok {
		got, found := lookup(v, p)
		s, isString := got.(string)
		if !found || !isString {
			t.Fatalf("%s: %s is %v, want a string to capture", at, p, got)
		}
		w.vars[name] = s
		return
	}
	if p, ok := strings.CutPrefix(c, "!"); ok {
		if got, found := lookup(v, p); found {
			t.Errorf("%s: %s is %v, want it absent", at, p, got)
		}
		return
	}
	if p, n, ok := strings.Cut(c, "#="); ok {
		got, _ := lookup(v, p)
		l := -1
		switch g := got.(type) {
		case []any:
			l = len(g)
		case map[string]any:
			l = len(g)
		}
		if strconv.Itoa(l) != n {
			t.Errorf("%s: %s has %d elements, want %s (%v)", at, p, l, n, got)
		}
		return
	}
	p, want, ok := strings.Cut(c, "=")
	if !ok {
		t.Fatalf("%s: check %q is none of path=value, path#=n, !path, path->name", at, c)
	}
	got, found := lookup(v, p)
	if !found {
		t.Errorf("%s: %s absent, want %s (answer %s)", at, p, want, w.raw)
		return
	}
	if s := render(got); s != want {
		t.Errorf("%s: %s = %s, want %s", at, p, s, want)
	}
}

func lookup(v any, path string) (any, bool) {
	for _, k := range strings.Split(path, ".") {
		switch c := v.(type) {
		case map[string]any:
			var ok bool
			if v, ok = c[k]; !ok {
				return nil, false
			}
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i < 0 || i >= len(c) {
				return nil, false
			}
			v = c[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func render(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}
