package fifo_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/fifo"
)

func TestMapForgetsItsOldestFirst(t *testing.T) {
	f := fifo.New[string, int](3)
	for i, k := range []string{"a", "b", "c"} {
		f.Put(k, i)
	}
	f.Put("a", 10) // an update keeps its place
	f.Put("d", 3)  // past the limit: the oldest (a) goes
	if diff := cmp.Diff([]string{"b", "c", "d"}, f.Keys()); diff != "" {
		t.Fatalf("keys (-want +got):\n%s", diff)
	}
	if f.Has("a") || f.Len() != 3 {
		t.Fatalf("a kept %v, len %d", f.Has("a"), f.Len())
	}
	if v, ok := f.Get("c"); !ok || v != 2 {
		t.Fatalf("c = %v %v", v, ok)
	}
	k, v, ok := f.Oldest()
	if !ok || k != "b" || v != 1 {
		t.Fatalf("oldest %v %v %v", k, v, ok)
	}
	f.DropOldest()
	f.DropOldest()
	f.DropOldest()
	f.DropOldest()
	if _, _, ok := f.Oldest(); ok || f.Len() != 0 {
		t.Fatalf("not empty after dropping all: %v", f.Keys())
	}
	z := fifo.New[int, int](0)
	z.Put(1, 1)
	z.Put(2, 2)
	if z.Len() != 1 || !z.Has(2) {
		t.Fatalf("a limit below 1 keeps one: %v", z.Keys())
	}
}
