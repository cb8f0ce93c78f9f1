package swebench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// goImageDockerfile is the image of a Go instance on OpenSandbox, built on
// this machine as the stack builds its own (no registry is reachable): the
// stack's Debian rootfs, git and patch from Debian's mirror, the toolchain
// the instance pins from the module proxy, the module cache its tests need
// (downloaded on the host: sandboxes run Go offline) and the repository at
// its base commit in the workdir. The last step compiles the tests once, so
// that the build cache every sandbox starts with holds the standard library
// and the dependencies, and checks that doing so left the work tree clean
// (it would otherwise be in every patch).
const goImageDockerfile = `FROM {{base}}
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends git patch >/dev/null && rm -rf /var/lib/apt/lists/*
COPY go /usr/local/go
RUN chmod -R a+x /usr/local/go/bin /usr/local/go/pkg/tool
COPY gomodcache /root/go/pkg/mod
COPY testbed /testbed
ENV PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root GOTOOLCHAIN=local GOFLAGS=-mod=mod GOPROXY=off GOMODCACHE=/root/go/pkg/mod GOCACHE=/root/.cache/go-build
RUN cd /testbed && {{warm}} && git status --porcelain && test -z "$(git status --porcelain)"
`

// goImageEnv is what the image's ENV says, given again as every sandbox's
// env: a runtime that starts commands without the image's environment
// still finds the toolchain and runs it offline.
var goImageEnv = map[string]string{
	"PATH": "/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root",
	"GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod", "GOPROXY": "off", "GOMODCACHE": "/root/go/pkg/mod", "GOCACHE": "/root/.cache/go-build",
}

// goImage is the image of ri on the stack, built unless an image of the
// same inputs is there already, and the commit its repository is at (the
// row's base_commit on it: the module proxy's source made one commit).
func goImage(t *testing.T, st osstack.Stack, proxy string, ri realInstance) (tag, base string) {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	mp := newModuleProxy(proxy, ri.versions)
	testbed := filepath.Join(dir, "testbed")
	base, version, err := mp.fetchModuleRepo(ctx, ri.module, ri.base, testbed)
	if err != nil {
		t.Fatal(err)
	}
	if version != ri.version {
		t.Fatalf("the proxy resolved %s to %s, want %s", ri.base, version, ri.version)
	}
	warm := "go test -count=1 -run '^$' ./" + ri.hackAddress
	dockerfile := strings.NewReplacer("{{base}}", st.Image, "{{warm}}", warm).Replace(goImageDockerfile)
	sum := sha256.Sum256([]byte(strings.Join([]string{dockerfile, ri.module, version, base, ri.toolchain}, "\x00")))
	tag = "osstack/swebench-" + strings.ToLower(ri.pkgName) + ":" + hex.EncodeToString(sum[:6])
	if dockerOut(t, "images", "-q", tag) != "" {
		return tag, base
	}
	began := time.Now()
	// The toolchain: the module proxy's zip of golang.org/toolchain.
	tv := "v0.0.1-" + ri.toolchain + ".linux-amd64"
	zip, err := mp.get(ctx, "golang.org/toolchain", tv+".zip", maxModuleZip)
	if err != nil {
		t.Fatalf("the toolchain %s from %s: %v", ri.toolchain, proxy, err)
	}
	if err := extractModuleZip(zip, "golang.org/toolchain@"+tv+"/", filepath.Join(dir, "go")); err != nil {
		t.Fatal(err)
	}
	// The modules, as the environment step downloads them on the local
	// provider, written writable so that the test's cleanup removes them.
	cmd := exec.Command("go", "mod", "download")
	cmd.Dir = testbed
	cmd.Env = append(os.Environ(), "GOMODCACHE="+filepath.Join(dir, "gomodcache"), "GOPROXY="+proxy,
		"GOFLAGS=-mod=mod -modcacherw", "GOTOOLCHAIN=local", "GONOSUMDB=*", "GOSUMDB=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod download: %v\n%s", err, out)
	}
	if out := hostGitStatus(t, testbed); out != "" {
		t.Fatalf("downloading the modules changed the work tree:\n%s", out)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	dockerOut(t, "build", "-q", "-t", tag, dir)
	t.Logf("built %s in %.0f s", tag, time.Since(began).Seconds())
	return tag, base
}

func hostGitStatus(t *testing.T, dir string) string {
	t.Helper()
	out, err := hostGit(context.Background(), dir, "status", "--porcelain")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out)
}

// dockerOut runs the stack's Docker client (the classic builder, as
// stack.sh builds its images) and returns its output.
func dockerOut(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("docker", args...)
	cmd.Env = append(os.Environ(), "DOCKER_BUILDKIT=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// sideBySide runs each of fs in a goroutine of its own and returns their
// errors, in fs's order, once all have returned.
func sideBySide(fs ...func() error) []error {
	errs := make([]error, len(fs))
	var wg sync.WaitGroup
	for i, f := range fs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = f()
		}()
	}
	wg.Wait()
	return errs
}

// stackUp is the real stack, once per test binary; each test that uses it
// releases it when done (the binary's other tests run for minutes more).
var stackUp = sync.OnceValues(osstack.Up)

// onOpenSandbox is a swebench server on the real OpenSandbox stack with
// checkpointing, and the agent-facing sandbox API: a world whose provider
// is the opensandbox one.
type onOpenSandbox struct {
	*world
	st    osstack.Stack
	name  string
	osbox *opensandbox.Provider
}

func newOnOpenSandbox(t *testing.T, st osstack.Stack, cfg Config) *onOpenSandbox {
	t.Helper()
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	w := &onOpenSandbox{world: &world{t: t, state: t.TempDir(), cfg: cfg, log: testLogger(t)}, st: st, name: "swb" + hex.EncodeToString(b)}
	t.Cleanup(w.clean)
	w.open()
	return w
}

// open starts a provider, owner and server on the world's state_dir.
func (w *onOpenSandbox) open() {
	t := w.t
	t.Helper()
	p, err := opensandbox.New(opensandbox.Options{Domain: w.st.Domain, APIKey: w.st.APIKey, Logger: w.log,
		TTL: time.Hour, ListLabels: map[string]string{owner.LabelOwner: w.name}})
	if err != nil {
		t.Fatal(err)
	}
	w.osbox = p
	w.serve(p, w.name)
}

// crash drops the owner as a SIGKILL would, then opens a fresh provider,
// owner and server on the same state_dir.
func (w *onOpenSandbox) crash() {
	if err := w.own.Abandon(); err != nil {
		w.t.Fatal(err)
	}
	w.open()
}

// left is what the lifecycle server lists of this world: sandboxes and
// snapshots.
func (w *onOpenSandbox) left() (sandboxes, snapshots []string, err error) {
	ctx := context.Background()
	sbs, err := w.osbox.ListSandboxes(ctx)
	if err != nil {
		return nil, nil, err
	}
	for _, s := range sbs {
		sandboxes = append(sandboxes, fmt.Sprintf("%s (%s)", s.Handle.SandboxID, s.Status))
	}
	snaps, err := w.osbox.ListSnapshots(ctx)
	for _, s := range snaps {
		snapshots = append(snapshots, s.ID)
	}
	return sandboxes, snapshots, err
}

// clean removes what a failed run left on the shared stack.
func (w *onOpenSandbox) clean() {
	ctx := context.Background()
	if sbs, err := w.osbox.ListSandboxes(ctx); err == nil {
		for _, s := range sbs {
			_ = w.osbox.Stop(ctx, s.Handle)
		}
	}
	if snaps, err := w.osbox.ListSnapshots(ctx); err == nil {
		for _, s := range snaps {
			_ = w.osbox.DeleteSnapshot(ctx, s.ID)
		}
	}
}

// TestARealGinInstanceOnOpenSandbox grades the gin instance in OpenSandbox
// sandboxes on the real stack, from an image built here: one session
// applies the gold patch, the other does nothing; a checkpoint is
// committed; each then drifts (the gold session undoes its fix, the other
// applies it), the server crashes, and after a restore each re-seeds onto
// its checkpoint's fork and verifies: gold 1, nothing 0, graded from what
// the checkpoint held. A release and a close leave nothing on the server.
func TestARealGinInstanceOnOpenSandbox(t *testing.T) {
	t.Parallel()
	needTools(t, "git", "go")
	ri := ginInstance
	proxy := realProxy(t, ri)
	st, err := stackUp()
	st = osstack.Require(t, st, err)
	t.Cleanup(st.Release)
	if _, err := exec.LookPath("docker"); err != nil {
		t.Skip("SKIP: no docker client on the PATH: the image of the instance is built with it")
	}
	image, base := goImage(t, st, proxy, ri)
	row := ri.row(t, proxy)
	row["base_commit"], row["image"] = base, image
	cfg := Config{
		TestCommands:      map[string]string{ri.repo: ri.testCmd},
		SandboxConfig:     SandboxConfig{TTLSeconds: 3600, Env: goImageEnv},
		EvaluationTimeout: 1800, // a compile of the package's tests on a loaded machine
		// The two sessions' gradings run side by side: their containers
		// are the stack's, outside the local sandboxes' CPU group, and the
		// test's wall clock is the package's longest.
		MaxConcurrentGradings: 2,
	}
	w := newOnOpenSandbox(t, st, cfg)
	body := mustJSON(t, row)
	// The two sessions start side by side (each a container of the image),
	// from goroutines of the test, not parallel subtests: those waited for
	// a slot of the package's -parallel behind every test still queued
	// (91 s of a 208 s run), and this test is the package's longest.
	var gold, none SeedResult
	errs := sideBySide(
		func() (err error) {
			gold, err = w.srv.SeedSession(context.Background(), w.own, "s-gold", body)
			return err
		},
		func() (err error) {
			none, err = w.srv.SeedSession(context.Background(), w.own, "s-nothing", body)
			return err
		},
	)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("seed: %v", err)
	}
	if gold.SandboxHandle == nil || none.SandboxHandle == nil {
		t.Fatalf("seeds without a sandbox: %+v, %+v", gold, none)
	}
	if v := w.agentRun(*gold.SandboxHandle, "go env GOVERSION"); strings.TrimSpace(v) != ri.toolchain {
		t.Errorf("the agent's go is %q, want the pinned %s", v, ri.toolchain)
	}
	w.applyAsAgent(*gold.SandboxHandle, row["patch"].(string))
	res, err := w.own.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sessions) != 2 {
		t.Fatalf("commit exported %v", res.Sessions)
	}
	// Drift after the checkpoint, which the restore must not bring back.
	w.agentRun(*gold.SandboxHandle, "git checkout -- context.go")
	w.applyAsAgent(*none.SandboxHandle, row["patch"].(string))

	w.crash()
	if _, err := w.own.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	// Each session re-seeds onto its checkpoint's fork and is graded, the
	// two side by side (from goroutines, as the seeds).
	cases := []struct {
		sid  string
		old  string
		want float64
	}{{"s-gold", *gold.SandboxHandle, 1}, {"s-nothing", *none.SandboxHandle, 0}}
	again := make([]SeedResult, len(cases))
	verified := make([]VerifyResult, len(cases))
	var runs []func() error
	for i, c := range cases {
		runs = append(runs, func() (err error) {
			if again[i], err = w.srv.SeedSession(context.Background(), w.own, c.sid, body); err != nil {
				return fmt.Errorf("%s: re-seed after restore: %w", c.sid, err)
			}
			if verified[i], err = w.srv.VerifySession(context.Background(), w.own, c.sid, body); err != nil {
				return fmt.Errorf("%s: verify: %w", c.sid, err)
			}
			return nil
		})
	}
	errs = sideBySide(runs...)
	for i, c := range cases {
		if errs[i] != nil {
			t.Error(errs[i])
			continue
		}
		if a := again[i]; !a.Restored || a.SandboxHandle == nil || *a.SandboxHandle == c.old {
			t.Errorf("%s: re-seed after restore: %+v (old sandbox %s)", c.sid, a, c.old)
			continue
		}
		v := verified[i]
		t.Logf("%s: reward %v, grading %.1f s (sandbox start %.1f s, apply %.1f s, eval %.1f s), failure %q", c.sid, v.Reward,
			v.PatchVerificationTimeTaken, v.EvalSandboxStartTimeTaken, v.PatchApplyTimeTaken, v.EvalTimeTaken, v.FailureKind)
		if v.Reward != c.want || v.MaskSample || v.TestFraming != grading.FramingMarked {
			t.Errorf("%s: want reward %v, got:\n%s", c.sid, c.want, describe(v))
		}
	}
	if _, err := w.own.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if err := w.own.Close(); err != nil && !errors.Is(err, owner.ErrClosed) {
		t.Fatal(err)
	}
	sbs, snaps, err := w.left()
	if err != nil {
		t.Fatal(err)
	}
	if len(sbs)+len(snaps) != 0 {
		t.Errorf("left on the lifecycle server: sandboxes %v, snapshots %v", sbs, snaps)
	}
}
