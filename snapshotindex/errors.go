package snapshotindex

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Sentinel errors. Every error the package returns that a caller may branch
// on wraps one of these, so errors.Is works through any added context.
var (
	// ErrNotFound: the checkpoint asked for is not in the index.
	ErrNotFound = errors.New("snapshotindex: not found")
	// ErrConflict: a checkpoint id was committed before with other content.
	// The concrete error is a *ConflictError.
	ErrConflict = errors.New("snapshotindex: checkpoint already committed with other content")
	// ErrCorrupt: a stored value cannot be decoded or is inconsistent with
	// its key or its checkpoint. The concrete error is a *CorruptError.
	ErrCorrupt = errors.New("snapshotindex: corrupt value")
	// ErrSchemaVersion: the directory holds an index written by another
	// schema version (or data with no version at all).
	ErrSchemaVersion = errors.New("snapshotindex: schema version mismatch")
	// ErrInvalid: the caller passed something that can never be stored
	// (an empty id, duplicate sessions, a commit too big for one
	// transaction, a tombstone for a snapshot still referenced). Retrying
	// the same call will not help.
	ErrInvalid = errors.New("snapshotindex: invalid argument")
	// ErrLocked: another open index (another process, or another Open
	// here) holds the directory.
	ErrLocked = errors.New("snapshotindex: directory in use")
	// ErrClosed: the index was closed.
	ErrClosed = errors.New("snapshotindex: index closed")
)

// ConflictError reports a Commit of an existing checkpoint id whose records,
// scope or directory differ from what is stored. Nothing was written.
type ConflictError struct {
	CheckpointID string
	// Stored is the meta already in the index; Proposed is what the
	// rejected Commit would have written (its hash computed, no Seq).
	Stored, Proposed CheckpointMeta
}

func (e *ConflictError) Error() string {
	var diff []string
	if e.Stored.RecordsSHA256 != e.Proposed.RecordsSHA256 {
		diff = append(diff, fmt.Sprintf("records %d/%.12s… vs %d/%.12s…",
			e.Stored.RecordCount, e.Stored.RecordsSHA256, e.Proposed.RecordCount, e.Proposed.RecordsSHA256))
	}
	if !slices.Equal(e.Stored.Scope, e.Proposed.Scope) {
		diff = append(diff, fmt.Sprintf("scope %q vs %q", e.Stored.Scope, e.Proposed.Scope))
	}
	if e.Stored.CheckpointDir != e.Proposed.CheckpointDir {
		diff = append(diff, fmt.Sprintf("checkpoint_dir %q vs %q", e.Stored.CheckpointDir, e.Proposed.CheckpointDir))
	}
	return fmt.Sprintf("snapshotindex: checkpoint %q already committed with other content (stored vs new: %s)",
		e.CheckpointID, strings.Join(diff, "; "))
}

// Is makes errors.Is(err, ErrConflict) true.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }

// CorruptError reports a stored value that cannot be trusted. Key is the
// Badger key it was read from, as stored (see the key layout in the package
// doc).
type CorruptError struct {
	Key string
	Err error
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("snapshotindex: corrupt value under key %q: %v", e.Key, e.Err)
}

// Is makes errors.Is(err, ErrCorrupt) true.
func (e *CorruptError) Is(target error) bool { return target == ErrCorrupt }

// Unwrap returns the decoding error.
func (e *CorruptError) Unwrap() error { return e.Err }

func corrupt(key []byte, format string, args ...any) error {
	return &CorruptError{Key: string(key), Err: fmt.Errorf(format, args...)}
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalid, fmt.Sprintf(format, args...))
}
