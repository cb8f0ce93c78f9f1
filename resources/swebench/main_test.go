package swebench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/clock"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources/swebench"
	"github.com/sandboxowner/owner/sandboxapi"
)

// serveEnv makes the test binary a server process (childServer): its value is
// the JSON of a childConfig.
const serveEnv = "SWEBENCH_TEST_SERVE"

func TestMain(m *testing.M) {
	if cfg := os.Getenv(serveEnv); cfg != "" {
		os.Exit(childServer(cfg))
	}
	dir, err := os.MkdirTemp("", "swebench-test-caches-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv(swebench.CachesEnv, dir)
	code := m.Run()
	_ = exec.Command("chmod", "-R", "u+w", dir).Run() // the module cache is read-only without -modcacherw
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// childConfig is what a child server runs on.
type childConfig struct {
	Root, State, Templates, Caches string
	Repos, TestCommands            map[string]string
}

const (
	childSecret = "a-session-secret-the-restarted-server-shares"
	childToken  = "control-token"
)

// childServer is a whole SWE-bench server as one process: the local
// provider, an exported owner, the swebench resources, the HTTP surface with
// the sandbox exec API mounted and its tokens in /sandbox_access. It prints
// "LISTENING <addr>" and serves until SIGTERM (or a SIGKILL).
func childServer(raw string) int {
	var c childConfig
	if err := json.Unmarshal([]byte(raw), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	log := logrus.New()
	log.SetOutput(os.Stderr)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child server:", err); return 1 }
	p, err := local.New(local.Options{Root: c.Root, Logger: log, Caches: swebench.SharedCaches(c.Caches)})
	if err != nil {
		return fail(err)
	}
	own, err := owner.New(ctx, owner.Config{Name: "swebench", Provider: p, Logger: log,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: c.State}})
	if err != nil {
		return fail(err)
	}
	defer own.Close()
	res, err := swebench.New(swebench.Config{Repos: c.Repos, TemplateDir: c.Templates, TestCommands: c.TestCommands,
		SandboxConfig: swebench.SandboxConfig{TTLSeconds: 3600}}, swebench.Deps{Name: "swebench", Logger: log})
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	base := "http://" + ln.Addr().String()
	tokens, err := sandboxapi.NewTokens([]byte(childSecret), clock.Real{})
	if err != nil {
		return fail(err)
	}
	api := &sandboxapi.Handler{Provider: p, Tokens: tokens, Logger: log, Resolve: swebench.Resolver(own)}
	srv, err := httpapi.New(httpapi.Config{
		Owner: own, Resources: res, Logger: log, SessionSecret: []byte(childSecret), ControlAuthToken: childToken,
		Mounts: map[string]fasthttp.RequestHandler{sandboxapi.Prefix: api.Serve},
		Access: func(_ *httpapi.Session, sb owner.Sandbox, desc map[string]any) error {
			a := tokens.Access(base, sb.Handle.SandboxID, time.Now().Add(time.Hour))
			desc["endpoint"], desc["token"] = a.Endpoint, a.Token
			return nil
		},
	})
	if err != nil {
		return fail(err)
	}
	go func() { _ = srv.Serve(ln) }()
	fmt.Printf("LISTENING %s\n", ln.Addr())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return 0
}

// child is a running child server.
type child struct {
	cmd  *exec.Cmd
	base string
	done chan error
}

// startChild starts a server process on c and waits for its LISTENING line.
func startChild(t *testing.T, c childConfig) *child {
	t.Helper()
	raw, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+string(raw))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(t.TempDir(), "child.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, done: make(chan error, 1)}
	var addr string
	if _, err := fmt.Fscanf(stdout, "LISTENING %s\n", &addr); err != nil {
		_ = cmd.Process.Kill()
		b, _ := os.ReadFile(logFile.Name())
		t.Fatalf("child server did not start: %v\n%s", err, b)
	}
	go func() {
		_, _ = io.Copy(io.Discard, stdout)
		ch.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		if ch.cmd.ProcessState == nil {
			ch.stop(t, syscall.SIGTERM)
		}
	})
	ch.base = "http://" + addr
	return ch
}

// stop sends sig and waits for the process to exit.
func (c *child) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the child server did not exit after %v", sig)
	}
}
