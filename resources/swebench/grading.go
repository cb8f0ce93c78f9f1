package swebench

import (
	"context"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// GradingTime is how long the reply's grading took (its
// patch_verification_time_taken); zero when no grading ran. The server
// binary records it in its metrics.
func (r VerifyResult) GradingTime() time.Duration {
	return time.Duration(r.PatchVerificationTimeTaken * float64(time.Second))
}

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
		return grading.FramingLog
	}
	if !tc.module || tc.version == "" {
		return grading.FramingLog
	}
	if grading.MarksFraming(tc.version) {
		return grading.FramingMarked
	}
	return grading.FramingUnmarked
}

// ReadOutcome reads the row's results from an eval log under framing: the
// marked test section first, the whole log when that has no listed test.
func ReadOutcome(row Row, framing, log string) (grading.Outcome, error) {
	return grading.ReadOutcome(row.LogParser, row.FailToPass, row.PassToPass, framing, log)
}

// Decide applies grading.Decide to the row's lists.
func Decide(row Row, o grading.Outcome, exits []string) grading.Verdict {
	return grading.Decide(row.FailToPass, row.PassToPass, o, exits)
}
