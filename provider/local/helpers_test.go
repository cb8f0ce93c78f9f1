package local

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/localtest"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// helperEnv makes the test binary act as a fresh server process (see
// TestMain): the value names what it does.
const helperEnv = "LOCAL_PROVIDER_TEST_HELPER"

// sharedProbes keeps what New's probes found for every provider
// newProvider makes: the host is the same for all of them.
var sharedProbes = newProbeResults()

func TestMain(m *testing.M) {
	if action := os.Getenv(helperEnv); action != "" {
		os.Exit(runHelper(action))
	}
	// The modes of one test run side by side (forModes), and mostly wait
	// on sandboxes' processes and disks: go test's default of GOMAXPROCS
	// (2 here) ran them two at a time.
	flag.Parse()
	testparallel.AtLeast(4)
	var before []func() error
	if os.Getenv(cgroup2Env) != "" {
		before = append(before, enterPureCgroup2)
	}
	os.Exit(localtest.Run(m, before...))
}

// TestTempDirsAreUnderALockedRoot: the providers' roots (every test's
// t.TempDir) are where a later run clears what a killed one left mounted.
func TestTempDirsAreUnderALockedRoot(t *testing.T) {
	localtest.RequireRoot(t)
}

// runHelper is a fresh process using a root: "stop" stops the handle in
// LOCAL_TEST_HANDLE; "exec" runs LOCAL_TEST_COMMAND in it (and is killed by
// the test mid-command).
func runHelper(action string) int {
	p, err := New(Options{
		Root:      os.Getenv("LOCAL_TEST_ROOT"),
		Isolation: os.Getenv("LOCAL_TEST_ISOLATION"),
		Overlay:   os.Getenv("LOCAL_TEST_OVERLAY"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	var h provider.Handle
	if err := json.Unmarshal([]byte(os.Getenv("LOCAL_TEST_HANDLE")), &h); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ctx := context.Background()
	switch action {
	case "stop":
		err = p.Stop(ctx, h)
	case "exec":
		_, err = p.Exec(ctx, h, provider.ExecRequest{Command: os.Getenv("LOCAL_TEST_COMMAND")})
	default:
		err = fmt.Errorf("unknown helper action %q", action)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// mode is one isolation × filesystem combination.
type mode struct {
	name      string
	isolation string
	overlay   string
}

func allModes() []mode {
	return []mode{
		{"none-copy", IsolationNone, OverlayOff},
		{"none-overlay", IsolationNone, OverlayOn},
		{"container-copy", IsolationContainer, OverlayOff},
		{"container-overlay", IsolationContainer, OverlayOn},
	}
}

// ownInit says whether m's sandboxes' inits are the server's own binary
// (this test binary, under -race several times the size of the separate
// init and slower to start, twice per isolated sandbox) re-executed, the
// default path: container-copy's are, so that every test of forModes and
// containerModes covers both; every other mode's run the separate init,
// localtest.InitBinary (see newProvider).
func (m mode) ownInit() bool {
	return m.name == "container-copy" && m.isolation == IsolationContainer
}

// forModes runs f once per mode that can run here, in parallel subtests.
func forModes(t *testing.T, f func(t *testing.T, m mode)) {
	t.Helper()
	for _, m := range allModes() {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			f(t, m)
		})
	}
}

func testLogger(t *testing.T) logrus.FieldLogger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	if testing.Verbose() {
		l.SetOutput(tWriter{t})
		l.SetLevel(logrus.DebugLevel)
	}
	return l
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// ownInitBinary, as Options.InitBinary to newProvider, runs the server's
// own binary as the inits, whatever the mode.
const ownInitBinary = "(own)"

// newProvider makes a provider in mode m on opts (a fresh root when
// opts.Root is empty), skipping when the mode cannot run here, and stops
// every sandbox it lists at the end so that no overlay stays mounted. Its
// inits are the separate init binary unless m.ownInit or opts says
// ownInitBinary.
func newProvider(t *testing.T, m mode, opts Options) *Provider {
	t.Helper()
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	switch {
	case opts.InitBinary == ownInitBinary || opts.InitBinary == "" && m.ownInit():
		opts.InitBinary = ""
	case opts.InitBinary == "":
		opts.InitBinary = localtest.InitBinary(t)
	}
	opts.Isolation, opts.Overlay = m.isolation, m.overlay
	if opts.probed == nil {
		opts.probed = sharedProbes
	}
	if opts.Logger == nil {
		opts.Logger = testLogger(t)
	}
	p, err := New(opts)
	switch {
	case errors.Is(err, ErrIsolationUnavailable):
		t.Skipf("SKIP: the kernel refuses containers here (unprivileged user namespaces?): %v", err)
	case errors.Is(err, ErrOverlayUnavailable):
		t.Skipf("SKIP: overlayfs cannot be mounted here (needs root): %v", err)
	case err != nil:
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		stopAll(t, p)
		_ = p.Close()
	})
	return p
}

func stopAll(t *testing.T, p *Provider) {
	t.Helper()
	ctx := context.Background()
	ids, err := p.sandboxIDs()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, id := range ids {
		if err := p.Stop(ctx, provider.Handle{SandboxID: id, Provider: Name}); err != nil {
			t.Errorf("cleanup: stop %s: %v", id, err)
		}
	}
}

func start(t *testing.T, p *Provider, spec provider.Spec) provider.Handle {
	t.Helper()
	h, err := p.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("Start(%+v): %v", spec, err)
	}
	return h
}

func run(t *testing.T, p *Provider, h provider.Handle, command string) provider.ExecResult {
	t.Helper()
	res, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: command, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("Exec(%q): %v", command, err)
	}
	return res
}

// mustRun runs command and fails the test unless it exits 0.
func mustRun(t *testing.T, p *Provider, h provider.Handle, command string) string {
	t.Helper()
	res := run(t, p, h, command)
	if res.ExitCode != 0 {
		t.Fatalf("Exec(%q) exit %d, stderr %q", command, res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

func readFile(t *testing.T, p *Provider, h provider.Handle, name string) string {
	t.Helper()
	b, err := p.ReadFile(context.Background(), h, name)
	if err != nil {
		t.Fatalf("ReadFile(%q): %v", name, err)
	}
	return string(b)
}

func writeFile(t *testing.T, p *Provider, h provider.Handle, name, data string) {
	t.Helper()
	if err := p.WriteFile(context.Background(), h, name, []byte(data)); err != nil {
		t.Fatalf("WriteFile(%q): %v", name, err)
	}
}

func snapshot(t *testing.T, p *Provider, h provider.Handle) string {
	t.Helper()
	id, err := p.Snapshot(context.Background(), h, "test")
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	return id
}

func fork(t *testing.T, p *Provider, snap string) provider.Handle {
	t.Helper()
	h, err := p.Fork(context.Background(), provider.Spec{}, snap)
	if err != nil {
		t.Fatalf("Fork(%s): %v", snap, err)
	}
	return h
}

// fsDir is the host directory of a sandbox's tree.
func fsDir(p *Provider, h provider.Handle) string {
	s, err := p.loaded(h)
	if err != nil {
		panic(err)
	}
	return s.fsDir()
}

// upperDir is the host directory of an overlay sandbox's own layer.
func upperDir(p *Provider, h provider.Handle) string {
	s, err := p.loaded(h)
	if err != nil {
		panic(err)
	}
	return s.upperDir()
}

// mkfifo makes a FIFO in the sandbox's tree and returns a func that waits
// (bounded) for a command to write a line into it.
func mkfifo(t *testing.T, p *Provider, h provider.Handle, name string) func() {
	t.Helper()
	path := filepath.Join(fsDir(p, h), name)
	if err := syscall.Mkfifo(path, 0o666); err != nil {
		t.Fatalf("mkfifo: %v", err)
	}
	if err := os.Chmod(path, 0o666); err != nil { // the umask's bits: sandboxed commands are another uid
		t.Fatalf("chmod fifo: %v", err)
	}
	return func() {
		t.Helper()
		got := make(chan error, 1)
		go func() {
			f, err := os.Open(path) // blocks until the command opens it to write
			if err == nil {
				_, err = io.ReadAll(f)
				f.Close()
			}
			got <- err
		}()
		select {
		case err := <-got:
			if err != nil {
				t.Fatalf("fifo: %v", err)
			}
		case <-time.After(time.Minute): // a bound on a broken test, not a synchronisation
			t.Fatal("the command never wrote the fifo")
		}
	}
}

// execRunning starts command in the sandbox in the background and returns
// once it runs (it signals through a FIFO), with the channel its Exec's
// error will arrive on.
func execRunning(t *testing.T, ctx context.Context, p *Provider, h provider.Handle, command string) <-chan error {
	t.Helper()
	ready := mkfifo(t, p, h, "ready")
	done := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo > ready; " + command, Timeout: time.Minute})
		done <- err
	}()
	ready()
	return done
}

// commandPids are the live processes of the sandbox's commands: those
// marked with its id, but for its init and bubblewrap (the process group of
// the init's host process).
func commandPids(p *Provider, id string) []int {
	p.mu.Lock()
	s := p.sandboxes[id]
	p.mu.Unlock()
	initGroups := map[int]bool{}
	if s != nil {
		s.mu.Lock()
		for g := range s.groups {
			initGroups[g] = true
		}
		s.mu.Unlock()
	}
	marked := map[int]bool{}
	for _, pid := range markedProcesses(id) {
		marked[pid] = true
	}
	var out []int
	for _, e := range sinit.ListProcs() {
		if marked[e.Pid] && !initGroups[e.Pgrp] && e.State != 'Z' && e.State != 'X' {
			out = append(out, e.Pid)
		}
	}
	return out
}

// waitCommandPids returns commandPids once n of them show (a process shows
// once its exec is done), or what there are after a minute.
func waitCommandPids(p *Provider, id string, n int) []int {
	var pids []int
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if pids = commandPids(p, id); len(pids) == n {
			break
		}
	}
	return pids
}

// initPid is the host pid of sandbox h's init, which runs.
func initPid(p *Provider, h provider.Handle) int {
	p.mu.Lock()
	s := p.sandboxes[h.SandboxID]
	p.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.init.cmd.Process.Pid
}

// crash ends p's inits as a crash of its server would (their control
// sockets close, or their death signal fires), and waits until p let go of
// their cgroups: p is then abandoned, and a new provider on its root finds
// what a crashed server leaves.
func crash(p *Provider) {
	p.mu.Lock()
	var ins []*sandboxInit
	for _, s := range p.sandboxes {
		s.mu.Lock()
		if s.init != nil {
			ins = append(ins, s.init)
		}
		s.mu.Unlock()
	}
	p.mu.Unlock()
	for _, in := range ins {
		killGroup(in.pgid)
		<-in.released
	}
}
