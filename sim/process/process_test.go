// Package process_test is the process-level crash suite: it runs the
// server (cmd/server's program: the test binary itself, see
// internal/servertest) as a child process on the local provider,
// SIGKILLs it in the middle of a commit and of a restore, restarts it on the
// same state_dir, and checks the invariants over HTTP and on disk.
//
// The server runs with the local provider's crash-test delays
// (-sandbox.local.snapshot_delay_ms, fork_delay_ms), so a commit or a restore
// takes about opDelay and the kill, at a seeded random moment within
// 1.5 opDelay of the request, mostly lands inside it (sometimes just before
// or after: every case must keep the invariants). The test logs where each
// kill landed.
package process_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/internal/servertest"
	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/sweep"
)

const token = "sim-control-token"

type server struct {
	t *testing.T
	// dir is the server's state_dir; tests keep the controller's
	// checkpoint directories beside what it holds.
	dir  string
	cmd  *exec.Cmd
	addr string
	log  *serverLog
	done chan error
}

// serverLog is the server's stderr as read so far: written by the reader
// goroutine while the test reads it for its failure messages.
type serverLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// hangGuard bounds each wait of these tests on a server (its start, a
// request's answer, a stop, a pool's refill) and is the deadline the
// control requests give: a guard against a hang, never a measure of speed.
// Minutes were missed under load: a server's start (its startup checks of
// the real stack) at load 36, an agent's seed of a sandbox on the real
// stack beside the other real-stack tests at load 38, each then done alone
// in seconds.
const hangGuard = 10 * time.Minute

// requestGuard is an HTTP client's bound: past the control requests'
// deadline (hangGuard), so that the server's own answer comes first.
const requestGuard = hangGuard + time.Minute

// start runs the server on the local provider over dir and waits for its
// address.
func start(t *testing.T, dir string) *server {
	t.Helper()
	return startWith(t, dir, "-sandbox.provider", "local", "-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off",
		"-sandbox.local.snapshot_delay_ms", strconv.Itoa(int(opDelay/time.Millisecond)),
		"-sandbox.local.fork_delay_ms", strconv.Itoa(int(opDelay/time.Millisecond)))
}

// startWith runs the server with the provider flags given.
func startWith(t *testing.T, dir string, providerArgs ...string) *server {
	t.Helper()
	return startWithEnv(t, dir, nil, providerArgs...)
}

// startWithEnv is startWith with the server's environment env (nil: the
// test's own).
func startWithEnv(t *testing.T, dir string, env []string, providerArgs ...string) *server {
	t.Helper()
	args := append([]string{"-port", "0", "-log-format", "json", "-log-level", "info"}, providerArgs...)
	if i := slices.Index(providerArgs, "-sandbox.provider"); i >= 0 && i+1 < len(providerArgs) && providerArgs[i+1] == "local" &&
		!slices.Contains(providerArgs, "-sandbox.local.init_binary") {
		// The sandboxes' inits are the small init, not this -race binary
		// (unless the test names one: "" for the server's own).
		args = append(args, "-sandbox.local.init_binary", localtest.InitBinary(t))
	}
	args = append(args, "-checkpoint.enabled", "-checkpoint.state_dir", dir, "-checkpoint.control_auth_token", token)
	cmd := servertest.Command(env, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{t: t, dir: dir, cmd: cmd, log: &serverLog{}, done: make(chan error, 1)}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sent := false
		for sc.Scan() {
			s.log.Write(append(sc.Bytes(), '\n'))
			var e map[string]any
			if json.Unmarshal(sc.Bytes(), &e) == nil {
				if a, ok := e["addr"].(string); ok && !sent {
					addrc <- a
					sent = true
				}
			}
		}
		if !sent {
			close(addrc)
		}
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		s.kill()
		// A -race test binary is a -race server: a race it found is
		// in its log, whether it exited or was killed.
		if log := s.log.String(); strings.Contains(log, "WARNING: DATA RACE") {
			t.Errorf("the server reported a data race:\n%s", log[strings.Index(log, "WARNING: DATA RACE"):])
		}
	})
	select {
	case a, ok := <-addrc:
		if !ok {
			t.Fatalf("the server exited before serving:\n%s", s.log)
		}
		s.addr = a
	case <-time.After(hangGuard):
		t.Fatalf("the server did not start within %v:\n%s", hangGuard, s.log)
	}
	// The address is logged before the server accepts: a request that got
	// an answer means it serves. (A SIGTERM before that hangs the server's
	// stop: app.Stop waits for a Serve that a Shutdown which came first
	// never ends.)
	if code, _, err := s.call(nil, "GET", "/health", nil); err != nil || code != 200 {
		t.Fatalf("GET /health: %d %v\n%s", code, err, s.log)
	}
	return s
}

// kill ends the server if it still runs. Whether it exited is read from
// done, not cmd.ProcessState (which Wait writes on the waiting goroutine); a
// signal to a process that already exited fails harmlessly.
func (s *server) kill() {
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	s.done <- nil
}

func (s *server) term() {
	s.t.Helper()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.done:
		s.done <- err
		if err != nil {
			s.t.Fatalf("the server's SIGTERM exit: %v\n%s", err, s.log)
		}
	case <-time.After(hangGuard):
		// A goroutine dump says where it hangs.
		_ = s.cmd.Process.Signal(syscall.SIGQUIT)
		<-s.done
		s.done <- nil
		log := s.log.String()
		if i := strings.Index(log, "SIGQUIT"); i >= 0 {
			log = log[max(0, i-4000):min(len(log), i+12000)]
		}
		s.t.Fatalf("the server did not stop on SIGTERM within %v; its log and goroutines:\n%s", hangGuard, log)
	}
}

type agent struct {
	cl *http.Client
}

func newAgent() *agent {
	jar, _ := cookiejar.New(nil)
	return &agent{cl: &http.Client{Jar: jar, Timeout: requestGuard}}
}

// call posts body to path; the error is the transport's (a killed server).
func (s *server) call(a *agent, method, path string, body any) (int, map[string]any, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequest(method, "http://"+s.addr+path, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	cl := &http.Client{Timeout: requestGuard}
	if a != nil {
		cl = a.cl
	} else {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := cl.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, nil
}

func (s *server) ok(a *agent, path string, body any) map[string]any {
	s.t.Helper()
	code, m, err := s.call(a, "POST", path, body)
	if err != nil || code != 200 {
		s.t.Fatalf("POST %s: %d %v %v\n%s", path, code, m, err, s.log)
	}
	return m
}

func (s *server) control(op string, body map[string]any) (int, map[string]any, error) {
	if op != "release" {
		body["deadline_ts"] = float64(time.Now().Add(hangGuard).UnixMilli()) / 1000
	}
	return s.call(nil, "POST", "/ng-control/v1/checkpoint/"+op, body)
}

func episodes(n, attempt int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = map[string]any{"rollout_id": fmt.Sprintf("r%d", i), "attempt": attempt}
	}
	return out
}

// killDuring sends op and SIGKILLs the server after delay; it reports whether
// the reply came first.
func killDuring(s *server, delay time.Duration, op func() (int, error)) (replied bool, code int) {
	type res struct {
		code int
		err  error
	}
	got := make(chan res, 1)
	go func() {
		c, err := op()
		got <- res{c, err}
	}()
	timer := time.NewTimer(delay)
	defer timer.Stop()
	select {
	case r := <-got:
		s.kill()
		return r.err == nil, r.code
	case <-timer.C:
	}
	s.kill()
	r := <-got
	return r.err == nil, r.code
}

// checkDisk checks, with no server running, that every checkpoint in the
// index loads and that every snapshot it names exists; with leaks set (after
// a server recovered and stopped), also that the sweep finds nothing no
// checkpoint or tombstone accounts for.
func checkDisk(t *testing.T, dir string, leaks bool) {
	t.Helper()
	idx, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		t.Fatalf("whole checkpoints: the index cannot be opened: %v", err)
	}
	defer idx.Close()
	metas, err := idx.Checkpoints()
	if err != nil {
		t.Fatalf("whole checkpoints: %v", err)
	}
	for _, m := range metas {
		if _, err := idx.Checkpoint(m.ID); err != nil {
			t.Errorf("whole checkpoints: %s does not load: %v", m.ID, err)
		}
	}
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: filepath.Join(dir, "sandboxes"), Templates: map[string]string{"notes": ""}, Isolation: "none", Overlay: "off", Logger: lg, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	snaps, err := p.ListSnapshots(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	exists := map[string]bool{}
	for _, s := range snaps {
		exists[s.ID] = true
	}
	checkSnapshots(t, idx, exists, p, leaks)
}

// checkSnapshots checks that every snapshot the index names is among those
// that exist and, with leaks set, that the sweep over p finds nothing that no
// checkpoint or tombstone accounts for.
func checkSnapshots(t *testing.T, idx *snapshotindex.Index, exists map[string]bool, p provider.Provider, leaks bool) {
	t.Helper()
	refs, err := idx.ReferencedSnapshots()
	if err != nil {
		t.Fatal(err)
	}
	for id, cks := range refs {
		if !exists[id] {
			t.Errorf("restorable: snapshot %s named by %v is gone", id, cks)
		}
	}
	if !leaks {
		return
	}
	rep, err := sweep.Run(context.Background(), sweep.Options{Owner: "notes", Provider: p, Index: idx})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range rep.Sandboxes {
		t.Errorf("no leak: sandbox %s (%v) runs, held by nobody", s.Handle.SandboxID, s.Metadata)
	}
	for _, s := range rep.Snapshots {
		t.Errorf("no leak: snapshot %s (%s) is named by no checkpoint and no tombstone", s.ID, s.Name)
	}
}

// opDelay holds each snapshot and fork of the child server.
const opDelay = 30 * time.Millisecond

// killDelay is when, after a request, the server is killed.
func killDelay(rng *rand.Rand) time.Duration {
	return time.Duration(rng.Int64N(int64(opDelay * 3 / 2)))
}

// TestSIGKILLMidCommitAndMidRestore: sessions seed and write "one"; a commit
// is SIGKILLed; the restarted server restores (if the commit landed) and is
// SIGKILLed mid-restore; the next one restores again and every session
// verifies to 1.0; without a landed commit, verify is refused (409). The disk
// is checked after every kill and at the end.
func TestSIGKILLMidCommitAndMidRestore(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	const sessions = 12
	for iter := 0; iter < 6; iter++ {
		t.Run(fmt.Sprintf("iteration-%d", iter), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(iter), 5))
			dir := t.TempDir()
			s := start(t, dir)
			agents := make([]*agent, sessions)
			for i := range agents {
				agents[i] = newAgent()
				s.ok(agents[i], fmt.Sprintf("/ng-rollout/r%d/seed_session", i), map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
				s.ok(agents[i], fmt.Sprintf("/ng-rollout/r%d/append_note", i), map[string]any{"line": "one"})
			}
			if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
				t.Fatalf("prepare: %d %v %v", code, m, err)
			}
			commit := func() (int, error) {
				c, _, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
				return c, err
			}
			if iter%2 == 0 {
				// Odd iterations let the commit land, so that the kill
				// during the restore has a checkpoint to restore.
				delay := killDelay(rng)
				replied, code := killDuring(s, delay, commit)
				t.Logf("commit killed after %v: reply came first %v (status %d)", delay, replied, code)
			} else {
				if code, err := commit(); err != nil || code != 200 {
					t.Fatalf("commit: %d %v", code, err)
				}
				s.kill()
			}
			recovered(t, dir)

			s = start(t, dir)
			restore := func(s *server) (int, error) {
				c, _, err := s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
				return c, err
			}
			delay := killDelay(rng)
			replied, code := killDuring(s, delay, func() (int, error) { return restore(s) })
			t.Logf("restore killed after %v: reply came first %v (status %d)", delay, replied, code)
			recovered(t, dir)

			s = start(t, dir)
			code, err := restore(s)
			if err != nil {
				t.Fatal(err)
			}
			checkRestored(t, s, agents, code, nil)
			if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
				t.Errorf("release: %d %v %v", code, m, err)
			}
			s.term()
			checkDisk(t, dir, true)
			if t.Failed() {
				t.Logf("last server log:\n%s", lastLines(s.log.String(), 30))
			}
		})
	}
}

// checkRestored checks what a restore answering code left: without a landed
// commit, a verify is refused (409), never graded; with one, after resume
// every session re-seeds onto its fork (each is given to inspect, when set)
// and verifies to 1.0.
func checkRestored(t *testing.T, s *server, agents []*agent, code int, each func(a *agent, rollout string)) {
	t.Helper()
	if code != 200 {
		t.Logf("restore: status %d (the commit did not land)", code)
		vc, m, err := s.call(agents[0], "POST", "/ng-rollout/r0/verify", map[string]any{"expected_notes": []string{"one"}})
		if err != nil || vc != 409 {
			t.Errorf("no empty grading: verify without a sandbox: %d %v %v", vc, m, err)
		}
		return
	}
	if code, m, err := s.control("resume", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
		t.Fatalf("resume: %d %v %v", code, m, err)
	}
	for i, a := range agents {
		r := fmt.Sprintf("r%d-a1", i)
		s.ok(a, "/ng-rollout/"+r+"/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
		if each != nil {
			each(a, r)
		}
		v := s.ok(a, "/ng-rollout/"+r+"/verify", map[string]any{"expected_notes": []string{"one"}})
		if v["reward"] != 1.0 {
			t.Errorf("exact restore: session %s verified %v", r, v)
		}
	}
}

// recovered checks the disk a SIGKILL left, then starts a server on it (its
// startup recovers what the killed one left), stops it gracefully and checks
// that nothing leaked.
func recovered(t *testing.T, dir string) {
	t.Helper()
	checkDisk(t, dir, false)
	s := start(t, dir)
	s.term()
	checkDisk(t, dir, true)
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func TestMain(m *testing.M) {
	// The test binary is also the server the tests run (see servertest).
	servertest.ServeIfChild()
	// Most of these tests wait on server processes and sandboxes, not on
	// the CPU. The real stack's fault tests take its fault lock one after
	// another for minutes (the package's longest path): with 4 slots they
	// waited 40-55 s for one behind the local tests.
	flag.Parse()
	testparallel.AtLeast(8)
	// The servers' sandboxes live under a locked temporary root; the real
	// stack stays the shared one: its directory is pinned before TMPDIR
	// moves.
	os.Exit(localtest.Run(m, osstack.PinDir))
}

// TestTempDirsAreUnderALockedRoot: the servers' state and sandboxes (every
// test's t.TempDir) are where a later run clears what a killed one left.
func TestTempDirsAreUnderALockedRoot(t *testing.T) {
	localtest.RequireRoot(t)
	// The real stack is not: its pid files and the locks that keep fault
	// tests apart are shared with every other test binary.
	if dir := osstack.Dir(); strings.HasPrefix(dir, os.TempDir()+string(filepath.Separator)) {
		t.Errorf("the real stack's directory %s is under this run's %s", dir, os.TempDir())
	}
}

// TestSIGKILLWithWarmPools: a server whose warm pools keep sandboxes
// started ahead is SIGKILLed while seeds claim from them and the pools
// refill; the next start stops what the pools of the dead one had started,
// and once it stops nothing is left that no checkpoint names.
func TestSIGKILLWithWarmPools(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	dir := t.TempDir()
	s := startWith(t, dir, "-sandbox.provider", "local", "-sandbox.local.isolation", "none", "-sandbox.local.overlay", "off",
		"-sandbox.pool.size", "3", "-sandbox.pool.refill_concurrency", "2")
	for i := range 4 {
		a := newAgent()
		s.ok(a, fmt.Sprintf("/ng-rollout/r%d/seed_session", i), map[string]any{})
		s.ok(a, fmt.Sprintf("/ng-rollout/r%d/append_note", i), map[string]any{"line": "one"})
	}
	// The kill must leave pooled sandboxes behind for the restart to find:
	// wait (bounded) until the pools' refill has started one.
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: filepath.Join(dir, "sandboxes"), Templates: map[string]string{"notes": ""}, Isolation: "none", Overlay: "off", Logger: lg, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	pooled := func() (n int) {
		sbs, err := p.ListSandboxes(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, sb := range sbs {
			if sb.Metadata[owner.LabelPool] != "" && sb.Status == provider.StatusRunning {
				n++
			}
		}
		return n
	}
	for deadline := time.Now().Add(hangGuard); pooled() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pooled sandbox started within %v:\n%s", hangGuard, lastLines(s.log.String(), 30))
		}
	}
	s.kill()
	t.Logf("killed with %d pooled sandboxes running", pooled())
	recovered(t, dir)
	if n := pooled(); n != 0 {
		t.Errorf("no leak: %d pooled sandboxes still run after the restart", n)
	}
	if t.Failed() {
		t.Logf("last server log:\n%s", lastLines(s.log.String(), 30))
	}
}
