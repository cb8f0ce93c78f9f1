package fifo_test

import (
	"runtime"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxowner/owner/internal/fifo"
	"github.com/sandboxowner/owner/internal/racebuild"
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

// The keys keep their order through every wrap of the ring and growth,
// against a plain slice doing the same.
func TestMapKeepsItsOrderAroundTheRing(t *testing.T) {
	const limit = 13
	f := fifo.New[int, int](limit)
	var want []int
	for i := range 200 {
		k := i % 37
		if i%5 == 0 {
			k = i // a new key between updates
		}
		f.Put(k, i)
		if !slices.Contains(want, k) {
			want = append(want, k)
			if len(want) > limit {
				want = want[1:]
			}
		}
		if v, ok := f.Get(k); !ok || v != i {
			t.Fatalf("%d = %v %v, want %d", k, v, ok, i)
		}
		if i%17 == 0 {
			f.DropOldest()
			want = want[1:]
		}
		if diff := cmp.Diff(want, f.Keys(), cmpopts.EquateEmpty()); diff != "" {
			t.Fatalf("after put %d of %d (-want +got):\n%s", i, k, diff)
		}
	}
}

// Once full, a map forgets and remembers in place: a put of a new key
// grows no slice.
func TestAFullMapPutsWithoutGrowing(t *testing.T) {
	if racebuild.Enabled {
		t.Skip("allocations are not counted under -race")
	}
	f := fifo.New[int, int](1 << 10)
	next := 0
	put := func() { f.Put(next, next); next++ }
	for range 4 << 10 {
		put()
	}
	// Counted over all the puts: AllocsPerRun rounds an allocation every
	// thousand puts down to none.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 4 << 10 {
		put()
	}
	runtime.ReadMemStats(&after)
	if n := after.Mallocs - before.Mallocs; n > 0 {
		t.Errorf("%d allocations in %d puts into a full map, want none", n, 4<<10)
	}
}
