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
	// ring holds the keys in the order put, n of them from head on,
	// wrapping: once it has grown to the limit, a put past it reuses the
	// oldest's place instead of growing a slice again.
	ring    []K
	head, n int
}

// New returns an empty Map of at most limit entries (at least 1).
func New[K comparable, V any](limit int) *Map[K, V] {
	return &Map[K, V]{limit: max(limit, 1), m: map[K]V{}}
}

// Put sets k to v.
func (f *Map[K, V]) Put(k K, v V) {
	had := len(f.m)
	f.m[k] = v
	if len(f.m) == had {
		return // an update keeps its place
	}
	if f.n == f.limit {
		f.DropOldest()
	}
	if f.n == len(f.ring) {
		f.grow()
	}
	f.ring[(f.head+f.n)%len(f.ring)] = k
	f.n++
}

// grow makes room for one more key (up to the limit), oldest first.
func (f *Map[K, V]) grow() {
	ring := make([]K, min(max(2*len(f.ring), 8), f.limit))
	f.copyTo(ring)
	f.ring, f.head = ring, 0
}

// copyTo copies the keys, oldest first, to dst.
func (f *Map[K, V]) copyTo(dst []K) {
	n := copy(dst[:f.n], f.ring[f.head:min(f.head+f.n, len(f.ring))])
	copy(dst[n:f.n], f.ring)
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
func (f *Map[K, V]) Len() int { return f.n }

// Oldest returns the entry put first.
func (f *Map[K, V]) Oldest() (K, V, bool) {
	if f.n == 0 {
		var k K
		var v V
		return k, v, false
	}
	k := f.ring[f.head]
	return k, f.m[k], true
}

// DropOldest forgets the entry put first.
func (f *Map[K, V]) DropOldest() {
	if f.n == 0 {
		return
	}
	delete(f.m, f.ring[f.head])
	var zero K
	f.ring[f.head] = zero
	f.head = (f.head + 1) % len(f.ring)
	f.n--
}

// Keys are the keys, oldest first.
func (f *Map[K, V]) Keys() []K {
	if f.n == 0 {
		return nil
	}
	out := make([]K, f.n)
	f.copyTo(out)
	return out
}
