package snapshotindex

import (
	"slices"
	"strings"
	"sync"

	"github.com/dgraph-io/badger/v4"

	"github.com/sandboxowner/owner/internal/logs"
)

// Memory is an index's durable contents held in memory: what the directory
// of an Index holds across a process crash, key for key and byte for byte
// (the same JSON under the same keys). Handles from Open play the process:
// closing one and opening another over the same Memory is a crash and
// restart, which keeps every committed transaction and nothing else.
//
// A Memory costs a map and a slice to make, where opening Badger costs
// milliseconds and tens of megabytes, so a simulation can make one per run.
// It is safe for concurrent use.
type Memory struct {
	// mu is held for reading by read-only transactions and for writing by
	// read-write ones, so each sees a consistent state and writers take
	// turns, as in Badger.
	mu   sync.RWMutex
	data map[string][]byte
	keys []string // data's keys, sorted bytewise as Badger sorts them
}

// NewMemory returns the contents of a freshly created index directory: the
// schema version and nothing else.
func NewMemory() *Memory {
	m := &Memory{data: map[string][]byte{}}
	m.put(keySchema, encodeSchema())
	return m
}

// MemIndex is a handle over a Memory. It keeps the contract of Index
// exactly: the same validation, errors, orderings, sequence numbers, hashes
// and stored bytes, and after Close every method returns ErrClosed. Unlike
// Badger, nothing limits the size of one transaction.
type MemIndex struct{ engine }

// Open returns a handle over m that sees everything committed through
// earlier handles. Handles are independent: closing one leaves the others
// and m as they are. Badger would refuse a second Open of a directory that
// is still open; a Memory does not, so a caller modelling a crash closes
// the old handle first.
func (m *Memory) Open() *MemIndex {
	h := &MemIndex{}
	h.kv, h.log = memStore{m}, logs.Discard()
	return h
}

// Close makes later calls of this handle return ErrClosed, after the calls
// in flight return. A second Close returns nil. The Memory keeps its
// contents.
func (x *MemIndex) Close() error { return x.g.shut(func() error { return nil }) }

// put sets k, keeping keys sorted.
func (m *Memory) put(k string, v []byte) {
	if _, ok := m.data[k]; !ok {
		i, _ := slices.BinarySearch(m.keys, k)
		m.keys = slices.Insert(m.keys, i, k)
	}
	m.data[k] = v
}

// remove deletes k, keeping keys sorted.
func (m *Memory) remove(k string) {
	if _, ok := m.data[k]; !ok {
		return
	}
	delete(m.data, k)
	i, _ := slices.BinarySearch(m.keys, k)
	m.keys = slices.Delete(m.keys, i, i+1)
}

// memStore runs the engine's transactions on a Memory.
type memStore struct{ m *Memory }

func (s memStore) view(fn func(txn kvTxn) error) error {
	s.m.mu.RLock()
	defer s.m.mu.RUnlock()
	return fn(&memTxn{m: s.m})
}

// update applies writes as they come and undoes them unless fn succeeds
// (a panic included), so a failed transaction leaves nothing behind and no
// reader ever sees one half done.
func (s memStore) update(fn func(txn kvTxn) error) error {
	s.m.mu.Lock()
	defer s.m.mu.Unlock()
	txn := &memTxn{m: s.m, writable: true}
	done := false
	defer func() {
		if !done {
			txn.rollback()
		}
	}()
	if err := fn(txn); err != nil {
		return err
	}
	done = true
	return nil
}

// memTxn is a kvTxn over a Memory whose lock its store holds.
type memTxn struct {
	m        *Memory
	writable bool
	undo     []memUndo // in the order written
}

// memUndo is a key's value before a write: had is false when it was absent.
type memUndo struct {
	key string
	val []byte
	had bool
}

func (t *memTxn) get(key []byte, fn func(val []byte) error) (bool, error) {
	v, ok := t.m.data[string(key)]
	if !ok {
		return false, nil
	}
	return true, fn(v)
}

func (t *memTxn) set(key, val []byte) error {
	if !t.writable {
		return badger.ErrReadOnlyTxn
	}
	k := string(key)
	old, had := t.m.data[k]
	t.undo = append(t.undo, memUndo{k, old, had})
	// A copy, never nil (Badger stores an empty value as empty): the
	// caller may reuse val.
	t.m.put(k, append([]byte{}, val...))
	return nil
}

func (t *memTxn) delete(key []byte) error {
	if !t.writable {
		return badger.ErrReadOnlyTxn
	}
	k := string(key)
	if old, had := t.m.data[k]; had {
		t.undo = append(t.undo, memUndo{k, old, true})
		t.m.remove(k)
	}
	return nil
}

// scan takes the keys and values under prefix first so that, like a Badger
// iterator, it does not see the writes fn makes.
func (t *memTxn) scan(prefix []byte, withValues bool, fn func(key, val []byte) error) error {
	p := string(prefix)
	i, _ := slices.BinarySearch(t.m.keys, p)
	j := i
	for j < len(t.m.keys) && strings.HasPrefix(t.m.keys[j], p) {
		j++
	}
	keys := slices.Clone(t.m.keys[i:j])
	var vals [][]byte
	if withValues {
		vals = make([][]byte, len(keys))
		for n, k := range keys {
			vals[n] = t.m.data[k]
		}
	}
	for n, k := range keys {
		var val []byte
		if withValues {
			val = vals[n]
		}
		if err := fn([]byte(k), val); err != nil {
			return err
		}
	}
	return nil
}

// rollback restores every key written, newest write first.
func (t *memTxn) rollback() {
	for i := len(t.undo) - 1; i >= 0; i-- {
		u := t.undo[i]
		if u.had {
			t.m.put(u.key, u.val)
		} else {
			t.m.remove(u.key)
		}
	}
	t.undo = nil
}
