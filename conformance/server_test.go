package conformance_test

import (
	"bytes"
	"flag"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/replytest"
	"github.com/sandboxowner/owner/internal/servertest"
	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/provider/local/localtest"
)

const token = "conformance-token"

func TestMain(m *testing.M) {
	// The test binary is also the server the tests run (see servertest).
	servertest.ServeIfChild()
	flag.Parse()
	testparallel.AtLeast(4)
	// The sandboxes live under a locked temporary root (see localtest.Run),
	// and so does the small init's build.
	os.Exit(localtest.Run(m))
}

// server is one running server process.
type server struct {
	t    *testing.T
	base string
	dir  string
	cmd  *exec.Cmd
	log  *serverLog
	args []string
	// exited is closed once the process has been waited for.
	exited chan struct{}
}

// start runs the notes server on the local provider with checkpointing on,
// its state under a fresh directory; extra are more flags.
func start(t *testing.T, extra ...string) *server {
	t.Helper()
	s := &server{t: t, dir: t.TempDir()}
	s.args = append([]string{
		"-name", "notes", "-resources", "notes", "-host", "127.0.0.1",
		"-checkpoint.enabled", "-checkpoint.state_dir", filepath.Join(s.dir, "state"),
		"-checkpoint.control_auth_token", token,
		"-sandbox.local.root", filepath.Join(s.dir, "sandboxes"),
		// Copies, not overlay mounts: a process killed mid-test leaves
		// nothing mounted in the test's directory.
		"-sandbox.local.overlay", "off",
	}, extra...)
	s.run()
	t.Cleanup(s.stop)
	return s
}

// serverLog is a server's output so far, written by exec's copying
// goroutine while the test reads it; it says the address the server
// logged it serves on, once.
type serverLog struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	addr chan string
}

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.addr != nil {
		if a := servertest.Addr(l.buf.Bytes()); a != "" {
			l.addr <- a
			l.addr = nil
		}
	}
	return len(p), nil
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (s *server) run() {
	s.t.Helper()
	// Port 0: the kernel's port, read from the log, so that servers of
	// tests running at once never race for one.
	addr := make(chan string, 1)
	s.log = &serverLog{addr: addr}
	args := append(slices.Clone(s.args), "-port", "0")
	if i := slices.Index(args, "-sandbox.provider"); (i < 0 || i+1 < len(args) && args[i+1] == "local") &&
		!slices.Contains(args, "-sandbox.local.init_binary") {
		// The sandboxes' inits and the provider's startup probes run the
		// small init, not this -race binary (several times the CPU to
		// start, twice per isolated sandbox), as in sim/process.
		args = append(args, "-sandbox.local.init_binary", localtest.InitBinary(s.t))
	}
	s.cmd = servertest.Command(nil, args...)
	s.cmd.Stdout, s.cmd.Stderr = s.log, s.log
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	exited := make(chan struct{})
	s.exited = exited
	go func() { _ = s.cmd.Wait(); close(exited) }()
	// Startup: a bound on a broken server, not a synchronisation.
	select {
	case a := <-addr:
		s.base = "http://" + a
	case <-exited:
		s.t.Fatalf("the server exited at startup:\n%s", s.log)
	case <-time.After(servertest.StartGuard):
		s.t.Fatalf("the server logged no address within %v:\n%s", servertest.StartGuard, s.log)
	}
	for deadline := time.Now().Add(servertest.StartGuard); ; {
		select {
		case <-exited:
			s.t.Fatalf("the server exited at startup:\n%s", s.log)
		default:
		}
		if r, err := http.Get(s.base + "/health"); err == nil {
			r.Body.Close()
			if r.StatusCode == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("the server never answered /health:\n%s", s.log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop ends the server as an operator does (SIGTERM: it stops its
// sandboxes), so the test's directory can be removed.
func (s *server) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		<-s.exited
	}
}

// kill ends the process at once (kill -9), as a crash does.
func (s *server) kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

// restart kills the server and starts a fresh process on the same state.
func (s *server) restart() {
	s.kill()
	s.run()
}

// reply is one HTTP answer.
type reply struct {
	status int
	body   []byte
	header http.Header
}

func (r reply) json(t *testing.T) map[string]any {
	t.Helper()
	return replytest.Object(t, r.status, r.body)
}

// code is the envelope's error code ("" for none).
func (r reply) code() string { return replytest.Code(r.body) }

// agent is a client with its session cookie.
type agent struct{ cookie *http.Cookie }

func (s *server) do(a *agent, method, path string, body any, hdr map[string]string) reply {
	s.t.Helper()
	raw, err := replytest.Encode(body)
	if err != nil {
		s.t.Fatal(err)
	}
	var rd io.Reader
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	if a != nil && a.cookie != nil {
		req.AddCookie(a.cookie)
	}
	c := &http.Client{Timeout: 2 * time.Minute}
	resp, err := c.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if a != nil {
		for _, ck := range resp.Cookies() {
			if ck.MaxAge < 0 || ck.Value == "" {
				a.cookie = nil
			} else {
				a.cookie = ck
			}
		}
	}
	return reply{status: resp.StatusCode, body: b, header: resp.Header}
}

func (s *server) post(a *agent, path string, body any) reply {
	s.t.Helper()
	return s.do(a, "POST", path, body, nil)
}

const prefix = "/ng-control/v1/checkpoint/"

func (s *server) control(op string, body any) reply {
	s.t.Helper()
	method := "POST"
	if op == "status" {
		method = "GET"
	}
	return s.do(nil, method, prefix+op, body, map[string]string{"Authorization": "Bearer " + token})
}

func deadline(d time.Duration) float64 {
	return float64(time.Now().Add(d).UnixMilli()) / 1000
}

// base is a control body with checkpoint_id, a deadline a minute ahead and
// extra fields.
func body(id string, extra map[string]any) map[string]any {
	b := map[string]any{"checkpoint_id": id, "deadline_ts": deadline(time.Minute)}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

func (s *server) op(op, id string, extra map[string]any) map[string]any {
	s.t.Helper()
	return s.ok(s.control(op, body(id, extra)), op+" "+id)
}

func (s *server) ok(r reply, what string) map[string]any {
	s.t.Helper()
	if r.status != 200 {
		s.t.Fatalf("%s: %d %s", what, r.status, r.body)
	}
	return r.json(s.t)
}

func (s *server) want(r reply, status int, code, what string) {
	s.t.Helper()
	if r.status != status || r.code() != code {
		s.t.Fatalf("%s: %d %s, want %d %s", what, r.status, r.body, status, code)
	}
}

func ep(rollout string, attempt int) map[string]any {
	return map[string]any{"rollout_id": rollout, "attempt": attempt}
}
