package swebench

import "github.com/sandboxowner/owner/resources/swebench/grading"

// The grading decisions (log parsing, test2json framing, the guard, the
// verdict) live in package grading, whose tests reach them in seconds; these
// are their names here, where the server, its config and its replies use
// them.
type (
	Status        = grading.Status
	Statuses      = grading.Statuses
	TestResults   = grading.TestResults
	TestsStatus   = grading.TestsStatus
	GoTestFraming = grading.GoTestFraming
	Guard         = grading.Guard
	Excluded      = grading.Excluded
	Outcome       = grading.Outcome
	Verdict       = grading.Verdict
	PatchFile     = grading.PatchFile
)

// Test statuses.
const (
	StatusPassed  = grading.StatusPassed
	StatusFailed  = grading.StatusFailed
	StatusSkipped = grading.StatusSkipped
	StatusError   = grading.StatusError
	StatusXFail   = grading.StatusXFail
)

// Failure kinds, framings and exclusion reasons of package grading.
const (
	FailureTampering = grading.FailureTampering
	FramingMarked    = grading.FramingMarked
	FramingUnmarked  = grading.FramingUnmarked
	FramingLog       = grading.FramingLog
	ExcludedTestFile = grading.ExcludedTestFile
	ExcludedVendor   = grading.ExcludedVendor
	ExcludedModule   = grading.ExcludedModule
	ExcludedPath     = grading.ExcludedPath
	StartTestOutput  = grading.StartTestOutput
	EndTestOutput    = grading.EndTestOutput
)

// ParseLog is grading.ParseLog.
func ParseLog(parserName, log string) (Statuses, error) { return grading.ParseLog(parserName, log) }

// TestSection is grading.TestSection.
func TestSection(log string) (string, bool) { return grading.TestSection(log) }

// Resolve is grading.Resolve.
func Resolve(failToPass, passToPass []string, got Statuses) (TestsStatus, bool) {
	return grading.Resolve(failToPass, passToPass, got)
}

// ParseGoTestFraming is grading.ParseGoTestFraming.
func ParseGoTestFraming(log string, marked bool) GoTestFraming {
	return grading.ParseGoTestFraming(log, marked)
}

// MarksFraming is grading.MarksFraming.
func MarksFraming(goVersion string) bool { return grading.MarksFraming(goVersion) }

// ExitingInits is grading.ExitingInits.
func ExitingInits(patch string) []string { return grading.ExitingInits(patch) }

// PatchFiles is grading.PatchFiles.
func PatchFiles(patch string) []PatchFile { return grading.PatchFiles(patch) }

// DefaultProtectedModules is grading.DefaultProtectedModules.
func DefaultProtectedModules() []string { return grading.DefaultProtectedModules() }

func excludedPaths(ex []Excluded) []string { return grading.ExcludedPaths(ex) }
