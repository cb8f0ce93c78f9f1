package process_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/osexecd"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
	"github.com/sandboxowner/owner/snapshotindex"
)

const osbKey = "process-test-key"

// osbLatency is how long a create and a capture take on the fake server.
const osbLatency = 40 * time.Millisecond

// startOSB runs the server binary on sandbox.provider: opensandbox against
// the fake server at domain, which lives in this test process and so
// outlives every server it SIGKILLs, as a cluster would.
func startOSB(t *testing.T, dir, domain string, extra ...string) *server {
	t.Helper()
	args := []string{"-sandbox.provider", "opensandbox", "-sandbox.opensandbox.domain", domain,
		"-sandbox.opensandbox.api_key", osbKey, "-sandbox.opensandbox.ttl_s", "600", "-sandbox.opensandbox.images", "notes=registry.example/notes:1"}
	return startWith(t, dir, append(args, extra...)...)
}

// osbClient is a provider on the fake server, for checking from outside.
func osbClient(t *testing.T, srv *opensandboxtest.Server) *opensandbox.Provider {
	t.Helper()
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := opensandbox.New(opensandbox.Options{Domain: srv.Domain, APIKey: osbKey, Logger: lg, PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// checkOSB checks, with no server running, that every snapshot a checkpoint
// names exists on the fake server and, with leaks set, that the sweep finds
// nothing there that no checkpoint accounts for.
func checkOSB(t *testing.T, dir string, srv *opensandboxtest.Server, leaks bool) {
	t.Helper()
	idx, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		t.Fatalf("the index cannot be opened: %v", err)
	}
	defer idx.Close()
	exists := map[string]bool{}
	for _, id := range srv.SnapshotIDs() {
		exists[id] = true
	}
	checkSnapshots(t, idx, exists, osbClient(t, srv), leaks)
}

// sandboxExec runs a command through the server's sandbox API with the
// access /sandbox_access handed out.
func sandboxExec(t *testing.T, desc map[string]any, command string) (int, map[string]any) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"command": command})
	req, _ := http.NewRequest(http.MethodPost, desc["endpoint"].(string)+"/exec", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+desc["token"].(string))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	_ = json.NewDecoder(res.Body).Decode(&m)
	return res.StatusCode, m
}

func descriptor(t *testing.T, s *server, a *agent, rollout string) map[string]any {
	t.Helper()
	acc := s.ok(a, "/ng-rollout/"+rollout+"/sandbox_access", nil)
	conn, _ := acc["connection"].(map[string]any)
	desc, _ := conn["descriptor"].(map[string]any)
	if desc == nil {
		t.Fatalf("sandbox_access without a descriptor: %v", acc)
	}
	return desc
}

// TestOpenSandboxWalkThroughAndSIGKILL: the notes walk-through and the crash
// scenario on sandbox.provider: opensandbox. Sessions seed, write a note,
// and run a command through /sandbox_access (this server's sandbox API,
// forwarding to execd); a commit is SIGKILLed (or lands, then the restore is
// SIGKILLed); a fresh server restores, every session verifies to 1.0, and
// after release and a stop nothing is left on the OpenSandbox server.
func TestOpenSandboxWalkThroughAndSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	for iter := 0; iter < 4; iter++ {
		t.Run(fmt.Sprintf("iteration-%d", iter), func(t *testing.T) {
			t.Parallel()
			srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: osbKey, CreateLatency: osbLatency, SnapshotLatency: osbLatency, LowerCaseStates: iter%2 == 1})
			defer srv.Close()
			walkThroughAndSIGKILL(t, srv, srv.Domain, iter)
		})
	}
}

// TestOpenSandboxRealExecd: the same with OpenSandbox's real execd in every
// sandbox, behind the fake lifecycle server. Each sandbox's tree is a local
// provider's (which the fake server snapshots and forks), served by a real
// execd of its own under bubblewrap with the tree at /workspace. Commits are
// SIGKILLed in one iteration, restores in the other.
func TestOpenSandboxRealExecd(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process, and builds and runs the real execd")
	}
	t.Parallel()
	execd, err := osexecd.Build("../../../shared/opensandbox")
	if errors.Is(err, osexecd.ErrNoExecd) {
		t.Skipf("no real execd here (CI has it): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	quiet := logrus.New()
	quiet.SetOutput(io.Discard)
	for _, iter := range []int{0, 2} {
		t.Run(fmt.Sprintf("iteration-%d", iter), func(t *testing.T) {
			t.Parallel()
			lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{"registry.example/notes:1": ""}, Isolation: local.IsolationNone, Overlay: local.OverlayOff, Logger: quiet, InitBinary: localtest.InitBinary(t)})
			if err != nil {
				t.Fatal(err)
			}
			defer lp.Close()
			backend := osexecd.LocalBackend{Provider: lp, Workdir: opensandbox.DefaultWorkdir}
			srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: osbKey, CreateLatency: osbLatency, SnapshotLatency: osbLatency, Backend: backend})
			defer srv.Close()
			front := osexecd.NewFront(srv, backend, execd)
			defer front.Close()
			walkThroughAndSIGKILL(t, srv, front.Domain, iter)
			// Every endpoint the front hands out is a real execd's.
			if n := front.Started(); n < 6 {
				t.Errorf("%d real execds served the sandboxes, want one for each of the 6 sessions' at least", n)
			}
		})
	}
}

// walkThroughAndSIGKILL is one iteration: iter < 2 SIGKILLs a commit,
// iter >= 2 lets it land and SIGKILLs the restore. The binary talks to
// the fake server srv at domain.
func walkThroughAndSIGKILL(t *testing.T, srv *opensandboxtest.Server, domain string, iter int) {
	t.Helper()
	const sessions = 6
	rng := rand.New(rand.NewPCG(uint64(iter), 14))
	dir := t.TempDir()
	s := startOSB(t, dir, domain)
	agents := make([]*agent, sessions)
	for i := range agents {
		agents[i] = newAgent()
		r := fmt.Sprintf("r%d", i)
		s.ok(agents[i], "/ng-rollout/"+r+"/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
		s.ok(agents[i], "/ng-rollout/"+r+"/append_note", map[string]any{"line": "one"})
		desc := descriptor(t, s, agents[i], r)
		if code, m := sandboxExec(t, desc, "cat notes.txt"); code != 200 || m["stdout"] != "one\n" || m["exit_code"] != 0.0 {
			t.Fatalf("exec through the sandbox API: %d %v", code, m)
		}
	}
	if n := srv.Stats().LiveSandboxes; n != sessions {
		t.Fatalf("%d sandboxes on the server, want %d", n, sessions)
	}
	if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
		t.Fatalf("prepare: %d %v %v", code, m, err)
	}
	commit := func() (int, error) {
		c, _, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
		return c, err
	}
	if iter < 2 {
		delay := time.Duration(rng.Int64N(int64(2 * osbLatency)))
		replied, code := killDuring(s, delay, commit)
		t.Logf("commit killed after %v: reply came first %v (status %d)", delay, replied, code)
	} else {
		if code, err := commit(); err != nil || code != 200 {
			t.Fatalf("commit: %d %v", code, err)
		}
		s.kill()
	}
	checkOSB(t, dir, srv, false)

	restore := func(s *server) (int, error) {
		c, _, err := s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
		return c, err
	}
	if iter >= 2 {
		s = startOSB(t, dir, domain)
		delay := time.Duration(rng.Int64N(int64(2 * osbLatency)))
		replied, code := killDuring(s, delay, func() (int, error) { return restore(s) })
		t.Logf("restore killed after %v: reply came first %v (status %d)", delay, replied, code)
		checkOSB(t, dir, srv, false)
	}

	s = startOSB(t, dir, domain)
	code, err := restore(s)
	if err != nil {
		t.Fatal(err)
	}
	checkRestored(t, s, agents, code, func(a *agent, r string) {
		if code, m := sandboxExec(t, descriptor(t, s, a, r), "cat notes.txt"); code != 200 || m["stdout"] != "one\n" {
			t.Errorf("the fork's notes through the sandbox API: %d %v", code, m)
		}
	})
	if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
		t.Errorf("release: %d %v %v", code, m, err)
	}
	s.term()
	checkOSB(t, dir, srv, true)
	if st := srv.Stats(); st.LiveSandboxes != 0 || st.LiveSnapshots != 0 {
		t.Errorf("left on the OpenSandbox server: %d sandboxes %v, %d snapshots %v", st.LiveSandboxes, srv.SandboxIDs(), st.LiveSnapshots, srv.SnapshotIDs())
	}
	if v := srv.Violations(); len(v) > 0 {
		t.Errorf("requests that break the spec:\n%v", v)
	}
	if t.Failed() {
		t.Logf("last server log:\n%s", lastLines(s.log.String(), 40))
	}
}
