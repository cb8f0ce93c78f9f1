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
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
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
// naming those that still do, which it then kills. A process at one of the
// pids that started after Gone began is another's that took a freed pid:
// it counts as gone, and is never killed.
func Gone(t *testing.T, names map[int]string) {
	t.Helper()
	began, err := uptimeTicks()
	if err != nil {
		t.Fatal(err)
	}
	goneSince(t, names, began)
}

// goneSince is Gone for processes started by began (ticks since boot).
func goneSince(t *testing.T, names map[int]string, began uint64) {
	t.Helper()
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		var left []string
		var pids []int
		for pid, name := range names {
			if started, ok := running(pid); ok && started <= began {
				left, pids = append(left, fmt.Sprintf("%s (%d)", name, pid)), append(pids, pid)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(end) {
			for _, pid := range pids {
				// Still the one it was: a pidfd names the process, not the pid.
				if fd, err := unix.PidfdOpen(pid, 0); err == nil {
					if started, ok := running(pid); ok && started <= began {
						_ = unix.PidfdSendSignal(fd, unix.SIGKILL, nil, 0)
					}
					unix.Close(fd)
				}
			}
			t.Fatalf("left running after the test binary was killed: %s", strings.Join(left, ", "))
		}
	}
}

// Running: pid runs (a zombie does not).
func Running(pid int) bool {
	_, ok := running(pid)
	return ok
}

// running reports whether pid runs (a zombie does not), and when it
// started, in clock ticks since boot.
func running(pid int) (uint64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	if strings.HasPrefix(rest, "Z") {
		return 0, false
	}
	// After the command: state is field 3, starttime field 22.
	fields := strings.Fields(rest)
	if len(fields) < 20 {
		return 0, false
	}
	started, err := strconv.ParseUint(fields[19], 10, 64)
	if err != nil {
		return 0, false
	}
	return started, true
}

// uptimeTicks is the time since boot in clock ticks (USER_HZ, 100 on
// Linux), rounded up: a process started before now has a starttime no
// later.
func uptimeTicks() (uint64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	up, _, _ := strings.Cut(string(b), " ")
	secs, err := strconv.ParseFloat(up, 64)
	if err != nil {
		return 0, fmt.Errorf("/proc/uptime: %w", err)
	}
	return uint64(math.Ceil(secs*100)) + 1, nil
}
