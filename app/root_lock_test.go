package app_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
)

// startupAddr reads a JSON log until the startup line and returns its addr.
func startupAddr(t *testing.T, lines interface {
	Scan() bool
	Bytes() []byte
	Text() string
}) string {
	t.Helper()
	var log []string
	for lines.Scan() {
		log = append(log, lines.Text())
		var e map[string]any
		if json.Unmarshal(lines.Bytes(), &e) == nil {
			if a, ok := e["addr"].(string); ok {
				return a
			}
		}
	}
	t.Fatalf("no startup line: %v", log)
	return ""
}

// TestProcessSecondServerOnARootRefusesToStart runs the server twice on one
// sandbox root: the second exits 2 with one line naming the first's pid,
// and the first's sandbox is untouched. Once the first stops, the root is
// free again.
func TestProcessSecondServerOnARootRefusesToStart(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	args := []string{"-port", "0", "-log-format", "json", "-sandbox.provider", "local", "-sandbox.local.root", root}
	first, lines, _ := child(t, args...)
	addr := startupAddr(t, lines)
	go func() {
		for lines.Scan() {
		}
	}()
	s, body, cookie := post(t, addr, "/seed_session", "", "{}")
	if s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}

	second, lines2, _ := child(t, args...)
	var out []string
	for lines2.Scan() {
		out = append(out, lines2.Text())
	}
	err := second.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 {
		t.Errorf("second server: exit %v, want status 2", err)
	}
	if len(out) != 1 || !strings.Contains(out[0], fmt.Sprintf("is held by process %d", first.Process.Pid)) {
		t.Fatalf("second server's stderr %q, want one line naming process %d", out, first.Process.Pid)
	}
	// The first server's session still has its sandbox.
	if s, body, _ := post(t, addr, "/append_note", cookie, `{"line":"still mine"}`); s != 200 {
		t.Fatalf("append on the first server after the second tried: %d %s", s, body)
	}
	if s, body, _ := post(t, addr, "/verify", cookie, `{"expected_notes":["still mine"]}`); s != 200 || !strings.Contains(body, `"reward":1`) {
		t.Fatalf("verify on the first server: %d %s", s, body)
	}

	if err := first.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.Wait(); err != nil {
		t.Fatalf("first server's exit: %v", err)
	}
	third, lines3, _ := child(t, args...)
	startupAddr(t, lines3)
	_ = third.Process.Signal(syscall.SIGTERM)
	go func() {
		for lines3.Scan() {
		}
	}()
	if err := third.Wait(); err != nil {
		t.Fatalf("a server on the freed root: %v", err)
	}
}
