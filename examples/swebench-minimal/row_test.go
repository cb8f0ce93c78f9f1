// Package minimal_test checks the minimal SWE-bench row that
// docs/swebench.md runs.
package minimal_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/resources/swebench"
)

// TestMinimalRowExample: examples/swebench-minimal/make-row.sh, which
// docs/swebench.md runs, writes a row this package reads, whose repository
// holds the base commit with the fix on top, and whose patch and test patch
// apply at the base. (Grading such a task end to end is what the golden and
// agent tests do with the same module.)
func TestMinimalRowExample(t *testing.T) {
	for _, tool := range []string{"git", "jq", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed: the minimal row's script needs it", tool)
		}
	}
	script, err := filepath.Abs("make-row.sh")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(script)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make-row.sh: %v\n%s", err, out)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "row.json"))
	if err != nil {
		t.Fatal(err)
	}
	row, err := swebench.ParseRow(raw)
	if err != nil {
		t.Fatal(err)
	}
	got := []any{row.InstanceID, row.Repo, []string(row.FailToPass), []string(row.PassToPass)}
	want := []any{"example__calc-1", "example/calc", []string{"TestAbs", "TestAbs/negative"}, []string{"TestAbs/positive", "TestAdd"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("row (-want +got):\n%s", diff)
	}
	repo := filepath.Join(dir, "swebench", "repos", "calc")
	if parent := git(t, repo, "rev-parse", "HEAD^"); parent != row.BaseCommit {
		t.Errorf("base_commit %s is not the fix's parent %s", row.BaseCommit, parent)
	}
	git(t, repo, "checkout", "-q", row.BaseCommit)
	for name, patch := range map[string]string{"patch": row.Patch, "test_patch": row.TestPatch} {
		apply := exec.Command("git", "apply", "--check", "-")
		apply.Dir, apply.Stdin = repo, strings.NewReader(patch)
		if out, err := apply.CombinedOutput(); err != nil {
			t.Errorf("the row's %s does not apply at the base: %v\n%s", name, err, out)
		}
	}
}

func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}
