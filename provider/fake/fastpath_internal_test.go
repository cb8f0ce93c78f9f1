package fake

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestResolveFastPathAgreesWithTheWalk: the clean-path shortcut returns
// what the walk does, and refuses what it refuses, over random names.
func TestResolveFastPathAgreesWithTheWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	segs := []string{"", ".", "..", "a", "b", "...", ".x", "a b"}
	for range 20000 {
		var b strings.Builder
		if rng.IntN(2) == 0 {
			b.WriteByte('/')
		}
		for i := range rng.IntN(5) {
			if i > 0 {
				b.WriteByte('/')
			}
			b.WriteString(segs[rng.IntN(len(segs))])
		}
		name := b.String()
		if name == "" {
			continue
		}
		for _, dir := range []string{"/", "/work", "/a/b"} {
			got, gerr := resolve(dir, name)
			full := name
			if !strings.HasPrefix(name, "/") {
				full = dir + "/" + name
			}
			want, werr := walk(full, name)
			if (gerr != nil) != (werr != nil) || got != want {
				t.Fatalf("resolve(%q, %q) = %q, %v; the walk gives %q, %v", dir, name, got, gerr, want, werr)
			}
		}
	}
}

// TestHandleDescriptorIsMarshals: a handle's descriptor is what
// json.Marshal writes for it, whatever the id holds.
func TestHandleDescriptorIsMarshals(t *testing.T) {
	p := New(Options{Name: "fk"})
	for _, id := range []string{"sb-1", "p-sb-22", `q"<&>\`, "é\u2028"} {
		want, err := json.Marshal(descriptor{SandboxID: id})
		if err != nil {
			t.Fatal(err)
		}
		if d := cmp.Diff(string(want), string(p.handle(id).Descriptor)); d != "" {
			t.Fatalf("descriptor of %q (-Marshal +handle):\n%s", id, d)
		}
	}
}
