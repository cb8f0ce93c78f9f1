package snapshotindex

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// encodedRecord is a validated record in its stored form.
type encodedRecord struct {
	session, snapshot string
	value             []byte // canonical JSON: what is stored and hashed
}

// encodeRecords validates records and returns them in their canonical form:
// sorted by SessionID, times in UTC, marshalled by encoding/json (which
// sorts map keys and compacts raw JSON). The caller's slice is not touched.
func encodeRecords(records []Record) ([]encodedRecord, error) {
	for i, r := range records {
		switch {
		case r.SessionID == "":
			return nil, invalid("record %d: empty session_id", i)
		case r.SnapshotID == "":
			return nil, invalid("record %d (session %q): empty snapshot_id", i, r.SessionID)
		case r.Provider == "":
			return nil, invalid("record %d (session %q): empty provider", i, r.SessionID)
		}
	}
	sorted := slices.Clone(records)
	slices.SortFunc(sorted, func(a, b Record) int { return strings.Compare(a.SessionID, b.SessionID) })
	out := make([]encodedRecord, len(sorted))
	for i := range sorted {
		r := &sorted[i]
		if i > 0 && sorted[i-1].SessionID == r.SessionID {
			return nil, invalid("duplicate session_id %q", r.SessionID)
		}
		r.SnapshotAt = r.SnapshotAt.UTC()
		v, err := json.Marshal(r)
		if err != nil {
			return nil, invalid("session %q: encode record: %v", r.SessionID, err)
		}
		out[i] = encodedRecord{session: r.SessionID, snapshot: r.SnapshotID, value: v}
	}
	return out, nil
}

// hashValues is RecordsSHA256: the hex SHA-256 of every canonical record
// followed by a newline (which canonical JSON never contains), in SessionID
// order.
func hashValues(n int, value func(i int) []byte) string {
	h := sha256.New()
	for i := range n {
		h.Write(value(i))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Commit records a checkpoint: its meta, every record, a reverse reference
// per snapshot, and the deletion of clearIntents, all in one transaction.
// It returns the meta as stored, with RecordCount, RecordsSHA256, Seq and
// (when zero) CommittedAt filled in.
//
// Committing an id that is already stored with the same records, scope and
// checkpoint dir changes nothing but clearIntents and returns the stored
// meta, so a retry after an unacknowledged commit is safe. Other content is
// a *ConflictError. Records naming a tombstoned snapshot, empty ids,
// duplicate sessions and (in Badger) commits too big for one transaction
// are ErrInvalid.
func (x *engine) Commit(meta CheckpointMeta, records []Record, clearIntents ...IntentKey) (CheckpointMeta, error) {
	stored, err := x.commit(meta, records, clearIntents)
	if err != nil {
		return CheckpointMeta{}, fmt.Errorf("snapshotindex: commit %q: %w", meta.ID, err)
	}
	return stored, nil
}

func (x *engine) commit(meta CheckpointMeta, records []Record, clearIntents []IntentKey) (CheckpointMeta, error) {
	if meta.ID == "" {
		return CheckpointMeta{}, invalid("empty checkpoint id")
	}
	if err := checkIntentKeys(clearIntents); err != nil {
		return CheckpointMeta{}, err
	}
	enc, err := encodeRecords(records)
	if err != nil {
		return CheckpointMeta{}, err
	}
	hash := hashValues(len(enc), func(i int) []byte { return enc[i].value })
	if meta.RecordsSHA256 != "" && meta.RecordsSHA256 != hash {
		return CheckpointMeta{}, invalid("records_sha256 %s given, records hash to %s", meta.RecordsSHA256, hash)
	}
	if meta.RecordCount != 0 && meta.RecordCount != len(enc) {
		return CheckpointMeta{}, invalid("record_count %d given, %d records", meta.RecordCount, len(enc))
	}
	meta.RecordsSHA256, meta.RecordCount, meta.Seq = hash, len(enc), 0
	meta.CommittedAt = stamp(meta.CommittedAt)
	meta.Scope = slices.Clone(meta.Scope)

	var stored CheckpointMeta
	err = x.update(func(txn kvTxn) error {
		var old CheckpointMeta
		found, err := get(txn, metaKey(meta.ID), &old)
		if err != nil {
			return err
		}
		if found {
			if old.RecordsSHA256 != meta.RecordsSHA256 || !slices.Equal(old.Scope, meta.Scope) ||
				old.CheckpointDir != meta.CheckpointDir {
				return &ConflictError{CheckpointID: meta.ID, Stored: old, Proposed: meta}
			}
			stored = old
			return deleteIntents(txn, clearIntents)
		}
		// A tombstoned snapshot is on its way out; naming it would leave
		// the checkpoint pointing at nothing.
		dead, err := tombstoned(txn)
		if err != nil {
			return err
		}
		for _, e := range enc {
			if dead[e.snapshot] {
				return invalid("session %q: snapshot %q is tombstoned", e.session, e.snapshot)
			}
		}
		seq, err := nextSeq(txn)
		if err != nil {
			return err
		}
		meta.Seq = seq
		if err := setJSON(txn, metaKey(meta.ID), meta); err != nil {
			return err
		}
		for _, e := range enc {
			if err := txn.set(recordKey(meta.ID, e.session), e.value); err != nil {
				return err
			}
			if err := txn.set(refKey(e.snapshot, meta.ID), nil); err != nil {
				return err
			}
		}
		stored = meta
		return deleteIntents(txn, clearIntents)
	})
	return stored, err
}

// nextSeq increments and returns the seq counter. It lives in its own key,
// not in the metas, so a Drop of the latest checkpoint never lets a seq be
// handed out twice.
func nextSeq(txn kvTxn) (uint64, error) {
	var n uint64
	_, err := txn.get([]byte(keySeq), func(b []byte) error {
		if len(b) != 8 {
			return corrupt([]byte(keySeq), "seq counter is %d bytes, want 8", len(b))
		}
		n = binary.BigEndian.Uint64(b)
		return nil
	})
	if err != nil {
		return 0, err
	}
	n++
	return n, txn.set([]byte(keySeq), encodeSeq(n))
}

// Checkpoint returns a checkpoint and its records, sorted by SessionID. It
// checks the records against the meta's count and hash, so a checkpoint it
// returns is complete.
func (x *engine) Checkpoint(id string) (Checkpoint, error) {
	var c Checkpoint
	err := x.view(func(txn kvTxn) (err error) {
		c.Meta, c.Records, err = load(txn, id, func(r *Record) string { return r.SessionID })
		return err
	})
	if err != nil {
		return Checkpoint{}, fmt.Errorf("snapshotindex: checkpoint %q: %w", id, err)
	}
	return c, nil
}

// recordRef is the part of a record Drop needs; decoding only it is much
// cheaper than decoding the whole record.
type recordRef struct {
	SessionID  string `json:"session_id"`
	SnapshotID string `json:"snapshot_id"`
}

// load reads and verifies one checkpoint, decoding each record as a T
// (Record, or recordRef when only the ids matter). session returns a T's
// session id, which must match its key.
func load[T any](txn kvTxn, id string, session func(*T) string) (CheckpointMeta, []T, error) {
	var meta CheckpointMeta
	mk := metaKey(id)
	found, err := get(txn, mk, &meta)
	if err != nil {
		return meta, nil, err
	}
	if !found {
		return meta, nil, fmt.Errorf("%w: checkpoint %q", ErrNotFound, id)
	}
	if meta.ID != id {
		return meta, nil, corrupt(mk, "meta names checkpoint %q", meta.ID)
	}
	type entry struct {
		session string
		raw     []byte
	}
	var (
		recs    []T
		entries []entry
	)
	err = txn.scan(recordPrefix(id), true, func(key, val []byte) error {
		raw := bytes.Clone(val)
		var r T
		if err := decode(key, raw, &r); err != nil {
			return err
		}
		s := session(&r)
		if !bytes.Equal(key, recordKey(id, s)) {
			return corrupt(key, "record names session %q", s)
		}
		recs = append(recs, r)
		entries = append(entries, entry{s, raw})
		return nil
	})
	if err != nil {
		return meta, nil, err
	}
	if len(recs) != meta.RecordCount {
		return meta, nil, corrupt(mk, "meta counts %d records, the index holds %d", meta.RecordCount, len(recs))
	}
	// Key order is SessionID order unless an id holds '%' or '/', which
	// escaping reorders; the hash is defined over SessionID order.
	byEntry := func(a, b entry) int { return strings.Compare(a.session, b.session) }
	if !slices.IsSortedFunc(entries, byEntry) {
		perm := make([]int, len(entries))
		for i := range perm {
			perm[i] = i
		}
		slices.SortFunc(perm, func(a, b int) int { return byEntry(entries[a], entries[b]) })
		rs, es := slices.Clone(recs), slices.Clone(entries)
		for i, p := range perm {
			recs[i], entries[i] = rs[p], es[p]
		}
	}
	if h := hashValues(len(entries), func(i int) []byte { return entries[i].raw }); h != meta.RecordsSHA256 {
		return meta, nil, corrupt(mk, "records hash to %s, meta says %s", h, meta.RecordsSHA256)
	}
	return meta, recs, nil
}

// Checkpoints returns every checkpoint's meta, ordered by Seq.
func (x *engine) Checkpoints() ([]CheckpointMeta, error) {
	metas, err := list(x, []byte(pfxMeta),
		func(m *CheckpointMeta) []byte { return metaKey(m.ID) },
		func(a, b CheckpointMeta) int { return cmp.Compare(a.Seq, b.Seq) })
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: checkpoints: %w", err)
	}
	return metas, nil
}

// Latest returns the checkpoint with the highest Seq; ok is false when the
// index holds none.
func (x *engine) Latest() (meta CheckpointMeta, ok bool, err error) {
	return x.latest(func(CheckpointMeta) bool { return true })
}

// FindByDir returns the latest checkpoint committed with that CheckpointDir.
func (x *engine) FindByDir(checkpointDir string) (meta CheckpointMeta, ok bool, err error) {
	return x.latest(func(m CheckpointMeta) bool { return m.CheckpointDir == checkpointDir })
}

func (x *engine) latest(match func(CheckpointMeta) bool) (CheckpointMeta, bool, error) {
	metas, err := x.Checkpoints()
	if err != nil {
		return CheckpointMeta{}, false, err
	}
	for i := len(metas) - 1; i >= 0; i-- {
		if match(metas[i]) {
			return metas[i], true, nil
		}
	}
	return CheckpointMeta{}, false, nil
}

// SnapshotRefs returns the ids of the checkpoints whose records name the
// snapshot, sorted.
func (x *engine) SnapshotRefs(snapshotID string) ([]string, error) {
	var ids []string
	err := x.view(func(txn kvTxn) error {
		return txn.scan(refPrefix(snapshotID), false, func(key, _ []byte) error {
			_, id, ok := splitRef(key)
			if !ok {
				return corrupt(key, "malformed reference key")
			}
			ids = append(ids, id)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: refs of %q: %w", snapshotID, err)
	}
	slices.Sort(ids)
	return ids, nil
}

// ReferencedSnapshots maps every snapshot some checkpoint names to the ids of
// those checkpoints, sorted.
func (x *engine) ReferencedSnapshots() (map[string][]string, error) {
	refs := map[string][]string{}
	err := x.view(func(txn kvTxn) error {
		return txn.scan([]byte(pfxRef), false, func(key, _ []byte) error {
			snap, id, ok := splitRef(key)
			if !ok {
				return corrupt(key, "malformed reference key")
			}
			refs[snap] = append(refs[snap], id)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: referenced snapshots: %w", err)
	}
	for _, ids := range refs {
		slices.Sort(ids)
	}
	return refs, nil
}

// Drop deletes the checkpoints (meta, records, their reverse references) and
// adds the tombstones, in one transaction. Ids not in the index are ignored,
// so a repeated Drop is harmless. A tombstone for a snapshot that a
// checkpoint still names after the drop is ErrInvalid and nothing changes:
// deleting it would break that checkpoint's restore.
func (x *engine) Drop(checkpointIDs []string, tombstones []Tombstone) error {
	ts, err := checkTombstones(tombstones)
	if err != nil {
		return fmt.Errorf("snapshotindex: drop: %w", err)
	}
	err = x.update(func(txn kvTxn) error {
		for _, id := range checkpointIDs {
			if err := x.dropOne(txn, id); err != nil {
				return err
			}
		}
		return putTombstones(txn, ts)
	})
	if err != nil {
		return fmt.Errorf("snapshotindex: drop %q: %w", checkpointIDs, err)
	}
	if x.dropped != nil {
		x.dropped()
	}
	return nil
}

// dropOne deletes one checkpoint's keys. A checkpoint that verifies names
// its snapshots in its records; one that does not (the corrupt thing being
// dropped, perhaps) may have lost that list, so its references are found by
// scanning every reference key instead.
func (x *engine) dropOne(txn kvTxn, id string) error {
	if id == "" {
		return invalid("empty checkpoint id")
	}
	_, refs, loadErr := load(txn, id, func(r *recordRef) string { return r.SessionID })
	var keys [][]byte
	switch {
	case loadErr == nil:
		for _, r := range refs {
			keys = append(keys, recordKey(id, r.SessionID), refKey(r.SnapshotID, id))
		}
	case errors.Is(loadErr, ErrNotFound) || errors.Is(loadErr, ErrCorrupt):
		if err := txn.scan(recordPrefix(id), false, func(key, _ []byte) error {
			keys = append(keys, bytes.Clone(key))
			return nil
		}); err != nil {
			return err
		}
		if errors.Is(loadErr, ErrNotFound) && len(keys) == 0 {
			return nil // never committed, or dropped before: the usual idempotent case
		}
		x.log.Warnf("dropping checkpoint %q that does not verify (%v); scanning all references", id, loadErr)
		if err := txn.scan([]byte(pfxRef), false, func(key, _ []byte) error {
			if _, ckpt, ok := splitRef(key); ok && ckpt == id {
				keys = append(keys, bytes.Clone(key))
			}
			return nil
		}); err != nil {
			return err
		}
	default:
		return loadErr
	}
	keys = append(keys, metaKey(id))
	for _, k := range keys {
		if err := txn.delete(k); err != nil {
			return err
		}
	}
	return nil
}
