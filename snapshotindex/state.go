package snapshotindex

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// checkTombstones validates ts and returns a copy with times stamped.
func checkTombstones(ts []Tombstone) ([]Tombstone, error) {
	out := slices.Clone(ts)
	for i := range out {
		if out[i].SnapshotID == "" {
			return nil, invalid("tombstone %d: empty snapshot_id", i)
		}
		out[i].At = stamp(out[i].At)
	}
	return out, nil
}

// putTombstones writes ts, refusing any snapshot a checkpoint still names.
// It runs after the same transaction's drops, whose deletes it sees.
func putTombstones(txn kvTxn, ts []Tombstone) error {
	namedBy, err := namingCheckpoints(txn, ts)
	if err != nil {
		return err
	}
	for _, t := range ts {
		if id, ok := namedBy[t.SnapshotID]; ok {
			return invalid("tombstone for snapshot %q, which checkpoint %q still names", t.SnapshotID, id)
		}
		if err := setJSON(txn, tombKey(t.SnapshotID), t); err != nil {
			return err
		}
	}
	return nil
}

// fewTombstones is how many tombstones are checked against the references
// one prefix lookup each; more are checked in one pass over every
// reference. An iterator of a read-write transaction sorts the
// transaction's pending writes when it opens, so one lookup per tombstone
// in a Drop that deleted many references was quadratic (1.6 s for 1,000).
const fewTombstones = 16

// namingCheckpoints maps each of ts's snapshots that a checkpoint still
// names (as the transaction sees it) to one such checkpoint.
func namingCheckpoints(txn kvTxn, ts []Tombstone) (map[string]string, error) {
	named := map[string]string{}
	if len(ts) <= fewTombstones {
		for _, t := range ts {
			key, ok, err := exists(txn, refPrefix(t.SnapshotID))
			if err != nil {
				return nil, err
			}
			if ok {
				_, id, _ := splitRef(key)
				named[t.SnapshotID] = id
			}
		}
		return named, nil
	}
	want := make(map[string]bool, len(ts))
	for _, t := range ts {
		want[t.SnapshotID] = true
	}
	err := txn.scan([]byte(pfxRef), false, func(key, _ []byte) error {
		if snap, id, ok := splitRef(key); ok && want[snap] {
			if _, seen := named[snap]; !seen {
				named[snap] = id
			}
		}
		return nil
	})
	return named, err
}

// tombstoned returns the set of tombstoned snapshot ids.
func tombstoned(txn kvTxn) (map[string]bool, error) {
	dead := map[string]bool{}
	err := txn.scan([]byte(pfxTomb), false, func(key, _ []byte) error {
		dead[unescape(strings.TrimPrefix(string(key), pfxTomb))] = true
		return nil
	})
	return dead, err
}

// AddTombstones records snapshots that are about to be deleted and deletes
// clearIntents, in one transaction. Writing a tombstone again replaces it. A
// snapshot some checkpoint still names is ErrInvalid, and nothing is written.
func (x *engine) AddTombstones(ts []Tombstone, clearIntents ...IntentKey) error {
	ts, err := checkTombstones(ts)
	if err == nil {
		err = checkIntentKeys(clearIntents)
	}
	if err == nil {
		err = x.update(func(txn kvTxn) error {
			if err := putTombstones(txn, ts); err != nil {
				return err
			}
			return deleteIntents(txn, clearIntents)
		})
	}
	if err != nil {
		return fmt.Errorf("snapshotindex: add tombstones: %w", err)
	}
	return nil
}

// Tombstones returns every tombstone, sorted by SnapshotID.
func (x *engine) Tombstones() ([]Tombstone, error) {
	ts, err := list(x, []byte(pfxTomb),
		func(t *Tombstone) []byte { return tombKey(t.SnapshotID) },
		func(a, b Tombstone) int { return strings.Compare(a.SnapshotID, b.SnapshotID) })
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: tombstones: %w", err)
	}
	return ts, nil
}

// ClearTombstones deletes the tombstones of snapshots that are gone from the
// provider, in one transaction. Absent ones are ignored.
func (x *engine) ClearTombstones(snapshotIDs []string) error {
	err := x.update(func(txn kvTxn) error {
		for _, id := range snapshotIDs {
			if err := txn.delete(tombKey(id)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("snapshotindex: clear tombstones: %w", err)
	}
	return nil
}

// PutIntent writes (or replaces) an intent. A zero At is set to now.
func (x *engine) PutIntent(in Intent) error {
	err := checkIntentKeys([]IntentKey{{in.Kind, in.ID}})
	if err == nil {
		in.At = stamp(in.At)
		err = x.update(func(txn kvTxn) error {
			return setJSON(txn, intentKey(IntentKey{in.Kind, in.ID}), in)
		})
	}
	if err != nil {
		return fmt.Errorf("snapshotindex: put intent %s/%s: %w", in.Kind, in.ID, err)
	}
	return nil
}

// Intents returns the intents of one kind ("" for every kind), sorted by
// kind then id.
func (x *engine) Intents(kind string) ([]Intent, error) {
	ins, err := list(x, intentPrefix(kind),
		func(in *Intent) []byte { return intentKey(IntentKey{in.Kind, in.ID}) },
		func(a, b Intent) int { return cmp.Or(strings.Compare(a.Kind, b.Kind), strings.Compare(a.ID, b.ID)) })
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: intents %q: %w", kind, err)
	}
	return ins, nil
}

// DeleteIntent deletes an intent; an absent one is not an error.
func (x *engine) DeleteIntent(k IntentKey) error {
	err := checkIntentKeys([]IntentKey{k})
	if err == nil {
		err = x.update(func(txn kvTxn) error { return deleteIntents(txn, []IntentKey{k}) })
	}
	if err != nil {
		return fmt.Errorf("snapshotindex: delete intent %s/%s: %w", k.Kind, k.ID, err)
	}
	return nil
}
