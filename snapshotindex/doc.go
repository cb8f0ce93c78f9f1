// Package snapshotindex is the durable index of committed checkpoints and the
// provider snapshots they name, kept in Badger under checkpoint.state_dir.
//
// A checkpoint is a CheckpointMeta plus one Record per live session: enough
// for a fresh process to fork every session's sandbox from its snapshot
// (provider, spec, snapshot id, workdir, session data) and to stop the
// sandbox the snapshot came from (its Handle). The owner core writes a
// checkpoint with Commit once every session's snapshot succeeded, reads it
// back with Checkpoint on restore, and frees snapshots with Drop and the
// tombstone calls on release.
//
// # Guarantees
//
//   - Every write method is one Badger transaction with synced writes, so a
//     crash (even SIGKILL mid-commit) leaves each checkpoint either wholly
//     present or absent. Checkpoint re-checks the record count and the
//     records' SHA-256 against the meta on every load, and reports a
//     mismatch as a *CorruptError instead of returning a partial checkpoint.
//   - Commit is idempotent: the same id with the same records, scope and
//     checkpoint dir is a no-op returning the stored meta; the same id with
//     other content is a *ConflictError (errors.Is(err, ErrConflict)).
//   - A value that does not decode, or does not match its key, is a
//     *CorruptError naming the key; nothing panics on bad data.
//   - The index never names a doomed snapshot: Commit refuses records whose
//     snapshot is tombstoned, and AddTombstones / Drop refuse tombstones for
//     snapshots a remaining checkpoint names.
//   - All methods are safe for concurrent use. Writers are serialised (they
//     are rare and short); readers run in parallel on Badger snapshots.
//     After Close every method returns ErrClosed.
//
// # Store, Index and Memory
//
// Store is the contract above. *Index keeps it in Badger. *MemIndex keeps it
// in a Memory, for simulations and tests that need many indexes (opening
// Badger costs milliseconds and tens of megabytes): the same code runs over
// a sorted map instead of a Badger transaction, so both store the same JSON
// under the same keys and return the same results, orderings, sequence
// numbers and errors. A Memory is the disk and a MemIndex the process over
// it: closing a handle and opening another is a crash and restart, keeping
// every committed transaction. What a Memory lacks is what only a disk has:
// no limit on a transaction's size (a commit too big for Badger succeeds
// there), no schema check on open, no value-log GC.
//
// # Key layout
//
// Variable components are escaped ('%' → %25, '/' → %2F) so a prefix scan of
// one checkpoint or one snapshot can never pick up another's keys.
//
//	v                     schema version, decimal ("1"); Open refuses others
//	q                     last Seq handed out, uint64 big-endian
//	c/<ckpt>              CheckpointMeta, JSON
//	r/<ckpt>/<session>    Record, JSON (canonical form, see below)
//	s/<snapshot>/<ckpt>   reverse reference, empty value
//	t/<snapshot>          Tombstone, JSON
//	i/<kind>/<id>         Intent, JSON
//	m/<key>               Template, JSON (a keyed setup's snapshot)
//
// The canonical form of a record is encoding/json's output for it with its
// times in UTC; RecordsSHA256 is the hex SHA-256 of the canonical records in
// SessionID order, each followed by "\n". Checkpoints are ordered by Seq,
// which Commit takes from q, so it never repeats even after the newest
// checkpoint is dropped.
//
// # Crash safety of deletes: tombstone, delete, clear
//
// A snapshot is only deleted from the provider after a tombstone for it is
// durable, and the tombstone is only cleared after the delete succeeded:
//
//  1. Decide: Drop(checkpoints, tombstones) removes the released checkpoints
//     and tombstones the snapshots no kept checkpoint (nor live session)
//     needs, in one transaction. A failed commit tombstones the snapshots it
//     took with AddTombstones.
//  2. Delete each tombstoned snapshot from the provider (a missing one is
//     success there, so repeating this is harmless).
//  3. ClearTombstones the ones deleted.
//
// A crash after 1 leaves tombstones that a fresh process finds with
// Tombstones and finishes (2, 3); a crash before 1 leaves the checkpoints in
// place and their snapshots referenced. Either way nothing leaks and nothing
// a kept checkpoint needs is deleted.
//
// Intents cover the window before a snapshot is recorded anywhere: write an
// intent (PutIntent) before taking the snapshots it covers, and clear it in
// the same transaction as the outcome (Commit(..., key) or PutTemplate(...,
// key) on success, AddTombstones(snapshots, key) on failure). An intent
// found at startup is an operation that died midway; its body says how to
// find the snapshots to tombstone. The owner writes one standing intent per
// run at its start, covering every commit of that run, so that a commit
// writes nothing before its snapshots.
//
// # Sizing
//
// Values of 256 bytes or more (every realistic record) live in Badger's
// value log, so a transaction's budget is spent on keys: one commit of
// 10,000 records of any size fits. A commit that does not fit fails with
// ErrInvalid wrapping badger.ErrTxnTooBig and writes nothing. Open starts a
// goroutine that runs value-log GC after drops and every ten minutes; Close
// stops it.
//
// Options.InMemory is for unit tests only: nothing is durable and all values
// sit in the LSM tree, so commits are limited to about 4 MB of records.
package snapshotindex
