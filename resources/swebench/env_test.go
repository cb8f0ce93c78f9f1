package swebench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// envOf reads the environment the world's templates hold for (repo, base).
func envOf(t *testing.T, templateDir, repo, base string) *Environment {
	t.Helper()
	dir := filepath.Join(templateDir, strings.ReplaceAll(repo, "/", "__"), base)
	matches, _ := filepath.Glob(filepath.Join(dir+".env", "*", envFile))
	if len(matches) != 1 {
		t.Fatalf("environments of %s: %v, want one", dir, matches)
	}
	env, err := readEnvironment(filepath.Dir(matches[0]), dir)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// logged counts the entries whose message starts with msg.
func logged(hook *logtest.Hook, msg string) []*logrus.Entry {
	var out []*logrus.Entry
	for _, e := range hook.AllEntries() {
		if strings.HasPrefix(e.Message, msg) {
			out = append(out, e)
		}
	}
	return out
}

// fileState is what any write to a file or directory changes: its inode
// (a file replaced by a rename), mode, size and change time, which the
// kernel sets on every write and no process can set back.
type fileState struct {
	Mode         fs.FileMode
	Size         int64
	Ino          uint64
	Ctime, Mtime time.Time
}

// treeState is the state of every entry of a directory tree, by path: a
// write anywhere in it, even one that leaves the contents as they were,
// changes it. It reads no file's contents (the build caches it is taken
// of hold tens of megabytes, read several times by a test).
// cachesState is treeState of a template's caches without the server's
// own records of who stands on them (pins and users, cachegc.go), which
// no sandbox reaches.
func cachesState(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	states := treeState(t, dir)
	for rel := range states {
		for _, part := range strings.Split(rel, string(filepath.Separator)) {
			if part == cachePinsDir || part == cacheUsersDir {
				delete(states, rel)
				break
			}
		}
	}
	return states
}

func treeState(t *testing.T, dir string) map[string]fileState {
	t.Helper()
	states := map[string]fileState{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", p)
		}
		rel, _ := filepath.Rel(dir, p)
		states[rel] = fileState{Mode: fi.Mode(), Size: fi.Size(), Ino: st.Ino,
			Ctime: time.Unix(st.Ctim.Unix()), Mtime: time.Unix(st.Mtim.Unix())}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return states
}

// treeChanged says how a tree's state changed (its first few entries), ""
// when it did not.
func treeChanged(before, after map[string]fileState) string {
	diff := cmp.Diff(before, after)
	if len(diff) > 2000 {
		diff = diff[:2000] + "…"
	}
	return diff
}

func wantUnavailable(t *testing.T, err error, reason string) {
	t.Helper()
	if !errors.Is(err, ErrEnvironmentUnavailable) || !strings.Contains(err.Error(), reason) {
		t.Fatalf("seed err = %v, want ErrEnvironmentUnavailable with %q", err, reason)
	}
	var he *problem.Error
	if !errors.As(httpError(err), &he) || he.Status != 503 || he.Code != CodeEnvironmentUnavailable || !strings.Contains(he.Detail, reason) {
		t.Errorf("seed answers %+v, want 503 %s with the reason", he, CodeEnvironmentUnavailable)
	}
}

func wantMaskedEnvironmentError(t *testing.T, res VerifyResult, reason string) {
	t.Helper()
	if res.FailureKind != FailureEnvironment || !res.MaskSample || res.Reward != 0 || res.Resolved || res.EvaluationCompleted ||
		res.EvalSandboxStartTimeTaken != 0 || res.TestsStatus != nil || !strings.Contains(res.FailureReason, reason) {
		t.Errorf("verify of an unavailable instance graded or did not mask:\n%s", describe(res))
	}
}

func TestAFreshTemplateBuildsItsEnvironmentWithTheNetworkAndGradesOffline(t *testing.T) {
	t.Parallel()
	gp := newGoProxy(t)
	tk := newDepTask(t, gp)
	w := newWorld(t, tk, freshTemplates(), withConfig(withDepTask(tk, gp)))
	hook := logtest.NewLocal(w.log)
	row := tk.depRow("example__depcalc-1")
	seed := w.seed("s-1", row)
	if gp.zips() != 1 {
		t.Fatalf("the environment step downloaded %d module zips, want 1: %v", gp.zips(), gp.asked())
	}
	env := envOf(t, w.cfg.TemplateDir, depTaskRepo, tk.base)
	if !env.OK || env.Source != EnvSourceDefaultGo || !cmp.Equal(env.Commands, DefaultGoEnvSetup) || env.TreeChanged {
		t.Errorf("environment: %+v", env)
	}
	if _, err := os.Stat(filepath.Join(env.cacheDir("gomod"), depModule+"@"+depVersion, "mathx.go")); err != nil {
		t.Errorf("the template's module cache lacks the dependency: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(env.Dir, envLog)); !strings.Contains(string(b), "+ go mod download") {
		t.Errorf("the environment step's log: %q", b)
	}
	if len(logged(hook, "swebench: environment ready")) != 1 || len(logged(hook, "swebench: instance validated")) != 1 {
		t.Error("the environment step and the validation were not logged once each")
	}
	// Its build cache started as a copy of the standard-library layer
	// every template of the toolchain shares.
	if want := stdLayerKey(context.Background(), "local"); env.StdLayer != want || !strings.HasPrefix(want, "local-go1.") {
		t.Errorf("the environment's build cache was seeded from layer %q, want %q", env.StdLayer, want)
	}
	if len(logged(hook, "swebench: environment's build cache seeded with the standard library")) != 1 {
		t.Error("the standard-library layer's use was not logged")
	}
	// What the environment's build cache held when it was made (the
	// layer's entries among it) was stamped ahead: no go command of an
	// eval refreshes it, which the purge of evals beside it would take
	// for a write.
	layer := filepath.Join(w.cfg.StdCacheDir, env.StdLayer)
	stamped, fromLayer := 0, 0
	if err := filepath.WalkDir(layer, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(layer, path)
		var info os.FileInfo
		for _, l := range env.cacheChain("gobuild") {
			if info, err = os.Stat(filepath.Join(l, rel)); err == nil {
				break
			}
		}
		if err != nil {
			return nil // trimmed, or the layer grew since
		}
		fromLayer++
		if info.ModTime().Equal(buildCacheStamp()) {
			stamped++
		}
		return nil
	}); err != nil || fromLayer == 0 || stamped != fromLayer {
		t.Errorf("%d of the %d entries the build cache has from the layer stamped ahead (%v)", stamped, fromLayer, err)
	}

	// The agent's sandbox is offline, against the template's module cache.
	sb := *seed.SandboxHandle
	if got := w.agentRun(sb, "go env GOPROXY GOFLAGS GOMODCACHE"); got != "off\n-mod=mod\n/caches/gomod\n" {
		t.Errorf("the agent's go env: %q", got)
	}
	requests := len(gp.asked())
	if w.prov.Isolation() == local.IsolationContainer {
		res := w.agentExec(sb, "GOPROXY="+gp.URL+" go list -m -versions "+depModule)
		if res.ExitCode == 0 || len(gp.asked()) != requests {
			t.Errorf("the agent reached the proxy (exit %d):\n%s%s", res.ExitCode, res.Stdout, res.Stderr)
		}
	}
	w.applyAsAgent(sb, tk.patch)
	res := w.verify("s-1", row)
	wantResolved(t, res)
	if len(gp.asked()) != requests {
		t.Errorf("the agent or the grading asked the proxy: %v", gp.asked()[requests:])
	}

	// The environment and the validation are kept: a second seed runs
	// neither again.
	w.seed("s-2", row)
	if n := len(logged(hook, "swebench: environment step started")); n != 1 || gp.zips() != 1 {
		t.Errorf("the environment step ran %d times, %d downloads", n, gp.zips())
	}
	if n := len(logged(hook, "swebench: instance validated")); n != 1 {
		t.Errorf("validated %d times", n)
	}
	if env.SeededFrom != "" {
		t.Errorf("the first environment of the repository was seeded from %q", env.SeededFrom)
	}

	// A template of another commit of the repository starts from a copy of
	// this one's caches: its step downloads nothing, and its build cache
	// holds what the validation above compiled.
	marker := filepath.Join(env.cacheDir("gobuild"), "seed-marker")
	if err := os.WriteFile(marker, []byte("from the first commit"), 0o644); err != nil {
		t.Fatal(err)
	}
	gobuild := treeState(t, env.cacheDir("gobuild"))
	next := tk.depRow("example__depcalc-2")
	next["base_commit"], next["patch"] = tk.fix, ""
	next["FAIL_TO_PASS"], next["PASS_TO_PASS"] = []string{"TestAddZero"}, []string{"TestAdd"}
	w.seed("s-3", next)
	env2 := envOf(t, w.cfg.TemplateDir, depTaskRepo, tk.fix)
	if want := tk.base + ".env/" + filepath.Base(env.Dir); env2.SeededFrom != want || gp.zips() != 1 {
		t.Errorf("the second commit's environment: seeded from %q (want %q), %d downloads in all", env2.SeededFrom, want, gp.zips())
	}
	if diff := treeChanged(gobuild, treeState(t, env.cacheDir("gobuild"))); diff != "" {
		t.Errorf("seeding another environment changed this one's build cache (-before +after):\n%s", diff)
	}
	if b := chainRead(t, env2.cacheChain("gobuild"), "seed-marker"); b != "from the first commit" {
		t.Errorf("the second commit's build cache is not a copy of the first's: %q", b)
	}
	// Of every layer of the first's chain, not only its newest.
	for _, l := range env.cacheChain("gobuild") {
		for _, rel := range regularFiles(t, l) {
			if _, err := os.Stat(filepath.Join(env2.cacheBase("gobuild"), rel)); err != nil {
				t.Errorf("the second commit's build cache lacks %s of the first's layer %s", rel, l)
				break
			}
		}
	}
}

func TestAFailingEnvironmentStepMakesTheInstanceUnavailable(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk, freshTemplates(), withConfig(func(c *Config) {
		c.EnvSetup = map[string][]string{
			taskRepo:          {"echo fetching", "exit 7"},
			"example__calc-2": {"echo this instance has its own step"},
		}
	}))
	hook := logtest.NewLocal(w.log)
	row := tk.row("example__calc-1")
	for i := 0; i < 2; i++ {
		_, err := w.srv.SeedSession(context.Background(), w.own, "s-1", mustJSON(t, row))
		wantUnavailable(t, err, "exited 7")
		if !strings.Contains(err.Error(), "fetching") {
			t.Errorf("the reason lacks the step's output: %v", err)
		}
	}
	if n := len(logged(hook, "swebench: environment step started")); n != 1 {
		t.Errorf("the failing step ran %d times; its result is not kept", n)
	}
	if n := len(logged(hook, "swebench: environment step failed")); n != 1 {
		t.Errorf("the failure was logged %d times", n)
	}
	if _, ok := w.own.SessionSandbox(context.Background(), "s-1"); ok {
		t.Error("the seed of an unavailable instance lent a sandbox")
	}
	if live := w.liveSandboxes(); len(live) != 0 {
		t.Errorf("sandboxes running: %v", live)
	}
	res := w.verify("s-1", row)
	wantMaskedEnvironmentError(t, res, "exited 7")

	// An instance's own entry wins over its repository's.
	seed := w.seed("s-2", tk.row("example__calc-2"))
	if seed.SandboxHandle == nil {
		t.Fatal("no sandbox for the instance with a working step")
	}
}

func TestValidationMakesABrokenInstanceUnavailable(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	// Three validations below run at once, each in a grading slot.
	w := newWorld(t, tk, withConfig(func(c *Config) { c.MaxConcurrentGradings = 3 }))
	hook := logtest.NewLocal(w.log)
	run := runSuffix(t)

	p2p := tk.row("example__calc-p2p-" + run)
	p2p["FAIL_TO_PASS"], p2p["PASS_TO_PASS"] = []string{"TestAbs"}, append(append([]string{}, passToPass...), "TestAbs/negative")
	none := tk.row("example__calc-none-" + run)
	none["FAIL_TO_PASS"], none["PASS_TO_PASS"] = []string{"TestNothing"}, []string{"TestNothingElse"}
	// A FAIL_TO_PASS test that passes without the fix is a warning.
	warn := tk.row("example__calc-warn-" + run)
	warn["FAIL_TO_PASS"], warn["PASS_TO_PASS"] = []string{"TestAbs/positive", "TestAbs/negative"}, []string{"TestAdd"}
	// The three instances validate at once: each validation is a sandbox
	// of its own, and much of its time is the sandbox's start and stop.
	rows := []map[string]any{p2p, none, warn}
	sids := []string{"s-p2p", "s-none", "s-warn"}
	errs := make([]error, len(rows))
	var wg sync.WaitGroup
	for i := range rows {
		body := mustJSON(t, rows[i])
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = w.srv.SeedSession(context.Background(), w.own, sids[i], body)
		}()
	}
	wg.Wait()
	wantUnavailable(t, errs[0], "PASS_TO_PASS tests do not pass without the patch: TestAbs/negative")
	wantMaskedEnvironmentError(t, w.verify("s-p2p", p2p), "TestAbs/negative")
	wantUnavailable(t, errs[1], "no FAIL_TO_PASS or PASS_TO_PASS test appears in the eval log")
	if errs[2] != nil {
		t.Fatalf("seed s-warn: %v", errs[2])
	}
	entries := logged(hook, "swebench: FAIL_TO_PASS tests already pass")
	if len(entries) != 1 || entries[0].Level != logrus.WarnLevel || !cmp.Equal(entries[0].Data["fail_to_pass_passing"], []string{"TestAbs/positive"}) {
		t.Errorf("the warning: %v", entries)
	}
	unavailable := len(logged(hook, "swebench: instance unavailable"))
	if unavailable != 2 {
		t.Errorf("%d unavailable instances logged, want 2", unavailable)
	}

	// The results are kept with the template: a new server on it does not
	// validate again.
	w.crash()
	_, err := w.srv.SeedSession(context.Background(), w.own, "s-p2p-again", mustJSON(t, p2p))
	wantUnavailable(t, err, "TestAbs/negative")
	if n := len(logged(hook, "swebench: instance unavailable")); n != unavailable {
		t.Errorf("the new server validated again (%d unavailable logged)", n)
	}

	// validate: false lends it all the same.
	w2 := newWorld(t, tk, withConfig(func(c *Config) { c.Validate = off() }))
	if seed := w2.seed("s-p2p", p2p); seed.SandboxHandle == nil {
		t.Error("validate: false did not lend the instance")
	}
}

// A second template of the same commit and step (another template_dir on
// the same std_cache_dir, as another server's would be) is seeded with the
// standard-library layer without compiling into it: no stdlib sandbox.
func TestAnotherTemplateOfTheSameTreeCopiesTheStandardLibraryLayer(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	for i := range 2 {
		w := newWorld(t, tk, freshTemplates(), withConfig(func(c *Config) { c.Validate = off() }))
		hook := logtest.NewLocal(w.log)
		w.seed("s", tk.row("example__calc-1"))
		env := envOf(t, w.cfg.TemplateDir, taskRepo, tk.base)
		if want := stdLayerKey(context.Background(), "local"); env.StdLayer != want {
			t.Errorf("template %d: seeded from layer %q, want %q", i, env.StdLayer, want)
		}
		seeded := logged(hook, "swebench: environment's build cache seeded with the standard library")
		if len(seeded) != 1 {
			t.Fatalf("template %d: the layer's use logged %d times", i, len(seeded))
		}
		// The first may have found the mark another test's environment
		// of this tree left; the second finds the first's.
		if compiled, ok := seeded[0].Data["compiled"].(bool); !ok || (i == 1 && compiled) {
			t.Errorf("template %d: compiled %v (%v), want the second not to compile", i, seeded[0].Data["compiled"], ok)
		}
		if i == 1 {
			// Nothing but the layer's copy is in this build cache (no
			// validation ran): a go test of the tree with it compiles and
			// vets only the tree's own package.
			std, own := goTestWork(t, env.Image, env.cacheDir("gobuild"))
			if len(std) != 0 || len(own) == 0 {
				t.Errorf("go test with the seeded build cache compiled or vetted %d standard-library packages %v (and %d steps in the tree)", len(std), std, len(own))
			}
		}
	}
}

// goTestWork runs the host's go test, as a validation would, over a copy of
// tree with the build cache cache, and returns the compile and vet steps it
// ran in GOROOT and in the tree. It writes into cache: the caller's own (a
// template of its test's), used no more.
func goTestWork(t *testing.T, tree, cache string) (std, own []string) {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("cp", "-a", tree+"/.", dir+"/tree/").CombinedOutput(); err != nil {
		t.Fatalf("copy the tree: %v: %s", err, out)
	}
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("go", "test", "-x", "-count=1", "./...")
	cmd.Dir = filepath.Join(dir, "tree")
	cmd.Env = append(os.Environ(), "GOCACHE="+cache, "GOFLAGS=-mod=mod", "GOPROXY=off",
		"GOTOOLCHAIN=local", "GOWORK=off", "GOMODCACHE="+filepath.Join(dir, "gomod"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go test: %v\n%s", err, out)
	}
	// -x prints each step's directory (cd DIR) before the tool's command
	// line: the vet tool's ends in its vet.cfg, the compiler's has -p PKG.
	root := strings.TrimSpace(string(goroot))
	at := ""
	for _, line := range strings.Split(string(out), "\n") {
		if d, ok := strings.CutPrefix(line, "cd "); ok {
			at = d
			continue
		}
		vet := strings.HasSuffix(line, "vet.cfg") && strings.Contains(line, "/vet ")
		compile := strings.Contains(line, "/compile ") && strings.Contains(line, " -p ")
		if !vet && !compile {
			continue
		}
		switch {
		case strings.HasPrefix(at, root+"/") || strings.Contains(line, " -std "):
			std = append(std, at+": "+line)
		case at == "." || at == cmd.Dir || strings.HasPrefix(at, cmd.Dir+"/"):
			own = append(own, line)
		}
	}
	return std, own
}

func TestAGradingThatRanNoTestSaysSo(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	for _, validated := range []bool{true, false} {
		t.Run("validated="+strconv.FormatBool(validated), func(t *testing.T) {
			t.Parallel()
			w := newWorld(t, tk, withConfig(func(c *Config) {
				if !validated {
					c.Validate = off()
				}
			}))
			row := tk.row("example__calc-1")
			seed := w.seed("s", row)
			w.agentRun(*seed.SandboxHandle, "echo 'func broken( {' >> calc.go")
			res := w.verify("s", row)
			if res.FailureKind != FailureNoTestResults || res.Reward != 0 || res.Resolved || res.EvaluationCompleted || res.MaskSample == validated {
				t.Errorf("a patch that breaks the build:\n%s", describe(res))
			}
		})
	}
}

func TestAnAgentWritingIntoItsCachesCannotChangeAGrading(t *testing.T) {
	t.Parallel()
	gp := newGoProxy(t)
	tk := newDepTask(t, gp)
	// The standard-library layers are a copy of the shared ones, which
	// other tests' environments write meanwhile: this test holds no lock
	// on them while its agent and grading run, and its layer changes only
	// by what this test's sandboxes could do to it.
	std := privateStdLayers(t)
	w := newWorld(t, tk, withConfig(withDepTask(tk, gp)), withConfig(func(c *Config) { c.StdCacheDir = std }))
	if w.prov.Isolation() != local.IsolationContainer {
		t.Skip("SKIP: unisolated, nothing is read-only to an agent (this kernel refuses containers)")
	}
	row := tk.depRow("example__depcalc-1")
	seed := w.seed("s", row)
	sb := *seed.SandboxHandle
	env := envOf(t, w.cfg.TemplateDir, depTaskRepo, tk.base)
	caches := filepath.Join(env.Dir, envCaches)
	before := cachesState(t, caches)
	layer := filepath.Join(w.cfg.StdCacheDir, env.StdLayer)
	if env.StdLayer == "" {
		t.Fatal("the environment was not seeded from a standard-library layer")
	}
	if _, err := os.Stat(layer); err != nil {
		t.Fatalf("the layer the environment was seeded from: %v", err)
	}
	layerBefore := treeState(t, layer)

	// The agent fixes the repository, then breaks the dependency in the
	// module cache (so that a grading reading it would fail PASS_TO_PASS)
	// and poisons every entry of its build cache.
	w.applyAsAgent(sb, tk.patch)
	w.agentRun(sb, "go test -count=1 ./... >/dev/null")
	res := w.agentExec(sb, `f="$GOMODCACHE/`+depModule+"@"+depVersion+`/mathx.go"; chmod u+w "$f"; printf 'package mathx\nfunc Neg(x int) int { return x }\nfunc Add(a, b int) int { return a - b }\n' > "$f"`)
	if res.ExitCode == 0 {
		t.Error("the agent wrote the template's module cache")
	}
	// One shell per batch of files: the cache holds the standard library's
	// thousands of entries, and a shell per file took minutes under load.
	w.agentRun(sb, `find "$GOCACHE" -type f -exec sh -c 'for f; do echo poisoned > "$f"; done' _ {} + && test -n "$(ls "$GOCACHE")"`)
	// It also goes for the layer every template's build cache is seeded
	// from, by its host path: a poisoned entry there would reach the
	// environments of every repository built after. (In a container the
	// host's /tmp is not the sandbox's: the writes land in its own.)
	w.agentExec(sb, "L="+shQuote(layer)+`; find "$L" -type f -exec sh -c 'for f; do echo poisoned > "$f"; done' _ {} + ; mkdir -p "$L/00"; echo poisoned > "$L/00/planted-a"`)
	if diff := treeChanged(before, cachesState(t, caches)); diff != "" {
		t.Fatalf("the agent's writes reached the template's caches (-before +after):\n%s", diff)
	}
	if diff := treeChanged(layerBefore, treeState(t, layer)); diff != "" {
		t.Fatalf("the agent's writes reached the standard-library layer (-before +after):\n%s", diff)
	}
	wantResolved(t, w.verify("s", row))
	// Nor did the grading's own writes (it compiled the patched package).
	if diff := treeChanged(before, cachesState(t, caches)); diff != "" {
		t.Errorf("the grading's writes reached the template's caches (-before +after):\n%s", diff)
	}
	if diff := treeChanged(layerBefore, treeState(t, layer)); diff != "" {
		t.Errorf("the grading's writes reached the standard-library layer (-before +after):\n%s", diff)
	}
}

func TestTheGoldenInstanceOnAFreshMachineResolvesWithOnlyTheRepository(t *testing.T) {
	t.Parallel()
	gp := newGoProxy(t)
	tk := newDepTask(t, gp)
	_, own, srv := newGolden(t, tk, func(c *Config, _ *provider.Provider) {
		withDepTask(tk, gp)(c)
		c.TemplateDir = t.TempDir()
	})
	row := tk.depRow("example__depcalc-1")
	if _, err := srv.SeedSession(context.Background(), own, "g", mustJSON(t, row)); err != nil {
		t.Fatal(err)
	}
	res, err := srv.VerifySession(context.Background(), own, "g", mustJSON(t, row))
	if err != nil {
		t.Fatal(err)
	}
	wantResolved(t, res)
	if gp.zips() != 1 {
		t.Errorf("%d module downloads, want 1 (by the environment step)", gp.zips())
	}
	var out map[string]any
	_ = json.Unmarshal(mustJSON(t, res), &out)
	if _, ok := out["failure_kind"]; ok {
		t.Errorf("a resolved grading has a failure_kind: %v", out["failure_kind"])
	}
}

// privateStdLayers is a copy of the test binary's standard-library layer of
// the host's toolchain (the one the dependency task's templates use) and its
// marks, copied under the layer's shared lock (as a server copies it), for a
// test of its own to digest. The other toolchains' layers are left out:
// copying them cost the test a hundred megabytes and nothing it checks.
func privateStdLayers(t *testing.T) string {
	t.Helper()
	dst := t.TempDir()
	layer := filepath.Join(testStdCacheDir(), stdLayerKey(context.Background(), "local"))
	unlock, err := lockFileShared(layer + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	for _, src := range []string{layer, layer + stdDoneDir} {
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			continue // not made yet: the test's server makes its own
		}
		if out, err := exec.Command("cp", "-a", src, dst+"/").CombinedOutput(); err != nil {
			t.Fatalf("copy the layer %s: %v: %s", src, err, out)
		}
	}
	return dst
}

// Two processes writing one JSON file: each through a temporary file of
// its own, so neither publishes the other's half-written one.
func TestWriteJSONFileLeavesAnotherWritersTemporaryFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "v.json")
	other := path + ".tmp"
	if err := os.WriteFile(other, []byte(`{"half":`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeJSONFile(path, map[string]int{"a": 1}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(other); err != nil || string(b) != `{"half":` {
		t.Errorf("the other writer's temporary file: %q, %v", b, err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "{\n  \"a\": 1\n}" {
		t.Errorf("the file: %q, %v", b, err)
	}
}
