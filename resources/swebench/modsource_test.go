package swebench

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestModuleProxyNames(t *testing.T) {
	if got := EscapeModulePath("github.com/BurntSushi/toml"); got != "github.com/!burnt!sushi/toml" {
		t.Errorf("EscapeModulePath = %q", got)
	}
	list := []string{"v1.9.1", "v1.9.2-0.20231213022851-53fbf4dbfbf4", "v1.12.1-0.20260626164816-34dac209ffb6", "v2.0.0-rc.1-abcdef"}
	for commit, want := range map[string]string{
		"53fbf4dbfbf4": "v1.9.2-0.20231213022851-53fbf4dbfbf4",
		"34DAC209FFB6d1b2c3d4e5f6a7b8c9d0e1f2a3b4": "v1.12.1-0.20260626164816-34dac209ffb6",
		"53fbf4dbfbf":  "", // shorter than a pseudo-version's revision
		"abcdef123456": "",
	} {
		if got := PseudoVersionFor(list, commit); got != want {
			t.Errorf("PseudoVersionFor(%s) = %q, want %q", commit, got, want)
		}
	}
	for list, want := range map[string]string{
		"https://proxy.example/,direct": "https://proxy.example", "off": "", "direct|http://p:1/x": "http://p:1/x", "": "",
	} {
		if got := proxyFirst(list); got != want {
			t.Errorf("proxyFirst(%q) = %q, want %q", list, got, want)
		}
	}
}

func TestRowAtALocalCommit(t *testing.T) {
	base := strings.Repeat("ab", 20)
	local := strings.Repeat("cd", 20)
	r := Row{BaseCommit: base, EvalScript: "git checkout " + base + " -- a_test.go\ngit diff " + base + "\n"}
	got := r.At(local)
	want := Row{BaseCommit: local, EvalScript: "git checkout " + local + " -- a_test.go\ngit diff " + local + "\n"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("At (-want +got):\n%s", d)
	}
	if d := cmp.Diff(r, r.At(base)); d != "" {
		t.Errorf("at its own commit (-want +got):\n%s", d)
	}
	if d := cmp.Diff(r, r.At("")); d != "" {
		t.Errorf("at no commit (-want +got):\n%s", d)
	}
	// An abbreviated base is not replaced inside the script: it may be a
	// prefix of another id there.
	short := Row{BaseCommit: base[:12], EvalScript: "git diff " + base + "\n"}
	if got := short.At(local); got.BaseCommit != local || got.EvalScript != short.EvalScript {
		t.Errorf("abbreviated: %+v", got)
	}
}

func moduleZip(t *testing.T, prefix string, files map[string]string) []byte {
	t.Helper()
	var zb bytes.Buffer
	zw := zip.NewWriter(&zb)
	for name, body := range files {
		f, err := zw.Create(prefix + name)
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
	return zb.Bytes()
}

func TestExtractModuleZipRefusesUnsafePaths(t *testing.T) {
	p := "example.com/m@v1.0.0/"
	for _, bad := range []string{"../x", "a/../../x", ".git/config", "/abs"} {
		if err := extractModuleZip(moduleZip(t, p, map[string]string{bad: "x"}), p, t.TempDir()); err == nil {
			t.Errorf("%q was extracted", bad)
		}
	}
	dir := t.TempDir()
	if err := extractModuleZip(moduleZip(t, p, map[string]string{"go.mod": "module m\n", "a/b.go": "package a\n"}), p, dir); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "a", "b.go")); err != nil || string(b) != "package a\n" {
		t.Errorf("a/b.go: %q %v", b, err)
	}
}

// moduleProxyOf serves the task repository at its base commit as module
// example.com/calc at a pseudo-version of that commit (its list, .mod
// and .zip; no commit queries, as the proxy reachable here answers none).
func moduleProxyOf(t *testing.T, tk task) (url, version string, asked func() []string) {
	t.Helper()
	version = "v0.0.0-20260101000000-" + tk.base[:12]
	files := map[string]string{}
	for _, name := range strings.Fields(git(t, tk.dir, "ls-tree", "-r", "--name-only", tk.base)) {
		files[name] = git(t, tk.dir, "show", tk.base+":"+name) + "\n"
	}
	const module = "example.com/calc"
	zb := moduleZip(t, module+"@"+version+"/", files)
	info, _ := json.Marshal(map[string]string{"Version": version, "Time": "2026-01-01T00:00:00Z"})
	routes := map[string][]byte{
		"/" + module + "/@v/list":                 []byte("v0.0.1\n" + version + "\n"),
		"/" + module + "/@v/" + version + ".info": info,
		"/" + module + "/@v/" + version + ".mod":  []byte(files["go.mod"]),
		"/" + module + "/@v/" + version + ".zip":  zb,
	}
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
		b, ok := routes[r.URL.Path]
		if !ok {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write(b)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, version, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), paths...)
	}
}

// TestARepositoryNobodyClonedComesFromTheModuleProxy: with no clone of the
// task repository, its template is the module proxy's zip at the base
// commit; the agent's fix resolves, and a second template of the same
// commit downloads nothing.
func TestARepositoryNobodyClonedComesFromTheModuleProxy(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	url, version, asked := moduleProxyOf(t, tk)
	w := newWorld(t, tk, freshTemplates(), withConfig(func(c *Config) {
		c.Repos = nil
		c.Modules = map[string]string{taskRepo: "example.com/calc"}
		c.ModuleProxy = url
	}))
	for _, format := range []string{"original", "multilingual"} {
		row := tk.row("example__calc-1")
		if format == "multilingual" {
			row = tk.multilingualRow("example__calc-1")
		}
		sid := "s-module-" + format
		seed := w.seed(sid, row)
		sb := *seed.SandboxHandle
		if log := w.agentRun(sb, "git log --format=%s"); !strings.Contains(log, "example.com/calc@"+version) {
			t.Errorf("the sandbox's history: %q", log)
		}
		w.applyAsAgent(sb, tk.patch)
		wantResolved(t, w.verify(sid, row))
	}
	if d := cmp.Diff([]string{"/example.com/calc/@v/list", "/example.com/calc/@v/" + version + ".zip"}, asked()); d != "" {
		t.Errorf("asked of the proxy (-want +got):\n%s", d)
	}
	// A row whose commit the proxy does not know is refused at its seed.
	row := tk.row("example__calc-9")
	row["base_commit"] = strings.Repeat("0", 40)
	if _, err := w.srv.SeedSession(context.Background(), w.own, "s-unknown", mustJSON(t, row)); err == nil || !strings.Contains(err.Error(), "resolve example.com/calc") {
		t.Errorf("seed of an unknown commit: %v", err)
	}
}

func TestGoToolchainsConfig(t *testing.T) {
	c, err := Config{GoToolchains: map[string]string{"o/r": "go1.21.13", "o__r-1": "local", "o/s": "go1.22rc1"}}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		row  Row
		want string
	}{
		{Row{Repo: "o/r", InstanceID: "o__r-2"}, "go1.21.13"},
		{Row{Repo: "o/r", InstanceID: "o__r-1"}, "local"},
		{Row{Repo: "o/s"}, "go1.22rc1"},
		{Row{Repo: "o/t"}, "local"},
	} {
		if got := c.goToolchain(tc.row); got != tc.want {
			t.Errorf("goToolchain(%+v) = %q, want %q", tc.row, got, tc.want)
		}
	}
	for _, bad := range []string{"1.21", "go1.21.13; rm -rf /", "auto", "go1.21.13+auto", ""} {
		if _, err := (Config{GoToolchains: map[string]string{"o/r": bad}}).withDefaults(); err == nil {
			t.Errorf("go_toolchains %q accepted", bad)
		}
	}
	s := &Server{cfg: c}
	if s.envKey([]string{"go mod download"}, "local") == s.envKey([]string{"go mod download"}, "go1.21.13") {
		t.Error("a pinned toolchain does not change the environment's key")
	}
	if d, err := (Config{}).withDefaults(); err != nil || d.ModuleProxy == "" || d.Modules["gin-gonic/gin"] != "github.com/gin-gonic/gin" {
		t.Errorf("defaults: %v %q %v", err, d.ModuleProxy, d.Modules)
	}
}

// TestConfiguredModuleVersions: a proxy that resolves no commit (a mirror)
// is asked for the version module_versions names, which must be the
// commit's when the proxy reports its origin.
func TestConfiguredModuleVersions(t *testing.T) {
	const good, other = "6d9a83376b5e19b3c0368541ee46044ab284038b", "1111111111111111111111111111111111111111"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/example.com/m/@v/v1.2.3.info":
			fmt.Fprintf(w, `{"Version":"v1.2.3","Origin":{"VCS":"git","Hash":%q}}`, good)
		case "/example.com/m/@v/v1.0.0.info":
			fmt.Fprint(w, `{"Version":"v1.0.0"}`)
		default:
			http.Error(w, "This module version is not available.", http.StatusForbidden)
		}
	}))
	defer srv.Close()
	cases := []struct {
		commit   string
		versions map[string]string
		want     string
		err      string
	}{
		{good[:12], map[string]string{good: "v1.2.3"}, "v1.2.3", ""},
		{good, map[string]string{good[:12]: "v1.2.3"}, "v1.2.3", ""},
		{other, map[string]string{other: "v1.2.3"}, "", "module_versions says example.com/m@v1.2.3 is commit " + other},
		{other, map[string]string{other: "v1.0.0"}, "v1.0.0", ""}, // no origin to check
		{other, map[string]string{good: "v1.2.3"}, "", "403"},
		{other, map[string]string{other: "v9.9.9"}, "", "403"},
	}
	for _, c := range cases {
		got, err := newModuleProxy(srv.URL, c.versions).version(context.Background(), "example.com/m", c.commit)
		if got != c.want || (c.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("version(%s) with %v = %q, %v; want %q, %q", c.commit, c.versions, got, err, c.want, c.err)
		}
	}
}

// Two servers sharing template_dir (two Templates: each has its own
// in-process locks) making the same template from the module proxy: while
// one holds the template's lock file, the other waits for it instead of
// fetching the module and replacing a directory the first's sandboxes may
// stand on.
func TestAModuleTemplateWaitsForAnotherServersLock(t *testing.T) {
	needTools(t, "git")
	tk := newTask(t)
	url, _, asked := moduleProxyOf(t, tk)
	root := t.TempDir()
	tp, err := NewTemplates(root, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp.WithModules(map[string]string{taskRepo: "example.com/calc"}, url, nil)
	dir := tp.dir(taskRepo, tk.base)
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	unlock, err := lockFile(dir + ".lock") // the other server's
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, _, err := tp.Ensure(context.Background(), taskRepo, tk.base, testLogger(t))
		done <- err
	}()
	// Either it fetches (the bug) or it waits on the lock: /proc/locks
	// lists a waiter with "->".
	var fi os.FileInfo
	if fi, err = os.Stat(dir + ".lock"); err != nil {
		t.Fatal(err)
	}
	ino := fmt.Sprintf(":%d ", fi.Sys().(*syscall.Stat_t).Ino)
	waiting := func() bool {
		b, _ := os.ReadFile("/proc/locks")
		for _, l := range strings.Split(string(b), "\n") {
			if strings.Contains(l, "->") && strings.Contains(l, "FLOCK") && strings.Contains(l, ino) {
				return true
			}
		}
		return false
	}
	for deadline := time.Now().Add(2 * time.Minute); len(asked()) == 0 && !waiting(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("neither a fetch nor a wait on the lock")
		}
	}
	if got := asked(); len(got) > 0 {
		t.Fatalf("the module was fetched while another server held the template's lock: %v", got)
	}
	unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
