package process_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
)

// realStack is the real OpenSandbox (../shared/opensandbox/stack.sh),
// brought up once per test binary, when a test first asks.
var realStack = sync.OnceValues(osstack.Up)

// onRealStack is a run of the server on the real stack under a name of its
// own: its sandboxes carry ng.owner = name, so what it left is found by
// that label.
type onRealStack struct {
	st   osstack.Stack
	name string
	// probed: the run's servers need not probe whether the stack takes
	// snapshots (the binary or an earlier server of the run found out).
	probed bool
}

// stackUse is how a test uses the real stack: shared with every other
// test, its servers probing snapshots themselves or relying on the probe
// the test binary makes once, or on a lifecycle server of its own (it
// kills that one).
type stackUse int

const (
	sharedStack stackUse = iota
	sharedStackProbed
	ownLifecycleServer
)

// newOnRealStack holds the real stack shared for the test and, for
// ownLifecycleServer, starts a lifecycle server of the test's own on the
// stack's dockerd. No test here stops a part of the shared stack: each
// holds it shared only, so none waits for another's hold.
func newOnRealStack(t *testing.T, use stackUse) *onRealStack {
	t.Helper()
	st, err := realStack()
	st = osstack.Require(t, st, err)
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	r := &onRealStack{st: st, name: "e2e" + hex.EncodeToString(b)}
	if use != sharedStack {
		if err := stackSnapshots(st); err != nil {
			t.Fatalf("probe the stack's snapshots: %v", err)
		}
		r.probed = true
	}
	if use == ownLifecycleServer {
		r.st = st.OwnServer(t)
	}
	t.Cleanup(func() { r.clean(t) })
	return r
}

// stackSnapshots probes, once per test binary, that the real stack takes
// snapshots, as a server does at startup (a sandbox started, snapshotted
// and deleted: seconds each time).
var stackSnapshots = func() func(osstack.Stack) error {
	var once sync.Once
	var err error
	return func(st osstack.Stack) error {
		once.Do(func() {
			lg := logrus.New()
			lg.SetOutput(io.Discard)
			var p *opensandbox.Provider
			if p, err = opensandbox.New(opensandbox.Options{Domain: st.Domain, APIKey: st.APIKey, Logger: lg}); err == nil {
				err = p.ProbeSnapshots(context.Background(), provider.Spec{Image: st.Image, TTLSeconds: 600,
					Metadata: map[string]string{"ng.owner": "e2e-probe"}})
			}
		})
		return err
	}
}()

func (r *onRealStack) start(t *testing.T, dir string) *server {
	t.Helper()
	args := []string{"-name", r.name, "-sandbox.provider", "opensandbox",
		"-sandbox.opensandbox.domain", r.st.Domain, "-sandbox.opensandbox.api_key", r.st.APIKey,
		"-sandbox.opensandbox.ttl_s", "600", "-sandbox.opensandbox.images", "notes=" + r.st.Image,
		"-sandbox.opensandbox.resources.memory", "256Mi"}
	if r.probed {
		args = append(args, "-sandbox.opensandbox.skip_snapshot_probe")
	}
	r.probed = true
	return startWith(t, dir, args...)
}

// client lists what carries this run's label, through the lifecycle
// server's own lists.
func (r *onRealStack) client(t *testing.T) *opensandbox.Provider {
	t.Helper()
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := opensandbox.New(opensandbox.Options{Domain: r.st.Domain, APIKey: r.st.APIKey, Logger: lg,
		ListLabels: map[string]string{"ng.owner": r.name}})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// left is what the lifecycle server lists of this run: sandboxes (by the
// server's own metadata filter) and snapshots (named by this run's owner),
// through the provider, which retries the 500 the real server answers when
// another test's delete removes a container while it lists them.
func (r *onRealStack) left(t *testing.T) (sandboxes, snapshots []string) {
	t.Helper()
	ctx := context.Background()
	p := r.client(t)
	sbs, err := p.ListSandboxes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sbs {
		sandboxes = append(sandboxes, fmt.Sprintf("%s (%s)", s.Handle.SandboxID, s.Status))
	}
	snaps, err := p.ListSnapshots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps {
		snapshots = append(snapshots, s.ID)
	}
	return sandboxes, snapshots
}

// firstSnapshot waits until the lifecycle server lists a snapshot of this
// run, for at most hangGuard (a guard against a commit that never
// snapshots, not a measure of speed).
func (r *onRealStack) firstSnapshot(t *testing.T) error {
	t.Helper()
	p := r.client(t)
	for bound := time.Now().Add(hangGuard); time.Now().Before(bound); time.Sleep(20 * time.Millisecond) {
		snaps, err := p.ListSnapshots(context.Background())
		if err != nil {
			return fmt.Errorf("list the run's snapshots: %w", err)
		}
		if len(snaps) > 0 {
			return nil
		}
	}
	return fmt.Errorf("no snapshot of the commit listed within %v", hangGuard)
}

// clean removes what a failed run left on the shared stack.
func (r *onRealStack) clean(t *testing.T) {
	ctx := context.Background()
	p := r.client(t)
	if sbs, err := p.ListSandboxes(ctx); err == nil {
		for _, s := range sbs {
			_ = p.Stop(ctx, s.Handle)
		}
	}
	if snaps, err := p.ListSnapshots(ctx); err == nil {
		for _, s := range snaps {
			_ = p.DeleteSnapshot(ctx, s.ID)
		}
	}
}

// TestRealStack runs the tests on the real stack alongside each other and
// the package's other tests: each holds the stack shared, and the one that
// kills a lifecycle server kills one of its own.
func TestRealStack(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the server as a process")
	}
	t.Parallel()
	for name, f := range map[string]func(*testing.T){
		"WalkThrough":                    realStackWalkThrough,
		"LifecycleServerKilledMidCommit": realStackLifecycleServerKilledMidCommit,
		"SandboxesStoppedMidEpisode":     realStackSandboxesStoppedMidEpisode,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f(t)
		})
	}
}

// realStackWalkThrough is README's notes walk-through on the real
// OpenSandbox: three sessions seed, write a note and read it through the
// sandbox API; a checkpoint is committed; work goes on and the server is
// SIGKILLed; a fresh server restores, every session re-seeds onto its fork
// (the note of the checkpoint, not the lost one) and verifies to 1.0; a
// release and a SIGTERM follow, and the lifecycle server's own lists hold no
// sandbox and no snapshot of the run.
func realStackWalkThrough(t *testing.T) {
	const sessions = 3
	rs, dir, s, agents := seededOnRealStack(t, sessions, sharedStack)
	for i, a := range agents {
		if code, m := sandboxExec(t, descriptor(t, s, a, fmt.Sprintf("r%d", i)), "cat notes.txt"); code != 200 || m["stdout"] != "one\n" || m["exit_code"] != 0.0 {
			t.Fatalf("exec through the sandbox API: %d %v", code, m)
		}
	}
	if sbs, _ := rs.left(t); len(sbs) != sessions {
		t.Fatalf("the lifecycle server lists %v, want %d sandboxes", sbs, sessions)
	}
	for _, op := range []string{"prepare", "commit", "resume"} {
		body := map[string]any{"checkpoint_id": "ck1"}
		if op == "commit" {
			body["checkpoint_dir"], body["episode_ids"] = filepath.Join(dir, "ctl-ck1"), episodes(sessions, 0)
		}
		began := time.Now()
		if code, m, err := s.control(op, body); err != nil || code != 200 {
			t.Fatalf("%s: %d %v %v\n%s", op, code, m, err, lastLines(s.log.String(), 30))
		}
		t.Logf("%s of %d sessions: %v", op, sessions, time.Since(began).Round(time.Millisecond))
	}
	for i, a := range agents {
		s.ok(a, fmt.Sprintf("/ng-rollout/r%d/append_note", i), map[string]any{"line": "lost"})
	}
	s.kill()

	s = rs.start(t, dir)
	began := time.Now()
	code, _, err := s.control("restore", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
	if err != nil || code != 200 {
		t.Fatalf("restore: %d %v\n%s", code, err, lastLines(s.log.String(), 30))
	}
	t.Logf("restore of %d sessions: %v", sessions, time.Since(began).Round(time.Millisecond))
	checkRestored(t, s, agents, code, func(a *agent, r string) {
		if code, m := sandboxExec(t, descriptor(t, s, a, r), "cat notes.txt"); code != 200 || m["stdout"] != "one\n" {
			t.Errorf("the fork's notes through the sandbox API: %d %v", code, m)
		}
	})
	if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
		t.Errorf("release: %d %v %v", code, m, err)
	} else if d, _ := m["deferred"].([]any); len(d) != 0 {
		t.Errorf("release deferred %v with every session verified", d)
	}
	s.term()
	if sbs, snaps := rs.left(t); len(sbs)+len(snaps) != 0 {
		t.Errorf("left on the lifecycle server: sandboxes %v, snapshots %v\n%s", sbs, snaps, lastLines(s.log.String(), 30))
	}
}

// seededOnRealStack starts the server on the real stack, used as use says
// (see newOnRealStack), with its state in a fresh directory and seeds n
// notes sessions.
func seededOnRealStack(t *testing.T, n int, use stackUse) (rs *onRealStack, dir string, s *server, agents []*agent) {
	t.Helper()
	rs = newOnRealStack(t, use)
	dir = t.TempDir()
	s = rs.start(t, dir)
	return rs, dir, s, seedNotes(t, s, n)
}

// seedNotes seeds n sessions on s at once, as a rollout's agents do, each
// writing the note "one".
func seedNotes(t *testing.T, s *server, n int) []*agent {
	t.Helper()
	agents := make([]*agent, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range agents {
		agents[i] = newAgent()
		r := fmt.Sprintf("r%d", i)
		wg.Go(func() {
			for _, step := range []struct {
				path string
				body map[string]any
			}{
				{"/ng-rollout/" + r + "/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)}},
				{"/ng-rollout/" + r + "/append_note", map[string]any{"line": "one"}},
			} {
				if code, m, err := s.call(agents[i], "POST", step.path, step.body); err != nil || code != 200 {
					errs[i] = fmt.Errorf("POST %s: %d %v %v", step.path, code, m, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("%v\n%s", err, lastLines(s.log.String(), 30))
	}
	return agents
}

// commitCk prepares, commits checkpoint id of n sessions and resumes; it
// returns the commit's status.
func commitCk(t *testing.T, s *server, id string, n int) int {
	t.Helper()
	if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": id}); err != nil || code != 200 {
		t.Fatalf("prepare: %d %v %v", code, m, err)
	}
	code, m, err := s.control("commit", map[string]any{"checkpoint_id": id, "checkpoint_dir": filepath.Join(s.dir, "ctl-"+id), "episode_ids": episodes(n, 0)})
	if err != nil {
		t.Fatalf("commit: %v", err)
	}
	t.Logf("commit: %d %v", code, m)
	if code, m, err := s.control("resume", map[string]any{"checkpoint_id": id}); err != nil || code != 200 {
		t.Fatalf("resume: %d %v %v", code, m, err)
	}
	return code
}

// restoreCk SIGKILLs s, starts a fresh server on dir, restores checkpoint
// id into it, checks every session verifies to 1.0 on its fork, releases, stops it
// with SIGTERM and checks that the lifecycle server lists nothing of the
// run.
func (r *onRealStack) restoreCk(t *testing.T, s *server, dir, id string, agents []*agent) {
	t.Helper()
	s.kill()
	s = r.start(t, dir)
	code, m, err := s.control("restore", map[string]any{"checkpoint_id": id, "checkpoint_dir": filepath.Join(s.dir, "ctl-"+id), "episode_ids": episodes(len(agents), 0)})
	if err != nil || code != 200 {
		t.Fatalf("restore from the last good checkpoint: %d %v %v\n%s", code, m, err, lastLines(s.log.String(), 30))
	}
	checkRestoredAs(t, s, id, agents, code)
	if code, m, err := s.control("release", map[string]any{"kept_checkpoint_ids": []string{}}); err != nil || code != 200 {
		t.Errorf("release: %d %v %v", code, m, err)
	}
	s.term()
	if sbs, snaps := r.left(t); len(sbs)+len(snaps) != 0 {
		t.Errorf("left on the lifecycle server: sandboxes %v, snapshots %v\n%s", sbs, snaps, lastLines(s.log.String(), 40))
	}
}

// realStackLifecycleServerKilledMidCommit: the lifecycle server is
// SIGKILLed while a commit's snapshots are in flight and started again. The
// commit completes or fails cleanly (an answer, never a hang); a failed one
// is committed again once the server is back; a fresh server restores from
// the checkpoint, and nothing of the run is left.
func realStackLifecycleServerKilledMidCommit(t *testing.T) {
	const sessions = 3
	// The lifecycle server killed is the test's own: the other tests'
	// calls go on to the shared one meanwhile.
	rs, dir, s, agents := seededOnRealStack(t, sessions, ownLifecycleServer)
	if code, m, err := s.control("prepare", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
		t.Fatalf("prepare: %d %v %v", code, m, err)
	}
	type answer struct {
		code int
		m    map[string]any
		err  error
	}
	done := make(chan answer, 1)
	go func() {
		code, m, err := s.control("commit", map[string]any{"checkpoint_id": "ck1", "checkpoint_dir": filepath.Join(dir, "ctl-ck1"), "episode_ids": episodes(sessions, 0)})
		done <- answer{code, m, err}
	}()
	// Kill once the lifecycle server lists the commit's first snapshot:
	// the commit is then under way, its other snapshots still to come or
	// in flight (wherever the kill lands, the outcome must be clean).
	if err := rs.firstSnapshot(t); err != nil {
		t.Fatalf("%v\n%s", err, lastLines(s.log.String(), 30))
	}
	if err := rs.st.KillServer(); err != nil {
		t.Fatal(err)
	}
	sharedServerAnswers(t)
	if err := rs.st.Up(); err != nil {
		t.Fatal(err)
	}
	var a answer
	select {
	case a = <-done:
	case <-time.After(hangGuard):
		t.Fatalf("the commit did not answer within %v of the lifecycle server's restart\n%s", hangGuard, lastLines(s.log.String(), 30))
	}
	if a.err != nil {
		t.Fatalf("commit: %v", a.err)
	}
	t.Logf("commit across the lifecycle server's restart: %d %v", a.code, a.m)
	if code, m, err := s.control("resume", map[string]any{"checkpoint_id": "ck1"}); err != nil || code != 200 {
		t.Fatalf("resume: %d %v %v", code, m, err)
	}
	good := "ck1"
	if a.code != 200 {
		good = "ck2"
		if code := commitCk(t, s, good, sessions); code != 200 {
			t.Fatalf("commit again once the lifecycle server is back: %d\n%s", code, lastLines(s.log.String(), 30))
		}
	}
	for i, ag := range agents {
		s.ok(ag, fmt.Sprintf("/ng-rollout/r%d/append_note", i), map[string]any{"line": "lost"})
	}
	rs.restoreCk(t, s, dir, good, agents)
}

// sharedServerAnswers fails the test unless the shared stack's lifecycle
// server answers: a test that kills its own must leave that one up.
func sharedServerAnswers(t *testing.T) {
	t.Helper()
	st, err := realStack()
	if err != nil {
		t.Fatal(err)
	}
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	p, err := opensandbox.New(opensandbox.Options{Domain: st.Domain, APIKey: st.APIKey, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.ListSandboxes(context.Background()); err != nil {
		t.Fatalf("the shared lifecycle server while the test's own is killed: %v", err)
	}
}

// realStackSandboxesStoppedMidEpisode: every sandbox of the run is
// stopped in the middle of episodes as a dockerd restart stops it (SIGTERM,
// then SIGKILL) and comes back Terminated. A renewal finds each lost, the
// sessions are reported lost (409 sandbox_lost, never a reward), a fresh
// server restores them from the last good checkpoint, and nothing of the
// run is left. A restart of the shared dockerd would end the other tests'
// sandboxes too: it waited for every other hold on the stack (the
// SWE-bench gin test's two minutes and more), the suite's longest path.
func realStackSandboxesStoppedMidEpisode(t *testing.T) {
	const sessions = 3
	rs, dir, s, agents := seededOnRealStack(t, sessions, sharedStackProbed)
	if code := commitCk(t, s, "ck1", sessions); code != 200 {
		t.Fatalf("commit: %d", code)
	}
	sbs, err := rs.client(t).ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs) != sessions {
		t.Fatalf("the lifecycle server lists %d sandboxes of the run, want %d", len(sbs), sessions)
	}
	ids := make([]string, len(sbs))
	for i, sb := range sbs {
		ids[i] = sb.Handle.SandboxID
	}
	if err := rs.st.StopSandboxes(ids...); err != nil {
		t.Fatal(err)
	}
	// The lifecycle server renews a sandbox whose container stopped as it
	// renews a running one: the provider's renewal finds each lost.
	p := rs.client(t)
	for _, sb := range sbs {
		if err := p.Renew(context.Background(), sb.Handle, time.Now().Add(time.Hour)); !errors.Is(err, provider.ErrSandboxNotFound) {
			t.Errorf("Renew of %s after its container stopped = %v, want ErrSandboxNotFound", sb.Handle.SandboxID, err)
		}
	}
	for i, ag := range agents {
		r := fmt.Sprintf("r%d", i)
		code, m, err := s.call(ag, "POST", "/ng-rollout/"+r+"/append_note", map[string]any{"line": "two"})
		if err != nil || code == 200 {
			t.Errorf("append_note in a sandbox that was stopped: %d %v %v", code, m, err)
		}
		code, m, err = s.call(ag, "POST", "/ng-rollout/"+r+"/verify", map[string]any{"expected_notes": []string{"one"}})
		if e, _ := m["error"].(map[string]any); err != nil || code != 409 || e["code"] != "sandbox_lost" {
			t.Errorf("verify of a session whose sandbox ended: %d %v %v, want 409 sandbox_lost", code, m, err)
		}
	}
	rs.restoreCk(t, s, dir, "ck1", agents)
}

// checkRestoredAs is checkRestored for a checkpoint of any id: resume it,
// then every session re-seeds onto its fork and verifies to 1.0.
func checkRestoredAs(t *testing.T, s *server, id string, agents []*agent, code int) {
	t.Helper()
	if code, m, err := s.control("resume", map[string]any{"checkpoint_id": id}); err != nil || code != 200 {
		t.Fatalf("resume: %d %v %v", code, m, err)
	}
	for i, a := range agents {
		r := fmt.Sprintf("r%d-a1", i)
		s.ok(a, "/ng-rollout/"+r+"/seed_session", map[string]any{"instance_id": fmt.Sprintf("row-%d", i)})
		v := s.ok(a, "/ng-rollout/"+r+"/verify", map[string]any{"expected_notes": []string{"one"}})
		if v["reward"] != 1.0 {
			t.Errorf("exact restore: session %s verified %v", r, v)
		}
	}
}
