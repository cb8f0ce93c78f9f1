package swebench

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// GradingTime is how long the reply's grading took (its
// patch_verification_time_taken); zero when no grading ran. The server
// binary records it in its metrics.
func (r VerifyResult) GradingTime() time.Duration {
	return time.Duration(r.PatchVerificationTimeTaken * float64(time.Second))
}

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

// goToolchain is what the grader learned of a sandbox's Go before any code
// of the patch ran: whether the repository is a Go module, and the version
// of the go command there.
type goToolchain struct {
	module  bool
	version string
}

// probeGo asks the sandbox, before the patch is applied, whether its
// repository is a Go module and which go runs there.
func probeGo(ctx context.Context, p provider.Provider, h provider.Handle) (goToolchain, error) {
	res, err := run(ctx, p, h, `[ -f go.mod ] || exit 0; echo module; go env GOVERSION 2>/dev/null || true`, nil, 2*time.Minute)
	if err != nil {
		return goToolchain{}, err
	}
	var tc goToolchain
	for _, line := range strings.Split(res.Stdout, "\n") {
		switch line = strings.TrimSpace(line); {
		case line == "module":
			tc.module = true
		case strings.Contains(line, "go1."):
			tc.version = line
		}
	}
	return tc, nil
}

// framing is the framing rule of a row's log on this toolchain: Go's when
// the repository is a Go module with a go command and the row's parser is
// Go's (or automatic).
func (tc goToolchain) framing(logParser string) string {
	switch strings.ToLower(strings.TrimSpace(logParser)) {
	case "", "auto", "go", "gotest", "go_test", "parse_log_gotest", "parse_log_go":
	default:
		return FramingLog
	}
	if !tc.module || tc.version == "" {
		return FramingLog
	}
	if MarksFraming(tc.version) {
		return FramingMarked
	}
	return FramingUnmarked
}

// Outcome is what a log says of a row's tests under a framing.
type Outcome struct {
	Statuses Statuses
	// Forged are listed tests whose only claims were output, not results
	// of the test binary.
	Forged []string
}

// ReadOutcome reads the row's results from an eval log under framing: the
// marked test section first, the whole log when that has no listed test.
func ReadOutcome(row Row, framing, log string) (Outcome, error) {
	if framing == FramingLog {
		st, err := ParseLog(row.LogParser, log)
		return Outcome{Statuses: st}, err
	}
	read := func(text string) Outcome {
		f := ParseGoTestFraming(text, framing == FramingMarked)
		return Outcome{Statuses: f.Statuses, Forged: f.Forged(row.FailToPass, row.PassToPass)}
	}
	if section, ok := TestSection(log); ok {
		if o := read(section); anyListed(row, o.Statuses) {
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
// is tampering, never resolved.
func Decide(row Row, o Outcome, exits []string) Verdict {
	ts, resolved := Resolve(row.FailToPass, row.PassToPass, o.Statuses)
	v := Verdict{Tests: ts, Resolved: resolved}
	var reasons []string
	if len(exits) > 0 {
		v.Resolved = false
		reasons = append(reasons, "the patch adds code that ends the test binary before or instead of its tests: "+strings.Join(firstN(exits, 5), "; "))
	}
	if len(o.Forged) > 0 && !v.Resolved {
		reasons = append(reasons, fmt.Sprintf("the tests' output claimed results the test binary did not report (outside its framing, or without a run) for %s", strings.Join(firstN(o.Forged, 10), ", ")))
	}
	if len(reasons) > 0 {
		v.Kind, v.Reason = FailureTampering, strings.Join(reasons, "; ")
	}
	return v
}
