package swebench

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// goProxy is a Go module proxy on loopback serving one module version, and
// what it was asked.
type goProxy struct {
	URL string

	mu       sync.Mutex
	requests []string
}

// The dependency the task repository needs: a module only the proxy has.
const (
	depModule  = "example.com/mathx"
	depVersion = "v1.0.0"
	depGoMod   = "module example.com/mathx\n\ngo 1.22\n"
	depSource  = "package mathx\n\n// Neg returns -x.\nfunc Neg(x int) int { return -x }\n\n// Add returns a+b.\nfunc Add(a, b int) int { return a + b }\n"
)

// newGoProxy serves depModule@depVersion over the GOPROXY protocol
// (list, .info, .mod, .zip) on 127.0.0.1.
func newGoProxy(t *testing.T) *goProxy {
	t.Helper()
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for name, body := range map[string]string{"go.mod": depGoMod, "mathx.go": depSource} {
		f, err := zw.Create(depModule + "@" + depVersion + "/" + name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	info, _ := json.Marshal(map[string]string{"Version": depVersion, "Time": "2026-01-01T00:00:00Z"})
	files := map[string][]byte{
		"/" + depModule + "/@v/list":                    []byte(depVersion + "\n"),
		"/" + depModule + "/@v/" + depVersion + ".info": info,
		"/" + depModule + "/@v/" + depVersion + ".mod":  []byte(depGoMod),
		"/" + depModule + "/@v/" + depVersion + ".zip":  zb.Bytes(),
	}
	gp := &goProxy{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gp.mu.Lock()
		gp.requests = append(gp.requests, r.URL.Path)
		gp.mu.Unlock()
		b, ok := files[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	gp.URL = srv.URL
	return gp
}

// zips counts the module downloads the proxy served.
func (gp *goProxy) zips() int {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	n := 0
	for _, r := range gp.requests {
		if strings.HasSuffix(r, ".zip") {
			n++
		}
	}
	return n
}

// asked returns the paths asked so far.
func (gp *goProxy) asked() []string {
	gp.mu.Lock()
	defer gp.mu.Unlock()
	return append([]string(nil), gp.requests...)
}

// env is the environment step's extra environment for this proxy.
func (gp *goProxy) env() map[string]string {
	return map[string]string{"GOPROXY": gp.URL, "GOSUMDB": "off"}
}

// The task repository with a dependency: example.com/calc, whose Add uses
// mathx and whose Abs is wrong for negative numbers.
const (
	depTaskRepo  = "example/depcalc"
	depTaskGoMod = "module example.com/calc\n\ngo 1.22\n\nrequire " + depModule + " " + depVersion + "\n"
	depBuggyCalc = "package calc\n\nimport \"example.com/mathx\"\n\n// Abs returns the absolute value of x.\nfunc Abs(x int) int {\n\tif x < 0 {\n\t\treturn x\n\t}\n\treturn x\n}\n\n// Add returns a+b.\nfunc Add(a, b int) int { return mathx.Add(a, b) }\n"
	depFixedCalc = "package calc\n\nimport \"example.com/mathx\"\n\n// Abs returns the absolute value of x.\nfunc Abs(x int) int {\n\tif x < 0 {\n\t\treturn mathx.Neg(x)\n\t}\n\treturn x\n}\n\n// Add returns a+b.\nfunc Add(a, b int) int { return mathx.Add(a, b) }\n"
)

// newDepTask makes the repository with a dependency, its go.sum written by
// the host's go against the proxy (into a module cache of the test's own,
// which the server never sees).
func newDepTask(t *testing.T, gp *goProxy) task {
	t.Helper()
	needTools(t, "git", "go")
	dir := filepath.Join(t.TempDir(), "depcalc")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	git(t, dir, "init", "-q", "-b", "main")
	writeFiles(t, dir, map[string]string{"go.mod": depTaskGoMod, "calc.go": depBuggyCalc, "calc_test.go": baseTests})
	cmd := exec.Command("go", "mod", "tidy")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOPROXY="+gp.URL, "GOSUMDB=off", "GOFLAGS=-mod=mod -modcacherw",
		"GOMODCACHE="+t.TempDir(), "GOTOOLCHAIN=local", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go mod tidy: %v\n%s", err, out)
	}
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", "Add calc")
	base := git(t, dir, "rev-parse", "HEAD")
	writeFiles(t, dir, map[string]string{"calc.go": depFixedCalc, "calc_test.go": fixTests, "abs_test.go": absTests})
	git(t, dir, "add", "-A")
	git(t, dir, "commit", "-q", "-m", fixMessage)
	fix := git(t, dir, "rev-parse", "HEAD")
	tk := task{dir: dir, base: base, fix: fix}
	tk.patch = git(t, dir, "diff", base, fix, "--", "calc.go") + "\n"
	tk.testPatch = git(t, dir, "diff", base, fix, "--", "abs_test.go", "calc_test.go") + "\n"
	gp.mu.Lock()
	gp.requests = nil // the server's requests are counted from here
	gp.mu.Unlock()
	return tk
}

// depRow is the dependency task's row.
func (tk task) depRow(id string) map[string]any {
	r := tk.row(id)
	r["repo"] = depTaskRepo
	return r
}

// withDepTask configures the world (or golden instance) for the dependency
// task: its repository, test command and proxy.
func withDepTask(tk task, gp *goProxy) func(*Config) {
	return func(c *Config) {
		c.Repos = map[string]string{depTaskRepo: tk.dir}
		c.TestCommands = map[string]string{depTaskRepo: goTestCmd}
		c.EnvSetupEnv = gp.env()
	}
}
