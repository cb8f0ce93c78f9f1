package grading

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseGoTestLog(t *testing.T) {
	log := `=== RUN   TestAdd
--- PASS: TestAdd (0.00s)
=== RUN   TestDiv
    calc_test.go:12: got 0, want 2
--- FAIL: TestDiv (0.01s)
=== RUN   TestTable
=== RUN   TestTable/zero
    --- PASS: TestTable/zero (0.00s)
    --- SKIP: TestTable/big (0.00s)
--- PASS: TestTable (0.00s)
FAIL
FAIL	example.com/calc	0.012s
`
	got, err := ParseLog("gotest", log)
	if err != nil {
		t.Fatal(err)
	}
	want := Statuses{"TestAdd": StatusPassed, "TestDiv": StatusFailed, "TestTable": StatusPassed,
		"TestTable/zero": StatusPassed, "TestTable/big": StatusSkipped}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
}

func TestParsePytestLog(t *testing.T) {
	log := `============================= test session starts ==============================
tests/test_x.py::test_a PASSED                                           [ 25%]
tests/test_x.py::test_b FAILED                                           [ 50%]
=========================== short test summary info ============================
PASSED tests/test_x.py::test_a
PASSED tests/test_x.py::test_c[1-2]
SKIPPED tests/test_x.py::test_d
XFAIL tests/test_x.py::test_e - reason
FAILED tests/test_x.py::test_b - AssertionError: boom
ERROR tests/test_x.py::test_f - fixture missing
`
	got, err := ParseLog("parse_log_pytest", log)
	if err != nil {
		t.Fatal(err)
	}
	want := Statuses{"tests/test_x.py::test_a": StatusPassed, "tests/test_x.py::test_b": StatusFailed,
		"tests/test_x.py::test_c[1-2]": StatusPassed, "tests/test_x.py::test_d": StatusSkipped,
		"tests/test_x.py::test_e": StatusXFail, "tests/test_x.py::test_f": StatusError}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
}

// Lines SWE-bench's parse_log_pytest reads its own way: a FAILED or ERROR
// summary line loses its first " - " before it is split (a PASSED one
// does not), a status word alone is no test, and a verbose line needs no
// percentage after its status.
func TestParsePytestLogQuirks(t *testing.T) {
	log := "FAILED - tests/x.py::t_f\nERROR - tests/x.py::t_e\nPASSED - tests/x.py::t_p\nPASSED \ntests/x.py::t_v SKIPPED\n"
	got, err := ParseLog("pytest", log)
	if err != nil {
		t.Fatal(err)
	}
	want := Statuses{"tests/x.py::t_f": StatusFailed, "tests/x.py::t_e": StatusError, "-": StatusPassed, "tests/x.py::t_v": StatusSkipped}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
}

func TestParseCargoLog(t *testing.T) {
	log := "running 3 tests\ntest a::ok_one ... ok\ntest a::bad ... FAILED\ntest b::later ... ignored\n"
	got, err := ParseLog("cargo", log)
	if err != nil {
		t.Fatal(err)
	}
	want := Statuses{"a::ok_one": StatusPassed, "a::bad": StatusFailed, "b::later": StatusSkipped}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
}

func TestParseLogReadsTheMarkedSection(t *testing.T) {
	// The set -x trace puts the marker in a trace line before the echo's
	// own line; test lines outside the markers (the eval script's git
	// output, a fake line printed before the tests) are not read.
	log := `+ git apply --verbose -
--- PASS: TestOutside (0.00s)
+ echo '>>>>> Start Test Output'
>>>>> Start Test Output
+ go test -v ./...
--- FAIL: TestInside (0.00s)
+ echo '>>>>> End Test Output'
>>>>> End Test Output
--- PASS: TestAfter (0.00s)
`
	got, err := ParseLog("", log)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(Statuses{"TestInside": StatusFailed}, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
	// Markers without a test between them: the whole log is parsed.
	log = ">>>>> Start Test Output\n>>>>> End Test Output\n--- PASS: TestLate (0.00s)\n"
	got, _ = ParseLog("gotest", log)
	if d := cmp.Diff(Statuses{"TestLate": StatusPassed}, got); d != "" {
		t.Errorf("fallback statuses (-want +got):\n%s", d)
	}
	// No markers at all: the whole log.
	got, _ = ParseLog("gotest", "--- PASS: TestX (1.2s)\n")
	if d := cmp.Diff(Statuses{"TestX": StatusPassed}, got); d != "" {
		t.Errorf("unmarked statuses (-want +got):\n%s", d)
	}
}

func TestTheWorstReportOfATestWins(t *testing.T) {
	log := "--- FAIL: TestBug (0.00s)\n--- PASS: TestBug (0.00s)\n--- SKIP: TestS (0.00s)\n--- PASS: TestS (0.00s)\n"
	got, _ := ParseLog("gotest", log)
	if d := cmp.Diff(Statuses{"TestBug": StatusFailed, "TestS": StatusPassed}, got); d != "" {
		t.Errorf("statuses (-want +got):\n%s", d)
	}
}

func TestUnknownParser(t *testing.T) {
	if _, err := ParseLog("parse_log_cobol", ""); !errors.Is(err, ErrUnknownLogParser) {
		t.Errorf("err = %v, want ErrUnknownLogParser", err)
	}
}

func TestResolve(t *testing.T) {
	got := Statuses{"F1": StatusPassed, "F2": StatusXFail, "P1": StatusPassed, "P2": StatusSkipped,
		"Fbad": StatusFailed, "Pbad": StatusError, "Fskip": StatusSkipped}
	cases := []struct {
		name     string
		f2p, p2p []string
		want     TestsStatus
		resolved bool
	}{
		{"all good", []string{"F1", "F2"}, []string{"P1"}, TestsStatus{
			FailToPass: TestResults{Success: []string{"F1", "F2"}, Failure: []string{}},
			PassToPass: TestResults{Success: []string{"P1"}, Failure: []string{}},
		}, true},
		// SWE-bench's test_passed: only PASSED and XFAIL pass.
		{"a skipped PASS_TO_PASS is not a pass", []string{"F1"}, []string{"P1", "P2"}, TestsStatus{
			FailToPass: TestResults{Success: []string{"F1"}, Failure: []string{}},
			PassToPass: TestResults{Success: []string{"P1"}, Failure: []string{"P2"}},
		}, false},
		{"a FAIL_TO_PASS failed", []string{"F1", "Fbad"}, nil, TestsStatus{
			FailToPass: TestResults{Success: []string{"F1"}, Failure: []string{"Fbad"}},
			PassToPass: TestResults{Success: []string{}, Failure: []string{}},
		}, false},
		{"a skipped FAIL_TO_PASS is not a pass", []string{"Fskip"}, nil, TestsStatus{
			FailToPass: TestResults{Success: []string{}, Failure: []string{"Fskip"}},
			PassToPass: TestResults{Success: []string{}, Failure: []string{}},
		}, false},
		{"a missing test is a failure", []string{"F1", "Gone"}, []string{"AlsoGone"}, TestsStatus{
			FailToPass: TestResults{Success: []string{"F1"}, Failure: []string{"Gone"}},
			PassToPass: TestResults{Success: []string{}, Failure: []string{"AlsoGone"}},
		}, false},
		{"a PASS_TO_PASS errored", []string{"F1"}, []string{"Pbad"}, TestsStatus{
			FailToPass: TestResults{Success: []string{"F1"}, Failure: []string{}},
			PassToPass: TestResults{Success: []string{}, Failure: []string{"Pbad"}},
		}, false},
		{"no FAIL_TO_PASS is never resolved", nil, []string{"P1"}, TestsStatus{
			FailToPass: TestResults{Success: []string{}, Failure: []string{}},
			PassToPass: TestResults{Success: []string{"P1"}, Failure: []string{}},
		}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ts, resolved := Resolve(c.f2p, c.p2p, got)
			if d := cmp.Diff(c.want, ts); d != "" {
				t.Errorf("tests_status (-want +got):\n%s", d)
			}
			if resolved != c.resolved {
				t.Errorf("resolved = %v, want %v", resolved, c.resolved)
			}
		})
	}
}

func TestTestSection(t *testing.T) {
	sec, ok := TestSection("a\n>>>>> Start Test Output\nb\nc\n>>>>> End Test Output\nd\n")
	if !ok || sec != "b\nc\n" {
		t.Errorf("section = %q, %v", sec, ok)
	}
	sec, ok = TestSection("a\n>>>>> Start Test Output\nb\n")
	if !ok || sec != "b\n" {
		t.Errorf("unterminated section = %q, %v", sec, ok)
	}
	if _, ok := TestSection("nothing"); ok {
		t.Error("a log without markers has a section")
	}
	if !strings.Contains(StartTestOutput, ">>>>>") {
		t.Error("marker changed")
	}
}

// TestSeverityOrder: of two reports of a test the worse wins, in the order
// skipped < passed < xfail < failed < error, and an unknown status loses to
// all of them.
func TestSeverityOrder(t *testing.T) {
	order := []Status{"UNKNOWN", StatusSkipped, StatusPassed, StatusXFail, StatusFailed, StatusError}
	for i, a := range order {
		for j, b := range order {
			m := Statuses{}
			m.add("T", a)
			m.add("T", b)
			want := a
			if j > i {
				want = b
			}
			if m["T"] != want {
				t.Errorf("%s then %s: %s, want %s", a, b, m["T"], want)
			}
		}
	}
}

func TestTestSectionEdges(t *testing.T) {
	cases := []struct {
		log, want string
		ok        bool
	}{
		{StartTestOutput, "", true},                                // the marker ends the log
		{StartTestOutput + "\nx" + EndTestOutput + "\n", "", true}, // the end marker on a line of output
		{StartTestOutput + "\nx\ny" + EndTestOutput, "x\n", true},  // the part of the end marker's line before it is cut
		{StartTestOutput + " trailing\nx\n" + EndTestOutput, "x\n", true},
		{EndTestOutput + "\n" + StartTestOutput + "\nx\n", "x\n", true},  // an end before the start is not its end
		{StartTestOutput + "\n" + EndTestOutput + "\nafter\n", "", true}, // an empty section
		{StartTestOutput + "\n\n" + EndTestOutput, "\n", true},           // a section of one empty line
	}
	for _, c := range cases {
		if got, ok := TestSection(c.log); got != c.want || ok != c.ok {
			t.Errorf("TestSection(%q) = %q, %v; want %q, %v", c.log, got, ok, c.want, c.ok)
		}
	}
	got := Statuses{"TestB": StatusPassed, "TestA": StatusFailed}.Names()
	if d := cmp.Diff([]string{"TestA", "TestB"}, got); d != "" {
		t.Errorf("Names (-want +got):\n%s", d)
	}
}
