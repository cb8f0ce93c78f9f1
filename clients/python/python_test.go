// Package python_test runs the Python client's tests against the real
// server (cmd/server's program, which this test binary also is: see
// internal/servertest): a notes server on loopback with the local provider under a
// temporary directory.
package python_test

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/servertest"
)

func TestMain(m *testing.M) {
	// The test binary is also the server the tests run (see servertest).
	servertest.ServeIfChild()
	os.Exit(m.Run())
}

// startServer runs a notes server on loopback; it is stopped (SIGTERM: it
// stops its sandboxes) when the test ends. Port 0: the kernel's, read from
// the server's startup line (see servertest.Addr). A port found free here
// and passed on was free only until another process's bind, and the
// server binds after its provider has started.
func startServer(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	logPath := filepath.Join(dir, "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := servertest.Command(nil, "-name", "notes", "-resources", "notes",
		"-host", "127.0.0.1", "-port", "0",
		"-sandbox.local.root", filepath.Join(dir, "sandboxes"),
		// Copies, not overlay mounts: a killed test leaves nothing mounted.
		"-sandbox.local.overlay", "off")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	serverLog := func() string { b, _ := os.ReadFile(logPath); return string(b) }
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-exited
		if t.Failed() {
			t.Logf("server log:\n%s", serverLog())
		}
	})
	// Startup: a bound on a broken server, not a synchronisation.
	base := ""
	for deadline := time.Now().Add(servertest.StartGuard); ; time.Sleep(20 * time.Millisecond) {
		select {
		case <-exited:
			t.Fatalf("the server exited at startup:\n%s", serverLog())
		default:
		}
		if base == "" {
			if addr := servertest.Addr([]byte(serverLog())); addr != "" {
				base = "http://" + addr
			}
		}
		if base != "" {
			if r, err := http.Get(base + "/health"); err == nil {
				r.Body.Close()
				if r.StatusCode == http.StatusOK {
					return base
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never answered /health:\n%s", serverLog())
		}
	}
}

// python runs python3 in this directory with the client importable.
func python(t *testing.T, base string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", args...)
	cmd.Env = append(os.Environ(), "SANDBOXOWNER_URL="+base, "PYTHONPATH=.", "PYTHONDONTWRITEBYTECODE=1")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed: the Python client's tests need it")
	}
	if out, err := exec.Command("python3", "-c", "import sys; sys.exit(sys.version_info < (3, 9))").CombinedOutput(); err != nil {
		t.Skipf("python3 is older than 3.9, the client's minimum: %s", out)
	}
}

func TestPythonClientAgainstTheServer(t *testing.T) {
	needPython(t)
	base := startServer(t)
	out, err := python(t, base, "-m", "unittest", "discover", "-v", "-s", "tests", "-t", ".")
	if err != nil {
		t.Fatalf("python3 -m unittest: %v\n%s", err, out)
	}
	// With SANDBOXOWNER_URL set nothing may skip: a skip would hide a test
	// that never ran against the server.
	if strings.Contains(out, "skipped") {
		t.Fatalf("tests skipped with a server running:\n%s", out)
	}
	if !strings.Contains(out, "test_tool_call_then_the_agent_reads_it_in_the_sandbox") {
		t.Fatalf("the server tests did not run:\n%s", out)
	}
	t.Log(out)
}

// The example an agent's author starts from runs as documented.
func TestAgentToolCallExample(t *testing.T) {
	needPython(t)
	base := startServer(t)
	out, err := python(t, base, "examples/agent_tool_call.py", base)
	if err != nil {
		t.Fatalf("examples/agent_tool_call.py: %v\n%s", err, out)
	}
	for _, want := range []string{
		`run_command({"command": "cat notes.txt && ls -a"}) -> {"exit_code": 0, "stdout": "one\n`,
		`"error": "file_not_found"`,
		"reward 1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the example's output lacks %q:\n%s", want, out)
		}
	}
}
