package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// scoreTestdata scores testdata/gremlins.json (a report on testdata/mod/pkg)
// with testdata/equivalent.txt.
func scoreTestdata(t *testing.T) (row, exclusions) {
	t.Helper()
	ex, err := readExclusions("testdata/equivalent.txt")
	if err != nil {
		t.Fatal(err)
	}
	res, err := readResult("testdata/gremlins.json")
	if err != nil {
		t.Fatal(err)
	}
	line := func(file string, n int) string { return readLine(filepath.Join("testdata/mod", file), n) }
	outside := func(file string, l, c int) bool { return outsideBlocks(filepath.Join("testdata/mod", file), l, c) }
	fn := func(file string, l int) string { return funcAt(filepath.Join("testdata/mod", file), l) }
	return score("pkg", res, ex, line, outside, fn), ex
}

func TestScoreDiscountsListedMutantsAndCountsAsGremlinsDoes(t *testing.T) {
	r, ex := scoreTestdata(t)
	got := map[string]any{
		"killed": r.killed, "lived": r.lived, "not covered": r.notCovered,
		"timed out": r.timedOut, "not viable": r.nv,
		"efficacy": r.efficacy(), "coverage": r.coverage(),
		"lived list": mutantNames(r.livedList), "excluded": mutantNames(r.excluded),
		"not covered list": mutantNames(r.notCoveredList), "unmeasured": mutantNames(r.unmeasured),
	}
	want := map[string]any{
		// the capacity hint is listed: neither killed nor lived
		"killed": 1, "lived": 1, "not covered": 2, "timed out": 1, "not viable": 1,
		"efficacy": 50.0, "coverage": 50.0,
		"lived list": []string{"pkg/a.go:5:7 CONDITIONALS_BOUNDARY  if n > 3 {"},
		"excluded":   []string{"pkg/a.go:4:23 ARITHMETIC_BASE  s := make([]int, 0, n+1)"},
		// a statement in a function or a case body is a line no test reached
		"not covered list": []string{"pkg/a.go:6:3 INVERT_ASSIGNMENTS  s = append(s, n)", `pkg/a.go:16:3 INVERT_NEGATIVES  return "big"`},
		// a package-level constant and a case expression have no
		// coverage block: gremlins never runs them
		"unmeasured": []string{"pkg/a.go:11:17 ARITHMETIC_BASE  const limit = 2 * 3", "pkg/a.go:15:9 CONDITIONALS_BOUNDARY  case n > limit:"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("score (-want +got):\n%s", d)
	}
	var unused []string
	for _, e := range ex.unused([]row{r}) {
		unused = append(unused, e.pos)
	}
	if d := cmp.Diff([]string{"testdata/equivalent.txt:3"}, unused); d != "" {
		t.Errorf("unused entries (-want +got):\n%s", d)
	}
}

func TestAnEntryFollowsItsCodeNotItsLineNumber(t *testing.T) {
	ex, err := parseExclusions("x", strings.NewReader("pkg/a.go | ARITHMETIC_BASE | 23 | s := make([]int, 0, n+1) | hint\n"))
	if err != nil {
		t.Fatal(err)
	}
	m := mutant{File: "pkg/a.go", Line: 40, Column: 23, Kind: "ARITHMETIC_BASE", Code: "s := make([]int, 0, n+1)", Func: "grow"}
	if _, ok := ex.match(m); !ok {
		t.Error("the entry did not match its code on another line")
	}
	inFunc, err := parseExclusions("x", strings.NewReader("pkg/a.go#grow | ARITHMETIC_BASE | 23 | s := make([]int, 0, n+1) | hint\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := inFunc.match(m); !ok {
		t.Error("an entry naming the line's function did not match")
	}
	other := m
	other.Func = "shrink"
	if _, ok := inFunc.match(other); ok {
		t.Error("an entry naming a function matched the same line in another")
	}
	if got := funcAt("testdata/mod/pkg/a.go", 5); got != "grow" {
		t.Errorf("funcAt line 5 = %q, want grow", got)
	}
	for name, other := range map[string]mutant{
		"another column": {File: m.File, Column: 22, Kind: m.Kind, Code: m.Code},
		"another kind":   {File: m.File, Column: m.Column, Kind: "INVERT_NEGATIVES", Code: m.Code},
		"another file":   {File: "pkg/b.go", Column: m.Column, Kind: m.Kind, Code: m.Code},
		"changed code":   {File: m.File, Column: m.Column, Kind: m.Kind, Code: "s := make([]int, 0, n+2)"},
	} {
		if _, ok := ex.match(other); ok {
			t.Errorf("%s: the entry matched", name)
		}
	}
}

func TestBadExclusionLinesAreRefused(t *testing.T) {
	for _, line := range []string{
		"pkg/a.go | ARITHMETIC_BASE | 23 | code",             // no why
		"pkg/a.go | ARITHMETIC_BASE | x | code | why",        // column not a number
		"pkg/a.go | ARITHMETIC_BASE | 0 | code | why",        // column not positive
		"pkg/a.go | ARITHMETIC_BASE | 3 |  | why",            // no code
		"pkg/a.go | ARITHMETIC_BASE | 3 | code |  ",          // empty why
		"pkg/a.go|ARITHMETIC_BASE|3|code|why without spaces", // the separator is " | "
	} {
		if _, err := parseExclusions("x", strings.NewReader(line+"\n")); err == nil {
			t.Errorf("%q was accepted", line)
		}
	}
}

func TestThresholdsDecideTheVerdict(t *testing.T) {
	r, _ := scoreTestdata(t) // efficacy 50%, coverage 50%
	for _, c := range []struct {
		th   thresholds
		want bool
	}{
		{thresholds{50, 50}, true},
		{thresholds{50.1, 50}, false},
		{thresholds{50, 50.1}, false},
	} {
		if got := r.meets(c.th); got != c.want {
			t.Errorf("meets(%v) = %v, want %v", c.th, got, c.want)
		}
	}
	var b bytes.Buffer
	printRow(&b, r, thresholds{90, 90}, false)
	if !strings.Contains(b.String(), "(BELOW)") || !strings.Contains(b.String(), "lived        pkg/a.go:5:7") {
		t.Errorf("the row does not say BELOW and list the mutant that lived:\n%s", b.String())
	}
}

func mutantNames(ms []mutant) []string {
	var out []string
	for _, m := range ms {
		out = append(out, m.String())
	}
	return out
}

// TestEquivalentListNamesLinesThatExist: every entry of the real list parses
// and names a line of code that its file still has, so an edit that moves
// an entry off its mutant fails here, not only in a mutation run.
func TestEquivalentListNamesLinesThatExist(t *testing.T) {
	ex, err := readExclusions("equivalent.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ex {
		file := filepath.Join("..", "..", e.file)
		b, err := os.ReadFile(file)
		if err != nil {
			t.Errorf("%s: %v", e.pos, err)
			continue
		}
		found := false
		for i, l := range strings.Split(string(b), "\n") {
			if strings.TrimSpace(l) == e.code && len(l)-len(strings.TrimLeft(l, " \t"))+len(e.code) >= e.column && (e.fn == "" || funcAt(file, i+1) == e.fn) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: %s has no line %q reaching column %d", e.pos, e.file, e.code, e.column)
		}
	}
}
