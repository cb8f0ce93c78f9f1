package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// The schema way runs gremlins' mutants of a package without gremlins,
// about ten times faster on a loaded machine: every mutant is compiled into
// one test binary behind a switch (ZZMUT names the one on), each test's
// coverage is taken once, and each mutant runs with only the tests that
// reach its line and -failfast. gremlins builds and runs the whole package's
// tests once a mutant. The rewrite keeps every line where it was, so the
// coverage of the original code places the mutants.

// schemaMutant is one mutant, named as gremlins names it.
type schemaMutant struct {
	File         string
	Line, Column int
	Kind, Status string
}

func (m *schemaMutant) id() string {
	return fmt.Sprintf("%s:%d:%d:%s", m.File, m.Line, m.Column, m.Kind)
}

// edit inserts text at off after deleting del bytes there.
type edit struct {
	off, del int
	text     string
	// kind orders the edits at one offset: the text there reads suffixes
	// (inner first), prefixes (outer first), then the replacement.
	kind editKind
	span int // the length of the expression a prefix or suffix wraps
}

type editKind int

const (
	replace editKind = iota
	prefix
	suffix
)

// site is one place in a file switched between its mutants.
type site struct {
	ids  []string
	line int
	eds  []edit
}

var (
	ordered = map[token.Token]string{token.LSS: "zzMutLSS", token.LEQ: "zzMutLEQ", token.GTR: "zzMutGTR", token.GEQ: "zzMutGEQ"}
	arith   = map[token.Token]string{token.ADD: "zzMutAdd", token.SUB: "zzMutSub", token.MUL: "zzMutMul", token.QUO: "zzMutQuo", token.REM: "zzMutRem"}
)

// sitesOf finds the mutants of one file's source (the kinds gremlins
// enables by default, outside constant declarations) and the edits that
// switch them. alias maps an INVERT_NEGATIVES on a binary minus to its
// ARITHMETIC_BASE: gremlins makes both, and both turn - into +.
func sitesOf(name string, src []byte) (sites []*site, muts []*schemaMutant, alias map[string]string, err error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, name, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, nil, nil, err
	}
	tf := fset.File(f.Pos())
	off := tf.Offset
	alias = map[string]string{}
	add := func(p token.Pos, kind string) string {
		q := fset.Position(p)
		m := &schemaMutant{File: filepath.Base(name), Line: q.Line, Column: q.Column, Kind: kind}
		muts = append(muts, m)
		return m.id()
	}
	line := func(p token.Pos) int { return fset.Position(p).Line }
	ast.Inspect(f, func(n ast.Node) bool {
		switch x := n.(type) {
		case *ast.GenDecl:
			return x.Tok != token.CONST
		case *ast.IncDecStmt:
			id := add(x.TokPos, "INCREMENT_DECREMENT")
			xs := string(src[off(x.X.Pos()):off(x.X.End())])
			fn := map[token.Token]string{token.INC: "zzMutInc", token.DEC: "zzMutDec"}[x.Tok]
			sites = append(sites, &site{ids: []string{id}, line: line(x.TokPos), eds: []edit{
				{off: off(x.Pos()), del: off(x.End()) - off(x.Pos()), text: fmt.Sprintf("%s = %s(%q, %s)", xs, fn, id, xs)},
			}})
			return false // x.X is copied as it is
		case *ast.UnaryExpr:
			if x.Op == token.SUB {
				id := add(x.OpPos, "INVERT_NEGATIVES")
				sites = append(sites, &site{ids: []string{id}, line: line(x.OpPos), eds: []edit{
					{off: off(x.OpPos), del: 1, text: fmt.Sprintf("zzMutNeg(%q, ", id)},
					{off: off(x.End()), text: ")", kind: suffix, span: off(x.End()) - off(x.Pos())},
				}})
			}
		case *ast.BinaryExpr:
			span := off(x.End()) - off(x.Pos())
			l := line(x.OpPos)
			if fn, ok := arith[x.Op]; ok {
				id := add(x.OpPos, "ARITHMETIC_BASE")
				if x.Op == token.SUB {
					alias[add(x.OpPos, "INVERT_NEGATIVES")] = id
				}
				sites = append(sites, &site{ids: []string{id}, line: l, eds: []edit{
					{off: off(x.Pos()), text: fmt.Sprintf("%s(%q, ", fn, id), kind: prefix, span: span},
					{off: off(x.OpPos), del: len(x.Op.String()), text: ", "},
					{off: off(x.End()), text: ")", kind: suffix, span: span},
				}})
			}
			fn, isOrdered := ordered[x.Op]
			if !isOrdered && x.Op != token.EQL && x.Op != token.NEQ {
				break
			}
			// Negation: (x op y) != on(n); boundary: a call answering
			// the other side of the boundary when on.
			nid := add(x.OpPos, "CONDITIONALS_NEGATION")
			s := &site{ids: []string{nid}, line: l}
			pre, post := "((", fmt.Sprintf(") != zzMutOn(%q))", nid)
			if isOrdered {
				bid := add(x.OpPos, "CONDITIONALS_BOUNDARY")
				s.ids = append(s.ids, bid)
				s.eds = append(s.eds,
					edit{off: off(x.Pos()), text: pre + fmt.Sprintf("%s(%q, ", fn, bid), kind: prefix, span: span},
					edit{off: off(x.OpPos), del: len(x.Op.String()), text: ", "},
					edit{off: off(x.End()), text: ")" + post, kind: suffix, span: span},
				)
			} else {
				s.eds = append(s.eds,
					edit{off: off(x.Pos()), text: pre, kind: prefix, span: span},
					edit{off: off(x.End()), text: post, kind: suffix, span: span},
				)
			}
			sites = append(sites, s)
		}
		return true
	})
	return sites, muts, alias, nil
}

// applyEdits applies edits to src. What is applied later at an offset lands
// before what was applied there earlier, so the replacement goes first,
// then the prefixes inner first, then the suffixes outer first.
func applyEdits(src []byte, eds []edit) []byte {
	eds = append([]edit(nil), eds...)
	rank := map[editKind]int{replace: 0, prefix: 1, suffix: 2}
	sort.SliceStable(eds, func(i, j int) bool {
		a, b := eds[i], eds[j]
		switch {
		case a.off != b.off:
			return a.off > b.off
		case a.kind != b.kind:
			return rank[a.kind] < rank[b.kind]
		case a.kind == prefix:
			return a.span < b.span
		default:
			return a.span > b.span
		}
	})
	out := append([]byte(nil), src...)
	for _, e := range eds {
		out = append(out[:e.off:e.off], append([]byte(e.text), out[e.off+e.del:]...)...)
	}
	return out
}

// runSchema makes the run of pkg ("owner", "./owner"), its work files
// under tmp; files names the files to mutate (comma-separated; "" all).
func runSchema(pkg, files, tmp string, maxTimeout time.Duration, log io.Writer) schemaRun {
	pkg = "./" + strings.TrimPrefix(pkg, "./")
	dir, _ := filepath.Abs(pkg)
	r := schemaRun{dir: dir, pkg: pkg, work: filepath.Join(tmp, strings.ReplaceAll(strings.TrimPrefix(pkg, "./"), "/", "_")+".schema"), files: map[string]bool{}, maxTimeout: maxTimeout, log: log}
	for _, f := range strings.Split(files, ",") {
		if f = strings.TrimSpace(f); f != "" {
			r.files[f] = true
		}
	}
	return r
}

// schemaRun is one package's run the schema way.
type schemaRun struct {
	dir   string // the package's directory, absolute
	pkg   string // as go test takes it
	work  string
	files map[string]bool // the files to mutate; none: all
	// maxTimeout caps a mutant's timeout (20 times its tests' own time
	// plus a minute); 0 leaves it.
	maxTimeout time.Duration
	log        io.Writer
}

// run measures the package and writes the result as gremlins' -o JSON.
func (r schemaRun) run(out string) error {
	if err := os.MkdirAll(r.work, 0o755); err != nil {
		return err
	}
	fmt.Fprintf(r.log, "== %s: the schema way, in %s\n", r.pkg, r.work)
	ents, err := os.ReadDir(r.dir)
	if err != nil {
		return err
	}
	sites := map[string][]*site{}
	var muts []*schemaMutant
	alias := map[string]string{}
	pkgName := ""
	for _, e := range ents {
		n := e.Name()
		if !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") || (len(r.files) > 0 && !r.files[n]) {
			continue
		}
		src, err := os.ReadFile(filepath.Join(r.dir, n))
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(token.NewFileSet(), n, src, parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		pkgName = f.Name.Name
		s, m, a, err := sitesOf(n, src)
		if err != nil {
			return err
		}
		sites[n], muts = s, append(muts, m...)
		for k, v := range a {
			alias[k] = v
		}
	}
	if pkgName == "" {
		return fmt.Errorf("%s: no file to mutate", r.pkg)
	}
	bin, dropped, err := r.build(pkgName, sites)
	if err != nil {
		return err
	}
	lineTests, took, err := r.coverage()
	if err != nil {
		return err
	}
	for _, m := range muts {
		key := fmt.Sprintf("%s:%d", m.File, m.Line)
		tests := lineTests[key]
		switch {
		case dropped[key]:
			m.Status = "NOT VIABLE"
		case len(tests) == 0:
			m.Status = "NOT COVERED"
		default:
			on := m.id()
			if a, ok := alias[on]; ok {
				on = a
			}
			m.Status = r.one(bin, on, tests, took)
		}
		fmt.Fprintf(r.log, "%14s %s:%d:%d %s\n", m.Status, m.File, m.Line, m.Column, m.Kind)
	}
	return writeReport(out, muts)
}

// build writes the switched files and builds the test binary, giving up the
// sites of each line that does not compile (a + of strings, a negated
// literal whose type the call cannot keep): their mutants are not viable.
func (r schemaRun) build(pkgName string, sites map[string][]*site) (string, map[string]bool, error) {
	bin := filepath.Join(r.work, "mutants.test")
	dropped := map[string]bool{}
	errAt := regexp.MustCompile(`([A-Za-z0-9_]+\.go):(\d+):\d+`)
	for {
		repl := map[string]string{}
		for name, ss := range sites {
			src, err := os.ReadFile(filepath.Join(r.dir, name))
			if err != nil {
				return "", nil, err
			}
			var eds []edit
			for _, s := range ss {
				if !dropped[fmt.Sprintf("%s:%d", name, s.line)] {
					eds = append(eds, s.eds...)
				}
			}
			p := filepath.Join(r.work, name)
			if err := os.WriteFile(p, applyEdits(src, eds), 0o644); err != nil {
				return "", nil, err
			}
			repl[filepath.Join(r.dir, name)] = p
		}
		helper := filepath.Join(r.work, "zz_mutants.go")
		if err := os.WriteFile(helper, []byte(strings.Replace(switches, "package PKG", "package "+pkgName, 1)), 0o644); err != nil {
			return "", nil, err
		}
		repl[filepath.Join(r.dir, "zz_mutants.go")] = helper
		b, _ := json.Marshal(map[string]any{"Replace": repl})
		overlay := filepath.Join(r.work, "overlay.json")
		if err := os.WriteFile(overlay, b, 0o644); err != nil {
			return "", nil, err
		}
		o, err := exec.Command("go", "test", "-c", "-overlay", overlay, "-o", bin, r.pkg).CombinedOutput()
		if err == nil {
			return bin, dropped, nil
		}
		n := 0
		for _, m := range errAt.FindAllStringSubmatch(string(o), -1) {
			if k := m[1] + ":" + m[2]; !dropped[k] && sites[m[1]] != nil {
				dropped[k] = true
				n++
			}
		}
		if n == 0 {
			return "", nil, fmt.Errorf("building %s's mutants: %w\n%s", r.pkg, err, o)
		}
	}
}

// coverage runs each test of the original package alone and returns which
// tests reach each line ("file.go:N") and how long each took.
func (r schemaRun) coverage() (map[string]map[string]bool, map[string]time.Duration, error) {
	cov := filepath.Join(r.work, "cover.test")
	if o, err := exec.Command("go", "test", "-c", "-cover", "-covermode=set", "-o", cov, r.pkg).CombinedOutput(); err != nil {
		return nil, nil, fmt.Errorf("building %s's tests with coverage: %w\n%s", r.pkg, err, o)
	}
	list, err := exec.Command(cov, "-test.list", ".*").Output()
	if err != nil {
		return nil, nil, fmt.Errorf("listing %s's tests: %w", r.pkg, err)
	}
	lines, took := map[string]map[string]bool{}, map[string]time.Duration{}
	prof := filepath.Join(r.work, "cover.out")
	for _, t := range strings.Fields(string(list)) {
		if !strings.HasPrefix(t, "Test") {
			continue
		}
		c := exec.Command(cov, "-test.run", "^"+t+"$", "-test.count=1", "-test.coverprofile", prof)
		c.Dir = r.dir
		start := time.Now()
		if o, err := c.CombinedOutput(); err != nil {
			return nil, nil, fmt.Errorf("%s fails without a mutant: %w\n%s", t, err, o)
		}
		took[t] = time.Since(start)
		if err := readProfile(prof, func(file string, from, to int) {
			for l := from; l <= to; l++ {
				k := fmt.Sprintf("%s:%d", filepath.Base(file), l)
				if lines[k] == nil {
					lines[k] = map[string]bool{}
				}
				lines[k][t] = true
			}
		}); err != nil {
			return nil, nil, err
		}
	}
	return lines, took, nil
}

// readProfile calls fn with each block of a cover profile that ran.
func readProfile(name string, fn func(file string, from, to int)) error {
	f, err := os.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		ln := sc.Text()
		i := strings.LastIndexByte(ln, ':')
		if strings.HasPrefix(ln, "mode:") || i < 0 {
			continue
		}
		var from, fc, to, tc, stmts, count int
		if _, err := fmt.Sscanf(ln[i+1:], "%d.%d,%d.%d %d %d", &from, &fc, &to, &tc, &stmts, &count); err != nil {
			return fmt.Errorf("cover profile line %q: %w", ln, err)
		}
		if count > 0 {
			fn(ln[:i], from, to)
		}
	}
	return sc.Err()
}

// one runs a mutant with the tests that reach its line.
func (r schemaRun) one(bin, id string, tests map[string]bool, took map[string]time.Duration) string {
	var names []string
	var base time.Duration
	for t := range tests {
		names = append(names, t)
		base += took[t]
	}
	sort.Strings(names)
	timeout := 20*base + time.Minute
	if r.maxTimeout > 0 && timeout > r.maxTimeout {
		timeout = r.maxTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := exec.CommandContext(ctx, bin, "-test.run", "^("+strings.Join(names, "|")+")$", "-test.failfast", "-test.count=1")
	c.Dir = r.dir
	c.Env = append(os.Environ(), "ZZMUT="+id)
	err := c.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		return "TIMED OUT"
	case err == nil:
		return "LIVED"
	case errors.As(err, &exit):
		return "KILLED"
	default:
		return "NOT VIABLE" // the binary did not start
	}
}

// writeReport writes the mutants as gremlins' -o JSON, which the script
// scores as it scores gremlins' own.
func writeReport(out string, muts []*schemaMutant) error {
	type mutation struct {
		Line   int    `json:"line"`
		Column int    `json:"column"`
		Type   string `json:"type"`
		Status string `json:"status"`
	}
	type file struct {
		FileName  string     `json:"file_name"`
		Mutations []mutation `json:"mutations"`
	}
	byFile := map[string][]mutation{}
	for _, m := range muts {
		byFile[m.File] = append(byFile[m.File], mutation{m.Line, m.Column, m.Kind, m.Status})
	}
	var rep struct {
		Files []file `json:"files"`
	}
	for name, ms := range byFile {
		rep.Files = append(rep.Files, file{name, ms})
	}
	sort.Slice(rep.Files, func(i, j int) bool { return rep.Files[i].FileName < rep.Files[j].FileName })
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(out, b, 0o644)
}

// switches is the file added to the package: each mutated operator calls
// one of these with its mutant's id.
const switches = `package PKG

import (
	zzcmp "cmp"
	zzos "os"
)

var zzMutID = zzos.Getenv("ZZMUT")

func zzMutOn(id string) bool { return id == zzMutID }

type zzMutNum interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr | ~float32 | ~float64
}

type zzMutInt interface {
	~int | ~int8 | ~int16 | ~int32 | ~int64 | ~uint | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uintptr
}

func zzMutLSS[T zzcmp.Ordered](id string, x, y T) bool {
	if zzMutOn(id) {
		return x <= y
	}
	return x < y
}

func zzMutLEQ[T zzcmp.Ordered](id string, x, y T) bool {
	if zzMutOn(id) {
		return x < y
	}
	return x <= y
}

func zzMutGTR[T zzcmp.Ordered](id string, x, y T) bool {
	if zzMutOn(id) {
		return x >= y
	}
	return x > y
}

func zzMutGEQ[T zzcmp.Ordered](id string, x, y T) bool {
	if zzMutOn(id) {
		return x > y
	}
	return x >= y
}

func zzMutAdd[T zzMutNum](id string, x, y T) T {
	if zzMutOn(id) {
		return x - y
	}
	return x + y
}

func zzMutSub[T zzMutNum](id string, x, y T) T {
	if zzMutOn(id) {
		return x + y
	}
	return x - y
}

func zzMutMul[T zzMutNum](id string, x, y T) T {
	if zzMutOn(id) {
		return x / y
	}
	return x * y
}

func zzMutQuo[T zzMutNum](id string, x, y T) T {
	if zzMutOn(id) {
		return x * y
	}
	return x / y
}

func zzMutRem[T zzMutInt](id string, x, y T) T {
	if zzMutOn(id) {
		return x * y
	}
	return x % y
}

func zzMutNeg[T zzMutNum](id string, x T) T {
	if zzMutOn(id) {
		return x
	}
	return -x
}

func zzMutInc[T zzMutNum](id string, x T) T {
	if zzMutOn(id) {
		return x - 1
	}
	return x + 1
}

func zzMutDec[T zzMutNum](id string, x T) T {
	if zzMutOn(id) {
		return x + 1
	}
	return x - 1
}
`
