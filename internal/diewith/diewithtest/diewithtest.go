// Package diewithtest kills a child test binary mid-run and looks for what
// it started: the tests of what must die with a test binary (diewith).
//
// The test binary runs itself with one test (the child's part, which
// skips unless Child finds its variable), the child starts its helpers and
// Writes their pids, and the parent SIGKILLs it as a -timeout or a
// cancelled CI job would, then waits until none of them runs.
package diewithtest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// env names, in the child, the file it writes its words to.
const env = "DIEWITHTEST_CHILD_OUT"

// Child reports whether this test binary is a child Kill started.
func Child() bool { return os.Getenv(env) != "" }

// Dir is, in the child, a directory of the parent test's, which it
// removes: the child's own TempDir would outlive it (killed, it cleans
// nothing).
func Dir() string { return filepath.Dir(os.Getenv(env)) }

// Write is the child's report of what it started (pids, then any other
// words), written at once; then the child waits to be killed.
func Write(t *testing.T, words ...any) {
	t.Helper()
	out := os.Getenv(env)
	if err := os.WriteFile(out+".tmp", []byte(fmt.Sprintln(words...)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(out+".tmp", out); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Hour) // killed here (a select{} alone would end in a deadlock panic)
}

// Kill runs this test binary's test child (it calls Write), waits up to
// guard (a hang guard) for what it Writes, SIGKILLs it and returns its
// words. A child that skips skips the test.
func Kill(t *testing.T, child string, guard time.Duration) []string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "started")
	cmd := exec.Command(self, "-test.run=^"+child+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+out)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	for end := time.Now().Add(guard); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-exited:
			if strings.Contains(log.String(), "--- SKIP") {
				t.Skipf("the child skipped:\n%s", log.String())
			}
			t.Fatalf("the child ended before it started its helpers: %v\n%s", err, log.String())
		default:
		}
		if b, err := os.ReadFile(out); err == nil {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			<-exited
			return strings.Fields(string(b))
		}
		if time.Now().After(end) {
			_ = cmd.Process.Kill()
			t.Fatalf("the child wrote nothing within %v:\n%s", guard, log.String())
		}
	}
}

// Gone waits, up to two minutes (a hang guard), until none of pids runs
// (a zombie does not: it waits only for its reaping), and fails the test
// naming those that still do, which it then kills.
func Gone(t *testing.T, names map[int]string) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var left []string
		var pids []int
		for pid, name := range names {
			if Running(pid) {
				left, pids = append(left, fmt.Sprintf("%s (%d)", name, pid)), append(pids, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(end) {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			t.Fatalf("left running after the test binary was killed: %s", strings.Join(left, ", "))
		}
	}
}

// Running: pid runs (a zombie does not).
func Running(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return !strings.HasPrefix(rest, "Z")
}
