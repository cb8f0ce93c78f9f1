package snapshotindex

import (
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
	// smaller commits (about 4 MB of records) than the on-disk index.
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

// Index is the snapshot index. Its methods are safe for concurrent use.
type Index struct {
	db  *badger.DB
	log logrus.FieldLogger

	// mu is held for reading by every call for its whole duration, and for
	// writing by Close, so Close waits for calls in flight and no call
	// touches a closed DB.
	mu     sync.RWMutex
	closed bool

	// writeMu serialises writers. Commit and Drop read (the seq counter,
	// tombstones, references) and then write; with one writer at a time
	// their checks cannot go stale and Badger never reports a conflict.
	writeMu sync.Mutex

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
			WithValueLogFileSize(vlogFileSize)
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

	db, err := badger.Open(bopts)
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: open %s: %w", dir, err)
	}
	if err := checkSchema(db); err != nil {
		_ = db.Close()
		return nil, err
	}
	x := &Index{db: db, log: log}
	if !opts.InMemory { // value-log GC is not allowed in memory
		x.gcKick = make(chan struct{}, 1)
		x.gcStop = make(chan struct{})
		x.gcDone = make(chan struct{})
		go x.gcLoop()
	}
	return x, nil
}

// checkSchema writes the schema version into an empty index and checks it in
// any other.
func checkSchema(db *badger.DB) error {
	return db.Update(func(txn *badger.Txn) error {
		item, err := txn.Get([]byte(keySchema))
		if errors.Is(err, badger.ErrKeyNotFound) {
			it := txn.NewIterator(badger.IteratorOptions{})
			it.Rewind()
			hasData := it.Valid()
			it.Close()
			if hasData {
				return fmt.Errorf("%w: the index holds data but no schema version key", ErrSchemaVersion)
			}
			return txn.Set([]byte(keySchema), []byte(strconv.Itoa(schemaValue)))
		}
		if err != nil {
			return fmt.Errorf("snapshotindex: read schema version: %w", err)
		}
		v, err := item.ValueCopy(nil)
		if err != nil {
			return fmt.Errorf("snapshotindex: read schema version: %w", err)
		}
		n, err := strconv.Atoi(string(v))
		if err != nil {
			return &CorruptError{Key: keySchema, Err: err}
		}
		if n != schemaValue {
			return fmt.Errorf("%w: the index has version %d, this build reads %d", ErrSchemaVersion, n, schemaValue)
		}
		return nil
	})
}

// Close closes the index after the calls in flight return. Later calls
// return ErrClosed; a second Close returns nil.
func (x *Index) Close() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.closed {
		return nil
	}
	x.closed = true
	if x.gcStop != nil {
		close(x.gcStop)
		<-x.gcDone
	}
	if err := x.db.Close(); err != nil {
		return fmt.Errorf("snapshotindex: close: %w", err)
	}
	return nil
}

// enter starts a call: it fails once the index is closed, and otherwise
// keeps Close waiting until the returned func runs.
func (x *Index) enter() (leave func(), err error) {
	x.mu.RLock()
	if x.closed {
		x.mu.RUnlock()
		return nil, ErrClosed
	}
	return x.mu.RUnlock, nil
}

// view runs a read-only transaction.
func (x *Index) view(fn func(txn *badger.Txn) error) error {
	leave, err := x.enter()
	if err != nil {
		return err
	}
	defer leave()
	return x.db.View(fn)
}

// update runs a read-write transaction, one writer at a time. A transaction
// too big for Badger is reported as ErrInvalid (it will never fit), still
// wrapping badger.ErrTxnTooBig.
func (x *Index) update(fn func(txn *badger.Txn) error) error {
	leave, err := x.enter()
	if err != nil {
		return err
	}
	defer leave()
	x.writeMu.Lock()
	defer x.writeMu.Unlock()
	err = x.db.Update(fn)
	if errors.Is(err, badger.ErrTxnTooBig) {
		return fmt.Errorf("%w: the change does not fit in one Badger transaction (at most %d bytes, %d entries): %w",
			ErrInvalid, x.db.MaxBatchSize(), x.db.MaxBatchCount(), err)
	}
	return err
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
