// Package fifo is the one bounded memory the server keeps of things that
// are gone (closed sessions, ended sandboxes, resumed checkpoints): a map
// that forgets its oldest entries first.
package fifo

// Map keeps at most its limit of entries; putting a new key past the limit
// drops the oldest. Updating a key keeps its place. It is not safe for
// concurrent use: its owner locks.
type Map[K comparable, V any] struct {
	limit int
	m     map[K]V
	order []K
}

// New returns an empty Map of at most limit entries (at least 1).
func New[K comparable, V any](limit int) *Map[K, V] {
	return &Map[K, V]{limit: max(limit, 1), m: map[K]V{}}
}

// Put sets k to v.
func (f *Map[K, V]) Put(k K, v V) {
	if _, ok := f.m[k]; !ok {
		f.order = append(f.order, k)
	}
	f.m[k] = v
	for len(f.order) > f.limit {
		f.DropOldest()
	}
}

// Get returns k's value.
func (f *Map[K, V]) Get(k K) (V, bool) {
	v, ok := f.m[k]
	return v, ok
}

// Has reports whether k is kept.
func (f *Map[K, V]) Has(k K) bool {
	_, ok := f.m[k]
	return ok
}

// Len is the number of entries.
func (f *Map[K, V]) Len() int { return len(f.order) }

// Oldest returns the entry put first.
func (f *Map[K, V]) Oldest() (K, V, bool) {
	if len(f.order) == 0 {
		var k K
		var v V
		return k, v, false
	}
	k := f.order[0]
	return k, f.m[k], true
}

// DropOldest forgets the entry put first.
func (f *Map[K, V]) DropOldest() {
	if len(f.order) == 0 {
		return
	}
	delete(f.m, f.order[0])
	var zero K
	f.order[0] = zero
	f.order = f.order[1:]
}

// Keys are the keys, oldest first.
func (f *Map[K, V]) Keys() []K { return append([]K(nil), f.order...) }
