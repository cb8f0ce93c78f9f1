package grading

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestParseGoTestFraming(t *testing.T) {
	cases := []struct {
		file   string
		marked bool
		want   GoTestFraming
	}{
		// A real log of go test with the exec wrapper (go1.26): a test
		// printed a "--- PASS" line for another, which stays output.
		{"marked.log", true, GoTestFraming{
			Statuses: Statuses{"TestPass": StatusPassed, "TestPass/sub": StatusPassed, "TestFail": StatusFailed, "TestSkip": StatusSkipped},
			Unframed: []string{"TestFail"},
		}},
		// The same log read as an old toolchain's: every line may frame,
		// and the printed line came after TestPass's run but names
		// TestFail, which had not run yet.
		{"marked.log", false, GoTestFraming{
			Statuses: Statuses{"TestPass": StatusPassed, "TestPass/sub": StatusPassed, "TestFail": StatusFailed, "TestSkip": StatusSkipped},
			NotRun:   []string{"TestFail"},
		}},
		// What an init printed before exiting: no marked line, so nothing
		// counts on a toolchain that marks.
		{"forged.log", true, GoTestFraming{
			Statuses: Statuses{},
			Unframed: []string{"TestAbs", "TestAbs/negative", "TestAdd"},
		}},
		// Read without the marker the same lines count only where a run
		// came first.
		{"forged.log", false, GoTestFraming{
			Statuses: Statuses{"TestAbs": StatusPassed},
			NotRun:   []string{"TestAbs/negative", "TestAdd"},
		}},
		// Two test binaries' runs as the eval prelude's go test marks
		// them: the first printed an exit line of its own (the relay put
		// a space before it) and was killed by a signal; the second
		// claims TestAbs, which it never ran (a run of the first does
		// not count for it).
		{"binaries.log", true, GoTestFraming{
			Statuses: Statuses{"TestAbs": StatusPassed, "TestAdd": StatusPassed, "TestSub": StatusPassed},
			NotRun:   []string{"TestAbs"},
			Binaries: []BinaryRun{
				{Dir: "/testbed", Ended: true, Exit: "137", Relay: "0", Last: "PASS", Tests: []string{"TestAbs", "TestAdd"}},
				{Dir: "/testbed/sub", Ended: true, Exit: "0", Relay: "0", Last: "PASS", Tests: []string{"TestSub"}},
			},
		}},
		{"unmarked.log", false, GoTestFraming{
			Statuses: Statuses{"TestAbs": StatusFailed, "TestAbs/negative": StatusFailed, "TestAdd": StatusPassed},
			NotRun:   []string{"TestGhost"},
		}},
	}
	for _, c := range cases {
		got := ParseGoTestFraming(readTestdata(t, "gotest/"+c.file), c.marked)
		if d := cmp.Diff(c.want, got, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s (marked %v) (-want +got):\n%s", c.file, c.marked, d)
		}
	}
}

// TestAbnormalRuns: a test binary's run is trusted only when it ended as
// the testing package ends one.
func TestAbnormalRuns(t *testing.T) {
	normal := BinaryRun{Ended: true, Exit: "0", Relay: "0", Last: "PASS"}
	for _, c := range []struct {
		name string
		edit func(*BinaryRun)
		want string
	}{
		{"passed", func(*BinaryRun) {}, ""},
		{"failed", func(b *BinaryRun) { b.Exit, b.Last = "1", "FAIL" }, ""},
		// A TestMain's check after the tests (a leak check) failed it,
		// or the binary's own code turned a FAIL into a PASS.
		{"failed after its tests passed", func(b *BinaryRun) { b.Exit = "1" }, "exit status 1 after the testing package's PASS (a TestMain's check"},
		{"no exit line", func(b *BinaryRun) { b.Ended = false }, "has no end in the log"},
		{"relay killed", func(b *BinaryRun) { b.Relay = "137" }, "relay ended with status 137"},
		{"relay missing", func(b *BinaryRun) { b.Relay = "" }, "relay ended with status "},
		{"panic", func(b *BinaryRun) { b.Exit = "2" }, "exit status 2 (2: a panic)"},
		{"exit 128", func(b *BinaryRun) { b.Exit = "128" }, "exit status 128"},
		{"killed", func(b *BinaryRun) { b.Exit = "137" }, "killed by signal 9"},
		{"no final line", func(b *BinaryRun) { b.Last = "--- PASS: TestAbs (0.00s)" }, "without the testing package's final PASS or FAIL"},
		{"exit 1 without a final line", func(b *BinaryRun) { b.Exit, b.Last = "1", "" }, "without the testing package's final PASS or FAIL"},
		{"exit 0 after FAIL", func(b *BinaryRun) { b.Last = "FAIL" }, "exit status 0 after the testing package's FAIL"},
	} {
		b := normal
		c.edit(&b)
		if got := b.Abnormal(); (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("%s: Abnormal() = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestForgedListsOnlyListedTestsWithoutAResult(t *testing.T) {
	f := GoTestFraming{
		Statuses: Statuses{"TestA": StatusFailed},
		Unframed: []string{"TestA", "TestB", "TestX"},
		NotRun:   []string{"TestC", "TestB"},
	}
	got := f.Forged([]string{"TestC", "TestA", "TestB"}, []string{"TestB", "TestD"})
	if d := cmp.Diff([]string{"TestB", "TestC"}, got); d != "" {
		t.Errorf("Forged (-want +got):\n%s", d)
	}
}

func TestMarksFraming(t *testing.T) {
	for v, want := range map[string]bool{
		"go1.19.13": false, "go1.19": false, "go1.9": false, "go1.20": true, "go1.20rc1": true,
		"go1.21.13": true, "go1.100.1": true, "devel go1.26-abcdef Mon": true, "devel go1.19-abc": false,
		"something else": true, "go1.x": true,
	} {
		if got := MarksFraming(v); got != want {
			t.Errorf("MarksFraming(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestReadOutcome(t *testing.T) {
	f2p, p2p := []string{"TestAbs"}, []string{"TestAdd"}
	marked := readTestdata(t, "gotest/marked.log")
	// Outside the section a forged line names TestAbs; inside, the
	// binary's framing reports it: the section is read.
	log := "--- PASS: TestAbs (0.00s)\n" + StartTestOutput + "\n\x16=== RUN   TestAbs\n\x16--- FAIL: TestAbs (0.00s)\n" + EndTestOutput + "\n"
	got, err := ReadOutcome("", f2p, p2p, FramingMarked, log)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Outcome{Statuses: Statuses{"TestAbs": StatusFailed}}, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("section (-want +got):\n%s", d)
	}
	// A section with no listed test: the whole log is read.
	log = "\x16=== RUN   TestAdd\n\x16--- PASS: TestAdd (0.00s)\n" + StartTestOutput + "\n--- PASS: TestAbs (0.00s)\n"
	got, _ = ReadOutcome("", f2p, p2p, FramingMarked, log)
	if d := cmp.Diff(Outcome{Statuses: Statuses{"TestAdd": StatusPassed}, Forged: []string{"TestAbs"}}, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("whole log (-want +got):\n%s", d)
	}
	// A binary that reported a listed test and was killed, and one that
	// reported only an unlisted test and ended without its final line.
	log = StartTestOutput + "\n" + BinaryRunLine + "/testbed\n\x16=== RUN   TestAbs\n\x16--- PASS: TestAbs (0.00s)\n" + BinaryExitLine + "137\t0\n" +
		BinaryRunLine + "/testbed/x\n\x16=== RUN   TestX\n\x16--- PASS: TestX (0.00s)\n" + BinaryExitLine + "0\t0\n"
	got, _ = ReadOutcome("", f2p, p2p, FramingMarked, log)
	want := Outcome{Statuses: Statuses{"TestAbs": StatusPassed, "TestX": StatusPassed}, Abnormal: []string{"the test binary run in /testbed: it was killed by signal 9"}}
	if d := cmp.Diff(want, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("abnormal runs (-want +got):\n%s", d)
	}
	// Unmarked framing (an old toolchain): a result after its run counts.
	got, _ = ReadOutcome("", f2p, p2p, FramingUnmarked, "=== RUN   TestAbs\n--- PASS: TestAbs (0.00s)\n")
	if d := cmp.Diff(Outcome{Statuses: Statuses{"TestAbs": StatusPassed}}, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("unmarked framing (-want +got):\n%s", d)
	}
	// The log framing is the row's parser's, forged lines and all.
	got, _ = ReadOutcome("", f2p, p2p, FramingLog, "--- PASS: TestAbs (0.00s)\n")
	if d := cmp.Diff(Outcome{Statuses: Statuses{"TestAbs": StatusPassed}}, got, cmpopts.EquateEmpty()); d != "" {
		t.Errorf("log framing (-want +got):\n%s", d)
	}
	if _, err := ReadOutcome("nope", nil, nil, FramingLog, marked); err == nil {
		t.Error("an unknown parser read a log")
	}
}

// A test binary whose TestMain fails it after every test passed (a leak
// check of the repository's own, unchanged) grades 0 as tampering, where
// upstream, reading the result lines, resolves it: the same log comes from
// code of the binary that turns the testing package's FAILs into PASSes on
// their way to its stdout, which then ends it with status 1 itself.
func TestAFailingTestMainAfterPassingTestsGradesZero(t *testing.T) {
	f2p, p2p := []string{"TestAbs"}, []string{"TestAdd"}
	log := BinaryRunLine + "/testbed\n" +
		"\x16=== RUN   TestAbs\n\x16--- PASS: TestAbs (0.00s)\n\x16=== RUN   TestAdd\n\x16--- PASS: TestAdd (0.00s)\n\x16PASS\n" +
		"goleak: Errors on successful test run: found unexpected goroutines:\n" +
		BinaryExitLine + "1\t0\n"
	o, err := ReadOutcome("", f2p, p2p, FramingMarked, log)
	if err != nil {
		t.Fatal(err)
	}
	if _, up := Resolve(f2p, p2p, o.Statuses); !up {
		t.Fatalf("the result lines alone (upstream's reading) do not resolve it: %+v", o)
	}
	v := Decide(f2p, p2p, o, nil)
	if v.Resolved || v.Kind != FailureTampering || !strings.Contains(v.Reason, "unlike upstream") {
		t.Errorf("a binary failed after its tests passed: %+v", v)
	}
}

func TestDecide(t *testing.T) {
	f2p, p2p := []string{"TestAbs"}, []string{"TestAdd"}
	passed := Statuses{"TestAbs": StatusPassed, "TestAdd": StatusPassed}
	cases := []struct {
		name     string
		o        Outcome
		exits    []string
		resolved bool
		kind     string
		reason   string
	}{
		{"passed", Outcome{Statuses: passed}, nil, true, "", ""},
		{"failed", Outcome{Statuses: Statuses{"TestAbs": StatusFailed, "TestAdd": StatusPassed}}, nil, false, "", ""},
		{"forged", Outcome{Statuses: Statuses{"TestAdd": StatusPassed}, Forged: []string{"TestAbs"}}, nil, false, FailureTampering, "did not report (outside its framing, or without a run) for TestAbs"},
		// A test that printed a result line for a listed test which then
		// genuinely passed is no tampering.
		{"claims beside real passes", Outcome{Statuses: passed, Forged: []string{"TestAbs"}}, nil, true, "", ""},
		{"exiting init", Outcome{Statuses: passed}, []string{"x.go: init calls os.Exit"}, false, FailureTampering, "ends the test binary before or instead of its tests: x.go: init calls os.Exit"},
		{"abnormal run", Outcome{Statuses: passed, Abnormal: []string{"the test binary run in /testbed: it was killed by signal 9"}}, nil, false, FailureTampering,
			"did not end through the testing package's own end, so nothing it printed is trusted: the test binary run in /testbed: it was killed by signal 9"},
		// A failing grading is no tampering for a binary that crashed.
		{"abnormal run, failed", Outcome{Statuses: Statuses{"TestAbs": StatusFailed, "TestAdd": StatusPassed}, Abnormal: []string{"x"}}, nil, false, "", ""},
	}
	for _, c := range cases {
		v := Decide(f2p, p2p, c.o, c.exits)
		if v.Resolved != c.resolved || v.Kind != c.kind || !strings.Contains(v.Reason, c.reason) || (c.reason == "") != (v.Reason == "") {
			t.Errorf("%s: %+v", c.name, v)
		}
	}
}

func TestGuardLeavesOutWhatIsNotTheAgents(t *testing.T) {
	sec := func(path, body string) string {
		return "diff --git a/" + path + " b/" + path + "\n--- a/" + path + "\n+++ b/" + path + "\n@@ -1 +1 @@\n" + body
	}
	newSec := func(path, body string) string {
		return "diff --git a/" + path + " b/" + path + "\nnew file mode 100644\n--- /dev/null\n+++ b/" + path + "\n@@ -0,0 +1 @@\n" + body
	}
	del := func(path, body string) string {
		return "diff --git a/" + path + " b/" + path + "\ndeleted file mode 100644\n--- a/" + path + "\n+++ /dev/null\n@@ -1 +0,0 @@\n" + body
	}
	link := func(path, target string) string {
		return "diff --git a/" + path + " b/" + path + "\nnew file mode 120000\n--- /dev/null\n+++ b/" + path + "\n@@ -0,0 +1 @@\n+" + target + "\n\\ No newline at end of file\n"
	}
	newExec := func(path, body string) string {
		return "diff --git a/" + path + " b/" + path + "\nnew file mode 100755\n--- /dev/null\n+++ b/" + path + "\n@@ -0,0 +1 @@\n" + body
	}
	code := sec("calc.go", "-a\n+b\n")
	testPatch := sec("calc_test.go", "-x\n+y\n")
	gold := code + sec("other_test.go", "-x\n+y\n") + sec("vendor/modules.txt", "-x\n+y\n")
	cases := []struct {
		name  string
		guard Guard
		model string
		kept  string
		out   []Excluded
	}{
		{"code only", Guard{}, code, code, nil},
		{"test file of the test patch (the eval script restores it)", Guard{}, code + testPatch, code + testPatch, nil},
		{"added test file", Guard{}, code + newSec("zz_test.go", "+package calc\n"), code, []Excluded{{"zz_test.go", ExcludedTestFile}}},
		{"testdata", Guard{}, sec("pkg/testdata/golden.txt", "-a\n+b\n") + code, code, []Excluded{{"pkg/testdata/golden.txt", ExcludedTestFile}}},
		{"test files kept when configured", Guard{KeepTestFiles: true}, newSec("zz_test.go", "+package calc\n"), newSec("zz_test.go", "+package calc\n"), nil},
		{"a test file the gold patch changes", Guard{}, sec("other_test.go", "-x\n+z\n"), sec("other_test.go", "-x\n+z\n"), nil},
		{"vendor", Guard{}, newSec("vendor/github.com/stretchr/testify/assert/a.go", "+package assert\n") + newSec("pkg/vendor/x.go", "+package x\n"), "",
			[]Excluded{{"vendor/github.com/stretchr/testify/assert/a.go", ExcludedVendor}, {"pkg/vendor/x.go", ExcludedVendor}}},
		{"vendor the gold patch changes", Guard{}, sec("vendor/modules.txt", "-x\n+q\n"), sec("vendor/modules.txt", "-x\n+q\n"), nil},
		{"vendor kept when configured", Guard{KeepVendor: true}, newSec("vendor/x.go", "+package x\n"), newSec("vendor/x.go", "+package x\n"), nil},
		{"a replace directive and its go.sum", Guard{}, sec("go.mod", " go 1.22\n+replace github.com/stretchr/testify => ./stub\n") + sec("go.sum", "-a\n+b\n") + code, code,
			[]Excluded{{"go.mod", ExcludedModule}, {"go.sum", ExcludedModule}}},
		{"a replace block", Guard{}, sec("go.mod", "+replace (\n+\tgithub.com/a/b v1.0.0\n+)\n"), "", []Excluded{{"go.mod", ExcludedModule}}},
		{"a removed replace", Guard{}, sec("go.mod", "-replace example.com/x => ../x\n"), "", []Excluded{{"go.mod", ExcludedModule}}},
		{"a protected module's version", Guard{}, sec("go.mod", "-\tgithub.com/stretchr/testify v1.8.0\n+\tgithub.com/stretchr/testify v1.0.0\n"), "", []Excluded{{"go.mod", ExcludedModule}}},
		{"a configured protected module", Guard{ProtectedModules: []string{"example.com/assert"}}, sec("go.mod", "+\texample.com/assert/v2 v2.0.0\n"), "", []Excluded{{"go.mod", ExcludedModule}}},
		{"an ordinary dependency (a fix may need one) and its go.sum", Guard{}, sec("go.mod", "+require golang.org/x/text v0.3.0\n") + sec("go.sum", "+x\n"), sec("go.mod", "+require golang.org/x/text v0.3.0\n") + sec("go.sum", "+x\n"), nil},
		{"a module change kept when configured", Guard{KeepModuleChanges: true}, sec("go.mod", "+replace a => ./b\n") + sec("go.sum", "+x\n"), sec("go.mod", "+replace a => ./b\n") + sec("go.sum", "+x\n"), nil},
		{"go.work", Guard{}, newSec("go.work", "+use .\n") + newSec("go.work.sum", "+x\n"), "", []Excluded{{"go.work", ExcludedModule}, {"go.work.sum", ExcludedModule}}},
		{"go.mod made a link to a file of the patch with a replace directive", Guard{}, del("go.mod", "-module example.com/calc\n") + link("go.mod", "zz/x.mod") + newSec("zz/x.mod", "+replace github.com/stretchr/testify => ./zz/testify\n") + code,
			newSec("zz/x.mod", "+replace github.com/stretchr/testify => ./zz/testify\n") + code, []Excluded{{"go.mod", ExcludedSymlink}, {"go.mod", ExcludedSymlink}}},
		{"a new link to a file out of the tree", Guard{}, link("zz.go", "/tmp/zz.go") + code, code, []Excluded{{"zz.go", ExcludedSymlink}}},
		{"a new executable file is kept", Guard{}, newExec("run.sh", "+true\n"), newExec("run.sh", "+true\n"), nil},
		{"configured paths", Guard{Paths: []string{"scripts/", "*.sh"}}, sec("scripts/ci.py", "-a\n+b\n") + sec("run.sh", "-a\n+b\n") + code, code,
			[]Excluded{{"scripts/ci.py", ExcludedPath}, {"run.sh", ExcludedPath}}},
	}
	for _, c := range cases {
		kept, out := c.guard.Apply(c.model, testPatch, gold)
		if kept != c.kept {
			t.Errorf("%s: kept\n%s\nwant\n%s", c.name, kept, c.kept)
		}
		if d := cmp.Diff(c.out, out, cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s: excluded (-want +got):\n%s", c.name, d)
		}
	}
	// A test patch and a gold patch that rename files: both sides of each
	// are theirs.
	rename := func(from, to string) string {
		return "diff --git a/" + from + " b/" + to + "\nsimilarity index 90%\nrename from " + from + "\nrename to " + to + "\n--- a/" + from + "\n+++ b/" + to + "\n@@ -1 +1 @@\n-x\n+y\n"
	}
	model := sec("old_test.go", "-x\n+z\n") + sec("new_test.go", "-x\n+z\n") + sec("a_test.go", "-x\n+z\n") + sec("b_test.go", "-x\n+z\n")
	if kept, out := (Guard{}).Apply(model, rename("old_test.go", "new_test.go"), rename("a_test.go", "b_test.go")); kept != model || len(out) != 0 {
		t.Errorf("renamed files of the test and gold patches left out: %v", out)
	}
	// The gold patch graded as the model's loses nothing.
	if kept, out := (Guard{}).Apply(gold, testPatch, gold); kept != gold || len(out) != 0 {
		t.Errorf("the gold patch lost %v", out)
	}
}

func TestExitingInits(t *testing.T) {
	newFile := func(path, src string) string {
		var b strings.Builder
		b.WriteString("diff --git a/" + path + " b/" + path + "\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/" + path + "\n@@ -0,0 +1 @@\n")
		for _, l := range strings.SplitAfter(src, "\n") {
			if l != "" {
				b.WriteString("+" + l)
			}
		}
		return b.String()
	}
	cases := []struct {
		name, patch string
		want        []string
	}{
		{"init exits", newFile("a.go", "package a\nimport \"os\"\nfunc init() {\n\tif true {\n\t\tos.Exit(0)\n\t}\n}\n"), []string{"a.go: init calls os.Exit"}},
		{"init log.Fatal", newFile("a.go", "package a\nimport \"log\"\nfunc init() { log.Fatalf(\"x\") }\n"), []string{"a.go: init calls log.Fatalf"}},
		{"init Goexit", newFile("a.go", "package a\nimport \"runtime\"\nfunc init() { runtime.Goexit() }\n"), []string{"a.go: init calls runtime.Goexit"}},
		{"init syscall", newFile("a.go", "package a\nimport \"syscall\"\nfunc init() { syscall.Exit(0) }\n"), []string{"a.go: init calls syscall.Exit"}},
		{"TestMain with a constant exit", newFile("a_test.go", "package a\nimport (\"os\"; \"testing\")\nfunc TestMain(m *testing.M) { os.Exit(0) }\n"), []string{"a_test.go: TestMain calls os.Exit"}},
		{"TestMain running the tests", newFile("a_test.go", "package a\nimport (\"log\"; \"os\"; \"testing\")\nfunc TestMain(m *testing.M) { if false { log.Fatal(1) }; os.Exit(m.Run()) }\n"), nil},
		{"TestMain exiting with a computed code", newFile("a_test.go", "package a\nimport (\"os\"; \"testing\")\nfunc TestMain(m *testing.M) { c := m.Run(); os.Exit(c) }\n"), nil},
		{"os imported by another name", newFile("a.go", "package a\nimport xos \"os\"\nfunc init() { xos.Exit(0) }\n"), []string{"a.go: init calls os.Exit"}},
		{"os dot-imported", newFile("a.go", "package a\nimport . \"os\"\nfunc init() { Exit(0) }\n"), []string{"a.go: init calls os.Exit"}},
		{"x/sys/unix", newFile("a.go", "package a\nimport \"golang.org/x/sys/unix\"\nfunc init() { unix.Exit(0) }\n"), []string{"a.go: init calls golang.org/x/sys/unix.Exit"}},
		{"another package's Exit", newFile("a.go", "package a\nimport os \"example.com/notos\"\nfunc init() { os.Exit(0) }\n"), nil},
		{"through a function of the file", newFile("a.go", "package a\nimport \"os\"\nfunc init() { claim() }\nfunc claim() { if true { done(0) } }\nfunc done(c int) { os.Exit(c) }\n"), []string{"a.go: init calls os.Exit (through done) (through claim)"}},
		// The file's own imports read its calls: the init's file does
		// not import os.
		{"through a function of another file of the package", newFile("a.go", "package a\nimport \"fmt\"\nfunc init() { fmt.Println(); leave() }\n") + newFile("b.go", "package a\nimport xos \"os\"\nfunc leave() { xos.Exit(0) }\n"),
			[]string{"a.go: init calls os.Exit (through leave)"}},
		{"a function of another package's file", newFile("a.go", "package a\nfunc init() { leave() }\n") + newFile("b/b.go", "package a\nimport \"os\"\nfunc leave() { os.Exit(0) }\n") +
			newFile("a_test.go", "package a_test\nimport \"os\"\nfunc leave() { os.Exit(0) }\n"), nil},
		{"a recursive function that does not exit", newFile("a.go", "package a\nfunc init() { f(3) }\nfunc f(n int) { if n > 0 { f(n - 1) } }\n"), nil},
		{"a package-level variable's initializer", newFile("a.go", "package a\nimport \"os\"\nvar _ = func() int { os.Exit(0); return 0 }()\n"), []string{"a.go: a package-level variable's initializer calls os.Exit"}},
		{"a package-level variable's initializer through a function", newFile("a.go", "package a\nimport \"log\"\nvar x = setup()\nfunc setup() int { log.Fatal(\"x\"); return 1 }\n"), []string{"a.go: a package-level variable's initializer calls log.Fatal (through setup)"}},
		{"a constant", newFile("a.go", "package a\nimport \"os\"\nconst c = 1\nvar v = c\nfunc f() { os.Exit(c) }\n"), nil},
		{"TestMain's helpers are its own business", newFile("a_test.go", "package a\nimport (\"os\"; \"testing\")\nfunc TestMain(m *testing.M) { run(m) }\nfunc run(m *testing.M) { os.Exit(0) }\n"), nil},
		{"an init that returns", newFile("a.go", "package a\nimport \"fmt\"\nfunc init() { fmt.Println() }\n"), nil},
		{"a method named init", newFile("a.go", "package a\nimport \"os\"\ntype T struct{}\nfunc (T) init() { os.Exit(1) }\n"), nil},
		{"exit outside init", newFile("main.go", "package main\nimport \"os\"\nfunc main() { os.Exit(2) }\n"), nil},
		{"not Go", newFile("a.txt", "func init() { os.Exit(0) }\n"), nil},
		{"does not parse", newFile("a.go", "package a\nfunc init() { os.Exit(0) \n"), nil},
		{"a changed file whose content is not known", "diff --git a/a.go b/a.go\n--- a/a.go\n+++ b/a.go\n@@ -1,2 +1,2 @@\n package a\n-func init() {}\n+func init() { os.Exit(0) }\n", nil},
	}
	for _, c := range cases {
		if d := cmp.Diff(c.want, ExitingInits(c.patch, nil), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
	}
}

// In a Go file the patch changes, only the lines it adds are the agent's:
// an exit it adds to an init, a package-level variable's initializer or a
// function one of them calls ends the binary; the repository's own do not
// count (a gold patch touching a file with one still resolves).
func TestExitingInitsReadTheLinesAPatchAddsToAnExistingFile(t *testing.T) {
	const base = "package calc\n\nimport \"os\"\n\nfunc init() {\n\tif os.Getenv(\"X\") == \"1\" {\n\t\tos.Exit(3)\n\t}\n\tsetup()\n}\n\nfunc setup() {}\n\nfunc Abs(x int) int { return x }\n"
	// changed is the patch of base into after (one hunk per changed line
	// is enough: only the + lines are read) and its content after it.
	changed := func(path, after string) (string, map[string]string) {
		var b strings.Builder
		b.WriteString("diff --git a/" + path + " b/" + path + "\nindex 1111111..2222222 100644\n--- a/" + path + "\n+++ b/" + path + "\n")
		old := map[string]bool{}
		for _, l := range strings.Split(base, "\n") {
			old[l] = true
		}
		for _, l := range strings.Split(after, "\n") {
			if !old[l] {
				b.WriteString("@@ -1 +1 @@\n+" + l + "\n")
			}
		}
		return b.String(), map[string]string{path: after}
	}
	cases := []struct {
		name, after string
		extra       string // a new file besides
		want        []string
	}{
		{"the fix alone", strings.Replace(base, "return x }", "if x < 0 { return -x }; return x }", 1), "", nil},
		{"an exit added to the existing init", strings.Replace(strings.Replace(base, "\tsetup()\n", "\tsetup()\n\tsyscall.Exit(0)\n", 1), "import \"os\"", "import (\n\t\"os\"\n\t\"syscall\"\n)", 1), "",
			[]string{"calc.go: init calls syscall.Exit"}},
		{"an exit added to a function the existing init calls", strings.Replace(base, "func setup() {}", "func setup() {\n\tos.Exit(0)\n}", 1), "",
			[]string{"calc.go: init calls os.Exit (through setup)"}},
		{"an exit split over lines, one of them added", strings.Replace(base, "\tsetup()\n", "\tos.\n\t\tExit(0)\n", 1), "",
			[]string{"calc.go: init calls os.Exit"}},
		{"an init added to the file", base + "\nfunc init() { os.Exit(0) }\n", "", []string{"calc.go: init calls os.Exit"}},
		{"a package-level variable added", base + "\nvar _ = func() int { os.Exit(0); return 0 }()\n", "", []string{"calc.go: a package-level variable's initializer calls os.Exit"}},
		// The whole file on its one line, with no newline at its end.
		{"a file of one line", "package calc; import \"os\"; func init() { os.Exit(0) }", "", []string{"calc.go: init calls os.Exit"}},
		{"an exit added outside any init", strings.Replace(base, "func Abs(x int) int { return x }", "func Abs(x int) int {\n\tos.Exit(0)\n\treturn x\n}", 1), "", nil},
		{"the existing init calls a function of a new file", strings.Replace(base, "\tsetup()\n", "\tsetup()\n\tleave()\n", 1),
			"diff --git a/leave.go b/leave.go\nnew file mode 100644\n--- /dev/null\n+++ b/leave.go\n@@ -0,0 +1,3 @@\n+package calc\n+import \"os\"\n+func leave() { os.Exit(0) }\n",
			[]string{"calc.go: init calls os.Exit (through leave)"}},
	}
	for _, c := range cases {
		patch, after := changed("calc.go", c.after)
		patch += c.extra
		if d := cmp.Diff(c.want, ExitingInits(patch, after), cmpopts.EquateEmpty()); d != "" {
			t.Errorf("%s (-want +got):\n%s", c.name, d)
		}
		if d := cmp.Diff([]string{"calc.go"}, ChangedGoFiles(patch)); d != "" {
			t.Errorf("%s: ChangedGoFiles (-want +got):\n%s", c.name, d)
		}
	}
	// A deleted file, a new one and a change that adds no line need no
	// content; nor does a file that is not Go.
	patch := "diff --git a/gone.go b/gone.go\ndeleted file mode 100644\n--- a/gone.go\n+++ /dev/null\n@@ -1 +0,0 @@\n-package calc\n" +
		"diff --git a/new.go b/new.go\nnew file mode 100644\n--- /dev/null\n+++ b/new.go\n@@ -0,0 +1 @@\n+package calc\n" +
		"diff --git a/cut.go b/cut.go\n--- a/cut.go\n+++ b/cut.go\n@@ -1,2 +1 @@\n package calc\n-var x = 1\n" +
		"diff --git a/a.txt b/a.txt\n--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-a\n+b\n"
	if got := ChangedGoFiles(patch); len(got) != 0 {
		t.Errorf("ChangedGoFiles = %v, want none", got)
	}
}

func TestSmallHelpers(t *testing.T) {
	if d := cmp.Diff([]string{"a", "b"}, FirstN([]string{"a", "b", "c"}, 2)); d != "" {
		t.Errorf("FirstN cut (-want +got):\n%s", d)
	}
	if d := cmp.Diff([]string{"a", "b"}, FirstN([]string{"a", "b"}, 2)); d != "" {
		t.Errorf("FirstN at its length (-want +got):\n%s", d)
	}
	st := Statuses{"TestB": StatusFailed}
	if !AnyListed(nil, []string{"TestA", "TestB"}, st) || !AnyListed([]string{"TestB"}, nil, st) || AnyListed([]string{"TestA"}, []string{"TestC"}, st) {
		t.Error("AnyListed")
	}
	ex := []Excluded{{Path: "z_test.go"}, {Path: "a/vendor/x.go"}}
	if d := cmp.Diff([]string{"a/vendor/x.go", "z_test.go"}, ExcludedPaths(ex)); d != "" {
		t.Errorf("ExcludedPaths (-want +got):\n%s", d)
	}
	for _, name := range []string{"", "auto", "parse_log_gotest", "pytest", "cargo"} {
		if err := CheckParser(name); err != nil {
			t.Errorf("CheckParser(%q): %v", name, err)
		}
	}
	if err := CheckParser("cobol"); err == nil {
		t.Error("CheckParser took an unknown parser")
	}
}
