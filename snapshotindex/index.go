package snapshotindex

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/flock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// Record is what a checkpoint holds for one session: enough for a fresh
// process to fork the session's sandbox from its snapshot and to stop the
// sandbox the snapshot was taken from.
type Record struct {
	SessionID  string          `json:"session_id"`
	Episode    string          `json:"episode,omitempty"`
	Provider   string          `json:"provider"`
	Sandbox    provider.Handle `json:"sandbox"`
	SnapshotID string          `json:"snapshot_id"`
	Spec       provider.Spec   `json:"spec"`
	Workdir    string          `json:"workdir"`
	Data       json.RawMessage `json:"session_data,omitempty"`
	SnapshotAt time.Time       `json:"snapshot_at"`
}

// CheckpointMeta describes one committed checkpoint.
type CheckpointMeta struct {
	ID            string    `json:"checkpoint_id"`
	CommittedAt   time.Time `json:"committed_at"`
	CheckpointDir string    `json:"checkpoint_dir,omitempty"`
	Scope         []string  `json:"scope,omitempty"`
	RecordCount   int       `json:"record_count"`
	RecordsSHA256 string    `json:"records_sha256"` // computed by Commit over the canonical records; callers leave it empty
	Seq           uint64    `json:"seq"`            // assigned by Commit, monotonically increasing
}

// Checkpoint is a checkpoint's meta and its records, sorted by SessionID.
type Checkpoint struct {
	Meta    CheckpointMeta
	Records []Record
}

// Tombstone marks a snapshot that has been decided dead but may not be
// deleted from the provider yet.
type Tombstone struct {
	SnapshotID string    `json:"snapshot_id"`
	Provider   string    `json:"provider"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
}

// Intent is a durable note of an operation in flight (for example "commit
// X is taking snapshots"), written before the operation's side effects and
// cleared in the same transaction that records its outcome. Intents left
// after a crash tell a fresh process what to clean up.
type Intent struct {
	Kind string          `json:"kind"`
	ID   string          `json:"id"`
	Body json.RawMessage `json:"body,omitempty"`
	At   time.Time       `json:"at"`
}

// IntentKey names an intent.
type IntentKey struct{ Kind, ID string }

// Options configure Open.
type Options struct {
	// Logger receives Badger's messages (its info lines at debug level) and
	// the index's own. Nil discards them.
	Logger logrus.FieldLogger
	// InMemory keeps everything in memory and ignores dir: tests only. It
	// is not durable, and all values sit in the LSM tree, so it holds
	// smaller commits (about 4 MB of records) than the on-disk index. A
	// Memory (NewMemory) keeps the same contract for a fraction of the cost
	// of opening Badger.
	InMemory bool
}

// Badger sizing. A transaction may hold at most 15% of MemTableSize bytes
// and that divided by skl.MaxNodeSize (~96 B) entries. Values of at least
// valueThreshold bytes go to the value log and cost only their key plus a
// 12-byte pointer in that budget, so with a 32 MiB memtable (4.8 MB, ~50k
// entries per transaction) a commit of 10,000 records of any size fits
// (two entries per record: the record and its reverse reference), while the
// memory an open index holds stays small enough for many in one test
// binary.
const (
	memTableSize   = 32 << 20
	valueThreshold = 256
	vlogFileSize   = 64 << 20
	gcInterval     = 10 * time.Minute
	gcDiscardRatio = 0.5
)

// Index is the snapshot index in Badger. Its methods are safe for
// concurrent use.
type Index struct {
	engine
	db *badger.DB

	// lock is the directory, flocked while the index is open (nil in
	// memory); see lockDir.
	lock *os.File

	gcKick chan struct{} // buffered(1): a drop made value-log garbage
	gcStop chan struct{}
	gcDone chan struct{}
}

// Open opens (creating if needed) the index in dir. A fresh directory gets
// the current schema version; an existing one must carry it, or Open fails
// with ErrSchemaVersion.
func Open(dir string, opts Options) (*Index, error) {
	log := logs.Or(opts.Logger)
	log = log.WithField("component", "snapshotindex")

	var bopts badger.Options
	if opts.InMemory {
		bopts = badger.DefaultOptions("").WithInMemory(true)
	} else {
		if dir == "" {
			return nil, invalid("empty directory")
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("snapshotindex: create %s: %w", dir, err)
		}
		// In memory, Badger rejects values above the threshold instead of
		// moving them to a value log, so only the disk index lowers it.
		bopts = badger.DefaultOptions(dir).
			WithValueThreshold(valueThreshold).
			WithValueLogFileSize(vlogFileSize).
			WithBypassLockGuard(true) // the index locks dir itself: lockDir
	}
	bopts = bopts.
		WithSyncWrites(true).
		WithLogger(badgerLogger{log.WithField("component", "badger")}).
		WithMemTableSize(memTableSize).
		WithNumMemtables(2).
		WithBlockCacheSize(8 << 20).
		WithIndexCacheSize(4 << 20).
		WithNumCompactors(2).
		WithMetricsEnabled(false)

	var lock *os.File
	if !opts.InMemory {
		l, err := lockDir(dir)
		if err != nil {
			return nil, err
		}
		lock = l
	}
	db, err := badger.Open(bopts)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("snapshotindex: open %s: %w", dir, err), unlockDir(lock))
	}
	kv := &badgerStore{db: db}
	if err := kv.update(checkSchema); err != nil {
		return nil, errors.Join(err, db.Close(), unlockDir(lock))
	}
	x := &Index{db: db, lock: lock}
	x.kv, x.log = kv, log
	if !opts.InMemory { // value-log GC is not allowed in memory
		x.gcKick = make(chan struct{}, 1)
		x.gcStop = make(chan struct{})
		x.gcDone = make(chan struct{})
		x.dropped = x.kickGC
		go x.gcLoop()
	}
	return x, nil
}

// checkSchema writes the schema version into an empty index and checks it in
// any other.
func checkSchema(txn kvTxn) error {
	var v []byte
	found, err := txn.get([]byte(keySchema), func(val []byte) error {
		v = bytes.Clone(val)
		return nil
	})
	if err != nil {
		return fmt.Errorf("snapshotindex: read schema version: %w", err)
	}
	if !found {
		_, hasData, err := exists(txn, nil)
		if err != nil {
			return fmt.Errorf("snapshotindex: read schema version: %w", err)
		}
		if hasData {
			return fmt.Errorf("%w: the index holds data but no schema version key", ErrSchemaVersion)
		}
		return txn.set([]byte(keySchema), encodeSchema())
	}
	n, err := strconv.Atoi(string(v))
	if err != nil {
		return &CorruptError{Key: keySchema, Err: err}
	}
	if n != schemaValue {
		return fmt.Errorf("%w: the index has version %d, this build reads %d", ErrSchemaVersion, n, schemaValue)
	}
	return nil
}

// Close closes the index after the calls in flight return, and returns
// once the directory is free for another Open. Later calls return
// ErrClosed; a second Close returns nil.
func (x *Index) Close() error {
	return x.g.shut(func() error {
		if x.gcStop != nil {
			close(x.gcStop)
			<-x.gcDone
		}
		var err error
		if cerr := x.db.Close(); cerr != nil {
			err = fmt.Errorf("snapshotindex: close: %w", cerr)
		}
		return errors.Join(err, unlockDir(x.lock))
	})
}

// lockDir takes the exclusive flock on dir that Badger's own guard would
// take (so a Badger tool, or a server of an earlier build, on the same
// directory is refused as before), and that only the index drops: Badger
// drops its lock by closing the directory, which leaves it held while a
// child forked meanwhile is on its way to exec (see internal/flock). A
// server that reopened its index right after closing it (a restart in one
// process) found the directory locked by its own children.
func lockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: lock %s: %w", dir, err)
	}
	if err := flock.TryExclusive(f); err != nil {
		_ = f.Close()
		if errors.Is(err, flock.ErrHeld) {
			return nil, fmt.Errorf("%w: %s (another server on this state_dir?): %w", ErrLocked, dir, err)
		}
		return nil, fmt.Errorf("snapshotindex: lock %s: %w", dir, err)
	}
	return f, nil
}

// unlockDir releases lockDir's lock; nil does nothing.
func unlockDir(f *os.File) error {
	if f == nil {
		return nil
	}
	if err := flock.Release(f); err != nil {
		return fmt.Errorf("snapshotindex: %w", err)
	}
	return nil
}

// badgerStore runs the engine's transactions in Badger.
type badgerStore struct {
	db *badger.DB
	// writeMu serialises writers. Commit and Drop read (the seq counter,
	// tombstones, references) and then write; with one writer at a time
	// their checks cannot go stale and Badger never reports a conflict.
	writeMu sync.Mutex
}

func (s *badgerStore) view(fn func(txn kvTxn) error) error {
	return s.db.View(func(txn *badger.Txn) error { return fn(badgerTxn{txn}) })
}

// update runs a read-write transaction, one writer at a time. A transaction
// too big for Badger is reported as ErrInvalid (it will never fit), still
// wrapping badger.ErrTxnTooBig.
func (s *badgerStore) update(fn func(txn kvTxn) error) error {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	err := s.db.Update(func(txn *badger.Txn) error { return fn(badgerTxn{txn}) })
	if errors.Is(err, badger.ErrTxnTooBig) {
		return fmt.Errorf("%w: the change does not fit in one Badger transaction (at most %d bytes, %d entries): %w",
			ErrInvalid, s.db.MaxBatchSize(), s.db.MaxBatchCount(), err)
	}
	return err
}

// badgerTxn is a kvTxn over a Badger transaction.
type badgerTxn struct{ txn *badger.Txn }

func (t badgerTxn) get(key []byte, fn func(val []byte) error) (bool, error) {
	item, err := t.txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %q: %w", key, err)
	}
	return true, value(item, fn)
}

func (t badgerTxn) set(key, val []byte) error { return t.txn.Set(key, val) }
func (t badgerTxn) delete(key []byte) error   { return t.txn.Delete(key) }

// scan iterates keys only unless withValues, which is much cheaper.
func (t badgerTxn) scan(prefix []byte, withValues bool, fn func(key, val []byte) error) error {
	opts := badger.DefaultIteratorOptions
	opts.Prefix = prefix
	opts.PrefetchValues = withValues
	// A read-write transaction allows one iterator at a time, so every
	// iterator is closed before scan returns.
	it := t.txn.NewIterator(opts)
	defer it.Close()
	for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
		item := it.Item()
		var err error
		if withValues {
			err = value(item, func(val []byte) error { return fn(item.Key(), val) })
		} else {
			err = fn(item.Key(), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// value calls fn with item's value. A failure to read the value names the
// key; fn's own error is returned as it is.
func value(item *badger.Item, fn func(val []byte) error) error {
	var fnErr error
	if err := item.Value(func(val []byte) error { fnErr = fn(val); return nil }); err != nil {
		return fmt.Errorf("read %q: %w", item.Key(), err)
	}
	return fnErr
}

// kickGC asks the GC loop to run soon; it never blocks.
func (x *Index) kickGC() {
	if x.gcKick == nil {
		return
	}
	select {
	case x.gcKick <- struct{}{}:
	default:
	}
}

// gcLoop reclaims value-log space. Records live in the value log (they are
// above valueThreshold), so dropped checkpoints leave garbage there that only
// RunValueLogGC returns to the disk.
func (x *Index) gcLoop() {
	defer close(x.gcDone)
	t := time.NewTicker(gcInterval)
	defer t.Stop()
	for {
		select {
		case <-x.gcStop:
			return
		case <-t.C:
		case <-x.gcKick:
		}
		n := 0
		for x.db.RunValueLogGC(gcDiscardRatio) == nil {
			n++
			select {
			case <-x.gcStop:
				return
			default:
			}
		}
		if n > 0 {
			x.log.Debugf("value-log GC rewrote %d files", n)
		}
	}
}

// badgerLogger routes Badger's log lines to the injected logger. Badger is
// chatty at info level (table dumps on open and close), so info goes to
// debug.
type badgerLogger struct{ l logrus.FieldLogger }

func (b badgerLogger) Errorf(f string, a ...any)   { b.l.Errorf(trimNL(f), a...) }
func (b badgerLogger) Warningf(f string, a ...any) { b.l.Warnf(trimNL(f), a...) }
func (b badgerLogger) Infof(f string, a ...any)    { b.l.Debugf(trimNL(f), a...) }
func (b badgerLogger) Debugf(f string, a ...any)   { b.l.Debugf(trimNL(f), a...) }

// trimNL drops the newline Badger ends most formats with; logrus adds its
// own.
func trimNL(f string) string { return strings.TrimSuffix(f, "\n") }
