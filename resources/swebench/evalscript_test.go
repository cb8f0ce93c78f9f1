package swebench

import (
	"errors"
	"os"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

// sampleTestPatch is a test patch touching four files: changed, new, with
// C-quoted paths, deleted.
func sampleTestPatch(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("grading/testdata/sample.patch")
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestBuildEvalScriptFromTestPatch(t *testing.T) {
	r := Row{InstanceID: "o__r-1", Repo: "o/r", BaseCommit: "abcdef0", TestPatch: sampleTestPatch(t)}
	got, err := BuildEvalScript(r, "go test -v ./...", "/testbed")
	if err != nil {
		t.Fatal(err)
	}
	want := "#!/bin/bash\nset -uxo pipefail\ncd '/testbed'\n" +
		"git -c core.fileMode=false diff abcdef0\n" +
		"git checkout abcdef0 -- 'calc_test.go' 'dir with space/é_test.go' 'old_test.go'\n" +
		"rm -rf -- 'new_test.go'\n" +
		"git apply --verbose - <<'EOF_114329324912'\n" + sampleTestPatch(t) + "EOF_114329324912\n" +
		"echo '>>>>> Start Test Output'\ngo test -v ./...\necho '>>>>> End Test Output'\n" +
		"git checkout abcdef0 -- 'calc_test.go' 'dir with space/é_test.go' 'old_test.go'\n"
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("script (-want +got):\n%s", d)
	}
}

func TestBuildEvalScriptKeepsTheRowsScript(t *testing.T) {
	r := Row{InstanceID: "x", EvalScript: "#!/bin/bash\nmake test\n"}
	got, err := BuildEvalScript(r, "", "/testbed")
	if err != nil || got != r.EvalScript {
		t.Errorf("script = %q, %v", got, err)
	}
}

func TestBuildEvalScriptNeedsATestCommand(t *testing.T) {
	r := Row{InstanceID: "x", Repo: "o/r", BaseCommit: "abcdef0", TestPatch: sampleTestPatch(t)}
	if _, err := BuildEvalScript(r, " ", "/testbed"); !errors.Is(err, ErrNoTestCommand) {
		t.Errorf("err = %v, want ErrNoTestCommand", err)
	}
}

func TestHeredocDelimiterAvoidsThePatch(t *testing.T) {
	d := heredocDelimiter("a\nEOF_114329324912\nb\n")
	if d == "EOF_114329324912" || strings.Contains("a\nEOF_114329324912\nb\n", d+"\n") {
		t.Errorf("delimiter %q is a line of the body", d)
	}
}

func TestDropSections(t *testing.T) {
	patch := `diff --git a/keep.go b/keep.go
new file mode 100644
--- /dev/null
+++ b/keep.go
@@ -0,0 +1 @@
+package x
diff --git a/vendor/dep/a.go b/vendor/dep/a.go
new file mode 100644
--- /dev/null
+++ b/vendor/dep/a.go
@@ -0,0 +1 @@
+package dep
diff --git a/build.log b/build.log
new file mode 100644
--- /dev/null
+++ b/build.log
@@ -0,0 +1 @@
+log
`
	got, dropped := dropSections(patch, newPristineSet([]string{"vendor/", "build.log"}))
	want := "diff --git a/keep.go b/keep.go\nnew file mode 100644\n--- /dev/null\n+++ b/keep.go\n@@ -0,0 +1 @@\n+package x\n"
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("patch (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"vendor/dep/a.go", "build.log"}, dropped); d != "" {
		t.Errorf("dropped (-want +got):\n%s", d)
	}
}

func TestTestCommandLookup(t *testing.T) {
	c := Config{TestCommands: map[string]string{"o/r": "repo-cmd", "o__r-2": "instance-cmd"}, DefaultTestCommand: "default-cmd"}
	for _, tc := range []struct{ repo, id, want string }{
		{"o/r", "o__r-1", "repo-cmd"},
		{"o/r", "o__r-2", "instance-cmd"},
		{"x/y", "x__y-1", "default-cmd"},
	} {
		if got := c.testCommand(Row{Repo: tc.repo, InstanceID: tc.id}); got != tc.want {
			t.Errorf("%s %s: %q, want %q", tc.repo, tc.id, got, tc.want)
		}
	}
}

func TestAConfigWithoutCachesGetsTheDefaultOnesAfterAYAMLRoundTrip(t *testing.T) {
	b, err := yaml.Marshal(Config{})
	if err != nil {
		t.Fatal(err)
	}
	var back Config
	if err := yaml.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	c, err := back.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(DefaultCaches(), c.Caches); d != "" {
		t.Errorf("caches after a round trip (-want +got):\n%s", d)
	}
	off, _ := Config{Caches: map[string]string{}}.withDefaults()
	if len(off.Caches) != 0 {
		t.Errorf("an empty caches map is not off: %v", off.Caches)
	}
}

func TestGradingCapDefaultsToHalfTheCPUs(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if want := max(1, runtime.NumCPU()/2); c.MaxConcurrentGradings != want || !cmp.Equal(c.WritableCaches, []string{"gobuild"}) || !c.validates() {
		t.Errorf("defaults: max_concurrent_gradings %d (want %d), writable_caches %v, validates %v", c.MaxConcurrentGradings, want, c.WritableCaches, c.validates())
	}
	for _, bad := range []Config{{MaxConcurrentGradings: -1}, {EnvSetupTimeout: -1}, {EnvSetupEnv: map[string]string{"A=B": "x"}}} {
		if _, err := bad.withDefaults(); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err = %v, want ErrConfig", bad, err)
		}
	}
}
