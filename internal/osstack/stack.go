package osstack

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/diewith"
	"github.com/sandboxowner/owner/internal/flock"
	"github.com/sandboxowner/owner/internal/freeport"
)

// Stack is the real OpenSandbox (its lifecycle server from source, Docker
// runtime, execd in every sandbox) on this machine, as
// ../shared/opensandbox/stack.sh brings it up.
type Stack struct {
	// URL is the lifecycle server's base, http://127.0.0.1:port (the API
	// is under /v1); Domain is host:port.
	URL, Domain string
	APIKey      string
	// Image is a Debian image sandboxes can start from.
	Image string
	// Script is stack.sh, for a test that stops or restarts a part.
	Script string
	// Dir is the stack's state folder (its logs, pid files).
	Dir string
	// env is stack.sh's environment: nil for the shared stack's (the
	// process's own), OSSTACK_DIR and OSSTACK_PORT of its own for a
	// lifecycle server of a test's own (OwnServer).
	env []string

	// held is the test's shared hold on the stack (Require); fault, the
	// fault lock the test holds (RequireFault), nil for none.
	held  *os.File
	fault *faultHold
}

// faultHold is a fault test's hold of the fault lock, given back once: when
// its fault is over (Exclusive's done) or when the test ends.
type faultHold struct {
	f    *os.File
	once sync.Once
	over atomic.Bool
}

func (h *faultHold) release() {
	h.over.Store(true)
	h.once.Do(func() { _ = flock.Release(h.f) })
}

// ErrNoStack means the real stack cannot run here: ../shared/opensandbox is
// absent (a user's clone). A test skips on it.
var ErrNoStack = errors.New("the real OpenSandbox stack is absent")

// Script finds ../shared/opensandbox/stack.sh beside the module root
// (found from the working directory up), or returns ErrNoStack.
func Script() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod above the working directory: %w", ErrNoStack)
		}
		dir = parent
	}
	script := filepath.Join(dir, "..", "shared", "opensandbox", "stack.sh")
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("%s: %w", script, ErrNoStack)
	}
	return script, nil
}

// Dir is the stack's directory, as stack.sh finds it: $OSSTACK_DIR,
// or opensandbox-stack under the temporary directory. Its pid files and the
// locks that keep fault tests apart live there, so every test binary must
// find the same one.
func Dir() string {
	if dir := os.Getenv("OSSTACK_DIR"); dir != "" {
		return dir
	}
	return filepath.Join(os.TempDir(), "opensandbox-stack")
}

// PinDir sets OSSTACK_DIR to Dir unless it is set: a TestMain
// calls it before it points TMPDIR elsewhere (localtest.TempRoot), so that
// the tests and the servers they start still find the shared stack, not a
// second one of their own under the new temporary directory.
func PinDir() error {
	if os.Getenv("OSSTACK_DIR") != "" {
		return nil
	}
	return os.Setenv("OSSTACK_DIR", Dir())
}

// Up brings the real stack up through stack.sh up (a few seconds when
// it is up already; minutes cold, most of it building execd) and returns
// where it answers. It holds the stack shared (Shared) only while stack.sh
// runs, so that it never starts a part a fault test stopped on purpose.
// Call it once per test binary (Stack.Up runs the script again); each test
// then takes its own hold through Require.
func Up() (Stack, error) {
	script, err := Script()
	if err != nil {
		return Stack{}, err
	}
	dir := Dir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return Stack{}, err
	}
	st := Stack{Script: script, Dir: dir}
	release, err := st.Shared()
	if err != nil {
		return Stack{}, err
	}
	defer release()
	if err := st.upAndRead(); err != nil {
		return Stack{}, err
	}
	return st, nil
}

// upAndRead runs stack.sh up in s's environment and reads where its
// server answers from what it prints.
func (s *Stack) upAndRead() error {
	var stderr bytes.Buffer
	cmd := exec.Command(s.Script, "up")
	cmd.Env = s.env
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%s up: %v: %s", s.Script, err, lastLine(stderr.String()))
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "=")
		switch k {
		case "OSSTACK_URL":
			s.URL = strings.TrimSuffix(v, "/v1")
		case "OSSTACK_API_KEY":
			s.APIKey = v
		case "OSSTACK_IMAGE":
			s.Image = v
		}
	}
	if s.URL == "" || s.Image == "" {
		return fmt.Errorf("%s up printed no OSSTACK_URL or OSSTACK_IMAGE: %q", s.Script, out)
	}
	s.Domain = strings.TrimPrefix(s.URL, "http://")
	return nil
}

// OwnServer starts a lifecycle server of the test's own beside the
// stack's, on its dockerd and images (stack.sh up with a directory and a
// port of its own: its own store, pid file and log), and stops it when the
// test ends. A test that kills and restarts it (KillServer, Up) takes no
// other test's server down, so it needs neither the fault lock nor
// Exclusive, and waits for no other test's hold: the shared hold s carries
// (s must come from Require) keeps dockerd up under it. StopDockerd on the
// returned Stack refuses: the dockerd is the shared stack's.
func (s Stack) OwnServer(tb testing.TB) Stack {
	tb.Helper()
	if s.held == nil {
		tb.Fatal("OwnServer on a Stack that Require did not return")
	}
	own := s
	own.Dir, own.fault = tb.TempDir(), nil
	// stack.sh finds the server's Python packages in its directory: the
	// shared stack's, unpacked once, rather than a download of its own.
	if err := os.Symlink(filepath.Join(s.Dir, "pydeps"), filepath.Join(own.Dir, "pydeps")); err != nil {
		tb.Fatal(err)
	}
	// Down with the test, whatever up did: it stops just the server its
	// pid file names (stack.sh leaves a dockerd it did not start alone).
	// stack.sh starts the server in a session of its own and exits, so a
	// test binary killed mid-run (its -timeout, a cancelled CI job) runs
	// no cleanup and the server would outlive it: a watcher runs down
	// then (diewith.OnExit), and the cleanup has it run down now.
	down := exec.Command(own.Script, "down")
	down.Env = append(os.Environ(), "OSSTACK_DIR="+own.Dir)
	w, err := diewith.OnExit(down)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := w.Run(); err != nil {
			tb.Errorf("the test's own lifecycle server: %v", err)
		}
	})
	// A port found free may be taken before the server binds it: a few
	// tries, each with another.
	for range 3 {
		var port int
		if port, err = freeport.Loopback(); err != nil {
			break
		}
		own.env = append(os.Environ(), "OSSTACK_DIR="+own.Dir, fmt.Sprintf("OSSTACK_PORT=%d", port))
		if err = own.upAndRead(); err == nil {
			return own
		}
	}
	tb.Fatalf("a lifecycle server of the test's own: %v", err)
	return Stack{}
}

// hold opens one of the stack's lock files and flocks it (LOCK_SH or
// LOCK_EX). Test binaries (go test runs packages at once) share the stack:
// every test that uses it holds tests.lock shared, and a test that stops or
// restarts one of its parts holds it exclusively for just that while
// (Exclusive). A flock is per open file, so each hold is a file of its own
// and holds in one process exclude each other as they do across processes.
// A hold ends with flock.Release (a child forked meanwhile holds a copy of
// the file until it execs).
func (s Stack) hold(name string, how int) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(s.Dir, name), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), how); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock the stack: %w", err)
	}
	return f, nil
}

// Lock files: every test holds testsLock; fault tests also hold faultsLock
// exclusively, one after another. gateLock gives the exclusive hold
// priority: a flock lets a new shared hold in while an exclusive one waits,
// so a fault test waited as long as the other tests' shared holds
// overlapped (8 minutes behind the SWE-bench gin test and its neighbours
// at load 30). A shared hold is taken through the gate (held shared just
// for that); Exclusive holds the gate exclusively while it waits and
// holds, so that new shared holds queue behind it and it waits only for
// those already taken.
const (
	testsLock  = "tests.lock"
	faultsLock = "faults.lock"
	gateLock   = "gate.lock"
)

// Shared holds the stack shared until release is called: no fault test
// stops or restarts a part of it meanwhile. Require takes it for a test;
// a program that is not a test (a benchmark) takes it itself. It waits
// while a fault test waits for the stack or holds it.
func (s Stack) Shared() (release func(), err error) {
	f, err := s.holdShared()
	if err != nil {
		return nil, err
	}
	return func() { _ = flock.Release(f) }, nil
}

// holdShared holds tests.lock shared, taken through the gate.
func (s Stack) holdShared() (*os.File, error) {
	gate, err := s.hold(gateLock, syscall.LOCK_SH)
	if err != nil {
		return nil, err
	}
	defer flock.Release(gate)
	return s.hold(testsLock, syscall.LOCK_SH)
}

// Exclusive turns the test's shared hold into an exclusive one, waiting
// until no other test holds the stack, for a test about to stop or
// restart a part of it; done turns it back into a shared hold, once the
// part is up again, and gives the fault lock back. The Stack must come
// from RequireFault: a conversion drops the shared hold before it waits,
// and only the fault lock keeps another fault from ending the test's
// sandboxes meanwhile. So a test has one fault: once it is over, the next
// fault test may seed and commit while this one restores, and stops
// nothing before this one's shared hold ends (its own Exclusive waits for
// it); its sandboxes then start while this test's calls may still go to
// the host ports of sandboxes the fault ended, as they would in
// production.
func (s Stack) Exclusive(tb testing.TB) (done func()) {
	tb.Helper()
	return s.exclusive(tb, func() {})
}

// exclusive is Exclusive, calling waiting once the gate is held (new
// shared holds wait from then on) and before it waits for the stack.
func (s Stack) exclusive(tb testing.TB, waiting func()) (done func()) {
	tb.Helper()
	if s.held == nil || s.fault == nil {
		tb.Fatal("Exclusive on a Stack that RequireFault did not return")
	}
	if s.fault.over.Load() {
		tb.Fatal("a second Exclusive: the test gave its fault lock back after its first")
	}
	gate, err := s.hold(gateLock, syscall.LOCK_EX)
	if err != nil {
		tb.Fatalf("hold the stack's gate: %v", err)
	}
	waiting()
	if err := syscall.Flock(int(s.held.Fd()), syscall.LOCK_EX); err != nil {
		_ = flock.Release(gate)
		tb.Fatalf("hold the stack exclusively: %v", err)
	}
	return func() {
		if err := syscall.Flock(int(s.held.Fd()), syscall.LOCK_SH); err != nil {
			tb.Errorf("hold the stack shared again: %v", err)
		}
		if err := flock.Release(gate); err != nil {
			tb.Errorf("release the stack's gate: %v", err)
		}
		s.fault.release()
	}
}

// RequireFault is Require for a test that stops or restarts a part of the
// stack (through Exclusive). It first takes the fault lock, exclusively
// until its fault is over (or the test ends), before its shared hold:
// faults come one after another, and a test waiting for its turn holds
// nothing another waits on.
func RequireFault(tb testing.TB, st Stack, err error) Stack {
	tb.Helper()
	if err == nil {
		f, err := st.hold(faultsLock, syscall.LOCK_EX)
		if err != nil {
			tb.Fatal(err)
		}
		st.fault = &faultHold{f: f}
		tb.Cleanup(st.fault.release)
	}
	return Require(tb, st, err)
}

// Require returns the stack Up brought up, held shared until the
// test ends (see hold), or ends the test: a skip in one line where the
// stack is absent, or could not come up outside CI; in CI (CI=true) a
// stack that does not come up fails the test.
func Require(tb testing.TB, st Stack, err error) Stack {
	tb.Helper()
	switch {
	case err == nil:
		f, err := st.holdShared()
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { _ = flock.Release(f) })
		st.held = f
		return st
	case errors.Is(err, ErrNoStack):
		tb.Skipf("skipped: no real OpenSandbox stack here (%v)", err)
	case os.Getenv("CI") == "true":
		tb.Fatalf("the real OpenSandbox stack did not come up in CI: %v", err)
	default:
		tb.Skipf("skipped: the real OpenSandbox stack did not come up (%v)", err)
	}
	return Stack{}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// Up runs stack.sh up again: it starts whatever part of the stack is down
// (after KillServer or StopDockerd) and waits until the server answers.
func (s Stack) Up() error {
	var stderr bytes.Buffer
	cmd := exec.Command(s.Script, "up")
	cmd.Env = s.env
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s up: %v: %s", s.Script, err, lastLine(stderr.String()))
	}
	return nil
}

// KillServer SIGKILLs the lifecycle server stack.sh started and waits
// until it is gone; Up starts it again (its sandboxes and snapshots
// survive: Docker labels and its sqlite store).
func (s Stack) KillServer() error { return s.signal("server", syscall.SIGKILL) }

// StopDockerd stops the dockerd stack.sh started (SIGTERM: it stops every
// container, which then shows Terminated) and waits until it is gone; Up
// starts it again. An error wrapping ErrNoStack means stack.sh did not
// start the dockerd that runs (it is someone else's to stop).
func (s Stack) StopDockerd() error { return s.signal("dockerd", syscall.SIGTERM) }

// StopSandboxes does to the sandboxes named (the lifecycle server's ids)
// what a dockerd restart does to every sandbox: docker stop sends each
// one's container SIGTERM, then SIGKILL after its grace, and the lifecycle
// server reports it Terminated from then on. Unlike StopDockerd it ends no
// other test's sandboxes, so a test needs no Exclusive for it.
func (s Stack) StopSandboxes(ids ...string) error {
	docker, err := exec.LookPath("docker")
	if err != nil {
		docker = "/usr/bin/docker" // stack.sh's client
	}
	var containers []string
	for _, id := range ids {
		out, err := exec.Command(docker, "ps", "-q", "--filter", "label=opensandbox.io/id="+id).Output()
		if err != nil {
			return fmt.Errorf("the container of sandbox %s: %w", id, err)
		}
		c := strings.Fields(string(out))
		if len(c) == 0 {
			return fmt.Errorf("no running container of sandbox %s", id)
		}
		containers = append(containers, c...)
	}
	if out, err := exec.Command(docker, append([]string{"stop"}, containers...)...).CombinedOutput(); err != nil {
		return fmt.Errorf("docker stop %v: %w: %s", containers, err, out)
	}
	return nil
}

func (s Stack) signal(part string, sig syscall.Signal) error {
	b, err := os.ReadFile(filepath.Join(s.Dir, "run", part+".pid"))
	if err != nil {
		return fmt.Errorf("no pid file of the stack's %s: %w", part, ErrNoStack)
	}
	var pid int
	if _, err := fmt.Sscan(string(b), &pid); err != nil || pid <= 0 {
		return fmt.Errorf("pid file of the stack's %s: %q", part, b)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("signal the stack's %s (%d): %w", part, pid, err)
	}
	// Not our child: poll until it is gone, for at most two minutes.
	for i := 0; i < 1200; i++ {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("the stack's %s (%d) did not exit", part, pid)
}

// Release gives the test's hold on the stack back before the test ends.
// The Stack must not be used after.
func (s Stack) Release() {
	if s.held != nil {
		_ = s.held.Close()
	}
}
