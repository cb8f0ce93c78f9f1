package main

import (
	"bytes"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The schema way on testdata/schema/p: each mutant runs with the tests of
// its line and ends as gremlins would have it end.
func TestSchemaRunsEachMutantWithTheTestsOfItsLine(t *testing.T) {
	if testing.Short() {
		t.Skip("builds two test binaries")
	}
	var log bytes.Buffer
	out := filepath.Join(t.TempDir(), "p.json")
	if err := runSchema("testdata/schema/p", "", t.TempDir(), time.Minute, &log).run(out); err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	res, err := readResult(out)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range res.Files {
		for _, m := range f.Mutations {
			got[fmt.Sprintf("%s:%d:%d %s", f.FileName, m.Line, m.Column, m.Type)] = m.Status
		}
	}
	want := map[string]string{
		// n < 0: negated, 3 is clamped to 0; n <= 0 clamps 0 to 0 as
		// well (an equivalent mutant)
		"p.go:7:7 CONDITIONALS_NEGATION":  "KILLED",
		"p.go:7:7 CONDITIONALS_BOUNDARY":  "LIVED",
		"p.go:10:7 CONDITIONALS_NEGATION": "KILLED",
		"p.go:10:7 CONDITIONALS_BOUNDARY": "LIVED",
		// a + (b-a)/2, every operator of it, nested
		"p.go:17:35 ARITHMETIC_BASE":       "KILLED",
		"p.go:17:39 ARITHMETIC_BASE":       "KILLED",
		"p.go:17:39 INVERT_NEGATIVES":      "KILLED", // gremlins' second name for the binary minus
		"p.go:17:42 ARITHMETIC_BASE":       "KILLED",
		"p.go:23:10 CONDITIONALS_NEGATION": "KILLED",
		// c-- runs only when neg, which no test asks
		"p.go:24:5 INCREMENT_DECREMENT": "NOT COVERED",
		"p.go:26:5 INCREMENT_DECREMENT": "KILLED",
		// -c * 1: the negation inside the product
		"p.go:29:9 INVERT_NEGATIVES": "KILLED",
		"p.go:29:12 ARITHMETIC_BASE": "LIVED",
		// a + of strings does not compile as a -
		"p.go:33:42 ARITHMETIC_BASE": "NOT VIABLE",
		"p.go:36:38 ARITHMETIC_BASE": "NOT COVERED",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("mutants (-want +got):\n%s\nlog:\n%s", d, log.String())
	}
}

// Edits at one offset nest: the outer call's prefix before the inner one's,
// the inner suffix before the outer, a replacement after the prefixes.
func TestEditsNestAtOneOffset(t *testing.T) {
	src := []byte("-a*b")
	// -a*b: the product wraps the negation, which starts where it does.
	got := string(applyEdits(src, []edit{
		{off: 0, text: "mul(", kind: prefix, span: 4},
		{off: 2, del: 1, text: ", "},
		{off: 4, text: ")", kind: suffix, span: 4},
		{off: 0, del: 1, text: "neg("},
		{off: 2, text: ")", kind: suffix, span: 2},
	}))
	if want := "mul(neg(a), b)"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if s := string(src); !strings.HasPrefix(s, "-a") {
		t.Errorf("the source changed: %q", s)
	}
}
