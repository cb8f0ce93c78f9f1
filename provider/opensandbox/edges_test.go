package opensandbox_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/osexecd"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// TestAnExecdSlowerThanOneSliceStillStarts: a start waits for execd in
// slices of four polls and looks at the sandbox between them; an execd that
// answers only in a later slice is a start, not a failure.
func TestAnExecdSlowerThanOneSliceStillStarts(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{ReadyTimeout: time.Minute})
	// Every execd request fails 20 times: more pings than one slice of
	// 4 s holds (8), fewer than the minute.
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/direct/", Status: http.StatusServiceUnavailable, Times: 20})
	begun := e.clk.Now()
	h := e.start(t, provider.Spec{})
	if waited := e.clk.Now().Sub(begun); waited <= 4*time.Second {
		t.Fatalf("the start waited %v: the faults did not outlast the first slice", waited)
	}
	if got := e.exec(t, h, "echo up"); got.Stdout != "up\n" {
		t.Errorf("exec = %+v", got)
	}
}

// TestAStartWhoseExecdNeverAnswersNamesItsLastAnswer: an execd that answers
// /ping with a failure until the ready deadline fails the start with that
// answer, and the sandbox is deleted.
func TestAStartWhoseExecdNeverAnswersNamesItsLastAnswer(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{ReadyTimeout: 30 * time.Second})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/direct/", Status: http.StatusServiceUnavailable, Times: 1 << 20})
	_, err := e.p.Start(context.Background(), provider.Spec{Image: "x"})
	var aerr *opensandbox.APIError
	if !errors.As(err, &aerr) || aerr.Status != http.StatusServiceUnavailable {
		t.Errorf("Start = %v, want the ping's 503", err)
	}
	if st := e.srv.Stats(); st.LiveSandboxes != 0 || st.Deleted != 1 {
		t.Errorf("live %d, deleted %d: want the sandbox deleted", st.LiveSandboxes, st.Deleted)
	}
}

// TestAStopTheServerRefusesIsAnError: a delete the server refuses is the
// stop's error, and the sandbox is still there and still usable.
func TestAStopTheServerRefusesIsAnError(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxRetries: -1})
	h := e.start(t, provider.Spec{})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodDelete, Path: "/v1/sandboxes/" + h.SandboxID, Status: http.StatusInternalServerError})
	if err := e.p.Stop(context.Background(), h); err == nil {
		t.Fatal("Stop answered 500 = nil, want an error")
	}
	if st, err := e.p.Status(context.Background(), h); err != nil || st != provider.StatusRunning {
		t.Errorf("Status after a refused stop = %v, %v; want running", st, err)
	}
	if got := e.exec(t, h, "echo up"); got.Stdout != "up\n" {
		t.Errorf("exec after a refused stop = %+v", got)
	}
}

// TestTheStatusOfAGoneSandboxIsStopped: a sandbox deleted, or whose
// entrypoint exited, is stopped and not found.
func TestTheStatusOfAGoneSandboxIsStopped(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	deleted, exited := e.start(t, provider.Spec{}), e.start(t, provider.Spec{})
	if err := e.p.Stop(ctx, deleted); err != nil {
		t.Fatal(err)
	}
	e.srv.Terminate(exited.SandboxID)
	for name, h := range map[string]provider.Handle{"deleted": deleted, "exited": exited} {
		if st, err := e.p.Status(ctx, h); st != provider.StatusStopped || !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Status of the %s sandbox = %v, %v; want stopped, ErrSandboxNotFound", name, st, err)
		}
	}
}

// TestASnapshotByAnotherProcessCarriesTheSandboxsLabels: a provider that
// did not start the sandbox (the owner restarted) reads its labels from the
// server, and its snapshot is listed with them.
func TestASnapshotByAnotherProcessCarriesTheSandboxsLabels(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	labels := map[string]string{"ng.owner": "me", "ng.session": "s1"}
	h := e.start(t, provider.Spec{Metadata: labels})
	p2 := e.another(t, opensandbox.Options{})
	sid, err := p2.Snapshot(context.Background(), h, "ck-1")
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := p2.ListSnapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i := range snaps {
		snaps[i].CreatedAt = time.Time{}
	}
	want := []provider.SnapshotInfo{{ID: sid, Name: "ck-1", SandboxID: h.SandboxID, Metadata: labels}}
	if diff := cmp.Diff(want, snaps); diff != "" {
		t.Errorf("ListSnapshots (-want +got):\n%s", diff)
	}
}

// TestAListingAsksForItsLabelsOnly: a listing sends ListLabels as the
// server's metadata filter (a server holding others' sandboxes answers only
// ours), and no filter at all without them.
func TestAListingAsksForItsLabelsOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		labels map[string]string
		want   []string // the metadata parameters of the listing
	}{
		{"labels", map[string]string{"ng.owner": "a"}, []string{"ng.owner=a"}},
		{"none", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
			rec := &recorder{}
			p := e.another(t, opensandbox.Options{ListLabels: tc.labels, HTTPClient: &http.Client{Transport: rec}})
			if _, err := p.ListSandboxes(context.Background()); err != nil {
				t.Fatal(err)
			}
			lists := rec.queries(http.MethodGet, "/v1/sandboxes")
			if len(lists) != 1 {
				t.Fatalf("%d list requests, want 1", len(lists))
			}
			if diff := cmp.Diff(tc.want, lists[0]["metadata"]); diff != "" {
				t.Errorf("the listing's metadata filter (-want +got):\n%s", diff)
			}
		})
	}
}

// another is a second provider on e's server and clock (another owner
// process), with popts' other fields.
func (e *env) another(t *testing.T, popts opensandbox.Options) *opensandbox.Provider {
	t.Helper()
	popts.Domain, popts.APIKey, popts.Clock, popts.PollInterval = e.srv.Domain, key, e.clk, time.Second
	popts.Sleep = func(ctx context.Context, d time.Duration) error {
		e.clk.Advance(d)
		return ctx.Err()
	}
	p, err := opensandbox.New(popts)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorder is a transport that notes each request's method, path and
// query.
type recorder struct {
	mu   sync.Mutex
	reqs []*url.URL
	meth []string
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req.URL)
	r.meth = append(r.meth, req.Method)
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

// queries returns the queries of the requests made to method and path.
func (r *recorder) queries(method, path string) []url.Values {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []url.Values
	for i, u := range r.reqs {
		if r.meth[i] == method && u.Path == path {
			out = append(out, u.Query())
		}
	}
	return out
}

// TestASpecsReadyTimeoutBoundsItsStart: a spec's own ready timeout, not
// the provider's, is how long its start waits.
func TestASpecsReadyTimeoutBoundsItsStart(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{CreateLatency: time.Hour}, opensandbox.Options{ReadyTimeout: 10 * time.Minute})
	_, err := e.p.Start(context.Background(), provider.Spec{Image: "x", ReadyTimeoutSeconds: 30})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Start = %v, want a deadline error", err)
	}
	if waited := e.clk.Now().Sub(t0); waited < 30*time.Second || waited > 32*time.Second {
		t.Errorf("gave up after %v, want about the spec's 30 s", waited)
	}
}

// TestRetriesBackOffFrom250msDoublingTo10s: the waits between retries of a
// call whose answers ask no Retry-After start at 250 ms, double, stop
// growing at 10 s, each within ±25% jitter (24 of them, so that the
// jitter's draws spread over its range).
func TestRetriesBackOffFrom250msDoublingTo10s(t *testing.T) {
	const retries = 24
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{MaxRetries: retries})
	h := e.start(t, provider.Spec{TTLSeconds: 3600})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + h.SandboxID, Status: http.StatusServiceUnavailable, Times: retries})
	e.mu.Lock()
	e.sleeps = nil
	e.mu.Unlock()
	if st, err := e.p.Status(context.Background(), h); err != nil || st != provider.StatusRunning {
		t.Fatalf("Status through %d 503s = %v, %v", retries, st, err)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.sleeps) != retries {
		t.Fatalf("waits %v, want %d", e.sleeps, retries)
	}
	for i, d := range e.sleeps {
		b := min(250*time.Millisecond<<i, 10*time.Second)
		if d < b*3/4 || d >= b*5/4 {
			t.Errorf("wait %d = %v, want %v ±25%%", i, d, b)
		}
	}
}

// TestAFileCallIsMadeAgainOnlyWhenItGotNoAnswerOfExecds: an answered file
// call is made once (a read is not asked about as a directory); execd's own
// 500 is its answer, not retried; a proxy's 502 is tried again.
func TestAFileCallIsMadeAgainOnlyWhenItGotNoAnswerOfExecds(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{})
	upload := "/direct/" + h.SandboxID + "/proxy/44772/files/upload"
	for _, tc := range []struct {
		name  string
		fault *opensandboxtest.Fault
		call  func() error
		ok    bool
		calls int
	}{
		{"a write", nil, func() error { return e.p.WriteFile(ctx, h, "a.txt", []byte("A")) }, true, 1},
		{"a read", nil, func() error { _, err := e.p.ReadFile(ctx, h, "a.txt"); return err }, true, 1},
		{"a write execd answers 500", &opensandboxtest.Fault{Method: http.MethodPost, Path: upload, Status: http.StatusInternalServerError},
			func() error { return e.p.WriteFile(ctx, h, "b.txt", []byte("B")) }, false, 1},
		{"a write a proxy answers 502", &opensandboxtest.Fault{Method: http.MethodPost, Path: upload, Status: http.StatusBadGateway},
			func() error { return e.p.WriteFile(ctx, h, "c.txt", []byte("C")) }, true, 2},
	} {
		if tc.fault != nil {
			e.srv.Inject(*tc.fault)
		}
		before := e.srv.Stats().Requests["execd (direct)"]
		if err := tc.call(); (err == nil) != tc.ok {
			t.Errorf("%s: %v, want success %v", tc.name, err, tc.ok)
		}
		if n := e.srv.Stats().Requests["execd (direct)"] - before; n != tc.calls {
			t.Errorf("%s: %d execd requests, want %d", tc.name, n, tc.calls)
		}
	}
}

// TestADirectorysDownloadAnswered500IsADirectory: execd answers the download
// of a directory 500 on some file systems, saying what it likes; the path is
// then asked about (/files/info), and a directory is syscall.EISDIR.
func TestADirectorysDownloadAnswered500IsADirectory(t *testing.T) {
	lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{"t": ""}, Isolation: "none", Overlay: "off"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lp.Close() })
	workdir := filepath.Join(t.TempDir(), "sandbox")
	e := newEnv(t, opensandboxtest.Options{Backend: osexecd.LocalBackend{Provider: lp, Workdir: workdir}}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{Image: "t", Workdir: workdir, Files: map[string]string{"d/f.txt": "F"}})
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/direct/" + h.SandboxID + "/proxy/44772/files/download", Status: http.StatusInternalServerError})
	if got, err := e.p.ReadFile(ctx, h, "d"); !errors.Is(err, syscall.EISDIR) {
		t.Errorf("ReadFile of a directory answered 500 = %q, %v; want EISDIR", got, err)
	}
}
