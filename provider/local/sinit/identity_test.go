package sinit

import (
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// Identity changes with the messages' shape: a field's name, its JSON
// name, its type, and the structs a message holds. Two builds whose
// messages differ in any of these are told apart by the provider's check.
func TestTheIdentityCoversTheMessagesShape(t *testing.T) {
	type inner struct {
		A int `json:"a"`
	}
	type inner2 struct {
		A string `json:"a"`
	}
	type base struct {
		X int    `json:"x"`
		S *inner `json:"s"`
	}
	type renamed struct {
		Y int    `json:"x"`
		S *inner `json:"s"`
	}
	type retagged struct {
		X int    `json:"y"`
		S *inner `json:"s"`
	}
	type retyped struct {
		X uint   `json:"x"`
		S *inner `json:"s"`
	}
	type nested struct {
		X int     `json:"x"`
		S *inner2 `json:"s"`
	}
	shape := func(v any) string {
		var b strings.Builder
		describe(&b, reflect.TypeOf(v), map[reflect.Type]bool{})
		// The types' own names are not the shape.
		return strings.NewReplacer("renamed", "base", "retagged", "base", "retyped", "base", "nested", "base", "inner2", "inner").Replace(b.String())
	}
	want := shape(base{})
	for _, v := range []any{renamed{}, retagged{}, retyped{}, nested{}} {
		if got := shape(v); got == want {
			t.Errorf("%T has the shape of base: %s", v, got)
		}
	}
	if got := shape(base{}); got != want {
		t.Errorf("the shape of one type changed: %s, then %s", want, got)
	}
	if id := Identity(); !strings.HasPrefix(id, "sandboxowner-init protocol 1 ") {
		t.Errorf("Identity %q", id)
	}
}

// Only an argv whose argv[0] is the init's name, with a stage it knows,
// runs anything: the server's binary run otherwise goes on to its main.
func TestDispatchRunsOnlyAnInitsArgv(t *testing.T) {
	for _, args := range [][]string{nil, {"server"}, {"/usr/bin/server", "run"}, {Name, "bogus"}, {Name, StageRun, "x"}} {
		if code, ok := Dispatch(args); ok {
			t.Errorf("Dispatch(%q) ran something (exit %d)", args, code)
		}
	}
}

// Identity changes with the init's code, not only with its messages'
// shape: sources that differ in a file's content or name (tests aside)
// are told apart, and what is hashed is every non-test file of this
// package as it is on disk.
func TestTheIdentityCoversTheInitsCode(t *testing.T) {
	digest := func(files fstest.MapFS) string { return identity(files) }
	file := func(s string) *fstest.MapFile { return &fstest.MapFile{Data: []byte(s)} }
	base := fstest.MapFS{"a.go": file("package sinit // drop every capability"), "b.go": file("x"), "a_test.go": file("t")}
	want := digest(base)
	for name, other := range map[string]fstest.MapFS{
		"code changed":          {"a.go": file("package sinit // drop some capabilities"), "b.go": file("x"), "a_test.go": file("t")},
		"a file renamed":        {"c.go": file("package sinit // drop every capability"), "b.go": file("x"), "a_test.go": file("t")},
		"bytes moved":           {"a.go": file("package sinit // drop every capabilit"), "b.go": file("yx"), "a_test.go": file("t")},
		"a file more":           {"a.go": file("package sinit // drop every capability"), "b.go": file("x"), "c.go": file(""), "a_test.go": file("t")},
		"a file less":           {"a.go": file("package sinit // drop every capability"), "a_test.go": file("t")},
		"not Go, but the test":  {"a.go": file("package sinit // drop every capability"), "b.go": file("x"), "a_test.go": file("t"), "notes.txt": file("x")},
		"only the test changed": {"a.go": file("package sinit // drop every capability"), "b.go": file("x"), "a_test.go": file("u")},
	} {
		same := name == "not Go, but the test" || name == "only the test changed"
		if got := digest(other); (got == want) != same {
			t.Errorf("%s: identity %q, base's %q: same %v, want %v", name, got, want, got == want, same)
		}
	}

	onDisk, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	want2, got := map[string]string{}, map[string]string{}
	for _, name := range onDisk {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		want2[name] = string(b)
	}
	embedded, _ := fs.Glob(sources, "*.go")
	for _, name := range embedded {
		if !strings.HasSuffix(name, "_test.go") {
			b, _ := fs.ReadFile(sources, name)
			got[name] = string(b)
		}
	}
	if diff := cmp.Diff(want2, got); diff != "" {
		t.Errorf("the hashed sources (-on disk +embedded):\n%s", diff)
	}
	if Identity() != identity(sources) {
		t.Errorf("Identity %q is not the embedded sources' %q", Identity(), identity(sources))
	}
}
