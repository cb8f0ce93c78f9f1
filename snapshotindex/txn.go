package snapshotindex

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"time"
)

// decode unmarshals val, stored under key, into v; bad JSON is a
// *CorruptError naming the key.
func decode(key, val []byte, v any) error {
	if err := json.Unmarshal(val, v); err != nil {
		return corrupt(key, "%w", err)
	}
	return nil
}

// get decodes the value under key into v; found is false when it is absent.
func get(txn kvTxn, key []byte, v any) (found bool, err error) {
	return txn.get(key, func(val []byte) error { return decode(key, val, v) })
}

// list decodes every value under prefix and returns them sorted by order. A
// value that keyOf says belongs under another key is corrupt: the key is the
// index's only way to find it, so the two must agree.
func list[T any](x *engine, prefix []byte, keyOf func(*T) []byte, order func(a, b T) int) ([]T, error) {
	var out []T
	err := x.view(func(txn kvTxn) error {
		return txn.scan(prefix, true, func(key, val []byte) error {
			var v T
			if err := decode(key, val, &v); err != nil {
				return err
			}
			if want := keyOf(&v); !bytes.Equal(key, want) {
				return corrupt(key, "value belongs under key %q", want)
			}
			out = append(out, v)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, order)
	return out, nil
}

// errFound ends a scan that has seen what it looked for.
var errFound = errors.New("snapshotindex: found")

// exists returns the first key under prefix, if any. Inside a read-write
// transaction it sees that transaction's own pending sets and deletes.
func exists(txn kvTxn, prefix []byte) (first []byte, ok bool, err error) {
	err = txn.scan(prefix, false, func(key, _ []byte) error {
		first = bytes.Clone(key)
		return errFound
	})
	switch {
	case errors.Is(err, errFound):
		return first, true, nil
	case err != nil:
		return nil, false, err
	}
	return nil, false, nil
}

// setJSON marshals v under key.
func setJSON(txn kvTxn, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return invalid("encode %q: %v", key, err)
	}
	return txn.set(key, b)
}

// deleteIntents deletes the named intents; absent ones are ignored.
func deleteIntents(txn kvTxn, keys []IntentKey) error {
	for _, k := range keys {
		if err := txn.delete(intentKey(k)); err != nil {
			return err
		}
	}
	return nil
}

func checkIntentKeys(keys []IntentKey) error {
	for _, k := range keys {
		if k.Kind == "" || k.ID == "" {
			return invalid("intent key %+v: empty kind or id", k)
		}
	}
	return nil
}

// stamp returns t in UTC (the stored form, so equal instants encode and hash
// alike), or now when t is zero.
func stamp(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now().UTC()
	}
	return t.UTC()
}
