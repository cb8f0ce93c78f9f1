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

func TestDiffGitPaths(t *testing.T) {
	cases := []struct{ in, a, b string }{
		{"a/x.go b/x.go", "x.go", "x.go"},
		{"a/old.go b/new.go", "old.go", "new.go"}, // a rename: the sides differ
		{`"a/sp ace.go" "b/sp ace.go"`, "sp ace.go", "sp ace.go"},
		{`"a/\303\251.go" b/e.go`, "é.go", "e.go"},
		{`a/x y.go b/"q".go`, "x y.go", `"q".go`},
		{`"a/unterminated`, "", ""},
		{"no sides at all", "", ""},
		{"c/x.go d/x.go", "", ""},
	}
	for _, c := range cases {
		if a, b := diffGitPaths(c.in); a != c.a || b != c.b {
			t.Errorf("diffGitPaths(%q) = %q, %q; want %q, %q", c.in, a, b, c.a, c.b)
		}
	}
}

func TestUnquoteGit(t *testing.T) {
	cases := map[string]string{
		`plain`:                 "plain",
		"tab after\t":           "tab after",
		`"x"`:                   "x",
		`"\a\b\f\n\r\t\v\\\""`:  "\a\b\f\n\r\t\v\\\"",
		`"\303\251"`:            "é",
		`"\400"`:                "400", // not an octal byte: the digits as they are
		`"\3"`:                  "3",   // too short for one
		`"trailing \"`:          `trailing \`,
		`"q`:                    `"q`,
		`"`:                     `"`,
		`"\x"`:                  "x",
		`"a\1011b"`:             "aA1b",
		`"\1234"`:               "S4",
		"\"\\303\\251 x\"\t":    "é x",
		`"\0"`:                  "0",
		`"dir with space/\303"`: "dir with space/\xc3",
		`""`:                    "",
		`"\30"`:                 "30", // an octal escape cut by the end
	}
	for in, want := range cases {
		if got := unquoteGit(in); got != want {
			t.Errorf("unquoteGit(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestSplitSections(t *testing.T) {
	patch := "preamble\n" +
		"diff --git a/gone.go b/gone.go\ndeleted file mode 100644\n--- a/gone.go\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n" +
		"diff --git a/new.go b/new.go\n--- /dev/null\n+++ b/new.go\n@@ -0,0 +1 @@\n+--- /dev/null\n" +
		"diff --git a/bin b/bin\nGIT binary patch\nnew file mode 100644\n" +
		"diff --git \"a/\\303\\251\" \"b/\\303\\251\"\n--- \"a/\\303\\251\"\n+++ \"b/\\303\\251\"\t\n@@ -1 +1 @@\n-a\n+b\n"
	got := SplitSections(patch)
	type s struct {
		Path, OldPath   string
		IsNew, Deleted  bool
		StartsWithDiff  bool
		EndsWithNewline bool
	}
	var view []s
	text := ""
	for _, sec := range got {
		view = append(view, s{sec.Path, sec.OldPath, sec.IsNew, sec.Deleted, len(sec.Text) > 4 && sec.Text[:4] == "diff", sec.Text[len(sec.Text)-1] == '\n'})
		text += sec.Text
	}
	want := []s{
		{"", "", false, false, false, true},
		{"gone.go", "gone.go", false, true, true, true},
		{"new.go", "new.go", true, false, true, true},
		{"bin", "bin", false, false, true, true},
		{"é", "é", false, false, true, true},
	}
	if d := cmp.Diff(want, view); d != "" {
		t.Errorf("sections (-want +got):\n%s", d)
	}
	if text != patch {
		t.Error("the sections do not add up to the patch")
	}
}

// Headers SplitSections must read however git (or a hand) wrote them.
func TestSplitSectionsHeaders(t *testing.T) {
	type view struct {
		Path, OldPath  string
		IsNew, Deleted bool
	}
	cases := []struct {
		name, patch string
		want        []view
	}{
		{"no preamble: no empty section", "diff --git a/x b/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
			[]view{{"x", "x", false, false}}},
		{"a diff --git line it cannot read takes the +++ path", "diff --git \"a/x\n--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n",
			[]view{{"x", "", false, false}}},
		{"the diff --git line's path wins over a +++ line's", "diff --git a/x b/x\n--- a/x\n+++ b/y\n@@ -1 +1 @@\n-a\n+b\n",
			[]view{{"x", "x", false, false}}},
		{"a deleted file is its a/ side", "diff --git a/x b/y\ndeleted file mode 100644\n--- a/x\n+++ /dev/null\n@@ -1 +0,0 @@\n-a\n",
			[]view{{"x", "x", false, true}}},
		{"a deletion without an a/ side keeps its b/ side", "diff --git  b/x\ndeleted file mode 100644\n",
			[]view{{"x", "", false, true}}},
	}
	for _, c := range cases {
		var got []view
		for _, sec := range SplitSections(c.patch) {
			got = append(got, view{sec.Path, sec.OldPath, sec.IsNew, sec.Deleted})
		}
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
	}
}
