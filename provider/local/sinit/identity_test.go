package sinit

import (
	"reflect"
	"strings"
	"testing"
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
