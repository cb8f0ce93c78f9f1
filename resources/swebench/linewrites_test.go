package swebench

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// TestEvalPipesWriteALineAWrite runs each awk stage an eval's output passes
// through (the relay of a test binary's output, the filter of go test's, the
// eval's filter) with the host's awk, as the eval picks it, into a
// SOCK_SEQPACKET socket, which keeps every write a message of its own. A
// line written in two writes lets another writer of the same pipe (the
// shell saying a process was killed) land inside it: a marked "=== RUN
// TestAbs" became "=== RUN   TestAbsKilled", and the grader read the
// binary's results as claims without a run.
func TestEvalPipesWriteALineAWrite(t *testing.T) {
	needTools(t, "awk", "sh", "bash")
	awk := "awk"
	if out, err := exec.Command("awk", "-W", "version").Output(); err == nil && strings.Contains(string(out), "mawk") {
		awk = "awk -W interactive"
	}
	lines := []string{"\x16=== RUN   TestAbs", "\x16--- PASS: TestAbs (0.00s)", "\x16\x16ng-exit\t0\t0", "ok  \tcalc\t0.01s", "plain output", strings.Repeat("z", 3000), grading.StartTestOutput}
	in := strings.Join(lines, "\n") + "\n"
	prelude := "eval \"$NG_PRELUDE\" && "
	stages := []struct {
		name, script string
		want         []string
	}{
		{"ng_relay", prelude + "ng_relay", []string{"\x16=== RUN   TestAbs", "\x16--- PASS: TestAbs (0.00s)", " \x16\x16ng-exit\t0\t0", "ok  \tcalc\t0.01s", "plain output", lines[5], lines[6]}},
		{"ng_unlisted", prelude + "ng_unlisted", []string{lines[0], lines[1], lines[2], lines[4], lines[5], lines[6]}},
		{"evalFilter", evalFilter, lines},
	}
	for _, s := range stages {
		t.Run(s.name, func(t *testing.T) {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
			if err != nil {
				t.Fatal(err)
			}
			w, r := os.NewFile(uintptr(fds[0]), "w"), os.NewFile(uintptr(fds[1]), "r")
			defer r.Close()
			cmd := exec.Command("bash", "-c", s.script)
			cmd.Env = append(os.Environ(), "LC_ALL=C", "NG_AWK="+awk, "NG_DIR="+t.TempDir(), "NG_T0=1", "NG_REAL_GO=", "NG_PRELUDE="+evalPrelude)
			cmd.Stdin = strings.NewReader(in)
			cmd.Stdout = w
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				w.Close()
				t.Fatal(err)
			}
			w.Close()
			var writes []string
			buf := make([]byte, 1<<16)
			for {
				n, err := syscall.Read(fds[1], buf)
				if errors.Is(err, syscall.EINTR) {
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				writes = append(writes, string(buf[:n]))
			}
			if err := cmd.Wait(); err != nil {
				t.Fatal(err)
			}
			want := make([]string, len(s.want))
			for i, l := range s.want {
				want[i] = l + "\n"
			}
			if d := cmp.Diff(want, writes); d != "" {
				t.Errorf("the writes of %s (-a line a write +got):\n%s", s.name, d)
			}
		})
	}
}
