package grading

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestPatchFiles(t *testing.T) {
	want := []PatchFile{
		{Path: "calc_test.go"},
		{Path: "new_test.go", New: true},
		{Path: "dir with space/é_test.go"},
		{Path: "old_test.go", Deleted: true},
	}
	if d := cmp.Diff(want, PatchFiles(readTestdata(t, "sample.patch"))); d != "" {
		t.Errorf("files (-want +got):\n%s", d)
	}
}

func TestDiffGitPathsWithSpaces(t *testing.T) {
	a, b := diffGitPaths("a/x b/y.go b/x b/y.go")
	if a != "x b/y.go" || b != "x b/y.go" {
		t.Errorf("paths = %q, %q", a, b)
	}
}
