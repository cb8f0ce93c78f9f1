package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
)

// exclusion is one equivalent mutant: a mutant of kind at column of the line
// whose code (trimmed) is code, in file. The code stands in for the line
// number so that an edit above it does not move the entry off its mutant; an
// edit of the line itself does, and the script then warns that the entry
// matched nothing.
type exclusion struct {
	// fn, when set (written "file#Func"), is the function the line must
	// be in, for a line of code that recurs in the file.
	file, fn, kind, code, why string
	column                    int
	pos                       string // where the entry is, for messages
}

type exclusions []exclusion

// readExclusions reads the list: one entry a line,
// "file | KIND | column | code | why" (file may be "file#Func" to name the
// function of a line that recurs), '#' starts a comment line.
func readExclusions(name string) (exclusions, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseExclusions(name, f)
}

func parseExclusions(name string, r io.Reader) (exclusions, error) {
	var ex exclusions
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.SplitN(line, " | ", 5)
		if len(fields) != 5 {
			return nil, fmt.Errorf("%s:%d: want \"file | KIND | column | code | why\"", name, n)
		}
		for i := range fields {
			fields[i] = strings.TrimSpace(fields[i])
		}
		col, err := strconv.Atoi(fields[2])
		if err != nil || col < 1 {
			return nil, fmt.Errorf("%s:%d: column %q is not a positive number", name, n, fields[2])
		}
		if fields[3] == "" || fields[4] == "" {
			return nil, fmt.Errorf("%s:%d: an entry needs the line's code and why the mutant is equivalent", name, n)
		}
		file, fn, _ := strings.Cut(fields[0], "#")
		ex = append(ex, exclusion{
			file: file, fn: fn, kind: fields[1], column: col, code: fields[3], why: fields[4],
			pos: fmt.Sprintf("%s:%d", name, n),
		})
	}
	return ex, sc.Err()
}

func (ex exclusions) match(m mutant) (exclusion, bool) {
	for _, e := range ex {
		if e.file == m.File && e.kind == m.Kind && e.column == m.Column && e.code == m.Code && (e.fn == "" || e.fn == m.Func) {
			return e, true
		}
	}
	return exclusion{}, false
}

// unused returns the entries that matched no mutant of a measured package.
func (ex exclusions) unused(rows []row) []exclusion {
	measured := map[string]bool{}
	used := map[string]bool{}
	for _, r := range rows {
		measured[r.pkg] = true
		for _, m := range r.excluded {
			used[m.entry] = true
		}
	}
	var out []exclusion
	for _, e := range ex {
		if measured[path.Dir(e.file)] && !used[e.pos] {
			out = append(out, e)
		}
	}
	return out
}

// mutant is one mutant of a measured package, with the line it changes.
type mutant struct {
	File   string // relative to the module root
	Line   int
	Column int
	Kind   string
	Status string
	Code   string // the line, trimmed
	Func   string // the function the line is in
	Why    string // for an excluded mutant, why it is equivalent
	entry  string // for an excluded mutant, the entry that excluded it
}

func (m mutant) String() string {
	return fmt.Sprintf("%s:%d:%d %s  %s", m.File, m.Line, m.Column, m.Kind, m.Code)
}

// row is one package's figures.
type row struct {
	pkg                                     string
	killed, lived, notCovered, timedOut, nv int
	livedList, notCoveredList, excluded     []mutant
	// unmeasured are "not covered" mutants where the coverage profile has
	// no block (a case expression, a package-level constant): gremlins
	// never runs them, whatever the tests reach.
	unmeasured []mutant
}

type thresholds struct{ efficacy, coverage float64 }

func (r row) efficacy() float64 {
	if r.killed+r.lived == 0 {
		return 100
	}
	return 100 * float64(r.killed) / float64(r.killed+r.lived)
}

func (r row) coverage() float64 {
	if r.killed+r.lived+r.notCovered == 0 {
		return 100
	}
	return 100 * float64(r.killed+r.lived) / float64(r.killed+r.lived+r.notCovered)
}

func (r row) meets(t thresholds) bool {
	return r.efficacy() >= t.efficacy && r.coverage() >= t.coverage
}

// score counts a package's mutants as gremlins does (efficacy = killed /
// (killed + lived), coverage = (killed + lived) / (killed + lived + not
// covered); timed-out and not-viable mutants count in neither), leaving out
// the excluded ones whatever their status and the unmeasured ones (outside
// reports where a "not covered" mutant lies outside every coverage block).
func score(pkg string, res result, ex exclusions, line func(file string, n int) string, outside func(file string, line, col int) bool, fn func(file string, line int) string) row {
	r := row{pkg: pkg}
	for _, f := range res.Files {
		file := path.Join(pkg, f.FileName)
		for _, mu := range f.Mutations {
			m := mutant{File: file, Line: mu.Line, Column: mu.Column, Kind: mu.Type, Status: mu.Status, Code: line(file, mu.Line), Func: fn(file, mu.Line)}
			if e, ok := ex.match(m); ok {
				m.Why, m.entry = e.why, e.pos
				r.excluded = append(r.excluded, m)
				continue
			}
			switch mu.Status {
			case "KILLED":
				r.killed++
			case "LIVED":
				r.lived++
				r.livedList = append(r.livedList, m)
			case "NOT COVERED":
				if outside(file, mu.Line, mu.Column) {
					r.unmeasured = append(r.unmeasured, m)
					continue
				}
				r.notCovered++
				r.notCoveredList = append(r.notCoveredList, m)
			case "TIMED OUT":
				r.timedOut++
			case "NOT VIABLE":
				r.nv++
			}
		}
	}
	for _, l := range [][]mutant{r.livedList, r.notCoveredList, r.excluded, r.unmeasured} {
		sort.Slice(l, func(i, j int) bool {
			if l[i].File != l[j].File {
				return l[i].File < l[j].File
			}
			if l[i].Line != l[j].Line {
				return l[i].Line < l[j].Line
			}
			return l[i].Column < l[j].Column
		})
	}
	return r
}

func printRow(w io.Writer, r row, t thresholds, verbose bool) {
	verdict := "ok"
	if !r.meets(t) {
		verdict = "BELOW"
	}
	fmt.Fprintf(w, "%s: efficacy %.1f%%, coverage %.1f%% (%s): killed %d, lived %d, not covered %d, timed out %d, not viable %d, excluded %d, unmeasured %d\n",
		r.pkg, r.efficacy(), r.coverage(), verdict, r.killed, r.lived, r.notCovered, r.timedOut, r.nv, len(r.excluded), len(r.unmeasured))
	for _, m := range r.livedList {
		fmt.Fprintf(w, "  lived        %s\n", m)
	}
	if verbose {
		for _, m := range r.notCoveredList {
			fmt.Fprintf(w, "  not covered  %s\n", m)
		}
		for _, m := range r.excluded {
			fmt.Fprintf(w, "  excluded     %s  (%s)\n", m, m.Why)
		}
		for _, m := range r.unmeasured {
			fmt.Fprintf(w, "  unmeasured   %s\n", m)
		}
	}
}

func printTable(w io.Writer, rows []row, t thresholds) {
	fmt.Fprintf(w, "\n| package | efficacy | mutator coverage |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(w, "| %s | %.1f%% (%d lived) | %.1f%% |\n", r.pkg, r.efficacy(), r.lived, r.coverage())
	}
	fmt.Fprintf(w, "thresholds: efficacy >= %.0f%%, coverage >= %.0f%%\n", t.efficacy, t.coverage)
}
