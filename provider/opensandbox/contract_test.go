package opensandbox_test

// The lifecycle contract suite: every call the provider makes and every
// answer it must handle, run against the project's fake server and against
// the real OpenSandbox (../shared/opensandbox/stack.sh: its lifecycle server
// from source, the Docker runtime, execd in every sandbox). Where the two
// differ the real one is right and the fake follows it.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// TestMain runs the contract tests side by side: each mostly waits on the
// real stack (a create, a state, a capture: a minute or two apiece under
// load), not on the CPU, and go test's default of GOMAXPROCS (2 here) ran
// them two at a time (327 s for the package at load 15-33, 17 CPU-s).
func TestMain(m *testing.M) {
	flag.Parse()
	testparallel.AtLeast(8)
	os.Exit(m.Run())
}

// realStack is brought up once per test binary, when a test first asks.
var realStack = sync.OnceValues(osstack.Up)

// hangGuard bounds each wait of these tests for a server's state, answer or
// file: a guard against a hang, never a pace. On the real stack a minute
// is within a loaded machine's reach (TestContractExitedSandboxes' two
// starts and waits took 68 s at load 22-39).
const hangGuard = 10 * time.Minute

// server is one lifecycle server the suite runs against.
type server struct {
	name   string
	url    string // http://host:port; the API is under /v1
	domain string
	key    string
	image  string
	fake   *opensandboxtest.Server // nil for the real one
	// clk is the fake's clock (nil for the real one).
	clk *heldClock
	// run labels every sandbox of one test, so that lists are filtered to
	// it and leftovers can be found.
	run string
}

// eachServer runs f against the fake server and the real stack (skipped in
// one line where the stack cannot run, failed in CI when it does not come
// up).
func eachServer(t *testing.T, f func(t *testing.T, s *server)) {
	t.Run("fake", func(t *testing.T) {
		clk := &heldClock{}
		srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: key, SnapshotLatency: 300 * time.Millisecond, Clock: clk})
		t.Cleanup(srv.Close)
		f(t, &server{name: "fake", url: srv.URL, domain: srv.Domain, key: key, image: "debian", fake: srv, clk: clk, run: newRun()})
	})
	t.Run("real", func(t *testing.T) {
		st, err := realStack()
		st = osstack.Require(t, st, err)
		s := &server{name: "real", url: st.URL, domain: st.Domain, key: st.APIKey, image: st.Image, run: newRun()}
		t.Cleanup(func() { s.cleanup(t) })
		f(t, s)
	})
}

// heldClock is real time that a test can hold still (the fake's states
// follow it): a snapshot taken while it is held stays Creating however
// long a loaded machine takes between two requests, instead of the 300 ms
// of its capture, which 8 tests side by side at load 30 outran.
type heldClock struct {
	clock.Real
	mu   sync.Mutex
	held bool
	at   time.Time     // the time held
	lag  time.Duration // how far behind real time it runs
}

func (c *heldClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held {
		return c.at
	}
	return time.Now().Add(-c.lag)
}

// holdTime holds the fake's clock still until the returned release (on
// the real server, nothing).
func (s *server) holdTime() (release func()) {
	c := s.clk
	if c == nil {
		return func() {}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.held = time.Now().Add(-c.lag), true
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.lag, c.held = time.Since(c.at), false
	}
}

func newRun() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "c" + hex.EncodeToString(b)
}

// call makes one lifecycle request with the API key (hdr overrides;
// an empty value removes a header) and decodes a JSON answer.
func (s *server) call(t *testing.T, method, path string, body any, hdr ...string) (int, map[string]any, http.Header) {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, ok := body.(string)
		if !ok {
			j, _ := json.Marshal(body)
			b = string(j)
		}
		r = strings.NewReader(b)
	}
	req, err := http.NewRequest(method, s.url+path, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(opensandbox.APIKeyHeader, s.key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	res, b := s.send(t, req)
	var m map[string]any
	if len(bytes.TrimSpace(b)) > 0 {
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: answer %q is not a JSON object: %v", method, path, b, err)
		}
	}
	return res.StatusCode, m, res.Header
}

// send does req and reads its answer. The real server answers a list or a
// get with a bare 500 when a container's image is deleted while it reads
// it (another test's snapshot going): a safe request that gets one is
// sent again, as the provider's client does, until the deletes let it
// through (on a loaded machine a run of them outlasted five tries) or
// hangGuard passes.
func (s *server) send(t *testing.T, req *http.Request) (*http.Response, []byte) {
	t.Helper()
	bound := time.Now().Add(hangGuard)
	for attempt := 1; ; attempt++ {
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		racedDelete := req.Method == http.MethodGet && res.StatusCode == http.StatusInternalServerError && !json.Valid(b)
		if !racedDelete || time.Now().After(bound) {
			return res, b
		}
		t.Logf("%s %s: a bare 500 (attempt %d), sent again", req.Method, req.URL.Path, attempt)
		time.Sleep(time.Duration(min(attempt, 5)) * 200 * time.Millisecond)
	}
}

// createBody is a create request in the provider's form.
func (s *server) createBody(extra map[string]any) map[string]any {
	b := map[string]any{
		"image":          map[string]any{"uri": s.image},
		"entrypoint":     []string{"tail", "-f", "/dev/null"},
		"timeout":        600,
		"resourceLimits": map[string]string{"cpu": "500m", "memory": "256Mi"},
		"metadata":       map[string]string{"contract.run": s.run},
	}
	for k, v := range extra {
		if v == nil {
			delete(b, k)
		} else {
			b[k] = v
		}
	}
	return b
}

// create makes a sandbox and deletes it when the test ends.
func (s *server) create(t *testing.T, extra map[string]any) map[string]any {
	t.Helper()
	st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(extra))
	if st != http.StatusAccepted {
		t.Fatalf("create: %d %v", st, m)
	}
	id := m["id"].(string)
	t.Cleanup(func() { s.call(t, http.MethodDelete, "/v1/sandboxes/"+id, nil) })
	return m
}

// cleanup deletes what a test on the real server left: sandboxes of its
// run, then their snapshots.
func (s *server) cleanup(t *testing.T) {
	q := url.Values{"metadata": {"contract.run=" + s.run}, "pageSize": {"200"}}
	_, m := s.list(t, q)
	items, _ := m["items"].([]any)
	var sources []string
	for _, it := range items {
		id := it.(map[string]any)["id"].(string)
		sources = append(sources, id)
		s.call(t, http.MethodDelete, "/v1/sandboxes/"+id, nil)
	}
	for _, id := range sources {
		_, m, _ := s.call(t, http.MethodGet, "/v1/snapshots?sandboxId="+id, nil)
		items, _ := m["items"].([]any)
		for _, it := range items {
			s.call(t, http.MethodDelete, "/v1/snapshots/"+it.(map[string]any)["id"].(string), nil)
		}
	}
}

func stateOf(m map[string]any) string {
	st, _ := m["status"].(map[string]any)
	s, _ := st["state"].(string)
	return s
}

// waitState polls a sandbox or snapshot until its state is one of want, or
// a minute passes (a wide bound: the real server takes about a second).
func (s *server) waitState(t *testing.T, path string, want ...string) map[string]any {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st, m, _ := s.call(t, http.MethodGet, path, nil)
		if st == http.StatusOK {
			for _, w := range want {
				if stateOf(m) == w {
					return m
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %v, want state %v", path, st, m, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// execdUp waits until the sandbox's execd answers /ping (a create answers
// Running before execd listens), for at most hangGuard.
func (s *server) execdUp(t *testing.T, id string) {
	t.Helper()
	_, m, _ := s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/44772", nil)
	ep := asString(m["endpoint"])
	deadline := time.Now().Add(hangGuard)
	for {
		res, err := http.Get("http://" + ep + "/ping")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("execd of %s at %s did not answer: %v", id, ep, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isCodeError checks the server's own error shape, {code, message}.
func isCodeError(t *testing.T, what string, st int, m map[string]any, wantStatus int, code string) {
	t.Helper()
	if st != wantStatus || m["code"] != code || m["message"] == nil {
		t.Errorf("%s: %d %v, want %d {code: %s, message}", what, st, m, wantStatus, code)
	}
}

// isValidationError checks FastAPI's shape, 422 {detail: [...]}.
func isValidationError(t *testing.T, what string, st int, m map[string]any) {
	t.Helper()
	d, ok := m["detail"].([]any)
	if st != http.StatusUnprocessableEntity || !ok || len(d) == 0 {
		t.Errorf("%s: %d %v, want 422 {detail: [...]}", what, st, m)
	}
}

func TestContractAuthAndErrorShapes(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		st, m, _ := s.call(t, http.MethodGet, "/v1/sandboxes", nil, opensandbox.APIKeyHeader, "")
		isCodeError(t, "no API key", st, m, http.StatusUnauthorized, "MISSING_API_KEY")
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes", nil, opensandbox.APIKeyHeader, "wrong")
		isCodeError(t, "wrong API key", st, m, http.StatusUnauthorized, "INVALID_API_KEY")

		for _, tc := range []struct {
			why  string
			body any
		}{
			{"bad JSON", `{"image":`},
			{"no entrypoint", s.createBody(map[string]any{"entrypoint": nil})},
			{"timeout below 60", s.createBody(map[string]any{"timeout": 59})},
			{"image and snapshotId both", s.createBody(map[string]any{"snapshotId": "x"})},
		} {
			st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes", tc.body)
			isValidationError(t, tc.why, st, m)
		}
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes?pageSize=0", nil)
		isValidationError(t, "pageSize=0", st, m)

		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"metadata": map[string]string{"bad key!": "x"}}))
		isCodeError(t, "bad metadata key", st, m, http.StatusBadRequest, "SANDBOX::INVALID_METADATA_LABEL")

		st, m, _ = s.call(t, http.MethodGet, "/v1/no-such-route", nil)
		if st != http.StatusNotFound || m["detail"] != "Not Found" {
			t.Errorf("unknown route: %d %v, want 404 {detail: Not Found}", st, m)
		}
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/no-such-sandbox", nil)
		isCodeError(t, "get of a sandbox that never was", st, m, http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
		st, m, _ = s.call(t, http.MethodGet, "/v1/snapshots/no-such-snapshot", nil)
		isCodeError(t, "get of a snapshot that never was", st, m, http.StatusNotFound, "SNAPSHOT::NOT_FOUND")
		st, m = s.list(t, url.Values{"state": {"bogus"}})
		if items, _ := m["items"].([]any); st != http.StatusOK || len(items) != 0 {
			t.Errorf("list ?state=bogus: %d %v, want 200 and empty", st, m)
		}
	})
}

func TestContractSandboxLifecycle(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		// Create answers 202 with the sandbox already Running.
		first := s.create(t, map[string]any{"metadata": map[string]string{"contract.run": s.run, "role": "first"}})
		if stateOf(first) != "Running" {
			t.Errorf("create answered %s, want Running", stateOf(first))
		}
		id := first["id"].(string)
		second := s.create(t, map[string]any{"metadata": map[string]string{"contract.run": s.run, "role": "second"}})

		st, m, _ := s.call(t, http.MethodGet, "/v1/sandboxes/"+id, nil)
		if st != http.StatusOK || m["image"].(map[string]any)["uri"] != s.image || m["metadata"].(map[string]any)["role"] != "first" {
			t.Errorf("get: %d %v", st, m)
		}

		// Lists are filtered by metadata on the server, newest first.
		q := url.Values{"metadata": {"contract.run=" + s.run}}
		_, m = s.list(t, q)
		if diff := cmp.Diff([]string{second["id"].(string), id}, ids(m)); diff != "" {
			t.Errorf("list by metadata, newest first (-want +got):\n%s", diff)
		}
		q = url.Values{"metadata": {"contract.run=" + s.run + "&role=first"}, "state": {"Running"}}
		_, m = s.list(t, q)
		if diff := cmp.Diff([]string{id}, ids(m)); diff != "" {
			t.Errorf("list by two labels and a state (-want +got):\n%s", diff)
		}

		// The endpoint of execd: no scheme, a path, no headers (the Docker
		// runtime's execd has no access token), and execd answers a call
		// that carries none; the server-proxy form has no /v1.
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/44772", nil)
		ep, _ := m["endpoint"].(string)
		if st != http.StatusOK || ep == "" || strings.Contains(ep, "://") || !strings.Contains(ep, "/") {
			t.Errorf("endpoint: %d %v, want host:port/path without a scheme", st, m)
		}
		if _, ok := m["headers"]; ok {
			t.Errorf("endpoint: %v, want no headers", m)
		}
		s.execdUp(t, id)
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=true", nil)
		if want := "/sandboxes/" + id + "/proxy/44772"; st != http.StatusOK || !strings.HasSuffix(asString(m["endpoint"]), want) || m["headers"] != nil {
			t.Errorf("proxy endpoint: %d %v, want host:port%s and no headers", st, m, want)
		}
		res, err := http.Get("http://" + asString(m["endpoint"]) + "/ping")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("execd's /ping through the server proxy with no headers: %d, want 200", res.StatusCode)
		}
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/0", nil)
		isCodeError(t, "endpoint of port 0", st, m, http.StatusBadRequest, "DOCKER::INVALID_PORT")
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/abc", nil)
		isValidationError(t, "endpoint of port abc", st, m)
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id+"/endpoints/44772?use_server_proxy=bogus", nil)
		isValidationError(t, "use_server_proxy=bogus", st, m)

		// Renew: 200 with the new expiry; into the past 400.
		at := time.Now().Add(20 * time.Minute).UTC().Truncate(time.Second)
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/renew-expiration", map[string]string{"expiresAt": at.Format(time.RFC3339)})
		if got, _ := time.Parse(time.RFC3339Nano, asString(m["expiresAt"])); st != http.StatusOK || !got.Equal(at) {
			t.Errorf("renew: %d %v, want 200 expiresAt %s", st, m, at)
		}
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/renew-expiration", map[string]string{"expiresAt": time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)})
		if st != http.StatusBadRequest {
			t.Errorf("renew into the past: %d %v, want 400", st, m)
		}

		// A metadata merge patch: null removes a label.
		st, m, _ = s.call(t, http.MethodPatch, "/v1/sandboxes/"+id+"/metadata", map[string]any{"role": nil, "added": "yes"})
		if diff := cmp.Diff(map[string]any{"contract.run": s.run, "added": "yes"}, m["metadata"]); st != http.StatusOK || diff != "" {
			t.Errorf("metadata patch: %d (-want +got):\n%s", st, diff)
		}

		// Pause, a second pause (500), resume, resume of a running one (409).
		if st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/pause", nil); st != http.StatusAccepted || m != nil {
			t.Errorf("pause: %d %v, want 202 with an empty body", st, m)
		}
		s.waitState(t, "/v1/sandboxes/"+id, "Paused")
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/pause", nil)
		if st != http.StatusInternalServerError {
			t.Errorf("second pause: %d %v, want 500", st, m)
		}
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/snapshots", map[string]string{})
		isCodeError(t, "snapshot of a paused sandbox", st, m, http.StatusConflict, "SNAPSHOT::INVALID_SOURCE_STATE")
		if st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil); st != http.StatusAccepted {
			t.Errorf("resume: %d %v", st, m)
		}
		s.waitState(t, "/v1/sandboxes/"+id, "Running")
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/resume", nil)
		isCodeError(t, "resume of a running sandbox", st, m, http.StatusConflict, "DOCKER::SANDBOX_NOT_PAUSED")

		// Delete: 204, then 404 for everything.
		if st, _, _ := s.call(t, http.MethodDelete, "/v1/sandboxes/"+id, nil); st != http.StatusNoContent {
			t.Errorf("delete: %d", st)
		}
		st, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+id, nil)
		isCodeError(t, "get after delete", st, m, http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
		st, m, _ = s.call(t, http.MethodDelete, "/v1/sandboxes/"+id, nil)
		isCodeError(t, "delete twice", st, m, http.StatusNotFound, "DOCKER::SANDBOX_NOT_FOUND")
	})
}

// TestContractExitedSandboxes: an entrypoint that exits leaves the sandbox
// listed, Terminated (exit 0) or Failed (non-zero), until it is deleted.
// Its lease is renewed as a running one's is: a renewal says nothing of a
// sandbox's state.
func TestContractExitedSandboxes(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		for entry, want := range map[string]string{"true": "Terminated", "false": "Failed"} {
			id := s.create(t, map[string]any{"entrypoint": []string{entry}})["id"].(string)
			s.waitState(t, "/v1/sandboxes/"+id, want)
			st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/snapshots", map[string]string{})
			isCodeError(t, "snapshot of a "+want+" sandbox", st, m, http.StatusConflict, "SNAPSHOT::INVALID_SOURCE_STATE")
			at := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
			st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/renew-expiration", map[string]string{"expiresAt": at.Format(time.RFC3339)})
			if got, _ := time.Parse(time.RFC3339Nano, asString(m["expiresAt"])); st != http.StatusOK || !got.Equal(at) {
				t.Errorf("renew of a %s sandbox: %d %v, want 200 expiresAt %s", want, st, m, at.Format(time.RFC3339))
			}
		}
	})
}

func TestContractSnapshotsAndForks(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		src := s.create(t, map[string]any{
			"metadata": map[string]string{"contract.run": s.run, "role": "source", "ng.restore": "ck-old"},
			"env":      map[string]string{"FROM_SOURCE": "yes"},
		})
		id := src["id"].(string)
		// The capture takes a while when much has changed: time to see
		// the snapshot Creating on the real server.
		if s.fake == nil {
			s.execdUp(t, id)
			p := s.provider(t, nil)
			if res, err := p.Exec(context.Background(), p2h(id), provider.ExecRequest{Command: "head -c 200000000 /dev/urandom > /big", Cwd: "/", Timeout: time.Minute}); err != nil || res.ExitCode != 0 {
				t.Fatalf("write a big file: %v %+v", err, res)
			}
		}
		// The fake's capture lasts until the checks of a Creating
		// snapshot are done.
		release := s.holdTime()
		st, snap, hdr := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/snapshots", nil)
		if st != http.StatusAccepted || stateOf(snap) != "Creating" {
			t.Fatalf("snapshot: %d %v, want 202 Creating", st, snap)
		}
		sid := snap["id"].(string)
		if loc := hdr.Get("Location"); loc != "/v1/snapshots/"+sid {
			t.Errorf("snapshot Location %q, want /v1/snapshots/%s", loc, sid)
		}
		sid = s.whileCreating(t, id, sid)
		st, m, _ := s.call(t, http.MethodGet, "/v1/sandboxes/"+id, nil)
		if stateOf(m) != "Paused" && stateOf(m) != "Running" {
			t.Errorf("source while captured: %d %v, want Paused (or Running once done)", st, m)
		}
		release()
		s.waitState(t, "/v1/snapshots/"+sid, "Ready")
		s.waitState(t, "/v1/sandboxes/"+id, "Running")

		// The list of a source's snapshots, newest first.
		st, snap2, _ := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/snapshots", map[string]string{"name": "second"})
		if st != http.StatusAccepted {
			t.Fatalf("second snapshot: %d %v", st, snap2)
		}
		sid2 := snap2["id"].(string)
		s.waitState(t, "/v1/snapshots/"+sid2, "Ready")
		_, m, _ = s.call(t, http.MethodGet, "/v1/snapshots?sandboxId="+id, nil)
		if diff := cmp.Diff([]string{sid2, sid}, ids(m)); diff != "" {
			t.Errorf("snapshots of the source, newest first (-want +got):\n%s", diff)
		}
		if st, _, _ := s.call(t, http.MethodDelete, "/v1/snapshots/"+sid2, nil); st != http.StatusNoContent {
			t.Errorf("delete a Ready snapshot: %d", st)
		}

		// A fork answers Running, has snapshotId and no image, and inherits
		// the source's metadata (what it names wins).
		st, fork, _ := s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"image": nil, "entrypoint": nil, "snapshotId": sid,
			"metadata": map[string]string{"contract.run": s.run, "role": "fork"}}))
		if st != http.StatusAccepted || stateOf(fork) != "Running" {
			t.Fatalf("fork: %d %v, want 202 Running", st, fork)
		}
		fid := fork["id"].(string)
		t.Cleanup(func() { s.call(t, http.MethodDelete, "/v1/sandboxes/"+fid, nil) })
		_, m, _ = s.call(t, http.MethodGet, "/v1/sandboxes/"+fid, nil)
		if _, hasImage := m["image"]; m["snapshotId"] != sid || hasImage {
			t.Errorf("GET of a fork: %v, want snapshotId %s and no image", m, sid)
		}
		want := map[string]any{"contract.run": s.run, "role": "fork", "ng.restore": "ck-old"}
		if diff := cmp.Diff(want, m["metadata"]); diff != "" {
			t.Errorf("fork's metadata, inherited from the source (-want +got):\n%s", diff)
		}

		// Deleting the source leaves the snapshot usable.
		if st, _, _ := s.call(t, http.MethodDelete, "/v1/sandboxes/"+id, nil); st != http.StatusNoContent {
			t.Errorf("delete the source: %d", st)
		}
		st, fork2, _ := s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"image": nil, "entrypoint": nil, "snapshotId": sid}))
		if st != http.StatusAccepted {
			t.Fatalf("fork after its source is gone: %d %v", st, fork2)
		}
		t.Cleanup(func() { s.call(t, http.MethodDelete, "/v1/sandboxes/"+fork2["id"].(string), nil) })

		// A snapshot a live fork stands on cannot be deleted, and the
		// refused delete leaves it Deleting: no fork is made from it any
		// more, and the delete is finished by trying again once the forks
		// are gone.
		st, m, _ = s.call(t, http.MethodDelete, "/v1/snapshots/"+sid, nil)
		isCodeError(t, "delete a snapshot a fork lives on", st, m, http.StatusConflict, "SNAPSHOT::DELETE_CONFLICT")
		if _, m, _ := s.call(t, http.MethodGet, "/v1/snapshots/"+sid, nil); stateOf(m) != "Deleting" {
			t.Errorf("snapshot after a refused delete: %v, want Deleting", m)
		}
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"image": nil, "entrypoint": nil, "snapshotId": sid}))
		isCodeError(t, "fork from a snapshot being deleted", st, m, http.StatusConflict, "SNAPSHOT::NOT_READY")
		st, m, _ = s.call(t, http.MethodDelete, "/v1/snapshots/"+sid, nil)
		isCodeError(t, "delete again while a fork lives", st, m, http.StatusConflict, "SNAPSHOT::DELETE_CONFLICT")
		for _, f := range []string{fid, fork2["id"].(string)} {
			if st, _, _ := s.call(t, http.MethodDelete, "/v1/sandboxes/"+f, nil); st != http.StatusNoContent {
				t.Errorf("delete fork: %d", st)
			}
		}
		if st, m, _ := s.call(t, http.MethodDelete, "/v1/snapshots/"+sid, nil); st != http.StatusNoContent {
			t.Errorf("delete the snapshot once its forks are gone: %d %v", st, m)
		}
		st, m, _ = s.call(t, http.MethodDelete, "/v1/snapshots/"+sid, nil)
		isCodeError(t, "delete a snapshot twice", st, m, http.StatusNotFound, "SNAPSHOT::NOT_FOUND")
		st, m, _ = s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"image": nil, "entrypoint": nil, "snapshotId": sid}))
		isCodeError(t, "fork from a deleted snapshot", st, m, http.StatusNotFound, "SNAPSHOT::NOT_FOUND")
	})
}

// whileCreating checks what a fork from, and a delete of, a snapshot still
// Creating answer, and returns the snapshot the rest of the test uses. The
// fake holds a snapshot Creating for as long as its test needs (its clock
// held, see holdTime); the real
// server only while its capture lasts, which a loaded machine can outrun
// between two requests. So on the real server an answer that the
// capture's end explains (the fork made, the delete done) is checked for
// being that (the snapshot Ready), and undone: the fork deleted, or the
// snapshot made again.
func (s *server) whileCreating(t *testing.T, id, sid string) string {
	t.Helper()
	st, m, _ := s.call(t, http.MethodPost, "/v1/sandboxes", s.createBody(map[string]any{"image": nil, "entrypoint": nil, "snapshotId": sid}))
	if s.fake == nil && st == http.StatusAccepted {
		if _, sm, _ := s.call(t, http.MethodGet, "/v1/snapshots/"+sid, nil); stateOf(sm) != "Ready" {
			t.Fatalf("fork accepted from snapshot %v, want it Ready or the fork refused", sm)
		}
		if st, dm, _ := s.call(t, http.MethodDelete, "/v1/sandboxes/"+m["id"].(string), nil); st != http.StatusNoContent {
			t.Fatalf("delete the fork made once the capture ended: %d %v", st, dm)
		}
		t.Logf("the capture ended before the fork: what a Creating snapshot answers was not seen this run")
		return sid
	}
	isCodeError(t, "fork while Creating", st, m, http.StatusConflict, "SNAPSHOT::NOT_READY")
	st, m, _ = s.call(t, http.MethodDelete, "/v1/snapshots/"+sid, nil)
	if s.fake == nil && st == http.StatusNoContent {
		// The capture ended between the two requests, and the delete
		// took the Ready snapshot: wait until it is gone, make another.
		s.waitStatus(t, "/v1/snapshots/"+sid, http.StatusNotFound)
		s.waitState(t, "/v1/sandboxes/"+id, "Running")
		st, snap, _ := s.call(t, http.MethodPost, "/v1/sandboxes/"+id+"/snapshots", nil)
		if st != http.StatusAccepted {
			t.Fatalf("snapshot again: %d %v", st, snap)
		}
		t.Logf("the capture ended before the delete: what a Creating snapshot answers a delete was not seen this run")
		return snap["id"].(string)
	}
	isCodeError(t, "delete while Creating", st, m, http.StatusConflict, "SNAPSHOT::INVALID_STATE")
	return sid
}

// waitStatus polls path until it answers status, or hangGuard passes.
func (s *server) waitStatus(t *testing.T, path string, status int) {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		st, m, _ := s.call(t, http.MethodGet, path, nil)
		if st == status {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %v, want %d", path, st, m, status)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// list answers GET /v1/sandboxes?q. The real server answers 500
// DOCKER::SANDBOX_QUERY_FAILED when a container it lists is removed while it
// reads it (another test's delete on the shared stack); the provider retries
// a 500 after its backoff, and so does this, until a storm of deletes has
// passed (a loaded machine's can outlast the provider's four retries) or
// hangGuard passes.
func (s *server) list(t *testing.T, q url.Values) (int, map[string]any) {
	t.Helper()
	bound := time.Now().Add(hangGuard)
	for retry := 0; ; retry++ {
		st, m, _ := s.call(t, http.MethodGet, "/v1/sandboxes?"+q.Encode(), nil)
		if st != http.StatusInternalServerError || m["code"] != "DOCKER::SANDBOX_QUERY_FAILED" || time.Now().After(bound) {
			return st, m
		}
		time.Sleep(opensandbox.Backoff(min(retry, 4)))
	}
}

func ids(list map[string]any) []string {
	var out []string
	items, _ := list["items"].([]any)
	for _, it := range items {
		out = append(out, it.(map[string]any)["id"].(string))
	}
	return out
}

func asString(v any) string { s, _ := v.(string); return s }

func p2h(id string) provider.Handle {
	return provider.Handle{SandboxID: id, Provider: opensandbox.Name}
}

// provider is the client under test on s, listing what carries the run's
// label.
func (s *server) provider(t *testing.T, opts *opensandbox.Options) *opensandbox.Provider {
	t.Helper()
	var o opensandbox.Options
	if opts != nil {
		o = *opts
	}
	o.Domain, o.APIKey = s.domain, s.key
	if o.ListLabels == nil {
		o.ListLabels = map[string]string{"contract.run": s.run}
	}
	if o.PollInterval == 0 {
		o.PollInterval = 100 * time.Millisecond
	}
	p, err := opensandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Wait)
	return p
}

// TestContractProvider drives the provider itself through every call it
// makes, on both servers.
func TestContractProvider(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		p := s.provider(t, nil)
		labels := map[string]string{"contract.run": s.run, "ng.session": "s1", "ng.restore": "ck-0"}
		h, err := p.Start(ctx, provider.Spec{Image: s.image, Metadata: labels, Env: map[string]string{"E": "1"}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(ctx, h) })
		if st, err := p.Status(ctx, h); err != nil || st != provider.StatusRunning {
			t.Errorf("Status = %v, %v; want running", st, err)
		}
		// Its execd wants the token the create gave it, and no other.
		base, hdr, err := p.Endpoint(ctx, h)
		if err != nil {
			t.Fatal(err)
		}
		tok := hdr[opensandbox.ExecdTokenHeader]
		for _, tc := range []struct {
			token, body string
			status      int
		}{{"", execdRefusal, 401}, {"not-" + tok, execdRefusal, 401}, {tok, "", 200}} {
			if st, body := ping(t, base, tc.token); st != tc.status || strings.TrimSpace(body) != tc.body {
				t.Errorf("ping with token %q = %d %q, want %d %q", tc.token, st, body, tc.status, tc.body)
			}
		}
		if err := p.WriteFile(ctx, h, "state.txt", []byte("before")); err != nil {
			t.Fatal(err)
		}
		if err := p.Renew(ctx, h, time.Now().Add(30*time.Minute)); err != nil {
			t.Errorf("Renew: %v", err)
		}
		sid, err := p.Snapshot(ctx, h, "ck-1")
		if err != nil {
			t.Fatal(err)
		}
		snaps, err := p.ListSnapshots(ctx)
		if err != nil || len(snaps) != 1 || snaps[0].ID != sid || snaps[0].Name != "ck-1" {
			t.Errorf("ListSnapshots = %+v, %v; want the one snapshot", snaps, err)
		}

		// The fork's labels are its own: none inherited from the source.
		forkLabels := map[string]string{"contract.run": s.run, "ng.session": "s2"}
		f, err := p.Fork(ctx, provider.Spec{Metadata: forkLabels}, sid)
		if err != nil {
			t.Fatal(err)
		}
		if b, err := p.ReadFile(ctx, f, "state.txt"); err != nil || string(b) != "before" {
			t.Errorf("fork reads %q, %v; want the snapshot's contents", b, err)
		}
		list, err := p.ListSandboxes(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]map[string]string{}
		for _, info := range list {
			got[info.Handle.SandboxID] = info.Metadata
		}
		if diff := cmp.Diff(map[string]map[string]string{h.SandboxID: labels, f.SandboxID: forkLabels}, got); diff != "" {
			t.Errorf("ListSandboxes labels (-want +got):\n%s", diff)
		}

		// A snapshot in use: refused at once, deleted once the fork goes.
		// A delete that waited for the fork instead would wait past its
		// context (the fork goes only after it returns): an error that is
		// not ErrSnapshotInUse, whatever the machine's load.
		inUse, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err = p.DeleteSnapshot(inUse, sid)
		cancel()
		if !errors.Is(err, provider.ErrSnapshotInUse) {
			t.Errorf("DeleteSnapshot under a live fork = %v, want ErrSnapshotInUse", err)
		}
		if err := p.Stop(ctx, f); err != nil {
			t.Fatal(err)
		}
		if err := p.DeleteSnapshot(ctx, sid); err != nil {
			t.Errorf("DeleteSnapshot once the fork is gone: %v", err)
		}
		if err := p.DeleteSnapshot(ctx, sid); err != nil {
			t.Errorf("DeleteSnapshot twice: %v", err)
		}
		if _, err := p.Fork(ctx, provider.Spec{Metadata: forkLabels}, sid); !errors.Is(err, provider.ErrSnapshotNotFound) {
			t.Errorf("Fork from a deleted snapshot = %v, want ErrSnapshotNotFound", err)
		}

		if err := p.Stop(ctx, h); err != nil {
			t.Fatal(err)
		}
		if _, err := p.Status(ctx, h); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Status after Stop = %v, want ErrSandboxNotFound", err)
		}
		if err := p.Renew(ctx, h, time.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Renew after Stop = %v, want ErrSandboxNotFound", err)
		}
		if err := p.Stop(ctx, h); err != nil {
			t.Errorf("Stop twice = %v", err)
		}
	})
}

// TestContractProviderACallLandsInItsSandbox: sandbox A's cached endpoint
// leads to sandbox B's execd (as after a runtime restart that gave A's host
// port to B): every call for A is refused there (B's execd wants B's
// token), the endpoint is resolved again, and the call lands in A. Nothing
// is ever written in B, nothing of A's is read from B.
func TestContractProviderACallLandsInItsSandbox(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		p := s.provider(t, nil)
		spec := provider.Spec{Image: s.image, Metadata: map[string]string{"contract.run": s.run}}
		a, err := p.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(ctx, a) })
		b, err := p.Start(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Stop(ctx, b) })
		baseB, _, err := p.Endpoint(ctx, b)
		if err != nil {
			t.Fatal(err)
		}
		moved := func() { opensandbox.PointEndpoint(p, a.SandboxID, baseB) }

		moved()
		if err := p.WriteFile(ctx, a, "note.txt", []byte("for A")); err != nil {
			t.Fatalf("WriteFile for A through B's endpoint: %v", err)
		}
		moved()
		if got, err := p.ReadFile(ctx, a, "note.txt"); err != nil || string(got) != "for A" {
			t.Errorf("ReadFile for A through B's endpoint = %q, %v; want A's note", got, err)
		}
		moved()
		res, err := p.Exec(ctx, a, provider.ExecRequest{Command: "cat note.txt"})
		if err != nil || res.Stdout != "for A\n" {
			t.Errorf("Exec for A through B's endpoint = %+v, %v; want A's note", res, err)
		}
		moved()
		if _, err := p.Exec(ctx, a, provider.ExecRequest{Command: "echo ran >> ran.txt"}); err != nil {
			t.Errorf("Exec for A through B's endpoint: %v", err)
		}
		if got, err := p.ReadFile(ctx, a, "ran.txt"); err != nil || string(got) != "ran\n" {
			t.Errorf("A's ran.txt = %q, %v; want the command run once, in A", got, err)
		}
		for _, name := range []string{"note.txt", "ran.txt"} {
			if got, err := p.ReadFile(ctx, b, name); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("B's %s = %q, %v; want none: nothing meant for A is written in B", name, got, err)
			}
		}
	})
}

// TestContractProviderAnEndedSandboxsPortIsNotItsOwn: sandbox A ended (as
// every sandbox does when the runtime restarts) and its cached endpoint
// leads to sandbox B's execd, which takes any call (made without a token:
// as one whose agent replaced its execd with a server of its own would).
// A new process's calls for A are refused before they connect, never made
// in B.
func TestContractProviderAnEndedSandboxsPortIsNotItsOwn(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		a := s.create(t, map[string]any{"entrypoint": []string{"true"}})["id"].(string)
		s.waitState(t, "/v1/sandboxes/"+a, "Terminated")
		b := s.create(t, nil)["id"].(string)
		s.waitState(t, "/v1/sandboxes/"+b, "Running")
		s.execdUp(t, b)
		p := s.provider(t, nil)
		baseB, _, err := p.Endpoint(ctx, p2h(b))
		if err != nil {
			t.Fatal(err)
		}
		opensandbox.PointEndpoint(p, a, baseB)
		if _, err := p.Exec(ctx, p2h(a), provider.ExecRequest{Command: "echo ran > ran.txt", Cwd: "/tmp"}); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Exec for the ended A = %v, want ErrSandboxNotFound", err)
		}
		opensandbox.PointEndpoint(p, a, baseB)
		if err := p.WriteFile(ctx, p2h(a), "/tmp/note.txt", []byte("for A")); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("WriteFile for the ended A = %v, want ErrSandboxNotFound", err)
		}
		for _, name := range []string{"/tmp/ran.txt", "/tmp/note.txt"} {
			if got, err := p.ReadFile(ctx, p2h(b), name); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("B's %s = %q, %v; want none: nothing meant for A is made in B", name, got, err)
			}
		}
	})
}

// TestContractProviderExitedSandboxIsLost: a sandbox whose entrypoint
// exited (as every one does after its runtime restarts) is reported gone,
// never as a sandbox that merely failed a command.
func TestContractProviderExitedSandboxIsLost(t *testing.T) {
	t.Parallel()
	eachServer(t, func(t *testing.T, s *server) {
		ctx := context.Background()
		p := s.provider(t, &opensandbox.Options{Entrypoint: []string{"true"}})
		// Once it is seen exited, not at the ready deadline (5 minutes):
		// a start that ran into the deadline fails with
		// context.DeadlineExceeded instead, so the error tells the two
		// apart however long a loaded machine took.
		_, err := p.Start(ctx, provider.Spec{Image: s.image, Metadata: map[string]string{"contract.run": s.run}})
		if !errors.Is(err, provider.ErrSandboxNotFound) || errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Start of a sandbox whose entrypoint exits = %v, want ErrSandboxNotFound", err)
		}
		if n := len(listed(t, s)); n != 0 {
			t.Errorf("%d sandboxes left by a start that failed", n)
		}
		q := s.create(t, map[string]any{"entrypoint": []string{"true"}})
		s.waitState(t, "/v1/sandboxes/"+q["id"].(string), "Terminated")
		_, err = p.Status(ctx, p2h(q["id"].(string)))
		if !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Status of a Terminated sandbox = %v, want ErrSandboxNotFound", err)
		}
		// The server renews it (TestContractExitedSandboxes); the provider
		// finds it lost.
		if err := p.Renew(ctx, p2h(q["id"].(string)), time.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Renew of a Terminated sandbox = %v, want ErrSandboxNotFound", err)
		}
		if err := p.Stop(ctx, p2h(q["id"].(string))); err != nil {
			t.Errorf("Stop of a Terminated sandbox: %v", err)
		}
		if n := len(listed(t, s)); n != 0 {
			t.Errorf("%d sandboxes left after Stop of a Terminated one", n)
		}
	})
}

func listed(t *testing.T, s *server) []string {
	_, m := s.list(t, url.Values{"metadata": {"contract.run=" + s.run}})
	return ids(m)
}
