package snapshotindex

import (
	"sync"

	"github.com/sirupsen/logrus"
)

// Store is the snapshot index's contract. The Badger-backed *Index and the
// in-memory *MemIndex both implement it by running the same code over their
// own key-value transactions, so they return the same errors, orderings,
// sequence numbers and hashes, and store the same bytes under the same keys.
type Store interface {
	Commit(meta CheckpointMeta, records []Record, clearIntents ...IntentKey) (CheckpointMeta, error)
	Checkpoint(id string) (Checkpoint, error)
	Checkpoints() ([]CheckpointMeta, error)
	Latest() (meta CheckpointMeta, ok bool, err error)
	FindByDir(checkpointDir string) (meta CheckpointMeta, ok bool, err error)
	SnapshotRefs(snapshotID string) ([]string, error)
	ReferencedSnapshots() (map[string][]string, error)
	Drop(checkpointIDs []string, tombstones []Tombstone) error
	AddTombstones(ts []Tombstone, clearIntents ...IntentKey) error
	Tombstones() ([]Tombstone, error)
	ClearTombstones(snapshotIDs []string) error
	PutIntent(in Intent) error
	Intents(kind string) ([]Intent, error)
	DeleteIntent(k IntentKey) error
	PutTemplate(t Template, clearIntents ...IntentKey) error
	Templates() ([]Template, error)
	DropTemplates(keys []string, tombstones []Tombstone) error
	Close() error
}

var (
	_ Store = (*Index)(nil)
	_ Store = (*MemIndex)(nil)
)

// kvTxn is one transaction over the index's keys, in Badger or in a Memory.
// A read-write transaction sees its own writes. The byte slices handed to a
// callback are valid only during the call.
type kvTxn interface {
	// get calls fn with key's value; found is false, and fn is not called,
	// when the key is absent.
	get(key []byte, fn func(val []byte) error) (found bool, err error)
	set(key, val []byte) error
	delete(key []byte) error
	// scan calls fn for every key under prefix, in key order, until fn
	// fails; val is nil unless withValues.
	scan(prefix []byte, withValues bool, fn func(key, val []byte) error) error
}

// kvStore runs transactions: view read-only, update read-write, one writer
// at a time and all or nothing (an error from fn writes nothing).
type kvStore interface {
	view(fn func(txn kvTxn) error) error
	update(fn func(txn kvTxn) error) error
}

// engine is the index over a kvStore: every rule of the contract lives here
// once, and Index and MemIndex embed it over Badger and over a Memory.
type engine struct {
	kv  kvStore
	log logrus.FieldLogger
	// dropped runs after each successful Drop (Badger's value-log GC kick);
	// nil for none.
	dropped func()
	g       gate
}

// view runs a read-only transaction unless the index is closed.
func (x *engine) view(fn func(txn kvTxn) error) error { return x.run(x.kv.view, fn) }

// update runs a read-write transaction unless the index is closed.
func (x *engine) update(fn func(txn kvTxn) error) error { return x.run(x.kv.update, fn) }

// run runs fn in a transaction started by begin, unless the index is closed.
func (x *engine) run(begin func(fn func(txn kvTxn) error) error, fn func(txn kvTxn) error) error {
	leave, err := x.g.enter()
	if err != nil {
		return err
	}
	defer leave()
	return begin(fn)
}

// gate admits calls until it is shut, and shutting waits for the calls in
// flight, so no call touches a closed store.
type gate struct {
	// mu is held for reading by every call for its whole duration, and for
	// writing by shut.
	mu     sync.RWMutex
	closed bool
}

// enter starts a call: it fails with ErrClosed once the gate is shut, and
// otherwise keeps shut waiting until the returned func runs.
func (g *gate) enter() (leave func(), err error) {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return nil, ErrClosed
	}
	return g.mu.RUnlock, nil
}

// shut closes the gate after the calls in flight return and then runs
// release. A second shut does nothing and returns nil.
func (g *gate) shut(release func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	return release()
}
