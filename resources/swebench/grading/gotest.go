package grading

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// framingMarker is the byte (^V) with which the testing package of a
// toolchain that has it starts every line of its own framing ("=== RUN",
// "--- PASS: …", the final "PASS") when the test binary runs with
// -test.v=test2json: output a test, an init or a TestMain prints cannot be
// told from framing without it.
const framingMarker = '\x16'

// framingMarkedSince is the first Go release whose testing package marks its
// framing (and accepts -test.v=test2json at all).
const framingMarkedSince = "go1.20"

// The lines the eval prelude's go test prints around each test binary it
// runs: BinaryRunLine and the binary's directory before it starts,
// BinaryExitLine, the binary's exit status and its output relay's, after it
// ended. The relay puts a space before any line of the binary's output
// that starts with two markers, so a test binary cannot print either line:
// what lies between them is that binary's output, and the exit line is the
// shell's word on how it ended.
const (
	BinaryRunLine  = "\x16\x16ng-run\t"
	BinaryExitLine = "\x16\x16ng-exit\t"
)

// GoTestFraming is what a Go test log shows under the grader's rules: a
// result counts only when it is framing of the test binary (marked, when
// the toolchain marks) and the test's "=== RUN" came before it, in the same
// binary's run where the log marks binaries' runs.
type GoTestFraming struct {
	Statuses Statuses
	// Unframed are the tests that a result line outside the toolchain's
	// framing (no marker) claimed: output, not results.
	Unframed []string
	// NotRun are the tests a framing result named that no "=== RUN"
	// before it started.
	NotRun []string
	// Binaries are the test binaries' runs the log marks, in order.
	Binaries []BinaryRun
}

// BinaryRun is one test binary's run, between its run and exit lines.
type BinaryRun struct {
	Dir string
	// Ended: the exit line came; Exit and Relay are the binary's and its
	// output relay's exit statuses from it.
	Ended       bool
	Exit, Relay string
	// Last is the binary's last marked framing line (the testing
	// package's own end prints "PASS" or "FAIL" last).
	Last string
	// Tests are the tests whose results counted in this run.
	Tests []string
}

// failedAfterPass is why a run that ended with status 1 after a final
// PASS is not trusted (Abnormal).
const failedAfterPass = "it ended with exit status 1 after the testing package's PASS (a TestMain's check after the tests, " +
	"a leak check say, or code of the binary that turned its FAILs into PASSes: the log cannot tell them apart, " +
	"so, unlike upstream, which reads only the result lines, its results do not count)"

// Abnormal says how the run did not end through the testing package's own
// end ("" when it did): the exit line missing (the shell that ran it or the
// log's filter was killed), the relay failed, an exit status other than 0
// or 1 (a panic, a signal), no final PASS or FAIL as the last marked line,
// or a status that is not the final line's (0 after PASS, 1 after FAIL).
// Code of the binary can print the marked framing itself: a run that ended
// otherwise than the testing package ends one proves nothing of what it
// printed. That holds for status 1 after a final PASS too, where upstream
// SWE-bench, which reads only the result lines, counts the tests: a
// TestMain of the repository's that fails its binary after its tests
// passed (a leak check) ends it so, and so does code of the binary that
// turns the testing package's FAILs into PASSes on their way to its stdout
// (a pipe of its own made fd 1), the testing package then ending it with
// its own status 1. Accepting the first would reward the second, which
// needs no exit of its own that a check could see.
func (b BinaryRun) Abnormal() string {
	switch {
	case !b.Ended:
		return "its run has no end in the log (the shell that ran it, or the log's filter, was stopped)"
	case b.Relay != "0":
		return "its output's relay ended with status " + b.Relay
	case b.Exit != "0" && b.Exit != "1":
		if n, err := strconv.Atoi(b.Exit); err == nil && n > 128 {
			return fmt.Sprintf("it was killed by signal %d", n-128)
		}
		return "it ended with exit status " + b.Exit + " (2: a panic)"
	case b.Last != "PASS" && b.Last != "FAIL":
		return "it ended without the testing package's final PASS or FAIL"
	case b.Exit == "1" && b.Last == "PASS":
		return failedAfterPass
	case (b.Exit == "0") != (b.Last == "PASS"):
		return "it ended with exit status " + b.Exit + " after the testing package's " + b.Last
	}
	return ""
}

// ParseGoTestFraming reads the results of a Go test log. marked says that
// the toolchain marks its framing: only marked lines are framing then, and
// any other line is output, however it looks. A result line ("--- PASS: X
// (0.00s)", indented for subtests) counts only after X's "=== RUN" line.
func ParseGoTestFraming(log string, marked bool) GoTestFraming {
	f := GoTestFraming{Statuses: Statuses{}}
	ran := map[string]bool{}
	unframed, notRun := map[string]bool{}, map[string]bool{}
	var cur *BinaryRun
	for _, line := range strings.Split(log, "\n") {
		line = strings.TrimRight(line, "\r")
		if dir, ok := strings.CutPrefix(line, BinaryRunLine); ok {
			f.Binaries = append(f.Binaries, BinaryRun{Dir: dir})
			cur, ran = &f.Binaries[len(f.Binaries)-1], map[string]bool{}
			continue
		}
		if st, ok := strings.CutPrefix(line, BinaryExitLine); ok {
			if cur != nil {
				cur.Ended = true
				cur.Exit, cur.Relay, _ = strings.Cut(st, "\t")
			}
			cur, ran = nil, map[string]bool{}
			continue
		}
		isMarked := strings.HasPrefix(line, string(framingMarker))
		line = strings.TrimPrefix(line, string(framingMarker))
		if isMarked && cur != nil {
			cur.Last = line
		}
		line = strings.TrimLeft(line, " \t")
		if name, ok := strings.CutPrefix(line, "=== RUN   "); ok {
			if isMarked || !marked {
				ran[name] = true
			}
			continue
		}
		g := goTestLine.FindStringSubmatch(line)
		if g == nil {
			continue
		}
		name := g[2]
		switch {
		case marked && !isMarked:
			unframed[name] = true
		case !ran[name]:
			notRun[name] = true
		default:
			f.Statuses.add(name, goStatus(g[1]))
			if cur != nil {
				cur.Tests = append(cur.Tests, name)
			}
		}
	}
	f.Unframed, f.NotRun = sortedSet(unframed), sortedSet(notRun)
	return f
}

func goStatus(word string) Status {
	switch word {
	case "PASS":
		return StatusPassed
	case "SKIP":
		return StatusSkipped
	}
	return StatusFailed
}

func sortedSet(m map[string]bool) []string {
	if len(m) == 0 {
		return nil
	}
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Forged returns the listed tests whose only claims were forged (outside
// the framing, or without a run) and that have no counted result.
func (f GoTestFraming) Forged(listed ...[]string) []string {
	claimed := map[string]bool{}
	for _, n := range f.Unframed {
		claimed[n] = true
	}
	for _, n := range f.NotRun {
		claimed[n] = true
	}
	var out []string
	seen := map[string]bool{}
	for _, l := range listed {
		for _, n := range l {
			if _, counted := f.Statuses[n]; claimed[n] && !counted && !seen[n] {
				seen[n] = true
				out = append(out, n)
			}
		}
	}
	sort.Strings(out)
	return out
}

// MarksFraming reports whether the toolchain of `go env GOVERSION` (such as
// "go1.24.3", "go1.25rc1" or "devel go1.26-abcdef") marks its test framing.
// An unknown version is taken to mark: a toolchain new enough to be unknown
// is newer than the marker.
func MarksFraming(goVersion string) bool {
	v := strings.TrimSpace(goVersion)
	if i := strings.Index(v, "go1."); i >= 0 {
		v = v[i:]
	} else {
		return true
	}
	major, minor, ok := goMinor(v)
	sinceMajor, sinceMinor, _ := goMinor(framingMarkedSince)
	if !ok {
		return true
	}
	return major > sinceMajor || (major == sinceMajor && minor >= sinceMinor)
}

// goMinor reads "go1.N…" as (1, N).
func goMinor(v string) (int, int, bool) {
	rest, ok := strings.CutPrefix(v, "go1.")
	if !ok {
		return 0, 0, false
	}
	end := 0
	for end < len(rest) && rest[end] >= '0' && rest[end] <= '9' {
		end++
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil {
		return 0, 0, false
	}
	return 1, n, true
}
