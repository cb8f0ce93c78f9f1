package opensandboxtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

var t0 = time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)

const key = "k"

type client struct {
	t   *testing.T
	srv *opensandboxtest.Server
	clk *clock.Manual
}

func newClient(t *testing.T, o opensandboxtest.Options) *client {
	clk := clock.NewManual(t0)
	o.Clock, o.APIKey = clk, key
	srv := opensandboxtest.NewServer(o)
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv, clk: clk}
}

// call makes a request with the API key and returns the status and the
// decoded JSON body (nil when empty).
func (c *client) call(method, path, body string, hdr map[string]string) (int, map[string]any, http.Header) {
	c.t.Helper()
	req, err := http.NewRequest(method, c.srv.URL+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set(opensandboxtest.APIKeyHeader, key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var m map[string]any
	if len(bytes.TrimSpace(b)) > 0 && b[0] == '{' {
		if err := json.Unmarshal(b, &m); err != nil {
			c.t.Fatalf("%s %s: body %q: %v", method, path, b, err)
		}
	}
	return res.StatusCode, m, res.Header
}

func state(m map[string]any) string {
	st, _ := m["status"].(map[string]any)
	s, _ := st["state"].(string)
	return s
}

const create = `{"image":{"uri":"python:3.11"},"entrypoint":["tail","-f","/dev/null"],"timeout":120,"resourceLimits":{"cpu":"1","memory":"1Gi"},"metadata":{"ng.owner":"x"}}`

// isInvalid checks FastAPI's validation error body: {"detail": [...]}.
func isInvalid(t *testing.T, m map[string]any) {
	t.Helper()
	d, ok := m["detail"].([]any)
	if len(m) != 1 || !ok || len(d) == 0 {
		t.Errorf("error body %v, want {detail: [...]}", m)
	}
}

// isError checks the {code,message} error body.
func isError(t *testing.T, m map[string]any, code string) {
	t.Helper()
	if len(m) != 2 || m["code"] != code || m["message"] == "" {
		t.Errorf("error body %v, want exactly {code: %s, message}", m, code)
	}
}

func TestAuth(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{})
	st, m, _ := c.call("GET", "/v1/sandboxes", "", map[string]string{opensandboxtest.APIKeyHeader: ""})
	if st != 401 {
		t.Errorf("no key: %d", st)
	}
	isError(t, m, "MISSING_API_KEY")
	st, m, _ = c.call("GET", "/v1/sandboxes", "", map[string]string{opensandboxtest.APIKeyHeader: "wrong"})
	if st != 401 {
		t.Errorf("wrong key: %d", st)
	}
	isError(t, m, "INVALID_API_KEY")
}

func TestCreatePendingThenRunning(t *testing.T) {
	for _, lower := range []bool{false, true} {
		c := newClient(t, opensandboxtest.Options{CreateLatency: 2 * time.Second, LowerCaseStates: lower})
		st, m, hdr := c.call("POST", "/v1/sandboxes", create, nil)
		want := map[bool][2]string{false: {"Pending", "Running"}, true: {"pending", "running"}}[lower]
		if st != 202 || state(m) != want[0] {
			t.Fatalf("create: %d %v", st, m)
		}
		if loc := hdr.Get("Location"); loc != "" {
			t.Errorf("create answered Location %q; the real server sends none", loc)
		}
		if _, ok := m["image"]; ok {
			t.Error("the create answer carries the image; the spec says it does not")
		}
		id := m["id"].(string)
		if want := t0.Add(120 * time.Second).Format(time.RFC3339Nano); m["expiresAt"] != want {
			t.Errorf("expiresAt %v, want %s", m["expiresAt"], want)
		}
		c.clk.Advance(2 * time.Second)
		_, m, _ = c.call("GET", "/v1/sandboxes/"+id, "", nil)
		if state(m) != want[1] || m["image"].(map[string]any)["uri"] != "python:3.11" {
			t.Errorf("after the latency: %v", m)
		}
	}
}

func TestCreateIsCheckedAgainstTheSchema(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{})
	for _, tc := range []struct {
		body, why string
		label     bool
	}{
		{`{"entrypoint":["x"],"resourceLimits":{}}`, "no source", false},
		{`{"image":{"uri":"x"},"snapshotId":"s","entrypoint":["x"],"resourceLimits":{}}`, "both sources", false},
		{`{"image":{"uri":"x"},"resourceLimits":{}}`, "image without entrypoint", false},
		{`{"image":{"uri":"x"},"entrypoint":["x"]}`, "no resourceLimits", false},
		{`{"image":{"uri":"x","tag":"y"},"entrypoint":["x"],"resourceLimits":{}}`, "unknown field of a closed object", false},
		{`{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{},"timeout":59}`, "timeout below 60", false},
		{`{"image":{"uri":"x"},"entrypoint":[],"resourceLimits":{}}`, "empty entrypoint", false},
		{`{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{"cpu":1}}`, "a number where strings are", false},
		{`{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{},"metadata":{"a":"b:c"}}`, "a label value with ':'", true},
		{`{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{},"metadata":{"opensandbox.io/x":"y"}}`, "a reserved label prefix", true},
		{`{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{}} {}`, "trailing data", false},
	} {
		st, m, _ := c.call("POST", "/v1/sandboxes", tc.body, nil)
		if tc.label {
			if st != 400 {
				t.Errorf("%s: %d, want 400", tc.why, st)
			}
			isError(t, m, "SANDBOX::INVALID_METADATA_LABEL")
			continue
		}
		if st != 422 {
			t.Errorf("%s: %d, want 422", tc.why, st)
			continue
		}
		isInvalid(t, m)
	}
	if n := len(c.srv.Violations()); n != 11 {
		t.Errorf("%d violations recorded, want 11:\n%v", n, c.srv.Violations())
	}
	// An unknown top-level field is accepted, as the spec leaves the
	// object open, but recorded.
	if st, _, _ := c.call("POST", "/v1/sandboxes", `{"image":{"uri":"x"},"entrypoint":["x"],"resourceLimits":{},"snapshotID":"typo"}`, nil); st != 202 {
		t.Errorf("open object: %d", st)
	}
	if v := c.srv.Violations(); !strings.Contains(v[len(v)-1], `unknown field "snapshotID"`) {
		t.Errorf("last violation %q", v[len(v)-1])
	}
}

func TestSnapshotsCaptureTwoAtATime(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{CreateLatency: time.Second, SnapshotLatency: 10 * time.Second})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id := m["id"].(string)
	if st, m, _ := c.call("POST", "/v1/sandboxes/"+id+"/snapshots", "", nil); st != 409 {
		t.Errorf("snapshot of a Pending sandbox: %d", st)
	} else {
		isError(t, m, "SNAPSHOT::INVALID_SOURCE_STATE")
	}
	c.clk.Advance(time.Second)
	// Three sources: the runtime pauses a source while it captures, and
	// refuses a second snapshot of it meanwhile.
	sources := []string{id}
	for i := 0; i < 2; i++ {
		_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
		sources = append(sources, m["id"].(string))
	}
	c.clk.Advance(time.Second)
	var snaps []string
	for _, src := range sources {
		st, m, _ := c.call("POST", "/v1/sandboxes/"+src+"/snapshots", `{"name":"n"}`, nil)
		if st != 202 || state(m) != "Creating" {
			t.Fatalf("snapshot: %d %v", st, m)
		}
		snaps = append(snaps, m["id"].(string))
	}
	if _, m, _ := c.call("GET", "/v1/sandboxes/"+id, "", nil); state(m) != "Paused" {
		t.Errorf("source while captured: %s, want Paused", state(m))
	}
	if st, m, _ := c.call("POST", "/v1/sandboxes/"+id+"/snapshots", "", nil); st != 409 {
		t.Errorf("second snapshot of a source being captured: %d", st)
	} else {
		isError(t, m, "SNAPSHOT::INVALID_SOURCE_STATE")
	}
	if _, m, _ := c.call("GET", "/v1/sandboxes/"+sources[2], "", nil); state(m) != "Running" {
		t.Errorf("source of a queued capture: %s, want Running", state(m))
	}
	states := func() []string {
		var out []string
		for _, s := range snaps {
			_, m, _ := c.call("GET", "/v1/snapshots/"+s, "", nil)
			out = append(out, state(m))
		}
		return out
	}
	// Deleting one still Creating is refused.
	if st, m, _ := c.call("DELETE", "/v1/snapshots/"+snaps[0], "", nil); st != 409 {
		t.Errorf("delete while Creating: %d", st)
	} else {
		isError(t, m, "SNAPSHOT::INVALID_STATE")
	}
	c.clk.Advance(10 * time.Second)
	if diff := cmp.Diff([]string{"Ready", "Ready", "Creating"}, states()); diff != "" {
		t.Errorf("after one capture time, the third still queues (-want +got):\n%s", diff)
	}
	c.clk.Advance(10 * time.Second)
	if diff := cmp.Diff([]string{"Ready", "Ready", "Ready"}, states()); diff != "" {
		t.Errorf("after two (-want +got):\n%s", diff)
	}
	if st := c.srv.Stats(); st.PeakCaptures != 2 {
		t.Errorf("peak captures %d, want 2", st.PeakCaptures)
	}
	if st, _, _ := c.call("POST", "/v1/sandboxes/"+id+"/snapshots", `{"name":"n","extra":1}`, nil); st != 422 {
		t.Errorf("unknown field in a closed schema: %d", st)
	}
	if st, _, _ := c.call("DELETE", "/v1/snapshots/"+snaps[0], "", nil); st != 204 {
		t.Errorf("delete when Ready: %d", st)
	}
	if st, m, _ := c.call("DELETE", "/v1/snapshots/"+snaps[0], "", nil); st != 404 {
		t.Errorf("delete again: %d", st)
	} else {
		isError(t, m, "SNAPSHOT::NOT_FOUND")
	}
}

func TestLeases(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id := m["id"].(string)
	manual := strings.Replace(create, `"timeout":120,`, "", 1)
	_, m, _ = c.call("POST", "/v1/sandboxes", manual, nil)
	forever := m["id"].(string)
	if _, ok := m["expiresAt"]; ok {
		t.Error("a sandbox without timeout has an expiresAt")
	}
	at := func(d time.Duration) string { return `{"expiresAt":"` + t0.Add(d).Format(time.RFC3339) + `"}` }
	if st, m, _ := c.call("POST", "/v1/sandboxes/"+forever+"/renew-expiration", at(time.Hour), nil); st != 409 {
		t.Errorf("renew without a TTL: %d %v", st, m)
	}
	if st, _, _ := c.call("POST", "/v1/sandboxes/"+id+"/renew-expiration", at(-time.Second), nil); st != 400 {
		t.Errorf("renew into the past: %d", st)
	}
	if st, _, _ := c.call("POST", "/v1/sandboxes/"+id+"/renew-expiration", `{"expiresAt":"soon"}`, nil); st != 400 {
		t.Errorf("renew with a bad time: %d", st)
	}
	if st, m, _ := c.call("POST", "/v1/sandboxes/"+id+"/renew-expiration", at(300*time.Second), nil); st != 200 || m["expiresAt"] == nil {
		t.Errorf("renew: %d %v", st, m)
	}
	c.clk.Advance(299 * time.Second)
	if st, _, _ := c.call("GET", "/v1/sandboxes/"+id, "", nil); st != 200 {
		t.Errorf("inside the renewed lease: %d", st)
	}
	c.clk.Advance(time.Second)
	if st, m, _ := c.call("GET", "/v1/sandboxes/"+id, "", nil); st != 404 {
		t.Errorf("past the lease: %d", st)
	} else {
		isError(t, m, "DOCKER::SANDBOX_NOT_FOUND")
	}
	if st, _, _ := c.call("GET", "/v1/sandboxes/"+forever, "", nil); st != 200 {
		t.Errorf("manual cleanup sandbox: %d", st)
	}
	if got := c.srv.Stats().Expired; got != 1 {
		t.Errorf("expired %d", got)
	}
}

func TestEndpointsAndExecd(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id := m["id"].(string)
	for _, proxy := range []string{"", "?use_server_proxy=true"} {
		st, ep, _ := c.call("GET", "/v1/sandboxes/"+id+"/endpoints/44772"+proxy, "", nil)
		if st != 200 {
			t.Fatalf("endpoint: %d", st)
		}
		addr := ep["endpoint"].(string)
		if strings.Contains(addr, "://") || !strings.HasPrefix(addr, c.srv.Domain+"/") {
			t.Errorf("endpoint %q: want host:port/prefix without a scheme", addr)
		}
		// As the Docker runtime: no headers named, none needed.
		if _, ok := ep["headers"]; ok {
			t.Errorf("endpoint %v: want no headers", ep)
		}
		res, err := http.Get("http://" + addr + "/ping")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Errorf("ping without headers: %d", res.StatusCode)
		}
	}
	if st, _, _ := c.call("GET", "/v1/sandboxes?pageSize=201", "", nil); st != 422 {
		t.Errorf("pageSize 201: %d", st)
	}
}

// newSyncClient is a client of a server whose runtime of record is an
// in-memory backend, returned too.
func newSyncClient(t *testing.T) (*client, *fake.Provider) {
	clk := clock.NewManual(t0)
	be := fake.New(fake.Options{Clock: clk})
	srv := opensandboxtest.NewServer(opensandboxtest.Options{Clock: clk, Backend: be, SyncWithBackend: true})
	t.Cleanup(srv.Close)
	return &client{t: t, srv: srv, clk: clk}, be
}

// TestSyncWithBackend: with SyncWithBackend, what the backend has is listed
// (a sandbox made behind the server's back is adopted) and what it lost is
// gone.
func TestSyncWithBackend(t *testing.T) {
	c, be := newSyncClient(t)
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id := m["id"].(string)
	if info, ok := be.Sandbox(id); !ok || info.Metadata["ng.owner"] != "x" {
		t.Fatalf("the sandbox's id %s is not the backend's, or it lost its labels: %+v", id, info)
	}
	behind, err := be.Start(context.Background(), provider.Spec{Metadata: map[string]string{"ng.owner": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	if st, m, _ := c.call("GET", "/v1/sandboxes/"+behind.SandboxID, "", nil); st != 200 || state(m) != "Running" {
		t.Errorf("a sandbox the backend has: %d %v", st, m)
	}
	if err := be.Stop(context.Background(), provider.Handle{SandboxID: id, Provider: be.Name()}); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := c.call("GET", "/v1/sandboxes/"+id, "", nil); st != 404 {
		t.Errorf("a sandbox the backend lost: %d, want 404", st)
	}
	be.FailNext(fake.OpStop, 1)
	if st, m, _ := c.call("DELETE", "/v1/sandboxes/"+behind.SandboxID, "", nil); st != 500 {
		t.Errorf("a delete the backend failed: %d %v, want 500", st, m)
	}
	if st, _, _ := c.call("GET", "/v1/sandboxes/"+behind.SandboxID, "", nil); st != 200 {
		t.Errorf("after a failed delete the sandbox is still there: %d", st)
	}
}

// Paging takes page and pageSize from 1 (pageSize at most 200); anything
// else, or what is not a number, is 422 as the real server answers a
// schema error.
func TestPagingLimits(t *testing.T) {
	c := newClient(t, opensandboxtest.Options{})
	for q, want := range map[string]int{
		"pageSize=1": 200, "pageSize=200": 200, "page=1": 200, "pageSize=": 200,
		"pageSize=0": 422, "pageSize=201": 422, "page=0": 422, "pageSize=x": 422,
	} {
		if st, _, _ := c.call("GET", "/v1/sandboxes?"+q, "", nil); st != want {
			t.Errorf("GET /v1/sandboxes?%s: %d, want %d", q, st, want)
		}
	}
}

// TestSyncAdoptsInOrder: what the backend made behind the server's back is
// listed newest first after what the server made, and a fork shows the
// snapshot it came from instead of an image.
func TestSyncAdoptsInOrder(t *testing.T) {
	c, be := newSyncClient(t)
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	first := m["id"].(string)
	ctx := context.Background()
	behind, err := be.Start(ctx, provider.Spec{Metadata: map[string]string{"ng.owner": "y"}})
	if err != nil {
		t.Fatal(err)
	}
	sid, err := be.Snapshot(ctx, behind, "n")
	if err != nil {
		t.Fatal(err)
	}
	sid2, err := be.Snapshot(ctx, behind, "n2")
	if err != nil {
		t.Fatal(err)
	}
	fork, err := be.Fork(ctx, provider.Spec{}, sid)
	if err != nil {
		t.Fatal(err)
	}
	_, m, _ = c.call("GET", "/v1/snapshots", "", nil)
	if diff := cmp.Diff([]string{sid2, sid}, itemIDs(m)); diff != "" {
		t.Errorf("adopted snapshots, newest first (-want +got):\n%s", diff)
	}
	_, m, _ = c.call("GET", "/v1/sandboxes", "", nil)
	if diff := cmp.Diff([]string{fork.SandboxID, behind.SandboxID, first}, itemIDs(m)); diff != "" {
		t.Errorf("list, newest first (-want +got):\n%s", diff)
	}
	_, m, _ = c.call("GET", "/v1/sandboxes/"+fork.SandboxID, "", nil)
	if _, hasImage := m["image"]; m["snapshotId"] != sid || hasImage {
		t.Errorf("an adopted fork: %v, want snapshotId %s and no image", m, sid)
	}
	_, m, _ = c.call("GET", "/v1/sandboxes/"+behind.SandboxID, "", nil)
	if img, _ := m["image"].(map[string]any); img["uri"] != "adopted" || m["snapshotId"] != nil {
		t.Errorf("an adopted sandbox: %v, want an image and no snapshotId", m)
	}
}

// itemIDs are the ids of a list's items, in order.
func itemIDs(list map[string]any) []string {
	var out []string
	items, _ := list["items"].([]any)
	for _, it := range items {
		out = append(out, it.(map[string]any)["id"].(string))
	}
	return out
}
