package resources_test

import (
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
)

func code(t *testing.T, err error) string {
	t.Helper()
	var e *problem.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v is not a *problem.Error", err)
	}
	return fmt.Sprintf("%d %s", e.Status, e.Code)
}

func TestDecodeDataIsLenient(t *testing.T) {
	type row struct {
		Line string `json:"line"`
	}
	var r row
	if err := resources.DecodeData([]byte("  "), &r); err != nil || r != (row{}) {
		t.Fatalf("empty body: %v %+v", err, r)
	}
	if err := resources.DecodeData([]byte(`{"line":"a","extra":[1]}`), &r); err != nil || r.Line != "a" {
		t.Fatalf("unknown field: %v %+v", err, r)
	}
	for body, want := range map[string]string{
		`{"line":1}`:   "field line must be string",
		`{"line":`:     "unexpected end of JSON input",
		`{"line":"a"`:  "unexpected end of JSON input",
		`{"line" "a"}`: "malformed JSON at byte",
	} {
		err := resources.DecodeData([]byte(body), &r)
		if got := code(t, err); got != "422 invalid_request" || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %s %v, want 422 invalid_request with %q", body, got, err, want)
		}
	}
}

func TestDecodeStrictRefusesWhatDataAccepts(t *testing.T) {
	var v struct {
		ID string `json:"id"`
	}
	for body, want := range map[string]string{
		``:                 "a JSON body is required",
		`{"id":"a","x":1}`: `unknown field "x"`,
		`{"id":"a"}]`:      "trailing data",
		`{"id":"a"} {}`:    "trailing data",
		`{"id":"a"}}`:      "trailing data",
	} {
		err := resources.DecodeStrict([]byte(body), &v)
		if err == nil || code(t, err) != "422 invalid_request" || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want 422 with %q", body, err, want)
		}
	}
	if err := resources.DecodeStrict([]byte(` {"id":"a"} `), &v); err != nil || v.ID != "a" {
		t.Fatalf("a good body: %v %+v", err, v)
	}
}

func TestCheckObject(t *testing.T) {
	for _, ok := range []string{"", " ", `{}`, `{"a":[1]}`} {
		if err := resources.CheckObject([]byte(ok)); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{`[1]`, `"s"`, `{`, `{} {}`, `3`} {
		if err := resources.CheckObject([]byte(bad)); err == nil || code(t, err) != "422 invalid_request" {
			t.Errorf("%q: %v, want 422", bad, err)
		}
	}
}

func TestErrorsMatchByCodeAndUnwrap(t *testing.T) {
	cause := errors.New("disk full")
	e := problem.Wrap(500, "commit_failed", cause)
	if !errors.Is(e, cause) || !errors.Is(e, &problem.Error{Code: "commit_failed"}) || errors.Is(e, &problem.Error{Code: "restore_failed"}) {
		t.Fatalf("Is/Unwrap of %v", e)
	}
	if diff := cmp.Diff("500 commit_failed", code(t, fmt.Errorf("wrapped: %w", e))); diff != "" {
		t.Fatal(diff)
	}
}

// TestContractKnowsNoTransport: the contract imports neither fasthttp nor
// the http package that serves it.
func TestContractKnowsNoTransport(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ast, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range ast.Imports {
			if p := strings.Trim(imp.Path.Value, `"`); strings.Contains(p, "fasthttp") || p == "github.com/sandboxowner/owner/http" {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
}
