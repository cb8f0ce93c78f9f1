package swebench

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A real instance of a real repository, from the module proxy: gin at a
// pseudo-version of commit 53fbf4dbfbf4, whose Context.Copy did not copy
// the route's full path; v1.10.0 fixed it (cp.fullPath = c.fullPath) and
// extended TestContextCopy to check it.
const (
	ginRepo    = "gin-gonic/gin"
	ginModule  = "github.com/gin-gonic/gin"
	ginBase    = "53fbf4dbfbf4"
	ginVersion = "v1.9.2-0.20231213022851-53fbf4dbfbf4"
	// ginToolchain is the toolchain the instance pins (its go.mod says go
	// 1.20), fetched by the environment step.
	ginToolchain = "go1.21.13"
	ginTestCmd   = "go test -v -count=1 -run '^(TestContextCopy|TestContextReset|TestContextHandlers|TestContextSetGet)$' ."
)

// ginRow makes the instance's row from the proxy's source: the fix and the
// test, as diffs against the base.
func ginRow(t *testing.T, proxy string) map[string]any {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "gin")
	local, version, err := newModuleProxy(proxy).fetchModuleRepo(context.Background(), ginModule, ginBase, dir)
	if err != nil {
		t.Fatal(err)
	}
	if version != ginVersion {
		t.Fatalf("the proxy resolved %s to %s, want %s", ginBase, version, ginVersion)
	}
	edit := func(file, old, new string) {
		p := filepath.Join(dir, file)
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), old) {
			t.Fatalf("%s: %v, or no %q in it", file, err, old)
		}
		if err := os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	edit("context.go", "\tcp.handlers = nil\n", "\tcp.handlers = nil\n\tcp.fullPath = c.fullPath\n")
	patch := git(t, dir, "diff", local, "--", "context.go") + "\n"
	edit("context_test.go", "\tc.Set(\"foo\", \"bar\")\n\n\tcp := c.Copy()\n", "\tc.Set(\"foo\", \"bar\")\n\tc.fullPath = \"/hola\"\n\n\tcp := c.Copy()\n")
	edit("context_test.go", "\tassert.Equal(t, cp.Params, c.Params)\n", "\tassert.Equal(t, cp.Params, c.Params)\n\tassert.Equal(t, cp.fullPath, c.fullPath)\n")
	testPatch := git(t, dir, "diff", local, "--", "context_test.go") + "\n"
	return map[string]any{
		"repo": ginRepo, "instance_id": "gin-gonic__gin-copy-fullpath", "base_commit": ginBase,
		"patch": patch, "test_patch": testPatch, "problem_statement": "Context.Copy loses FullPath()",
		"FAIL_TO_PASS": []string{"TestContextCopy"},
		"PASS_TO_PASS": []string{"TestContextReset", "TestContextHandlers", "TestContextSetGet"},
	}
}

// realProxy is the module proxy the real-repository tests use, or a skip.
func realProxy(t *testing.T) string {
	t.Helper()
	proxy := proxyFirst(os.Getenv("GOPROXY"))
	if proxy == "" {
		proxy = DefaultModuleProxy
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, proxy+"/"+ginModule+"/@v/"+ginVersion+".info", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Skipf("SKIP: the module proxy %s does not answer for gin (%v): the real-repository tests need it (CI reaches it)", proxy, err)
	}
	resp.Body.Close()
	return proxy
}

// TestARealGinInstanceFromTheModuleProxy: gin, never cloned here, comes
// from the module proxy with the toolchain the instance pins; its gold
// patch resolves, doing nothing does not, and an init that claims every
// test grades 0.
func TestARealGinInstanceFromTheModuleProxy(t *testing.T) {
	t.Parallel()
	proxy := realProxy(t)
	row := ginRow(t, proxy)
	w := newWorld(t, task{}, freshTemplates(), withConfig(func(c *Config) {
		c.Repos = nil
		c.Modules = map[string]string{ginRepo: ginModule}
		c.ModuleProxy = proxy
		c.TestCommands = map[string]string{ginRepo: ginTestCmd}
		c.GoToolchains = map[string]string{ginRepo: ginToolchain}
		c.EnvSetupTimeout, c.EvaluationTimeout = 1800, 1800 // a cold compile of gin's tests on a loaded machine
	}))
	cases := []struct {
		name  string
		agent string
		want  float64
	}{
		{"gold", "git apply - <<'EOF'\n" + row["patch"].(string) + "EOF\n", 1},
		{"nothing", "true", 0},
		{"an init that claims every test", "cat > zz_claims.go <<'EOF'\npackage gin\n\nimport (\n\t\"fmt\"\n\t\"os\"\n)\n\nfunc init() {\n\tfor _, n := range []string{\"TestContextCopy\", \"TestContextReset\", \"TestContextHandlers\", \"TestContextSetGet\"} {\n\t\tfmt.Printf(\"=== RUN   %s\\n--- PASS: %s (0.00s)\\n\", n, n)\n\t}\n\tos.Exit(0)\n}\nEOF\n", 0},
	}
	for _, c := range cases {
		began := time.Now()
		sid := "s-gin-" + strings.ReplaceAll(c.name, " ", "-")
		seed := w.seed(sid, row)
		seeded := time.Since(began)
		sb := *seed.SandboxHandle
		if v := w.agentRun(sb, "go env GOVERSION"); strings.TrimSpace(v) != ginToolchain {
			t.Errorf("the agent's go is %q, want the pinned %s", v, ginToolchain)
		}
		w.agentRun(sb, c.agent)
		res := w.verify(sid, row)
		t.Logf("%s: reward %v, seed %.1f s, grading %.1f s (eval %.1f s), framing %s, failure %q", c.name, res.Reward, seeded.Seconds(),
			res.PatchVerificationTimeTaken, res.EvalTimeTaken, res.TestFraming, res.FailureKind)
		if res.Reward != c.want || res.MaskSample || res.TestFraming != FramingMarked {
			t.Errorf("%s: want reward %v, got:\n%s", c.name, c.want, describe(res))
		}
	}
}
