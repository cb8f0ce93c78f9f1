package main

import (
	"go/ast"
	"go/parser"
	"go/token"
)

// outsideBlocks reports whether the position (1-based line and column, as
// gremlins gives them) lies where Go's coverage profile has no block: in a
// case clause's expressions (the clause's block starts after its colon), or
// outside every function body (a package-level constant or variable).
// gremlins calls a mutant there "not covered" whatever the tests run, and
// never runs it; the script counts such a mutant as unmeasured rather than
// as a line no test reaches. A file that does not parse answers false.
func outsideBlocks(file string, line, col int) bool {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		return false
	}
	tf := fset.File(f.Pos())
	if line < 1 || line > tf.LineCount() {
		return false
	}
	pos := tf.LineStart(line) + token.Pos(col-1)
	inBody, inCase := false, false
	ast.Inspect(f, func(n ast.Node) bool {
		if n == nil || pos < n.Pos() || pos >= n.End() {
			return n == f
		}
		switch n := n.(type) {
		case *ast.FuncDecl:
			inBody = n.Body != nil && pos >= n.Body.Pos()
		case *ast.FuncLit:
			inBody = true
		case *ast.CaseClause:
			for _, e := range n.List {
				if pos >= e.Pos() && pos < e.End() {
					inCase = true
				}
			}
		}
		return true
	})
	return inCase || !inBody
}

// funcAt returns the name of the function declared around a line ("" outside
// any, or when the file does not parse); a method is named by its name
// alone.
func funcAt(file string, line int) string {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		return ""
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fset.Position(fd.Pos()).Line <= line && line <= fset.Position(fd.End()).Line {
			return fd.Name.Name
		}
	}
	return ""
}
