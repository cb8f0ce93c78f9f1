package opensandboxtest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/hangguard"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// commandBackend is the in-memory fake as a server's backend that records
// the commands it is given, holds each until released (when hold is set),
// and has one directory, dir (the in-memory fake has none), so that a
// command in it streams from its start. A command in a cwd of cwdErrs fails
// with that error, as a runtime's would for a cwd it cannot enter (the
// in-memory fake takes any).
type commandBackend struct {
	*fake.Provider
	dir     string
	hold    chan struct{}
	cwdErrs map[string]error

	mu       sync.Mutex
	requests []provider.ExecRequest
	entered  chan struct{} // closed when the first command arrives
}

func (b *commandBackend) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	b.mu.Lock()
	b.requests = append(b.requests, req)
	if len(b.requests) == 1 {
		close(b.entered)
	}
	b.mu.Unlock()
	if b.hold != nil {
		<-b.hold
	}
	if err := b.cwdErrs[req.Cwd]; err != nil {
		return provider.ExecResult{}, err
	}
	return b.Provider.Exec(ctx, h, req)
}

func (b *commandBackend) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	if name == b.dir {
		return nil, &fs.PathError{Op: "read", Path: name, Err: syscall.EISDIR}
	}
	return b.Provider.ReadFile(ctx, h, name)
}

func newCommandBackend(hold chan struct{}) *commandBackend {
	return &commandBackend{Provider: fake.New(fake.Options{IDPrefix: "backend-"}), dir: "/w", hold: hold, entered: make(chan struct{})}
}

// command posts a command to the execd of sandbox id and returns the
// answer, its body unread.
func command(t *testing.T, c *client, id, body string) *http.Response {
	t.Helper()
	res, err := http.Post(c.srv.URL+"/direct/"+id+"/proxy/44772/command", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	return res
}

// A command's timeout is in milliseconds, as execd reads it.
func TestACommandsTimeoutIsInMilliseconds(t *testing.T) {
	b := newCommandBackend(nil)
	c := newClient(t, opensandboxtest.Options{Backend: b})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id, _ := m["id"].(string)
	for _, body := range []string{`{"command":"true","timeout":1500}`, `{"command":"true"}`} {
		if res := command(t, c, id, body); res.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d", body, res.StatusCode)
		} else {
			_, _ = io.Copy(io.Discard, res.Body)
		}
	}
	var got []time.Duration
	b.mu.Lock()
	for _, r := range b.requests {
		got = append(got, r.Timeout)
	}
	b.mu.Unlock()
	if diff := cmp.Diff([]time.Duration{1500 * time.Millisecond, 0}, got); diff != "" {
		t.Errorf("the timeouts the backend was given (-want +got):\n%s", diff)
	}
}

// A command in a directory streams from its start, as execd's does: its
// first events reach the client while it still runs.
func TestACommandStreamsWhileItRuns(t *testing.T) {
	hangguard.Arm(t) // a stream held back until the command ends would wait forever
	hold := make(chan struct{})
	b := newCommandBackend(hold)
	c := newClient(t, opensandboxtest.Options{Backend: b})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id, _ := m["id"].(string)
	defer close(hold) // only once its first event is read
	res := command(t, c, id, `{"command":"echo hi","cwd":"/w"}`)
	<-b.entered
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d", res.StatusCode)
	}
	first, err := bufio.NewReader(res.Body).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var f struct{ Type, Text string }
	if err := json.Unmarshal(first, &f); err != nil || f.Type != "init" || f.Text == "" {
		t.Errorf("first event %q (%v), want init with the command's id", first, err)
	}
}

// A cwd the runtime finds missing, or not a directory, once the command is
// run (the backend shows no directory to stream from at once) is execd's 400,
// as the real execd refuses it before it runs anything.
func TestACwdTheRuntimeCannotEnterIs400(t *testing.T) {
	b := newCommandBackend(nil)
	b.cwdErrs = map[string]error{
		"/gone":   &fs.PathError{Op: "chdir", Path: "/gone", Err: fs.ErrNotExist},
		"/file/x": &fs.PathError{Op: "chdir", Path: "/file/x", Err: syscall.ENOTDIR},
	}
	c := newClient(t, opensandboxtest.Options{Backend: b})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id, _ := m["id"].(string)
	for cwd, want := range map[string]string{"/gone": "does not exist", "/file/x": "not a directory"} {
		res := command(t, c, id, `{"command":"true","cwd":"`+cwd+`"}`)
		body, _ := io.ReadAll(res.Body)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(body), "INVALID_REQUEST_BODY") || !strings.Contains(string(body), want) {
			t.Errorf("a command in %s: %d %s, want 400 INVALID_REQUEST_BODY saying %q", cwd, res.StatusCode, body, want)
		}
	}
}
