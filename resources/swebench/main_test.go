package swebench_test

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/resources/swebench"
)

// serveEnv makes the test binary the server binary (cmd/server): its value
// is the JSON list of the command line's arguments.
const serveEnv = "SWEBENCH_TEST_SERVE"

func TestMain(m *testing.M) {
	if args := os.Getenv(serveEnv); args != "" {
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		code := app.Run(ctx, argv, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	// Most of these tests wait: on sandboxes compiling, on another test's
	// environment or validation of a shared template. go test runs
	// GOMAXPROCS parallel tests at once (2 here), which left the waits in
	// a row; the compiling itself is bounded by each server's grading
	// slots. Four were too few: on a cold run the real repositories' tests
	// and subtests, each waiting minutes for its template's environment
	// and validation, held every slot while the hack tests, which need
	// only the task's template, sat paused behind them for 20 minutes. An
	// explicit -parallel wins.
	flag.Parse()
	testparallel.AtLeast(max(16, 8*runtime.GOMAXPROCS(0)))
	held, dir, err := sharedTemplates()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	keep := held != nil
	os.Setenv(swebench.TemplatesEnv, dir)
	std, err := sharedStdLayers(dir, keep)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv(swebench.StdCacheEnv, std)
	proxyCache := filepath.Join(dir, ".goproxy")
	if keep {
		// What a module proxy served of a module version never changes:
		// kept for every source tree.
		proxyCache = filepath.Join(filepath.Dir(dir), ".goproxy")
	}
	if err := touchDir(proxyCache); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv(swebench.ProxyCacheEnv, proxyCache)
	// The providers' roots, with the templates' caches bound into them,
	// live under a locked temporary root. The kept templates, layers and
	// module proxy answers above lie outside it: they outlive runs; so does
	// the real stack's directory, pinned before TMPDIR moves.
	code := localtest.Run(m, osstack.PinDir)
	if keep {
		held.release(code == 0)
	} else {
		_ = os.RemoveAll(dir)
	}
	os.Exit(code)
}

// TestTempDirsAreUnderALockedRoot: the providers' roots and the servers'
// state (every test's t.TempDir) are where a later run clears what a killed
// one left mounted; the kept templates and the real stack's directory are
// not (they are shared with other runs).
func TestTempDirsAreUnderALockedRoot(t *testing.T) {
	localtest.RequireRoot(t)
	for _, dir := range []string{swebench.SharedTemplateDir(), swebench.SharedStdCacheDir(), osstack.Dir()} {
		if strings.HasPrefix(dir, os.TempDir()+string(filepath.Separator)) {
			t.Errorf("%s, shared with other runs, is under this run's %s", dir, os.TempDir())
		}
	}
}

// freshEnv, set, gives the test binary a template_dir of its own, removed at
// the end, instead of the one kept between runs.
const freshEnv = "SWEBENCH_TEST_FRESH"

// sharedTemplates is the template_dir every test of the binary shares, and
// the binary's hold on it when it is kept (nil for a fresh one). It is kept
// between runs of the same source tree (every .go file of the module,
// go.mod, go.sum and the Go version name it), so that a rerun does not
// build the templates' environments and validations again: those of a
// clean tree take minutes of compiling inside sandboxes. Any change to the
// code makes a new one; the templates, environments and validations are
// made to be shared by servers (and so by test binaries running at once:
// claimShared). Directories of other trees unused for a day are removed.
func sharedTemplates() (*claim, string, error) {
	if os.Getenv(freshEnv) != "" {
		dir, err := os.MkdirTemp("", "swebench-test-templates-")
		return nil, dir, err
	}
	key, err := sourceKey(filepath.Join("..", ".."))
	if err != nil {
		return nil, "", err
	}
	parent := filepath.Join(os.TempDir(), "sandboxowner-swebench-tests")
	c, err := claimShared(parent, key)
	if err != nil {
		return nil, "", err
	}
	sweepUnused(parent, key, time.Now())
	seedFromEarlierTree(parent, c)
	return c, c.dir, nil
}

// sharedStdLayers is the std_cache_dir of the test binary's servers. Kept
// templates share one kept beside theirs across every source tree whose
// standard-library layer is made the same way (stdlib.go and the Go
// version name it), so that a change elsewhere in the module does not
// compile the standard library of each toolchain again: minutes of the
// package's time on a cold run. A layer is Go's build cache, addressed by
// what each entry was built from, so whatever another tree's run left there
// can be unused but never wrong. A fresh run's is inside its templates.
func sharedStdLayers(templates string, keep bool) (string, error) {
	if !keep {
		return filepath.Join(templates, ".gostd"), nil
	}
	b, err := os.ReadFile("stdlib.go")
	if err != nil {
		return "", fmt.Errorf("hash the standard-library layer's code: %w", err)
	}
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	h.Write(b)
	dir := filepath.Join(filepath.Dir(templates), ".gostd-"+hex.EncodeToString(h.Sum(nil))[:16])
	return dir, touchDir(dir)
}

// touchDir makes dir and marks it used now (directories unused for a day
// are removed: sharedTemplates).
func touchDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	now := time.Now()
	return os.Chtimes(dir, now, now)
}

// sourceKey hashes what the kept templates, environments and validations
// are made by, by path and content: the Go version, go.mod and go.sum, the
// .go files of every package of the module this package's code imports
// (go list -deps), of app (the binary's tests run its wiring of the
// server), and every file under this package's directory (its tests and
// their rows, testdata, the grading package). A change elsewhere (the HTTP
// layer, the simulation, docs) cannot change what is kept, so it reuses
// it; any change to these makes a new one.
func sourceKey(root string) (string, error) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if .Module}}{{if .Module.Main}}{{.Dir}}{{end}}{{end}}", ".").Output()
	if err != nil {
		return "", fmt.Errorf("list the package's dependencies: %w", err)
	}
	self, err := filepath.Abs(".")
	if err != nil {
		return "", err
	}
	mod, err := filepath.Abs(root)
	if err != nil {
		return "", err
	}
	dirs := map[string]bool{filepath.Join(mod, "app"): true}
	for _, d := range strings.Fields(string(out)) {
		dirs[d] = true
	}
	h := sha256.New()
	fmt.Fprintln(h, runtime.Version())
	hash := func(path string) error {
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(mod, path)
		fmt.Fprintf(h, "%s %d\n", filepath.ToSlash(rel), len(b))
		h.Write(b)
		return nil
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if err := hash(filepath.Join(mod, f)); err != nil {
			return "", fmt.Errorf("hash the module's sources: %w", err)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(dirs)) {
		if within(d, self) {
			continue // walked whole below
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			return "", fmt.Errorf("hash the module's sources: %w", err)
		}
		for _, e := range entries {
			if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".go") {
				if err := hash(filepath.Join(d, e.Name())); err != nil {
					return "", fmt.Errorf("hash the module's sources: %w", err)
				}
			}
		}
	}
	err = filepath.WalkDir(self, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != self && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.Type().IsRegular() {
			return nil
		}
		return hash(path)
	})
	if err != nil {
		return "", fmt.Errorf("hash the package's files: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// within reports whether path is dir or inside it.
func within(path, dir string) bool {
	rel, err := filepath.Rel(dir, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

const (
	childSecret = "a-session-secret-the-restarted-server-shares"
	childToken  = "control-token"
)

// childConfig is the server binary's configuration for the task: the local
// provider on root (with the test binary's shared templates and
// standard-library layers), an exported owner
// on state, the swebench resources, a fixed session secret (cookies and
// sandbox tokens survive a restart). Its cleanup, which runs after the
// children's (startChild's SIGTERM) and before root's removal, stops what
// they left on root (stopLeftSandboxes).
func childConfig(t *testing.T, tr swebench.TaskRepo, root, state string) string {
	t.Helper()
	t.Cleanup(func() { stopLeftSandboxes(t, root) })
	cfg := app.Defaults()
	cfg.Name, cfg.Resources, cfg.Port, cfg.SessionSecret = "swebench", "swebench", 0, childSecret
	cfg.Sandbox.Provider = "local"
	cfg.Sandbox.Local.Root = root
	cfg.Sandbox.Local.InitBinary = localtest.InitBinary(t)
	cfg.Checkpoint.Enabled, cfg.Checkpoint.StateDir, cfg.Checkpoint.ControlAuthToken = true, state, childToken
	cfg.SWEBench = swebench.Config{
		Repos:         map[string]string{tr.Repo: tr.Dir},
		TemplateDir:   swebench.SharedTemplateDir(),
		StdCacheDir:   swebench.SharedStdCacheDir(),
		TestCommands:  map[string]string{tr.Repo: tr.TestCommand},
		SandboxConfig: swebench.SandboxConfig{TTLSeconds: 3600},
	}
	b, err := yaml.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "swebench.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// stopLeftSandboxes stops every sandbox a server left on root: local
// sandboxes outlive their server, so one killed (or stopped past its
// bounds) mid-validation leaves its sandbox running with the template's
// environment, the shared build cache among it, bound read-write inside
// root, and the removal of root deleted through the bind. The provider is
// exclusive: a server still running on root is reported, not raced.
func stopLeftSandboxes(t *testing.T, root string) {
	t.Helper()
	p, err := local.New(local.Options{Root: root, Exclusive: true, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Errorf("stop what the servers left on %s: %v", root, err)
		return
	}
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	left, err := p.ListSandboxes(ctx)
	if err != nil {
		t.Errorf("stop what the servers left on %s: %v", root, err)
		return
	}
	for _, sb := range left {
		if err := p.Stop(ctx, sb.Handle); err != nil {
			t.Errorf("stop %s, left on %s: %v", sb.Handle.SandboxID, root, err)
		}
	}
	if _, err := p.Reap(ctx); err != nil {
		t.Errorf("reap %s: %v", root, err)
	}
}

// child is a running server process.
type child struct {
	cmd  *exec.Cmd
	base string
	done chan error
}

// startChild starts the server binary on the config file and returns once it
// logs the address it serves.
func startChild(t *testing.T, config string) *child {
	t.Helper()
	argv, _ := json.Marshal([]string{"-config", config, "-log-format", "json"})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"="+string(argv))
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "server.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, done: make(chan error, 1)}
	addr := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintln(logFile, sc.Text())
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && strings.HasPrefix(line.Msg, "serving ") && line.Addr != "" {
				select {
				case addr <- line.Addr:
				default:
				}
			}
		}
		close(addr)
		ch.done <- cmd.Wait()
		logFile.Close()
	}()
	a, ok := <-addr
	if !ok {
		<-ch.done
		b, _ := os.ReadFile(logPath)
		t.Fatalf("the server did not start:\n%s", b)
	}
	t.Cleanup(func() {
		if ch.cmd.ProcessState == nil {
			ch.stop(t, syscall.SIGTERM)
		}
	})
	ch.base = "http://" + a
	return ch
}

// stop sends sig and waits for the process to exit.
func (c *child) stop(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
	select {
	case <-c.done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("the server did not exit after %v", sig)
	}
}
