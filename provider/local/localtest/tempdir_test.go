package localtest_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/internal/flock"
	"github.com/sandboxowner/owner/internal/racebuild"
	"github.com/sandboxowner/owner/provider/local/localtest"
)

// childEnv makes the test binary a test binary's stand-in (see TestMain):
// it takes its TempRoot, mounts a tmpfs (and one inside it) under it as a
// sandbox's overlay would be, says where, and waits to be killed.
const childEnv = "LOCALTEST_TEMPROOT_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

func child() int {
	if _, err := localtest.TempRoot(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	mnt := filepath.Join(os.TempDir(), "TestX123", "001", "sandboxes", "sb1")
	if err := mount(mnt); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if err := mount(filepath.Join(mnt, "inner")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println(os.TempDir())
	select {}
}

func mount(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return unix.Mount("tmpfs", dir, "tmpfs", 0, "size=1m")
}

// TestReapClearsWhatADeadTestBinaryLeft: a test binary that took its
// TempRoot and mounted under it keeps both while it lives (another run's
// Reap leaves them); once it is killed, Reap detaches its mounts and removes
// its directory. Directories TempRoot did not make are left alone, mounts
// and all.
func TestReapClearsWhatADeadTestBinaryLeft(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("skipped: mounting a tmpfs needs root")
	}
	base := t.TempDir()
	// Not TempRoot's: one named otherwise, with an unlocked lock file, and
	// one named so without a lock file. Both mounted.
	var others []string
	for _, name := range []string{"someone-else", localtest.Prefix + "nolock"} {
		dir := filepath.Join(base, name)
		if err := mount(filepath.Join(dir, "mnt")); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = unix.Unmount(filepath.Join(dir, "mnt"), unix.MNT_DETACH) })
		others = append(others, dir)
	}
	if err := os.WriteFile(filepath.Join(base, "someone-else", localtest.OwnerLock), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self)
	cmd.Env = racebuild.NoExitSleep(append(os.Environ(), childEnv+"=1", "TMPDIR="+base))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("the child said nothing: %v", err)
	}
	dir := strings.TrimSpace(line)
	if filepath.Dir(dir) != base || !strings.HasPrefix(filepath.Base(dir), localtest.Prefix) {
		t.Fatalf("the child's temp root %s is not a %s* directory in %s", dir, localtest.Prefix, base)
	}
	want := []string{filepath.Join(dir, "TestX123/001/sandboxes/sb1"), filepath.Join(dir, "TestX123/001/sandboxes/sb1/inner")}
	// Whatever Reap did, the test's own directory must go.
	t.Cleanup(func() { _ = unix.Unmount(want[0], unix.MNT_DETACH) })

	reaped, err := localtest.Reap(base)
	if err != nil || len(reaped) != 0 {
		t.Fatalf("Reap while the child lives: reaped %v, %v", reaped, err)
	}
	if d := cmp.Diff(want, localtest.MountsUnder(t, dir)); d != "" {
		t.Fatalf("a live test binary's mounts after Reap (-want +got):\n%s", d)
	}

	// Killed as go test's -timeout kills: no cleanup runs. Once Wait
	// returns, the process is gone and its lock with it.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	killed = true
	if d := cmp.Diff(want, localtest.MountsUnder(t, dir)); d != "" {
		t.Fatalf("the dead child's mounts before Reap (-want +got):\n%s", d)
	}

	reaped, err = localtest.Reap(base)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{dir}, reaped); d != "" {
		t.Errorf("reaped (-want +got):\n%s", d)
	}
	if got := localtest.MountsUnder(t, dir); len(got) != 0 {
		t.Errorf("mounts left under the dead child's root: %v", got)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the dead child's root is still there: %v", err)
	}
	for _, o := range others {
		if got := localtest.MountsUnder(t, o); len(got) != 1 {
			t.Errorf("%s, not TempRoot's, lost its mount: %v", o, got)
		}
	}
}

// TestTempRootIsLockedAndGoes: TempRoot points TMPDIR at a directory of
// its own, whose lock it holds (Reap leaves it); done puts TMPDIR back and
// removes the directory.
func TestTempRootIsLockedAndGoes(t *testing.T) {
	base := t.TempDir()
	t.Setenv("TMPDIR", base)
	done, err := localtest.TempRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := os.TempDir()
	if filepath.Dir(dir) != base || !strings.HasPrefix(filepath.Base(dir), localtest.Prefix) {
		t.Fatalf("TMPDIR %s is not a %s* directory in %s", dir, localtest.Prefix, base)
	}
	f, err := os.Open(filepath.Join(dir, localtest.OwnerLock))
	if err != nil {
		t.Fatal(err)
	}
	if err := flock.TryExclusive(f); err == nil {
		t.Error("the owner lock is not held")
	}
	_ = f.Close()
	if reaped, err := localtest.Reap(base); err != nil || len(reaped) != 0 {
		t.Errorf("Reap of a live temp root: %v %v", reaped, err)
	}
	done()
	if os.TempDir() != base {
		t.Errorf("TMPDIR after done: %s, want %s", os.TempDir(), base)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("the temp root after done: %v", err)
	}
}
