package swebench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

// needTools skips the test, saying why, unless every tool is on the PATH.
func needTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: %s is not on the PATH (CI installs git and patch; Go is the toolchain)", tool)
		}
	}
}

func testLogger(t testing.TB) *logrus.Logger {
	l := logrus.New()
	l.SetLevel(logrus.InfoLevel)
	if os.Getenv("SWEBENCH_TEST_LOG") == "" {
		l.SetOutput(discard{})
	} else {
		l.SetOutput(testWriter{t})
	}
	return l
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	// Fixed identities and dates: the same content makes the same commits
	// in every test, so that tests share templates (TemplatesEnv).
	cmd.Env = append(os.Environ(), "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
		"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_CONFIG_SYSTEM=/dev/null",
		"GIT_AUTHOR_DATE=2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2026-01-01T00:00:00Z")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func writeFiles(t testing.TB, dir string, files map[string]string) {
	t.Helper()
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// The task repository: a Go module whose Abs is wrong for negative numbers.
const (
	taskRepo   = "example/calc"
	taskGoMod  = "module example.com/calc\n\ngo 1.22\n"
	buggyCalc  = "package calc\n\n// Abs returns the absolute value of x.\nfunc Abs(x int) int {\n\tif x < 0 {\n\t\treturn x\n\t}\n\treturn x\n}\n\n// Add returns a+b.\nfunc Add(a, b int) int { return a + b }\n"
	fixedCalc  = "package calc\n\n// Abs returns the absolute value of x.\nfunc Abs(x int) int {\n\tif x < 0 {\n\t\treturn -x\n\t}\n\treturn x\n}\n\n// Add returns a+b.\nfunc Add(a, b int) int { return a + b }\n"
	baseTests  = "package calc\n\nimport \"testing\"\n\nfunc TestAdd(t *testing.T) {\n\tif Add(2, 3) != 5 {\n\t\tt.Fatal(\"Add(2, 3)\")\n\t}\n}\n"
	fixTests   = baseTests + "\nfunc TestAddZero(t *testing.T) {\n\tif Add(0, 0) != 0 {\n\t\tt.Fatal(\"Add(0, 0)\")\n\t}\n}\n"
	absTests   = "package calc\n\nimport \"testing\"\n\nfunc TestAbs(t *testing.T) {\n\tt.Run(\"positive\", func(t *testing.T) {\n\t\tif Abs(3) != 3 {\n\t\t\tt.Fatal(\"Abs(3)\")\n\t\t}\n\t})\n\tt.Run(\"negative\", func(t *testing.T) {\n\t\tif got := Abs(-3); got != 3 {\n\t\t\tt.Fatalf(\"Abs(-3) = %d\", got)\n\t\t}\n\t})\n}\n"
	goTestCmd  = "go test -v -count=1 ./..."
	fixMessage = "Fix Abs for negative numbers"
)

var (
	failToPass = []string{"TestAbs", "TestAbs/negative"}
	passToPass = []string{"TestAbs/positive", "TestAdd", "TestAddZero"}
)

// task is a task repository on the host and its rows.
type task struct {
	dir       string
	base, fix string
	patch     string // the fix, as the row's patch
	testPatch string
}

// newTask makes the repository: the base commit, then the fix commit (tagged,
// on main, and on a remote-tracking-like branch), which the agent must never
// see.
func newTask(t *testing.T) task {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "calc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main")
	writeFiles(t, dir, map[string]string{"go.mod": taskGoMod, "calc.go": buggyCalc, "calc_test.go": baseTests, "README.md": "calc\n"})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "Add calc")
	base := git(t, dir, "rev-parse", "HEAD")
	git(t, dir, "tag", "v1.0")
	writeFiles(t, dir, map[string]string{"calc.go": fixedCalc, "calc_test.go": fixTests, "abs_test.go": absTests})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", fixMessage)
	fix := git(t, dir, "rev-parse", "HEAD")
	git(t, dir, "tag", "-a", "v1.1", "-m", "release with the fix")
	git(t, dir, "branch", "release", fix)
	git(t, dir, "notes", "add", "-m", "a note on the fix", fix)
	tk := task{dir: dir, base: base, fix: fix}
	tk.patch = git(t, dir, "diff", base, fix, "--", "calc.go") + "\n"
	tk.testPatch = git(t, dir, "diff", base, fix, "--", "abs_test.go", "calc_test.go") + "\n"
	return tk
}

// row is the task as an original-format SWE-bench row (test lists as JSON
// strings, no eval_script: the script is built from test_patch and the
// configured test command).
func (tk task) row(id string) map[string]any {
	f2p, _ := json.Marshal(failToPass)
	p2p, _ := json.Marshal(passToPass)
	return map[string]any{
		"repo": taskRepo, "instance_id": id, "base_commit": tk.base, "patch": tk.patch, "test_patch": tk.testPatch,
		"problem_statement": "Abs(-3) returns -3", "hints_text": "", "created_at": "2026-01-01T00:00:00Z", "version": "1.0",
		"FAIL_TO_PASS": string(f2p), "PASS_TO_PASS": string(p2p), "environment_setup_commit": tk.base,
		"responses_create_params": map[string]any{"input": []any{}},
	}
}

// multilingualRow is the task in SWE-bench Multilingual's format: lists as
// JSON lists, its own eval_script (whose markers are `: '…'` lines that only
// the shell's -x trace on stderr prints), a log parser.
func (tk task) multilingualRow(id string) map[string]any {
	r := tk.row(id)
	r["FAIL_TO_PASS"], r["PASS_TO_PASS"] = failToPass, passToPass
	r["log_parser"] = "parse_log_gotest"
	r["eval_script"] = "#!/bin/bash\nset -uxo pipefail\ncd /testbed\ngit status\n" +
		"git checkout " + tk.base + " -- calc_test.go\nrm -f abs_test.go\n" +
		"git apply --verbose --reject - <<'EOF_114329324912'\n" + tk.testPatch + "EOF_114329324912\n" +
		": '>>>>> Start Test Output'\n" + goTestCmd + "\n: '>>>>> End Test Output'\n" +
		"git checkout " + tk.base + " -- calc_test.go\n"
	return r
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// world is a swebench server on a real local provider with checkpointing,
// and the agent-facing sandbox API.
type world struct {
	t      testing.TB
	tk     task
	root   string // the provider's root
	state  string // the owner's state_dir
	cfg    Config
	log    *logrus.Logger
	prov   *local.Provider
	own    *owner.Owner
	srv    *Server
	tokens *sandboxapi.Tokens
	api    *sandboxapi.Handler
	// caches places the local provider's named caches.
	caches map[string]string
	// isolation is the local provider's (auto by default).
	isolation string
}

type worldOpt func(*world)

func withConfig(f func(*Config)) worldOpt { return func(w *world) { f(&w.cfg) } }

// unisolated runs the world's commands unisolated (isolation none).
func unisolated() worldOpt { return func(w *world) { w.isolation = local.IsolationNone } }

// imageRows configures no repositories: rows name their image (a directory
// the test made), which has no environment, so the world's sandboxes share a
// build cache through the local provider's named caches (as a user's
// sandbox_config could) and validation is off.
func imageRows() worldOpt {
	return func(w *world) {
		w.cfg.Repos, w.cfg.TemplateDir, w.cfg.Validate = nil, "", off()
		w.cfg.SandboxConfig.Env = map[string]string{"GOCACHE": "/caches/gobuild"}
		w.cfg.SandboxConfig.ProviderOptions = map[string]any{local.CachesOption: map[string]any{"gobuild": "/caches/gobuild"}}
		w.caches = map[string]string{"gobuild": imageRowsCache()}
	}
}

// imageRowsCache is the build cache the worlds of imageRows share. It lies
// beside the standard-library layers, so that kept ones serve every source
// tree (a build cache is addressed by what each entry was built from, so
// what another tree left is never wrong) and a new tree's first imageRows
// test does not compile the standard library inside its sandbox; it is
// marked used now, as they are.
func imageRowsCache() string {
	dir := filepath.Join(filepath.Dir(testStdCacheDir()), ".image-rows-gobuild")
	now := time.Now()
	_ = os.Chtimes(dir, now, now)
	return dir
}

// off is a false *bool (swebench.validate: false).
func off() *bool { f := false; return &f }

// freshTemplates gives the world a template_dir of its own (the templates,
// their environments and validations are made anew).
func freshTemplates() worldOpt { return func(w *world) { w.cfg.TemplateDir = w.t.TempDir() } }

func newWorld(t testing.TB, tk task, opts ...worldOpt) *world {
	t.Helper()
	needTools(t, "git", "go", "patch")
	w := &world{t: t, tk: tk, root: t.TempDir(), state: t.TempDir(), log: testLogger(t)}
	w.cfg = Config{
		Repos:         map[string]string{taskRepo: tk.dir},
		TemplateDir:   testTemplatesDir(),
		StdCacheDir:   testStdCacheDir(),
		TestCommands:  map[string]string{taskRepo: goTestCmd},
		SandboxConfig: SandboxConfig{TTLSeconds: 3600},
		// EvaluationTimeout stays the default (1800 s): on a fresh
		// template_dir the first validation compiles Go's standard library
		// inside a sandbox, which took over 300 s at load average 50 on 2
		// cores, and a validation that times out is kept as unavailable
		// for every test sharing the template.
	}
	for _, o := range opts {
		o(w)
	}
	w.open()
	return w
}

// open starts the provider, the owner and the server on the world's dirs.
func (w *world) open() {
	t := w.t
	t.Helper()
	p, err := local.New(local.Options{Root: w.root, Logger: w.log, Caches: w.caches, Isolation: w.isolation, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	// Closed after the owner (cleanups run last first), so that the
	// sandbox directories it made ahead, their disks mounted, go before
	// the temporary root. A crash leaves the provider open, as a killed
	// process's would be until this test ends.
	t.Cleanup(func() { _ = p.Close() })
	w.prov = p
	w.serve(p, "swebench")
}

// serve starts an owner named name on p with checkpoints in the world's
// state_dir, the server and the sandbox API.
func (w *world) serve(p provider.Provider, name string) {
	t := w.t
	t.Helper()
	o, err := owner.New(context.Background(), owner.Config{
		Name: name, Provider: p, Logger: w.log,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: w.state},
	})
	if err != nil {
		t.Fatal(err)
	}
	own := o
	t.Cleanup(func() { _ = own.Close() })
	srv, err := New(w.cfg, Deps{Name: "swebench", Logger: w.log})
	if err != nil {
		t.Fatal(err)
	}
	tokens, err := sandboxapi.NewTokens([]byte("test-secret"), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	w.own, w.srv, w.tokens = o, srv, tokens
	w.api = &sandboxapi.Handler{Provider: p, Tokens: tokens, Logger: w.log, Resolve: resolver(own)}
}

// resolver tells the sandbox API what the owner knows of a sandbox.
func resolver(own *owner.Owner) sandboxapi.Resolver {
	return func(id string) (provider.Handle, sandbox.Fate) {
		_, h, fate := own.SandboxFate(id)
		switch fate {
		case sandbox.FateLive:
			return h, sandbox.FateLive
		case sandbox.FateSuperseded:
			return h, sandbox.FateSuperseded
		case sandbox.FateEnded:
			return h, sandbox.FateEnded
		}
		return h, sandbox.FateUnknown
	}
}

// crash drops the owner as a SIGKILL would (nothing stopped, nothing told),
// then opens a fresh provider, owner and server on the same directories.
func (w *world) crash() {
	if err := w.own.Abandon(); err != nil {
		w.t.Fatal(err)
	}
	w.open()
}

// runSuffix makes instance ids of the test's own: validations are kept
// with the test binary's shared templates (whose template and environment
// of the task other tests share), so an id with it is validated anew on
// every run (-count=2 too).
func runSuffix(t *testing.T) string {
	sum := sha256.Sum256([]byte(t.TempDir()))
	return hex.EncodeToString(sum[:4])
}

// in is the world as seen from t, a subtest of its test: its helpers fail
// t, not the parent test, so that subtests can run in parallel on it.
func (w *world) in(t testing.TB) *world {
	c := *w
	c.t = t
	return &c
}

func (w *world) seed(sid string, row map[string]any) SeedResult {
	w.t.Helper()
	res, err := w.srv.SeedSession(context.Background(), w.own, sid, mustJSON(w.t, row))
	if err != nil {
		w.t.Fatalf("seed %s: %v", sid, err)
	}
	return res
}

func (w *world) verify(sid string, row map[string]any) VerifyResult {
	w.t.Helper()
	res, err := w.srv.VerifySession(context.Background(), w.own, sid, mustJSON(w.t, row))
	if err != nil {
		w.t.Fatalf("verify %s: %v", sid, err)
	}
	return res
}

// agentExec runs a command in a sandbox the way an agent does: through the
// sandbox exec API with a token for that sandbox.
func (w *world) agentExec(sandboxID, command string) provider.ExecResult {
	w.t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI(sandboxapi.Prefix + sandboxID + "/exec")
	ctx.Request.Header.Set("Authorization", "Bearer "+w.tokens.Mint(sandboxID, time.Now().Add(time.Hour)))
	ctx.Request.SetBody(mustJSON(w.t, map[string]any{"command": command, "timeout_ms": agentTimeout.Milliseconds()}))
	w.api.Serve(&ctx)
	if ctx.Response.StatusCode() != 200 {
		w.t.Fatalf("agent exec %q: %d %s", command, ctx.Response.StatusCode(), ctx.Response.Body())
	}
	var res provider.ExecResult
	if err := json.Unmarshal(ctx.Response.Body(), &res); err != nil {
		w.t.Fatal(err)
	}
	return res
}

// agentTimeout bounds an agent's command in these tests. A command such as
// `go test ./...` in a sandbox took over two minutes on a saturated
// machine (load 55-85) and was killed, failing a test that proves nothing
// about time: the bound is only there so that a hung command ends.
const agentTimeout = 20 * time.Minute

// agentRun is agentExec that must succeed.
func (w *world) agentRun(sandboxID, command string) string {
	w.t.Helper()
	res := w.agentExec(sandboxID, command)
	if res.ExitCode != 0 {
		w.t.Fatalf("agent command %q exited %d:\n%s%s", command, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// applyAsAgent applies a patch in the sandbox through the exec API.
func (w *world) applyAsAgent(sandboxID, patch string) {
	w.t.Helper()
	w.agentRun(sandboxID, "git apply --verbose - <<'AGENT_EOF'\n"+patch+"AGENT_EOF\n")
}

// extract runs ExtractPatch in session sid's sandbox against the task's
// base commit (nothing untracked at seed), as verify would.
func (w *world) extract(sid string, unscrubbed bool) Extraction {
	w.t.Helper()
	var ex Extraction
	err := w.own.Do(context.Background(), sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		var err error
		from := ""
		if unscrubbed {
			from = w.tk.base
		}
		ex, err = ExtractPatch(ctx, p, sb.Handle, w.tk.base, nil, from, time.Minute)
		return err
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return ex
}

func (w *world) liveSandboxes() []string {
	w.t.Helper()
	infos, err := w.prov.ListSandboxes(context.Background())
	if err != nil {
		w.t.Fatal(err)
	}
	var ids []string
	for _, i := range infos {
		ids = append(ids, i.Handle.SandboxID)
	}
	return ids
}

// TemplatesEnv names the template_dir every world of the test binary shares
// (so that a template's environment is built, and its build cache warmed,
// once); TestMain (main_test.go) makes it.
const TemplatesEnv = "SWEBENCH_TEST_TEMPLATES"

// testTemplatesDir is that directory.
func testTemplatesDir() string { return os.Getenv(TemplatesEnv) }

// StdCacheEnv names the std_cache_dir every server of the test binary
// shares, worlds with templates of their own too: the standard library is
// compiled once per toolchain, not once per test (nor, kept, once per run);
// TestMain makes it.
const StdCacheEnv = "SWEBENCH_TEST_STD_CACHE"

// testStdCacheDir is that directory.
func testStdCacheDir() string { return os.Getenv(StdCacheEnv) }

func describe(res VerifyResult) string {
	b, _ := json.MarshalIndent(res, "", "  ")
	return string(b)
}
