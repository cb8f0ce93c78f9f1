package fake

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/sandboxowner/owner/provider"
)

// unsupported is the fake's answer to a command it does not know. It names
// what the fake does understand, so a test author sees at once why a command
// that works on a real sandbox did nothing here.
const unsupported = "fake: command not supported: %s (fake understands pwd, cat, ls, echo, true, false, exit, test -f)"

// word is one token of a command line. op marks an unquoted redirect (">" or
// ">>"), which a quoted ">" is not.
type word struct {
	text string
	op   bool
}

// errSyntax is a command line the fake will not interpret (pipes, lists,
// expansions); Exec reports it as exit status 2, as sh reports a syntax error.
var errSyntax = errors.New("fake: shell syntax not supported")

// tokenize splits a command line on blanks, honouring single quotes, double
// quotes (with \" and \\) and backslash escapes, and refusing the shell syntax
// the fake does not implement rather than passing it through as text.
func tokenize(line string) ([]word, error) {
	var (
		words []word
		cur   strings.Builder
		have  bool // cur holds a word, possibly empty ("")
	)
	flush := func() {
		if have {
			words = append(words, word{text: cur.String()})
			cur.Reset()
			have = false
		}
	}
	rs := []rune(line)
	for i := 0; i < len(rs); i++ {
		r := rs[i]
		switch {
		case r == ' ' || r == '\t' || r == '\n':
			flush()
		case r == '\'':
			end := indexRune(rs, i+1, '\'')
			if end < 0 {
				return nil, fmt.Errorf("%w: unterminated single quote", errSyntax)
			}
			cur.WriteString(string(rs[i+1 : end]))
			have, i = true, end
		case r == '"':
			have = true
			for i++; ; i++ {
				if i >= len(rs) {
					return nil, fmt.Errorf("%w: unterminated double quote", errSyntax)
				}
				c := rs[i]
				if c == '"' {
					break
				}
				if c == '$' || c == '`' {
					return nil, fmt.Errorf("%w: %q (no expansions)", errSyntax, c)
				}
				if c == '\\' && i+1 < len(rs) && (rs[i+1] == '"' || rs[i+1] == '\\') {
					i++
					c = rs[i]
				}
				cur.WriteRune(c)
			}
		case r == '\\':
			if i+1 < len(rs) {
				i++
				cur.WriteRune(rs[i])
			}
			have = true
		case r == '>':
			flush()
			op := ">"
			if i+1 < len(rs) && rs[i+1] == '>' {
				op, i = ">>", i+1
			}
			words = append(words, word{text: op, op: true})
		case strings.ContainsRune("|;&<$`()*?[", r) || (!have && (r == '#' || r == '~')):
			// #, ~ mean something only where a word starts.
			return nil, fmt.Errorf("%w: %q (fake runs one simple command: no pipes, lists, expansions, globs, comments or subshells)", errSyntax, r)
		default:
			cur.WriteRune(r)
			have = true
		}
	}
	flush()
	return words, nil
}

func indexRune(rs []rune, from int, r rune) int {
	for i := from; i < len(rs); i++ {
		if rs[i] == r {
			return i
		}
	}
	return -1
}

// shell is one command run against a sandbox's files.
type shell struct {
	files   map[string]string
	workdir string
	cwd     string
	out     strings.Builder
	errOut  strings.Builder
}

func (sh *shell) errorf(format string, args ...any) {
	fmt.Fprintf(&sh.errOut, format, args...)
}

// execute interprets line in sb with cwd as the current directory. A command
// that ran and failed is a result, never an error.
func execute(sb *sandbox, cwd, line string) provider.ExecResult {
	words, err := tokenize(line)
	if err != nil {
		return provider.ExecResult{Stderr: err.Error(), ExitCode: 2}
	}
	args, redirect, appendOut, err := splitRedirect(words)
	if err != nil {
		return provider.ExecResult{Stderr: err.Error(), ExitCode: 2}
	}
	sh := &shell{files: sb.files, workdir: sb.spec.Workdir, cwd: cwd}
	target := ""
	if redirect != "" {
		// sh opens the redirect before running the command; a bad target
		// means the command never runs.
		if target, err = sh.writablePath(redirect); err != nil {
			return provider.ExecResult{Stderr: err.Error() + "\n", ExitCode: 1}
		}
	}
	code := sh.run(args)
	res := provider.ExecResult{Stdout: sh.out.String(), Stderr: sh.errOut.String(), ExitCode: code}
	if target != "" {
		if appendOut {
			sb.files[target] += res.Stdout
		} else {
			sb.files[target] = res.Stdout
		}
		res.Stdout = ""
	}
	return res
}

// splitRedirect separates one optional "> FILE" or ">> FILE" from the
// arguments.
func splitRedirect(words []word) (args []string, target string, appendOut bool, err error) {
	for i := 0; i < len(words); i++ {
		w := words[i]
		if !w.op {
			args = append(args, w.text)
			continue
		}
		if target != "" {
			return nil, "", false, fmt.Errorf("%w: more than one redirect", errSyntax)
		}
		if i+1 >= len(words) || words[i+1].op {
			return nil, "", false, fmt.Errorf("%w: %s without a file", errSyntax, w.text)
		}
		target, appendOut = words[i+1].text, w.text == ">>"
		i++
	}
	return args, target, appendOut, nil
}

func (sh *shell) writablePath(name string) (string, error) {
	full, err := resolve(sh.cwd, name)
	if err != nil {
		return "", err
	}
	if isDir(sh.files, sh.workdir, full) {
		return "", fmt.Errorf("fake: %s: Is a directory", name)
	}
	return full, nil
}

func (sh *shell) run(args []string) int {
	if len(args) == 0 {
		return 0
	}
	name, args := args[0], args[1:]
	switch name {
	case "pwd":
		sh.out.WriteString(sh.cwd + "\n")
		return 0
	case "true":
		return 0
	case "false":
		return 1
	case "echo":
		return sh.echo(args)
	case "cat":
		return sh.cat(args)
	case "ls":
		return sh.ls(args)
	case "exit":
		return sh.exit(args)
	case "test":
		return sh.test(args)
	}
	sh.errorf(unsupported, name)
	return 127
}

func (sh *shell) echo(args []string) int {
	newline := true
	if len(args) > 0 && args[0] == "-n" {
		newline, args = false, args[1:]
	}
	sh.out.WriteString(strings.Join(args, " "))
	if newline {
		sh.out.WriteString("\n")
	}
	return 0
}

func (sh *shell) cat(args []string) int {
	code := 0
	for _, name := range args {
		full, err := resolve(sh.cwd, name)
		switch {
		case err != nil:
			sh.errorf("cat: %s: %v\n", name, err)
			code = 1
		case hasKey(sh.files, full):
			sh.out.WriteString(sh.files[full])
		case isDir(sh.files, sh.workdir, full):
			sh.errorf("cat: %s: Is a directory\n", name)
			code = 1
		default:
			sh.errorf("cat: %s: No such file or directory\n", name)
			code = 1
		}
	}
	return code
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}

func (sh *shell) ls(args []string) int {
	if len(args) > 1 || (len(args) == 1 && strings.HasPrefix(args[0], "-")) {
		sh.errorf("fake: ls takes at most one directory and no flags: ls %s", strings.Join(args, " "))
		return 2
	}
	name := "."
	if len(args) == 1 {
		name = args[0]
	}
	full, err := resolve(sh.cwd, name)
	switch {
	case err != nil:
		sh.errorf("ls: cannot access '%s': %v\n", name, err)
		return 2
	case hasKey(sh.files, full):
		sh.out.WriteString(name + "\n")
	case isDir(sh.files, sh.workdir, full):
		for _, child := range children(sh.files, sh.workdir, full) {
			sh.out.WriteString(child + "\n")
		}
	default:
		sh.errorf("ls: cannot access '%s': No such file or directory\n", name)
		return 2
	}
	return 0
}

func (sh *shell) exit(args []string) int {
	if len(args) == 0 {
		return 0
	}
	n, err := strconv.Atoi(args[0])
	if err != nil {
		sh.errorf("exit: %s: numeric argument required\n", args[0])
		return 2
	}
	return int(uint8(n)) // sh keeps the low 8 bits
}

func (sh *shell) test(args []string) int {
	if len(args) != 2 || args[0] != "-f" {
		sh.errorf("fake: test supports only test -f FILE: test %s", strings.Join(args, " "))
		return 2
	}
	full, err := resolve(sh.cwd, args[1])
	if err != nil || !hasKey(sh.files, full) {
		return 1
	}
	return 0
}
