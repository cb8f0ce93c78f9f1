package grading

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// ErrUnknownLogParser: a row names a log parser this package lacks.
var ErrUnknownLogParser = errors.New("swebench: unknown log parser")

// Status is a test's outcome in a log, in SWE-bench's vocabulary.
type Status string

// The outcomes a parser reports.
const (
	StatusPassed  Status = "PASSED"
	StatusFailed  Status = "FAILED"
	StatusSkipped Status = "SKIPPED"
	StatusError   Status = "ERROR"
	StatusXFail   Status = "XFAIL"
)

// severity orders statuses for a test reported more than once: the worst
// report wins, so a test that failed once is failed however often a line
// claims it passed (a test printing a fake "--- PASS" line cannot hide its
// real failure).
func severity(s Status) int {
	switch s {
	case StatusSkipped:
		return 0
	case StatusPassed:
		return 1
	case StatusXFail:
		return 2
	case StatusFailed:
		return 3
	case StatusError:
		return 4
	}
	return -1
}

// Statuses maps test names to their outcomes.
type Statuses map[string]Status

func (m Statuses) add(name string, s Status) {
	if old, ok := m[name]; !ok || severity(s) > severity(old) {
		m[name] = s
	}
}

// Names returns the tests, sorted.
func (m Statuses) Names() []string {
	out := make([]string, 0, len(m))
	for n := range m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// The markers SWE-bench's eval scripts print around the tests' output.
const (
	StartTestOutput = ">>>>> Start Test Output"
	EndTestOutput   = ">>>>> End Test Output"
)

// TestSection returns the part of log between the start and end markers
// (from the line after the first start marker to the line of the first end
// marker after it; to the end of the log without one). ok is false when the
// log has no start marker.
func TestSection(log string) (section string, ok bool) {
	i := strings.Index(log, StartTestOutput)
	if i < 0 {
		return "", false
	}
	rest := log[i+len(StartTestOutput):]
	if nl := strings.IndexByte(rest, '\n'); nl >= 0 {
		rest = rest[nl+1:]
	} else {
		rest = ""
	}
	if j := strings.Index(rest, EndTestOutput); j >= 0 {
		rest = rest[:j]
		if nl := strings.LastIndexByte(rest, '\n'); nl >= 0 {
			rest = rest[:nl+1]
		} else {
			rest = ""
		}
	}
	return rest, true
}

// CheckParser reports whether name is a log parser this package has.
func CheckParser(name string) error {
	_, err := parserFor(name)
	return err
}

// ParseLog parses an eval log with the named parser (see parserFor): first
// the marked test section, then, if that yields no test, the whole log.
func ParseLog(parserName, log string) (Statuses, error) {
	parse, err := parserFor(parserName)
	if err != nil {
		return nil, err
	}
	if section, ok := TestSection(log); ok {
		if m := parse(section); len(m) > 0 {
			return m, nil
		}
	}
	return parse(log), nil
}

type parser func(log string) Statuses

// parserFor returns the parser a row's log_parser names. SWE-bench's
// function names (parse_log_gotest, …) and short names are accepted; empty
// or "auto" runs every parser (their line formats do not overlap).
func parserFor(name string) (parser, error) {
	switch strings.ToLower(strings.TrimSpace(name)) {
	case "", "auto":
		return parseAll, nil
	case "go", "gotest", "go_test", "parse_log_gotest", "parse_log_go":
		return parseGoTest, nil
	case "pytest", "parse_log_pytest", "pytest_v2", "parse_log_pytest_v2", "parse_log_pytest_options":
		return parsePytest, nil
	case "cargo", "parse_log_cargo":
		return parseCargo, nil
	}
	return nil, fmt.Errorf("%w: %q (known: gotest, pytest, cargo, auto)", ErrUnknownLogParser, name)
}

func parseAll(log string) Statuses {
	m := Statuses{}
	for _, p := range []parser{parseGoTest, parsePytest, parseCargo} {
		for n, s := range p(log) {
			m.add(n, s)
		}
	}
	return m
}

// goTestLine is SWE-bench's parse_log_gotest pattern: "--- PASS: Name (0.00s)"
// (indented for subtests).
var goTestLine = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (.+) \((.+)\)$`)

func parseGoTest(log string) Statuses {
	return parseLines(log, goTestLine, 2, 1, map[string]Status{
		"PASS": StatusPassed, "FAIL": StatusFailed, "SKIP": StatusSkipped,
	})
}

// parseLines reads the lines (trimmed) that re matches: the test's name is
// group name, its outcome word group word, read through words.
func parseLines(log string, re *regexp.Regexp, name, word int, words map[string]Status) Statuses {
	m := Statuses{}
	for _, line := range strings.Split(log, "\n") {
		g := re.FindStringSubmatch(strings.TrimSpace(line))
		if g == nil {
			continue
		}
		if s, ok := words[g[word]]; ok {
			m.add(g[name], s)
		}
	}
	return m
}

// pytestStatuses are the outcome words pytest prints.
func pytestStatuses() [5]Status {
	return [5]Status{StatusPassed, StatusFailed, StatusSkipped, StatusError, StatusXFail}
}

// parsePytest reads pytest's -rA summary lines ("PASSED tests/x.py::test_a",
// "FAILED tests/x.py::test_b - AssertionError") as SWE-bench's
// parse_log_pytest does, and its verbose lines ("tests/x.py::test_a PASSED
// [ 50%]").
func parsePytest(log string) Statuses {
	m := Statuses{}
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimRight(line, "\r")
		for _, s := range pytestStatuses() {
			if strings.HasPrefix(line, string(s)+" ") {
				if s == StatusFailed || s == StatusError {
					line = strings.Replace(line, " - ", " ", 1)
				}
				if f := strings.Fields(line); len(f) > 1 {
					m.add(f[1], s)
				}
				break
			}
		}
		if f := strings.Fields(line); len(f) >= 2 && strings.Contains(f[0], "::") {
			for _, s := range pytestStatuses() {
				if f[1] == string(s) {
					m.add(f[0], s)
				}
			}
		}
	}
	return m
}

// cargoTestLine is libtest's "test path::name ... ok|FAILED|ignored".
var cargoTestLine = regexp.MustCompile(`^test (\S+) \.\.\. (ok|FAILED|ignored)`)

func parseCargo(log string) Statuses {
	return parseLines(log, cargoTestLine, 1, 2, map[string]Status{
		"ok": StatusPassed, "FAILED": StatusFailed, "ignored": StatusSkipped,
	})
}

// TestResults are one list's tests split by outcome.
type TestResults struct {
	Success []string `json:"success"`
	Failure []string `json:"failure"`
}

// TestsStatus is SWE-bench's tests_status report.
type TestsStatus struct {
	FailToPass TestResults `json:"FAIL_TO_PASS"`
	PassToPass TestResults `json:"PASS_TO_PASS"`
}

// Resolve applies SWE-bench's rule: resolved when every FAIL_TO_PASS and
// every PASS_TO_PASS test passed (or xfailed); a skipped one is not a
// pass. A test missing from the log is a failure; so is an empty
// FAIL_TO_PASS.
func Resolve(failToPass, passToPass []string, got Statuses) (TestsStatus, bool) {
	ts := TestsStatus{FailToPass: results(failToPass, got), PassToPass: results(passToPass, got)}
	resolved := len(failToPass) > 0 && len(ts.FailToPass.Failure) == 0 && len(ts.PassToPass.Failure) == 0
	return ts, resolved
}

// results splits names into those that passed or xfailed (SWE-bench's
// test_passed) and the rest.
func results(names []string, got Statuses) TestResults {
	r := TestResults{Success: []string{}, Failure: []string{}}
	for _, name := range names {
		switch got[name] {
		case StatusPassed, StatusXFail:
			r.Success = append(r.Success, name)
		default:
			r.Failure = append(r.Failure, name)
		}
	}
	return r
}
