// Package script runs scripted tests kept as data files (in the style of
// etcd-io/raft's testdata): each case is a command line, a line "----", and
// the expected output up to a blank line. Lines starting with '#' outside a
// case are comments. With -rewrite the files are rewritten with the output
// the code gives, for review in the diff.
package script

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the scripted tests' expected output")

// Case is one command of a script.
type Case struct {
	// Pos is file:line of the command.
	Pos string
	// Cmd is the command's first word; Args its key=value words (a bare
	// word is a key with the value ""), Words the words after Cmd.
	Cmd   string
	Args  map[string]string
	Words []string
	want  string
	// notes are the comment lines just above the command.
	notes []string
}

// Has reports whether the case names key.
func (c *Case) Has(key string) bool { _, ok := c.Args[key]; return ok }

// List reads a comma-separated argument: absent is nil, present and empty
// an empty list.
func (c *Case) List(key string) []string {
	v, ok := c.Args[key]
	if !ok {
		return nil
	}
	if v == "" {
		return []string{}
	}
	return strings.Split(v, ",")
}

// Parse reads a script.
func Parse(path string) ([]*Case, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var out []*Case
	var notes []string
	for i := 0; i < len(lines); i++ {
		line := strings.TrimSpace(lines[i])
		if line == "" {
			continue
		}
		if strings.HasPrefix(line, "#") {
			notes = append(notes, line)
			continue
		}
		c := &Case{Pos: fmt.Sprintf("%s:%d", filepath.Base(path), i+1), Args: map[string]string{}, notes: notes}
		notes = nil
		fields := strings.Fields(line)
		c.Cmd, c.Words = fields[0], fields[1:]
		for _, w := range c.Words {
			k, v, _ := strings.Cut(w, "=")
			c.Args[k] = v
		}
		if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "----" {
			return nil, fmt.Errorf("%s: expected ---- after the command", c.Pos)
		}
		i += 2
		var want []string
		for ; i < len(lines) && strings.TrimSpace(lines[i]) != ""; i++ {
			want = append(want, lines[i])
		}
		c.want = strings.Join(want, "\n")
		out = append(out, c)
	}
	return out, nil
}

// Run runs every script in glob: each file gets a fresh run from newRun,
// whose result is called with every case in order and returns its output.
func Run(t *testing.T, glob string, newRun func(t *testing.T) func(c *Case) string) {
	t.Helper()
	files, err := filepath.Glob(glob)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatalf("no scripts match %s", glob)
	}
	sort.Strings(files)
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cases, err := Parse(f)
			if err != nil {
				t.Fatal(err)
			}
			step := newRun(t)
			var b strings.Builder
			for i, c := range cases {
				got := strings.TrimRight(step(c), "\n")
				if got == "" {
					got = "ok"
				}
				if *rewrite {
					if i > 0 {
						b.WriteString("\n")
					}
					for _, n := range c.notes {
						b.WriteString(n + "\n")
					}
					fmt.Fprintf(&b, "%s\n----\n%s\n", strings.Join(append([]string{c.Cmd}, c.Words...), " "), got)
					continue
				}
				if got != c.want {
					t.Errorf("%s: %s %s\n got:\n%s\nwant:\n%s", c.Pos, c.Cmd, strings.Join(c.Words, " "), got, c.want)
				}
			}
			if *rewrite {
				if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
