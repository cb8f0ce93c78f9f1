package swebench

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// PatchFile is one file a unified diff touches.
type PatchFile struct {
	// Path is the file's path in the repository (b/ side; the a/ side for a
	// deletion).
	Path string
	// New: the diff creates the file (it is not at the base commit).
	New bool
	// Deleted: the diff deletes the file.
	Deleted bool
}

// PatchFiles lists the files a git diff touches, in order of appearance.
func PatchFiles(patch string) []PatchFile {
	var out []PatchFile
	for _, sec := range splitSections(patch) {
		if sec.path == "" {
			continue
		}
		out = append(out, PatchFile{Path: sec.path, New: sec.isNew, Deleted: sec.deleted})
	}
	return out
}

// section is one "diff --git" section of a patch.
type section struct {
	text    string
	path    string
	oldPath string
	isNew   bool
	deleted bool
}

// splitSections splits a git diff at its "diff --git" lines; text before the
// first one is a section without a path.
func splitSections(patch string) []section {
	var secs []section
	var cur *section
	var b strings.Builder
	flush := func() {
		if cur != nil {
			cur.text = b.String()
			secs = append(secs, *cur)
		} else if b.Len() > 0 {
			secs = append(secs, section{text: b.String()})
		}
		b.Reset()
	}
	inHeader := false
	for _, line := range strings.SplitAfter(patch, "\n") {
		if line == "" {
			continue
		}
		trimmed := strings.TrimRight(line, "\r\n")
		if strings.HasPrefix(trimmed, "diff --git ") {
			flush()
			a, bp := diffGitPaths(strings.TrimPrefix(trimmed, "diff --git "))
			cur = &section{path: bp, oldPath: a}
			inHeader = true
		} else if cur != nil && inHeader {
			switch {
			case strings.HasPrefix(trimmed, "new file mode"):
				cur.isNew = true
			case strings.HasPrefix(trimmed, "deleted file mode"):
				cur.deleted = true
			case strings.HasPrefix(trimmed, "--- /dev/null"):
				cur.isNew = true
			case strings.HasPrefix(trimmed, "+++ /dev/null"):
				cur.deleted = true
			case strings.HasPrefix(trimmed, "+++ "):
				if p := stripPrefix(unquoteGit(strings.TrimPrefix(trimmed, "+++ ")), "b/"); p != "" && cur.path == "" {
					cur.path = p
				}
			case strings.HasPrefix(trimmed, "@@"), strings.HasPrefix(trimmed, "GIT binary patch"):
				inHeader = false
			}
		}
		b.WriteString(line)
	}
	flush()
	for i := range secs {
		if secs[i].deleted && secs[i].path == "" {
			secs[i].path = secs[i].oldPath
		}
	}
	return secs
}

// diffGitPaths parses "a/X b/Y" (either side possibly C-quoted) of a
// "diff --git" line. Without renames both sides are the same path, which
// resolves the ambiguity of unquoted paths containing " b/".
func diffGitPaths(s string) (a, b string) {
	if strings.HasPrefix(s, `"`) {
		first, rest, ok := cutQuoted(s)
		if !ok {
			return "", ""
		}
		a = stripPrefix(first, "a/")
		rest = strings.TrimPrefix(rest, " ")
		if strings.HasPrefix(rest, `"`) {
			second, _, _ := cutQuoted(rest)
			return a, stripPrefix(second, "b/")
		}
		return a, stripPrefix(rest, "b/")
	}
	if n := len(s); n >= 5 && (n-5)%2 == 0 {
		half := (n - 5) / 2
		if s[:2] == "a/" && s[2+half:2+half+3] == " b/" && s[2:2+half] == s[5+half:] {
			return s[2 : 2+half], s[5+half:]
		}
	}
	if i := strings.Index(s, " b/"); i >= 0 {
		rest := s[i+1:]
		if strings.HasPrefix(rest, `"`) {
			q, _, _ := cutQuoted(rest)
			return stripPrefix(s[:i], "a/"), stripPrefix(q, "b/")
		}
		return stripPrefix(s[:i], "a/"), stripPrefix(rest, "b/")
	}
	return "", ""
}

func stripPrefix(s, p string) string {
	if strings.HasPrefix(s, p) {
		return s[len(p):]
	}
	return ""
}

// cutQuoted reads one C-quoted string at the start of s.
func cutQuoted(s string) (val, rest string, ok bool) {
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return unquoteGit(s[:i+1]), s[i+1:], true
		}
	}
	return "", s, false
}

// unquoteGit undoes git's C-style quoting of a path ("a/\303\251 x"); an
// unquoted string is returned as is, less a trailing tab git adds after
// paths with spaces in ---/+++ lines.
func unquoteGit(s string) string {
	s = strings.TrimSuffix(s, "\t")
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	in := s[1 : len(s)-1]
	var b strings.Builder
	for i := 0; i < len(in); i++ {
		c := in[i]
		if c != '\\' || i+1 == len(in) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := in[i]; e {
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3':
			if i+2 < len(in) {
				if v, err := strconv.ParseUint(in[i:i+3], 8, 8); err == nil {
					b.WriteByte(byte(v))
					i += 2
					continue
				}
			}
			b.WriteByte(e)
		default:
			b.WriteByte(e)
		}
	}
	return b.String()
}

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
	for _, f := range PatchFiles(r.TestPatch) {
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
	fmt.Fprintf(&b, "echo %s\n%s\necho %s\n", shQuote(StartTestOutput), testCommand, shQuote(EndTestOutput))
	if len(existing) > 0 {
		fmt.Fprintf(&b, "git checkout %s -- %s\n", r.BaseCommit, quote(existing))
	}
	return b.String(), nil
}
