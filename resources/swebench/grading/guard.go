package grading

import (
	"go/ast"
	goparser "go/parser"
	"go/token"
	"path"
	"sort"
	"strings"
)

// Guard says which parts of a model patch are outside the agent's remit
// and are left out of the grading (the files keep their base content, as
// the test files of the test patch do). Symbolic links the patch makes are
// always left out (what they name is out of the guard's sight). A file the row's gold patch touches
// is never left out for being of a kind: the gold patch must still resolve.
type Guard struct {
	// KeepTestFiles keeps the model patch's changes to test files the test
	// patch does not touch (*_test.go, anything under a testdata
	// directory). By default they are left out: a TestMain or init in a test
	// file the agent added runs before every test.
	KeepTestFiles bool `yaml:"keep_test_files" json:"keep_test_files,omitempty"`
	// KeepVendor keeps changes under vendor/ (left out by default: a
	// vendored stub replaces a dependency).
	KeepVendor bool `yaml:"keep_vendor" json:"keep_vendor,omitempty"`
	// KeepModuleChanges keeps go.mod changes that add or change replace
	// directives or touch a protected module, go.work files, and the go.sum
	// that goes with them (left out by default).
	KeepModuleChanges bool `yaml:"keep_module_changes" json:"keep_module_changes,omitempty"`
	// ProtectedModules are module path prefixes whose requirement a model
	// patch may not change in go.mod (test dependencies: assertion and
	// comparison libraries). nil means DefaultProtectedModules.
	ProtectedModules []string `yaml:"protected_modules,omitempty" json:"protected_modules,omitempty"`
	// Paths are further path patterns (path.Match syntax, or a directory
	// prefix ending in "/") whose changes are left out.
	Paths []string `yaml:"paths,omitempty" json:"paths,omitempty"`
	// AllowExitingInit keeps gradings of patches whose added files, or
	// lines added to existing ones, have an init or TestMain that ends the
	// process (graded 0 by default).
	AllowExitingInit bool `yaml:"allow_exiting_init" json:"allow_exiting_init,omitempty"`
}

// DefaultProtectedModules are the test dependencies a model patch may not
// swap.
func DefaultProtectedModules() []string {
	return []string{
		"github.com/stretchr/testify", "gotest.tools", "github.com/google/go-cmp",
		"github.com/onsi/gomega", "github.com/onsi/ginkgo", "github.com/frankban/quicktest",
		"github.com/matryer/is", "github.com/smartystreets/goconvey", "github.com/go-playground/assert",
	}
}

// Excluded is a file of the model patch left out of the grading.
type Excluded struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
}

// Reasons a file is excluded.
const (
	ExcludedTestFile = "test file not in the test patch"
	ExcludedVendor   = "vendored code"
	ExcludedModule   = "module replacement or test dependency change"
	ExcludedPath     = "configured path"
	ExcludedSymlink  = "symbolic link"
)

// Apply returns the model patch without the sections outside the agent's
// remit, and what it left out (in patch order). testPatch and goldPatch are
// the row's.
func (g Guard) Apply(model, testPatch, goldPatch string) (string, []Excluded) {
	inTest, inGold := patchPaths(testPatch), patchPaths(goldPatch)
	secs := SplitSections(model)
	reasons := make([]string, len(secs))
	modDropped := false
	linked := map[string]bool{}
	for i, sec := range secs {
		if sec.Path == "" {
			continue
		}
		reasons[i] = g.reason(sec, inTest, inGold)
		if reasons[i] == ExcludedSymlink {
			linked[sec.Path] = true
		}
	}
	for i, sec := range secs {
		// A file made a link goes whole: its other sections (the
		// deletion of the file it replaces) too.
		if linked[sec.Path] {
			reasons[i] = ExcludedSymlink
		}
		if reasons[i] == ExcludedModule && path.Base(sec.Path) == "go.mod" {
			modDropped = true
		}
	}
	var b strings.Builder
	var out []Excluded
	for i, sec := range secs {
		r := reasons[i]
		// go.sum goes with its go.mod: alone it would name sums of
		// modules the kept go.mod does not require.
		if r == "" && modDropped && path.Base(sec.Path) == "go.sum" && !inGold[sec.Path] && !g.KeepModuleChanges {
			r = ExcludedModule
		}
		if r != "" {
			out = append(out, Excluded{Path: sec.Path, Reason: r})
			continue
		}
		b.WriteString(sec.Text)
	}
	return b.String(), out
}

// reason is why sec is left out, or "".
func (g Guard) reason(sec Section, inTest, inGold map[string]bool) string {
	p := sec.Path
	switch {
	case inTest[p] || inGold[p]:
		// The test patch's files are restored by the eval script; the
		// gold patch's are the agent's to change.
		return ""
	case createsSymlink(sec.Text):
		// What a link names is out of the guard's sight: go.mod made a
		// link to a file of the patch holding a replace directive, say.
		return ExcludedSymlink
	case !g.KeepTestFiles && isTestPath(p):
		return ExcludedTestFile
	case !g.KeepVendor && (p == "vendor" || strings.HasPrefix(p, "vendor/") || strings.Contains(p, "/vendor/")):
		return ExcludedVendor
	case !g.KeepModuleChanges && (path.Base(p) == "go.work" || path.Base(p) == "go.work.sum"):
		return ExcludedModule
	case !g.KeepModuleChanges && path.Base(p) == "go.mod" && g.modChangeIsGuarded(sec.Text):
		return ExcludedModule
	}
	for _, pat := range g.Paths {
		if strings.HasSuffix(pat, "/") && strings.HasPrefix(p, pat) {
			return ExcludedPath
		}
		if ok, _ := path.Match(pat, p); ok {
			return ExcludedPath
		}
	}
	return ""
}

// createsSymlink reports whether a diff section makes its path a symbolic
// link (git's mode 120000), new or from a file.
func createsSymlink(text string) bool {
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "@@") {
			return false
		}
		if line == "new file mode 120000" || line == "new mode 120000" {
			return true
		}
	}
	return false
}

// isTestPath: a Go test file, or a file under a testdata directory.
func isTestPath(p string) bool {
	if strings.HasSuffix(p, "_test.go") {
		return true
	}
	return p == "testdata" || strings.HasPrefix(p, "testdata/") || strings.Contains(p, "/testdata/")
}

// modChangeIsGuarded reports whether a go.mod diff section adds or removes
// a replace directive (a line with "=>", or a replace block) or a line
// naming a protected module.
func (g Guard) modChangeIsGuarded(text string) bool {
	protected := g.ProtectedModules
	if protected == nil {
		protected = DefaultProtectedModules()
	}
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "+++") || strings.HasPrefix(line, "---") {
			continue
		}
		if !strings.HasPrefix(line, "+") && !strings.HasPrefix(line, "-") {
			continue
		}
		body := strings.TrimSpace(line[1:])
		if strings.Contains(body, "=>") || body == "replace (" || strings.HasPrefix(body, "replace ") {
			return true
		}
		for _, m := range protected {
			if m != "" && containsModule(body, m) {
				return true
			}
		}
	}
	return false
}

// containsModule reports whether a go.mod line names module m or one under
// it.
func containsModule(line, m string) bool {
	for _, f := range strings.Fields(line) {
		f = strings.Trim(f, `"`)
		if f == m || strings.HasPrefix(f, m+"/") {
			return true
		}
	}
	return false
}

// patchPaths are the paths a diff touches.
func patchPaths(patch string) map[string]bool {
	out := map[string]bool{}
	for _, sec := range SplitSections(patch) {
		if sec.Path != "" {
			out[sec.Path] = true
		}
		if sec.OldPath != "" {
			out[sec.OldPath] = true
		}
	}
	return out
}

// ExitingInits lists the Go files a patch creates (test files included)
// whose init or TestMain function, or a package-level variable's
// initializer, ends the process itself (os.Exit, syscall.Exit, log.Fatal…,
// runtime.Goexit), directly or through a function of any file the patch
// creates or changes in the same package, whatever name the file imports
// the package by, instead of returning or running the tests and returning
// their code: one of them ends a test binary before its tests ran, whatever
// it printed. after holds the content, once patched, of Go files the patch
// changes (ChangedGoFiles): in those, only a call on a line the patch adds
// counts (the repository's own exits are not the agent's), and they are
// listed too. A file missing from after is read as far as the patch shows
// it: not at all.
func ExitingInits(patch string, after map[string]string) []string {
	type parsed struct {
		path string
		file *ast.File
		// added tells a node on a line the patch adds (nil: all are).
		added func(ast.Node) bool
	}
	var files []parsed
	pkgs := map[string]*pkgFuncs{}
	pkgOf := func(p string, f *ast.File) *pkgFuncs {
		key := path.Dir(p) + "\x00" + f.Name.Name
		if pkgs[key] == nil {
			pkgs[key] = &pkgFuncs{funcs: map[string]fileFunc{}, ends: map[string]string{}}
		}
		return pkgs[key]
	}
	for _, sec := range SplitSections(patch) {
		if sec.Deleted || !strings.HasSuffix(sec.Path, ".go") {
			continue
		}
		var src string
		var added func(ast.Node) bool
		fset := token.NewFileSet()
		if sec.IsNew {
			var ok bool
			if src, ok = addedContent(sec.Text); !ok {
				continue
			}
		} else {
			var ok bool
			if src, ok = after[sec.Path]; !ok {
				continue
			}
			added = addedLines(fset, src, addedText(sec.Text))
		}
		f, err := goparser.ParseFile(fset, sec.Path, src, goparser.SkipObjectResolution)
		if err != nil {
			continue // it does not compile, so it ends nothing
		}
		files = append(files, parsed{sec.Path, f, added})
		pkg, imports := pkgOf(sec.Path, f), importNames(f)
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && fn.Body != nil {
				pkg.funcs[fn.Name.Name] = fileFunc{fn, imports, added}
			}
		}
	}
	var out []string
	for _, f := range files {
		if found := exitingInit(f.file, pkgOf(f.path, f.file), f.added); found != "" {
			out = append(out, f.path+": "+found)
		}
	}
	return out
}

// ChangedGoFiles are the Go files the patch changes (neither creates nor
// deletes) and adds lines to: what ExitingInits needs the content of.
func ChangedGoFiles(patch string) []string {
	var out []string
	for _, sec := range SplitSections(patch) {
		if sec.IsNew || sec.Deleted || !strings.HasSuffix(sec.Path, ".go") || len(addedText(sec.Text)) == 0 {
			continue
		}
		out = append(out, sec.Path)
	}
	return out
}

// addedText is the set of lines a diff section adds (without their "+").
func addedText(text string) map[string]bool {
	out := map[string]bool{}
	inHunk := false
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "@@"):
			inHunk = true
		case inHunk && strings.HasPrefix(line, "+"):
			out[line[1:]] = true
		}
	}
	return out
}

// addedLines tells whether a node of src (parsed with fset) spans a line
// whose text is one the patch adds. A line of the same text elsewhere in
// the file counts too: the patch may have been applied with fuzz, where
// its line numbers are not the file's, and a line too many only makes the
// check stricter.
func addedLines(fset *token.FileSet, src string, plus map[string]bool) func(ast.Node) bool {
	var lines []bool
	for _, l := range strings.Split(src, "\n") {
		lines = append(lines, plus[l])
	}
	return func(n ast.Node) bool {
		from, to := fset.Position(n.Pos()).Line, fset.Position(n.End()).Line
		for l := from; l <= to && l <= len(lines); l++ {
			if l >= 1 && lines[l-1] {
				return true
			}
		}
		return false
	}
}

// exitingInit describes the first way f's initialization (or TestMain)
// ends the process ("" for none); pkg holds the functions of its package
// that the patch creates.
func exitingInit(f *ast.File, pkg *pkgFuncs, added func(ast.Node) bool) string {
	x := exitFinder{imports: importNames(f), pkg: pkg, added: added}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv != nil || d.Body == nil || (d.Name.Name != "init" && d.Name.Name != "TestMain") {
				continue
			}
			if call := x.exitCall(d.Body, d.Name.Name == "TestMain"); call != "" {
				return d.Name.Name + " calls " + call
			}
		case *ast.GenDecl:
			if d.Tok != token.VAR {
				continue
			}
			for _, spec := range d.Specs {
				for _, v := range spec.(*ast.ValueSpec).Values {
					if call := x.exitCall(v, false); call != "" {
						return "a package-level variable's initializer calls " + call
					}
				}
			}
		}
	}
	return ""
}

// pkgFuncs are the functions the patch creates in one package.
type pkgFuncs struct {
	funcs map[string]fileFunc
	// ends memoizes, per function, the call through which it ends the
	// process ("" for none; being computed counts as none).
	ends map[string]string
}

// fileFunc is a function, the imports of its file and which of its nodes
// lie on lines the patch adds (nil: all).
type fileFunc struct {
	decl    *ast.FuncDecl
	imports map[string]string
	added   func(ast.Node) bool
}

// exitFinder finds process-ending calls in one file.
type exitFinder struct {
	// imports maps the names the file refers to packages by to their
	// paths ("." for the dot-imported ones: key "." + path).
	imports map[string]string
	pkg     *pkgFuncs
	// added tells an exit call on a line the patch adds (nil: all are):
	// in a file the patch changes, the others are the repository's.
	added func(ast.Node) bool
}

// importNames maps the names f refers to its imports by to their paths.
func importNames(f *ast.File) map[string]string {
	m := map[string]string{}
	for _, im := range f.Imports {
		p := strings.Trim(im.Path.Value, "\"`")
		name := path.Base(p)
		if im.Name != nil {
			name = im.Name.Name
		}
		if name == "." {
			m["."+p] = p
			continue
		}
		m[name] = p
	}
	return m
}

// exitCall returns the first call in n that ends the process ("" for
// none). A TestMain ends its binary with os.Exit(m.Run()) or a code it
// computed, so in a TestMain only an exit with a constant code counts,
// and only the call itself.
func (x exitFinder) exitCall(n ast.Node, testMain bool) string {
	var found string
	ast.Inspect(n, func(n ast.Node) bool {
		if found != "" {
			return false
		}
		if call, ok := n.(*ast.CallExpr); ok {
			found = x.endsProcess(call, testMain)
		}
		return found == ""
	})
	return found
}

// endsProcess names call when it ends the process ("" otherwise).
func (x exitFinder) endsProcess(call *ast.CallExpr, testMain bool) string {
	var names []string
	switch fun := call.Fun.(type) {
	case *ast.SelectorExpr:
		if pkg, ok := fun.X.(*ast.Ident); ok && x.imports[pkg.Name] != "" {
			names = append(names, x.imports[pkg.Name]+"."+fun.Sel.Name)
		}
	case *ast.Ident:
		for k, p := range x.imports {
			if strings.HasPrefix(k, ".") {
				names = append(names, p+"."+fun.Name)
			}
		}
		if !testMain {
			if through := x.funcEnds(fun.Name); through != "" {
				return through + " (through " + fun.Name + ")"
			}
		}
	}
	if x.added != nil && !x.added(call) {
		return ""
	}
	for _, name := range names {
		switch name {
		case "os.Exit", "syscall.Exit", "golang.org/x/sys/unix.Exit":
			if testMain {
				if len(call.Args) != 1 {
					return ""
				}
				if _, constant := call.Args[0].(*ast.BasicLit); !constant {
					return ""
				}
			}
			return name
		case "runtime.Goexit", "log.Fatal", "log.Fatalf", "log.Fatalln", "syscall.Kill", "syscall.RawSyscall", "syscall.Syscall":
			if testMain {
				return ""
			}
			return name
		}
	}
	return ""
}

// funcEnds is the call through which the package's function name ends the
// process when called ("" for none, or no such function).
func (x exitFinder) funcEnds(name string) string {
	fn, ok := x.pkg.funcs[name]
	if !ok {
		return ""
	}
	if found, done := x.pkg.ends[name]; done {
		return found
	}
	x.pkg.ends[name] = "" // a recursive call ends nothing more
	found := exitFinder{imports: fn.imports, pkg: x.pkg, added: fn.added}.exitCall(fn.decl.Body, false)
	x.pkg.ends[name] = found
	return found
}

// addedContent is the new file a creating diff section holds.
func addedContent(text string) (string, bool) {
	var b strings.Builder
	inHunk := false
	for _, line := range strings.SplitAfter(text, "\n") {
		switch {
		case line == "":
		case strings.HasPrefix(line, "@@"):
			inHunk = true
		case !inHunk:
		case strings.HasPrefix(line, "+"):
			b.WriteString(line[1:])
		case strings.HasPrefix(line, `\`):
		default:
			return "", false
		}
	}
	return b.String(), inHunk
}

// ExcludedPaths are the paths of ex, sorted (for logs).
func ExcludedPaths(ex []Excluded) []string {
	out := make([]string, len(ex))
	for i, e := range ex {
		out[i] = e.Path
	}
	sort.Strings(out)
	return out
}
