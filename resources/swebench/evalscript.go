package swebench

import (
	"fmt"
	"sort"
	"strings"

	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// shQuote quotes s for a POSIX shell.
func shQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// heredocDelimiter returns a here-document delimiter that is no line of body.
func heredocDelimiter(body string) string {
	lines := map[string]bool{}
	for _, l := range strings.Split(body, "\n") {
		lines[strings.TrimRight(l, "\r")] = true
	}
	d := "EOF_114329324912" // SWE-bench's
	for n := 0; lines[d]; n++ {
		d = fmt.Sprintf("EOF_114329324912_%d", n)
	}
	return d
}

// BuildEvalScript returns the script that grades the row in a sandbox whose
// repository is at workdir: the row's eval_script when it has one, otherwise
// SWE-bench's shape built from its test_patch and testCommand: restore the
// test files to the base commit (and remove the ones the test patch creates,
// so that a model patch touching them is overridden), apply the test patch,
// run testCommand between the ">>>>> Start Test Output" and
// ">>>>> End Test Output" markers, and restore the test files again.
func BuildEvalScript(r Row, testCommand, workdir string) (string, error) {
	if r.EvalScript != "" {
		return r.EvalScript, nil
	}
	if strings.TrimSpace(testCommand) == "" {
		return "", fmt.Errorf("%w: %s (%s): set swebench.test_commands[%q] (or [%q])", ErrNoTestCommand, r.InstanceID, r.Repo, r.Repo, r.InstanceID)
	}
	if strings.TrimSpace(r.TestPatch) == "" {
		return "", fmt.Errorf("%w: %s: no test_patch to build the eval script from", ErrInvalidRow, r.InstanceID)
	}
	var existing, created []string
	seen := map[string]bool{}
	for _, f := range grading.PatchFiles(r.TestPatch) {
		if seen[f.Path] {
			continue
		}
		seen[f.Path] = true
		if f.New {
			created = append(created, f.Path)
		} else {
			existing = append(existing, f.Path)
		}
	}
	sort.Strings(existing)
	sort.Strings(created)
	testPatch := r.TestPatch
	if !strings.HasSuffix(testPatch, "\n") {
		testPatch += "\n"
	}
	delim := heredocDelimiter(testPatch)
	quote := func(paths []string) string {
		q := make([]string, len(paths))
		for i, p := range paths {
			q[i] = shQuote(p)
		}
		return strings.Join(q, " ")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "#!/bin/bash\nset -uxo pipefail\ncd %s\n", shQuote(workdir))
	fmt.Fprintf(&b, "git -c core.fileMode=false diff %s\n", r.BaseCommit)
	if len(existing) > 0 {
		fmt.Fprintf(&b, "git checkout %s -- %s\n", r.BaseCommit, quote(existing))
	}
	if len(created) > 0 {
		fmt.Fprintf(&b, "rm -rf -- %s\n", quote(created))
	}
	fmt.Fprintf(&b, "git apply --verbose - <<'%s'\n%s%s\n", delim, testPatch, delim)
	fmt.Fprintf(&b, "echo %s\n%s\necho %s\n", shQuote(grading.StartTestOutput), testCommand, shQuote(grading.EndTestOutput))
	if len(existing) > 0 {
		fmt.Fprintf(&b, "git checkout %s -- %s\n", r.BaseCommit, quote(existing))
	}
	return b.String(), nil
}
