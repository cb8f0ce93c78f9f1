package grading

import (
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
	for _, sec := range SplitSections(patch) {
		if sec.Path == "" {
			continue
		}
		out = append(out, PatchFile{Path: sec.Path, New: sec.IsNew, Deleted: sec.Deleted})
	}
	return out
}

// Section is one "diff --git" section of a patch.
type Section struct {
	Text    string
	Path    string
	OldPath string
	IsNew   bool
	Deleted bool
}

// SplitSections splits a git diff at its "diff --git" lines; text before the
// first one is a section without a path.
func SplitSections(patch string) []Section {
	var secs []Section
	var cur *Section
	var b strings.Builder
	flush := func() {
		if cur != nil {
			cur.Text = b.String()
			secs = append(secs, *cur)
		} else if b.Len() > 0 {
			secs = append(secs, Section{Text: b.String()})
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
			cur = &Section{Path: bp, OldPath: a}
			inHeader = true
		} else if cur != nil && inHeader {
			switch {
			case strings.HasPrefix(trimmed, "new file mode"):
				cur.IsNew = true
			case strings.HasPrefix(trimmed, "deleted file mode"):
				cur.Deleted = true
			case strings.HasPrefix(trimmed, "--- /dev/null"):
				cur.IsNew = true
			case strings.HasPrefix(trimmed, "+++ /dev/null"):
				cur.Deleted = true
			case strings.HasPrefix(trimmed, "+++ "):
				if p := stripPrefix(unquoteGit(strings.TrimPrefix(trimmed, "+++ ")), "b/"); p != "" && cur.Path == "" {
					cur.Path = p
				}
			case strings.HasPrefix(trimmed, "@@"), strings.HasPrefix(trimmed, "GIT binary patch"):
				inHeader = false
			}
		}
		b.WriteString(line)
	}
	flush()
	for i := range secs {
		// A deleted file's path is its a/ side.
		if secs[i].Deleted && secs[i].OldPath != "" {
			secs[i].Path = secs[i].OldPath
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
