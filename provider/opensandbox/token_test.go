package opensandbox_test

// The execd access token: every sandbox is created with one of its own, its
// execd refuses calls without it, and the provider sends it on every call,
// also after a restart.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/freeport"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

const tokenLabel = "sandboxowner.io/execd-token"

// lastCreate is the body of the last create request the fake saw.
func lastCreate(t *testing.T, e *env) map[string]any {
	t.Helper()
	reqs := e.srv.Requests("POST /sandboxes")
	if len(reqs) == 0 {
		t.Fatal("no create request recorded")
	}
	var body map[string]any
	if err := json.Unmarshal(reqs[len(reqs)-1], &body); err != nil {
		t.Fatal(err)
	}
	return body
}

// createdToken is the execd token of the last create: the same in its env
// and its label, 128 random bits in hex.
func createdToken(t *testing.T, e *env) string {
	t.Helper()
	body := lastCreate(t, e)
	env, _ := body["env"].(map[string]any)
	md, _ := body["metadata"].(map[string]any)
	tok, _ := env["EXECD_ACCESS_TOKEN"].(string)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(tok) || md[tokenLabel] != tok {
		t.Fatalf("create sent env %v and metadata %v: want the same 32 hex digits in EXECD_ACCESS_TOKEN and %s", env, md, tokenLabel)
	}
	return tok
}

// ping calls base's /ping with token ("" for none) and returns the status
// and body.
func ping(t *testing.T, base, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(opensandbox.ExecdTokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// execdRefusal is execd's answer to a call without its token.
const execdRefusal = `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`

func TestEachSandboxsExecdWantsItsOwnToken(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	// The spec cannot choose the token.
	h := e.start(t, provider.Spec{Env: map[string]string{"EXECD_ACCESS_TOKEN": "chosen-by-the-spec", "E": "1"}})
	tok := createdToken(t, e)
	if env := lastCreate(t, e)["env"].(map[string]any); env["E"] != "1" {
		t.Errorf("create env %v lost the spec's E", env)
	}
	base, hdr, err := e.p.Endpoint(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{opensandbox.ExecdTokenHeader: tok}, hdr); diff != "" {
		t.Errorf("Endpoint's headers (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		token, body string
		status      int
	}{{"", execdRefusal + "\n", 401}, {"chosen-by-the-spec", execdRefusal + "\n", 401}, {tok, "", 200}} {
		if st, body := ping(t, base, tc.token); st != tc.status || body != tc.body {
			t.Errorf("ping with token %q = %d %q, want %d %q", tc.token, st, body, tc.status, tc.body)
		}
	}
	if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" {
		t.Errorf("echo = %+v", got)
	}

	// Another sandbox, and a fork of the first, each have their own.
	h2 := e.start(t, provider.Spec{})
	tok2 := createdToken(t, e)
	sid, err := e.p.Snapshot(ctx, h, "s")
	if err != nil {
		t.Fatal(err)
	}
	f, err := e.p.Fork(ctx, provider.Spec{}, sid)
	if err != nil {
		t.Fatal(err)
	}
	ftok := createdToken(t, e)
	if tok2 == tok || ftok == tok || ftok == tok2 {
		t.Errorf("tokens %s, %s and the fork's %s are not all different", tok, tok2, ftok)
	}
	for _, other := range []provider.Handle{h2, f} {
		ob, _, err := e.p.Endpoint(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := ping(t, ob, tok); st != http.StatusUnauthorized {
			t.Errorf("%s's execd answers the first sandbox's token with %d, want 401", other.SandboxID, st)
		}
		if got := e.exec(t, other, "echo hi"); got.Stdout != "hi\n" {
			t.Errorf("echo in %s = %+v", other.SandboxID, got)
		}
	}

	// Nobody is shown the token label: not the listing, not a snapshot's
	// labels.
	list, err := e.p.ListSandboxes(ctx)
	if err != nil || len(list) != 3 {
		t.Fatalf("ListSandboxes = %d, %v", len(list), err)
	}
	for _, info := range list {
		if _, ok := info.Metadata[tokenLabel]; ok {
			t.Errorf("ListSandboxes shows %s's token label", info.Handle.SandboxID)
		}
	}
	snaps, err := e.p.ListSnapshots(ctx)
	if err != nil || len(snaps) != 1 {
		t.Fatalf("ListSnapshots = %+v, %v", snaps, err)
	}
	if _, ok := snaps[0].Metadata[tokenLabel]; ok {
		t.Errorf("the snapshot's labels carry the token: %v", snaps[0].Metadata)
	}
}

// A server started again knows the tokens of the sandboxes it adopts: it
// reads each from its label once.
func TestAProviderStartedAgainReadsTheTokenFromTheLabel(t *testing.T) {
	// Through the server proxy: a direct endpoint's connections also read
	// the sandbox (see TestAnEndedSandboxsPortIsNotDialled).
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{UseServerProxy: true})
	h := e.start(t, provider.Spec{Files: map[string]string{"notes.txt": "hello\n"}})
	// The process that made it knows the token: it reads no label.
	made := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	e.exec(t, h, "true")
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - made; n != 0 {
		t.Errorf("the provider that made the sandbox read it %d times to reach its execd, want none", n)
	}
	again, err := opensandbox.New(e.popts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	if res, err := again.Exec(ctx, h, provider.ExecRequest{Command: "cat notes.txt"}); err != nil || res.Stdout != "hello\n" {
		t.Errorf("Exec after a restart = %+v, %v", res, err)
	}
	if b, err := again.ReadFile(ctx, h, "notes.txt"); err != nil || string(b) != "hello\n" {
		t.Errorf("ReadFile after a restart = %q, %v", b, err)
	}
	// An endpoint resolved again does not read the label again.
	opensandbox.PointEndpoint(again, h.SandboxID, closedPort(t))
	if res, err := again.Exec(ctx, h, provider.ExecRequest{Command: "cat notes.txt"}); err != nil || res.Stdout != "hello\n" {
		t.Errorf("Exec after a restart and a lost connection = %+v, %v", res, err)
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n != 1 {
		t.Errorf("the restarted provider read the sandbox %d times, want once (its label)", n)
	}
}

// A sandbox made without a token (by a server before tokens) is reached
// without one.
func TestASandboxMadeWithoutATokenIsReachedWithoutOne(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := rawCreate(t, e)
	if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" {
		t.Errorf("echo = %+v", got)
	}
}

// A call refused before it ran (by another sandbox's execd, which wants its
// own token, or with no connection made) goes once more to the sandbox's
// endpoint resolved again; a command that may have run is never sent
// twice, though the endpoint is resolved again for the next call.
func TestAMovedEndpointIsResolvedAgain(t *testing.T) {
	ctx := context.Background()
	t.Run("a port given to another sandbox", func(t *testing.T) {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		a, b := e.start(t, provider.Spec{}), e.start(t, provider.Spec{})
		e.srv.Reassign(a.SandboxID, b.SandboxID)
		if got := e.exec(t, a, "echo ran > ran.txt"); got.ExitCode != 0 {
			t.Fatalf("exec in A = %+v", got)
		}
		if err := e.p.WriteFile(ctx, a, "note.txt", []byte("for A")); err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"ran.txt", "note.txt"} {
			if _, err := e.p.ReadFile(ctx, a, name); err != nil {
				t.Errorf("A's %s: %v", name, err)
			}
			// B's cached endpoint leads nowhere now: resolved again too.
			if got, err := e.p.ReadFile(ctx, b, name); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("B's %s = %q, %v; want none", name, got, err)
			}
		}
	})
	t.Run("no connection", func(t *testing.T) {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		a := e.start(t, provider.Spec{})
		opensandbox.PointEndpoint(e.p, a.SandboxID, closedPort(t))
		if got := e.exec(t, a, "echo hi"); got.Stdout != "hi\n" {
			t.Errorf("exec = %+v", got)
		}
	})
	t.Run("a gateway's 403", func(t *testing.T) {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		a := e.start(t, provider.Spec{})
		gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, `{"error":"forbidden"}`, http.StatusForbidden)
		}))
		t.Cleanup(gw.Close)
		opensandbox.PointEndpoint(e.p, a.SandboxID, gw.URL)
		if err := e.p.WriteFile(ctx, a, "note.txt", []byte("for A")); err != nil {
			t.Fatal(err)
		}
		opensandbox.PointEndpoint(e.p, a.SandboxID, gw.URL)
		if got, err := e.p.ReadFile(ctx, a, "note.txt"); err != nil || string(got) != "for A" {
			t.Errorf("ReadFile = %q, %v", got, err)
		}
		opensandbox.PointEndpoint(e.p, a.SandboxID, gw.URL)
		if got := e.exec(t, a, "cat note.txt"); got.Stdout != "for A\n" {
			t.Errorf("exec = %+v", got)
		}
	})
	t.Run("a command that may have run", func(t *testing.T) {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		a := e.start(t, provider.Spec{})
		before := e.srv.Stats().Requests["GET /sandboxes/{id}/endpoints/{port}"]
		e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/direct/" + a.SandboxID + "/proxy/44772/command", AfterEffect: true, Drop: true})
		if _, err := e.p.Exec(ctx, a, provider.ExecRequest{Command: "echo ran >> ran.txt"}); err == nil {
			t.Fatal("Exec whose connection dropped after the command ran succeeded")
		}
		if got, err := e.p.ReadFile(ctx, a, "ran.txt"); err != nil || string(got) != "ran\n" {
			t.Errorf("ran.txt = %q, %v; want the command run once", got, err)
		}
		if n := e.srv.Stats().Requests["GET /sandboxes/{id}/endpoints/{port}"] - before; n != 1 {
			t.Errorf("the endpoint was resolved %d times after the dropped command, want once", n)
		}
	})
	t.Run("a refusal where the endpoint has not moved", func(t *testing.T) {
		e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
		a := e.start(t, provider.Spec{})
		before := e.srv.Stats().Requests["execd (direct)"]
		e.srv.Inject(opensandboxtest.Fault{Method: http.MethodPost, Path: "/direct/" + a.SandboxID + "/proxy/44772/command", Status: http.StatusForbidden})
		_, err := e.p.Exec(ctx, a, provider.ExecRequest{Command: "echo x"})
		var aerr *opensandbox.APIError
		if !errors.As(err, &aerr) || aerr.Status != http.StatusForbidden {
			t.Errorf("Exec refused where the endpoint stays = %v, want the 403", err)
		}
		if n := e.srv.Stats().Requests["execd (direct)"] - before; n != 1 {
			t.Errorf("%d execd requests, want the one refused: the same endpoint is not asked again", n)
		}
	})
}

// closedPort is the URL of a loopback port that refuses connections for
// the rest of the test (a port merely closed could be listened on again by
// any process meanwhile).
func closedPort(t *testing.T) string {
	t.Helper()
	p, release, err := freeport.Refusing()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
	return "http://127.0.0.1:" + strconv.Itoa(p)
}

// A sandbox that ended (as every one does when the runtime restarts) and
// whose host port another sandbox got: a process with no connection open
// (a restart ends them all) connects to that port for it only once the
// lifecycle server says it has not ended, so another sandbox's execd that
// takes any call (made here without a token: as one its agent replaced
// would) is never sent one.
func TestAnEndedSandboxsPortIsNotDialled(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	a := e.start(t, provider.Spec{Files: map[string]string{"note.txt": "A's"}})
	b := rawCreate(t, e)
	again, err := opensandbox.New(e.popts)
	if err != nil {
		t.Fatal(err)
	}
	baseOfA, _, err := again.Endpoint(ctx, a)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Terminate(a.SandboxID)
	e.srv.Reassign(a.SandboxID, b.SandboxID)
	e.mu.Lock()
	slept := len(e.sleeps)
	e.mu.Unlock()
	defer func() {
		// Refused at once: a sandbox that ended is not waited for.
		e.mu.Lock()
		defer e.mu.Unlock()
		if n := len(e.sleeps) - slept; n != 0 {
			t.Errorf("the calls for the ended sandbox backed off %d times, want none", n)
		}
	}()
	// A read first: an Exec that finds the sandbox ended forgets it, and
	// the read would not reach the port at all.
	if got, err := again.ReadFile(ctx, a, "note.txt"); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("ReadFile for the ended A = %q, %v; want ErrSandboxNotFound", got, err)
	}
	opensandbox.PointEndpoint(again, a.SandboxID, baseOfA)
	if _, err := again.Exec(ctx, a, provider.ExecRequest{Command: "echo ran > ran.txt"}); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("Exec for the ended A = %v, want ErrSandboxNotFound", err)
	}
	if got, err := e.p.ReadFile(ctx, b, "ran.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("B's ran.txt = %q, %v; want none: nothing meant for A runs in B", got, err)
	}
	// The look is per connection, and connections are kept: calls on one
	// look at nothing.
	if err := e.p.WriteFile(ctx, b, "b.txt", []byte("B")); err != nil {
		t.Fatal(err)
	}
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	for range 5 {
		if got, err := e.p.ReadFile(ctx, b, "b.txt"); err != nil || string(got) != "B" {
			t.Fatalf("ReadFile = %q, %v", got, err)
		}
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n > 1 {
		t.Errorf("5 reads looked at the sandbox %d times, want at most once (a new connection)", n)
	}
	// Nor while one is open: back-to-back commands, each on a connection
	// of its own while the last one's stream drains, look once at most.
	before = e.srv.Stats().Requests["GET /sandboxes/{id}"]
	for range 10 {
		if got := e.exec(t, b, "echo hi"); got.Stdout != "hi\n" {
			t.Fatalf("exec = %+v", got)
		}
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n > 1 {
		t.Errorf("10 commands looked at the sandbox %d times, want at most once", n)
	}
}

// rawCreate makes a sandbox without the provider (so without a token, as a
// server before tokens did) and waits until it runs.
func rawCreate(t *testing.T, e *env) provider.Handle {
	t.Helper()
	body := `{"image":{"uri":"x"},"entrypoint":["tail","-f","/dev/null"],"timeout":600,"resourceLimits":{"cpu":"1","memory":"1Gi"},"metadata":{}}`
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/sandboxes", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.APIKeyHeader, key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(res.Body).Decode(&doc)
	res.Body.Close()
	e.clk.Advance(10 * e.popts.PollInterval)
	return provider.Handle{SandboxID: doc.ID, Provider: opensandbox.Name, Descriptor: json.RawMessage(`{"sandbox_id":"` + doc.ID + `"}`)}
}

// The look at the sandbox before a connection is retried as any lifecycle
// call is, and a lifecycle server that still gives no answer fails the call
// closed with provider.ErrUnavailable (a 503 to agents, with Retry-After),
// never sent: the port may lead to another sandbox's execd, one its agent
// replaced (TestAnEndedSandboxsPortIsNotDialled). While the server is known
// unreachable, a look is one attempt.
func TestALifecycleServerThatDoesNotAnswerTheLookFailsTheCallClosed(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	a := e.start(t, provider.Spec{})
	fresh := func() *opensandbox.Provider { // no connection open yet
		t.Helper()
		again, err := opensandbox.New(e.popts)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := again.Endpoint(ctx, a); err != nil {
			t.Fatal(err)
		}
		return again
	}
	looks := func() int { return e.srv.Stats().Requests["GET /sandboxes/{id}"] }
	slept := func() int {
		e.mu.Lock()
		defer e.mu.Unlock()
		return len(e.sleeps)
	}
	look := func(f opensandboxtest.Fault) opensandboxtest.Fault {
		f.Method, f.Path = http.MethodGet, "/v1/sandboxes/"+a.SandboxID
		return f
	}

	// A passing failure is retried, and the command runs.
	again := fresh()
	before := looks()
	e.srv.Inject(look(opensandboxtest.Fault{Status: http.StatusServiceUnavailable}))
	if res, err := again.Exec(ctx, a, provider.ExecRequest{Command: "echo hi"}); err != nil || res.Stdout != "hi\n" {
		t.Errorf("Exec after one 503 to the look = %+v, %v; want it run", res, err)
	}
	if n := looks() - before; n != 2 {
		t.Errorf("the sandbox was looked at %d times, want 2 (a retry)", n)
	}

	calls := map[string]func(p *opensandbox.Provider) error{
		"Exec": func(p *opensandbox.Provider) error {
			_, err := p.Exec(ctx, a, provider.ExecRequest{Command: "echo ran >> ran.txt"})
			return err
		},
		"WriteFile": func(p *opensandbox.Provider) error { return p.WriteFile(ctx, a, "written.txt", []byte("x")) },
		"ReadFile": func(p *opensandbox.Provider) error {
			_, err := p.ReadFile(ctx, a, "ran.txt")
			return err
		},
	}
	for _, tc := range []struct {
		name string
		f    opensandboxtest.Fault
		// looks and backoffs of each call: a server that answers 503 is
		// asked through every retry; one that drops the connection is known
		// unreachable after the first call, whose look backs off alone.
		looks, sleeps []int
	}{
		{"503", opensandboxtest.Fault{Status: http.StatusServiceUnavailable, Times: 1000}, []int{6, 6, 6}, []int{5, 5, 5}},
		{"no answer", opensandboxtest.Fault{Drop: true, Times: 1000}, nil, []int{5, 0, 0}},
	} {
		again := fresh()
		e.srv.Inject(look(tc.f))
		for i, name := range []string{"Exec", "WriteFile", "ReadFile"} {
			before, sleeps := looks(), slept()
			err := calls[name](again)
			if !errors.Is(err, provider.ErrUnavailable) || errors.Is(err, provider.ErrSandboxNotFound) {
				t.Errorf("%s: %s while the look gets %s = %v, want ErrUnavailable (and not lost)", tc.name, name, tc.name, err)
			}
			if tc.looks != nil && looks()-before != tc.looks[i] {
				t.Errorf("%s: %s looked %d times, want %d", tc.name, name, looks()-before, tc.looks[i])
			}
			if n := slept() - sleeps; n != tc.sleeps[i] {
				t.Errorf("%s: %s backed off %d times, want %d", tc.name, name, n, tc.sleeps[i])
			}
		}
		e.srv.ClearFaults()
	}
	// Nothing was sent: no command ran, no file was written.
	for _, name := range []string{"ran.txt", "written.txt"} {
		if got, err := e.p.ReadFile(ctx, a, name); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("%s = %q, %v; want none: no call was made", name, got, err)
		}
	}
}

// The look, its retries included, is bounded as one request is: a server
// that keeps answering 503 fails a call at the bound, not after every retry.
func TestTheLookIsBoundedAsOneRequest(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	a := e.start(t, provider.Spec{})
	const retries = 10000
	opts := e.popts
	opts.RequestTimeout, opts.MaxRetries = 20*time.Millisecond, retries
	again, err := opensandbox.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	for {
		// At 20 ms an attempt, a loaded machine may need a few.
		if _, _, err := again.Endpoint(ctx, a); err == nil {
			break
		}
	}
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + a.SandboxID, Status: http.StatusServiceUnavailable, Times: retries + 1})
	if _, err := again.Exec(ctx, a, provider.ExecRequest{Command: "true"}); !errors.Is(err, provider.ErrUnavailable) {
		t.Errorf("Exec = %v, want ErrUnavailable", err)
	}
	// 5000 answers in 20 ms would be 4 µs each: only a look without its
	// bound gets near its 10001 attempts (an attempt cut at its own 20 ms
	// may not reach the server).
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n > retries/2 {
		t.Errorf("the look asked %d times, want it cut at its bound", n)
	}
}

// A connection still open shows that the sandbox's container is still there
// (a restart ends it with it): a second connection made meanwhile looks at
// nothing.
func TestAnOpenConnectionSparesTheLook(t *testing.T) {
	fk := fake.New(fake.Options{IDPrefix: "backend-"})
	e := newEnv(t, opensandboxtest.Options{Backend: fk}, opensandbox.Options{})
	ctx := context.Background()
	h := e.start(t, provider.Spec{})
	entered, release := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpExec && c.Phase == fake.PhaseBegin && first.CompareAndSwap(false, true) {
			close(entered)
			<-release
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := e.p.Exec(ctx, h, provider.ExecRequest{Command: "echo held"})
		done <- err
	}()
	<-entered // its connection is open, and busy
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" {
		t.Errorf("exec = %+v", got)
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n != 0 {
		t.Errorf("a second connection looked at the sandbox %d times while one was open, want none", n)
	}
	close(release)
	if err := <-done; err != nil {
		t.Error(err)
	}
}

// Once its connections are closed (as a runtime's restart closes them),
// the provider that made a sandbox looks at it again before it connects.
func TestClosedConnectionsBringTheLookBack(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	a := e.start(t, provider.Spec{Files: map[string]string{"note.txt": "A's"}})
	b := rawCreate(t, e)
	e.exec(t, a, "echo hi")
	e.p.Wait() // the command's stream read to its end: every connection idle
	opensandbox.CloseIdle(e.p, a.SandboxID)
	e.srv.Terminate(a.SandboxID)
	e.srv.Reassign(a.SandboxID, b.SandboxID)
	if err := e.p.WriteFile(ctx, a, "for-a.txt", []byte("A")); !errors.Is(err, provider.ErrSandboxNotFound) {
		t.Errorf("WriteFile for the ended A = %v, want ErrSandboxNotFound", err)
	}
	if got, err := e.p.ReadFile(ctx, b, "for-a.txt"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("B's for-a.txt = %q, %v; want none", got, err)
	}
}
