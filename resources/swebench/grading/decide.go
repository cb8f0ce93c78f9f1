package grading

import (
	"fmt"
	"strings"
)

// FailureTampering: the model patch ended the test binary itself or its
// tests' output claimed results the test binary did not report; reward 0.
const FailureTampering = "test_tampering"

// Test framings (test_framing in a verify reply).
const (
	// FramingMarked: Go tests whose toolchain marks its framing; only
	// marked result lines count.
	FramingMarked = "go_marked"
	// FramingUnmarked: Go tests on a toolchain without the marker (before
	// Go 1.20); result lines count after their test's "=== RUN".
	FramingUnmarked = "go_unmarked"
	// FramingLog: the row's log parser reads the whole log.
	FramingLog = "log"
)

// Outcome is what a log says of a row's tests under a framing.
type Outcome struct {
	Statuses Statuses
	// Forged are listed tests whose only claims were output, not results
	// of the test binary.
	Forged []string
	// Abnormal are the runs of test binaries that reported a listed test
	// and did not end through the testing package's own end: what each
	// printed may be its code's, not the testing package's.
	Abnormal []string
}

// ReadOutcome reads the results of the listed tests (failToPass,
// passToPass) from an eval log under framing: the marked test section
// first, the whole log when that has no listed test. logParser is the
// row's, for FramingLog.
func ReadOutcome(logParser string, failToPass, passToPass []string, framing, log string) (Outcome, error) {
	if framing == FramingLog {
		st, err := ParseLog(logParser, log)
		return Outcome{Statuses: st}, err
	}
	read := func(text string) Outcome {
		f := ParseGoTestFraming(text, framing == FramingMarked)
		return Outcome{Statuses: f.Statuses, Forged: f.Forged(failToPass, passToPass), Abnormal: f.abnormal(failToPass, passToPass)}
	}
	if section, ok := TestSection(log); ok {
		if o := read(section); AnyListed(failToPass, passToPass, o.Statuses) {
			return o, nil
		}
	}
	return read(log), nil
}

// Verdict is the grading's decision from the outcome and the patch.
type Verdict struct {
	Tests    TestsStatus
	Resolved bool
	// Kind and Reason are the failure_kind and failure_reason of a
	// grading the agent's code tampered with ("" otherwise).
	Kind, Reason string
}

// Decide applies SWE-bench's rule to the outcome, and the grader's: a patch
// whose added files end the test binary from an init or TestMain (exits),
// or whose tests' output claimed listed results the binary did not report,
// or whose test binary reported listed results and did not end through the
// testing package's own end, is tampering, never resolved.
func Decide(failToPass, passToPass []string, o Outcome, exits []string) Verdict {
	ts, resolved := Resolve(failToPass, passToPass, o.Statuses)
	v := Verdict{Tests: ts, Resolved: resolved}
	var reasons []string
	if len(exits) > 0 {
		v.Resolved = false
		reasons = append(reasons, "the patch adds code that ends the test binary before or instead of its tests: "+strings.Join(FirstN(exits, 5), "; "))
	}
	if len(o.Abnormal) > 0 && v.Resolved {
		v.Resolved = false
		reasons = append(reasons, "a test binary that reported listed tests did not end through the testing package's own end, so nothing it printed is trusted: "+strings.Join(FirstN(o.Abnormal, 5), "; "))
	}
	if len(o.Forged) > 0 && !v.Resolved {
		reasons = append(reasons, fmt.Sprintf("the tests' output claimed results the test binary did not report (outside its framing, or without a run) for %s", strings.Join(FirstN(o.Forged, 10), ", ")))
	}
	if len(reasons) > 0 {
		v.Kind, v.Reason = FailureTampering, strings.Join(reasons, "; ")
	}
	return v
}

// abnormal describes the runs of f that reported a listed test and did not
// end through the testing package's own end.
func (f GoTestFraming) abnormal(listed ...[]string) []string {
	want := map[string]bool{}
	for _, l := range listed {
		for _, n := range l {
			want[n] = true
		}
	}
	var out []string
	for _, b := range f.Binaries {
		why := b.Abnormal()
		if why == "" {
			continue
		}
		for _, n := range b.Tests {
			if want[n] {
				out = append(out, fmt.Sprintf("the test binary run in %s: %s", b.Dir, why))
				break
			}
		}
	}
	return out
}

// AnyListed reports whether statuses has a result for any listed test.
func AnyListed(failToPass, passToPass []string, statuses Statuses) bool {
	for _, l := range [][]string{failToPass, passToPass} {
		for _, name := range l {
			if _, ok := statuses[name]; ok {
				return true
			}
		}
	}
	return false
}

// FirstN is s cut to its first n elements.
func FirstN(s []string, n int) []string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
