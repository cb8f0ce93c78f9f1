package diewith

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/diewith/diewithtest"
)

// TestChildStartsHelpers is the child's part of
// TestHelpersDieWithTheTestBinary: it starts a direct child (Parent) and a
// daemon that leaves its tree as stack.sh's lifecycle server does (setsid,
// its starter gone), watched by OnExit.
func TestChildStartsHelpers(t *testing.T) {
	if !diewithtest.Child() {
		t.Skip("the child of TestHelpersDieWithTheTestBinary")
	}
	direct := exec.Command("sleep", "600")
	Parent(direct, syscall.SIGKILL)
	if err := direct.Start(); err != nil {
		t.Fatal(err)
	}
	pidFile := filepath.Join(diewithtest.Dir(), "daemon.pid")
	daemon := exec.Command("/bin/sh", "-c", `setsid sleep 600 </dev/null >/dev/null 2>&1 & echo $! >"$0"`, pidFile)
	if err := daemon.Run(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	w, err := OnExit(exec.Command("/bin/sh", "-c", `kill "$(cat "$0")"`, pidFile))
	if err != nil {
		t.Fatal(err)
	}
	diewithtest.Write(t, direct.Process.Pid, strings.TrimSpace(string(b)), w.Pid())
}

// A test binary SIGKILLed mid-run (as a -timeout or a cancelled CI job
// ends it, no cleanup run) leaves nothing of what it started through this
// package: its direct child got the parent-death signal, and a daemon that
// left its tree was stopped by its watcher, which then ended too.
func TestHelpersDieWithTheTestBinary(t *testing.T) {
	if diewithtest.Child() {
		t.Skip("in the child")
	}
	words := diewithtest.Kill(t, "TestChildStartsHelpers", 2*time.Minute)
	names := map[int]string{}
	for i, name := range []string{"the direct child", "the daemon", "the daemon's watcher"} {
		pid, err := strconv.Atoi(words[i])
		if err != nil {
			t.Fatalf("pids %q: %v", words, err)
		}
		names[pid] = name
	}
	diewithtest.Gone(t, names)
}

// Run runs the stop command at once, once, and reports its failure with
// its output.
func TestRunStopsNowAndOnce(t *testing.T) {
	if diewithtest.Child() {
		t.Skip("in the child")
	}
	mark := filepath.Join(t.TempDir(), "ran")
	w, err := OnExit(exec.Command("/bin/sh", "-c", `echo x >>"$0"`, mark))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(mark); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the stop command ran before Run: %v", err)
	}
	if err := w.Run(); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(mark); string(b) != "x\n" {
		t.Errorf("the stop command's runs: %q, want one", b)
	}
	failing, err := OnExit(exec.Command("/bin/sh", "-c", `echo the reason >&2; exit 3`))
	if err != nil {
		t.Fatal(err)
	}
	if err := failing.Run(); err == nil || !strings.Contains(err.Error(), "the reason") || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("a failing stop command: %v, want its exit status and output", err)
	}
}

// Parent sets the signal and keeps what the command's SysProcAttr holds.
func TestParentKeepsTheProcessAttributes(t *testing.T) {
	bare, grouped := exec.Command("true"), exec.Command("true")
	grouped.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	Parent(bare, syscall.SIGTERM)
	Parent(grouped, syscall.SIGKILL)
	if a := bare.SysProcAttr; a == nil || a.Pdeathsig != syscall.SIGTERM {
		t.Errorf("a bare command's attributes: %+v", a)
	}
	if a := grouped.SysProcAttr; !a.Setpgid || a.Pdeathsig != syscall.SIGKILL {
		t.Errorf("a grouped command's attributes: %+v", a)
	}
}
