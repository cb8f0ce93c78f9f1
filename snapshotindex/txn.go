package snapshotindex

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/dgraph-io/badger/v4"
)

// scan calls fn for every key under prefix, in key order. Without values
// the iterator reads keys only, which is much cheaper.
func scan(txn *badger.Txn, prefix []byte, withValues bool, fn func(item *badger.Item) error) error {
	opts := badger.DefaultIteratorOptions
	opts.Prefix = prefix
	opts.PrefetchValues = withValues
	// A read-write transaction allows one iterator at a time, so every
	// iterator is closed before scan returns.
	it := txn.NewIterator(opts)
	defer it.Close()
	for it.Seek(prefix); it.ValidForPrefix(prefix); it.Next() {
		if err := fn(it.Item()); err != nil {
			return err
		}
	}
	return nil
}

// decode unmarshals item's value into v; bad JSON is a *CorruptError naming
// the key.
func decode(item *badger.Item, v any) error {
	return item.Value(func(b []byte) error {
		if err := json.Unmarshal(b, v); err != nil {
			return corrupt(item.Key(), "%w", err)
		}
		return nil
	})
}

// get decodes the value under key into v; found is false when it is absent.
func get(txn *badger.Txn, key []byte, v any) (found bool, err error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %q: %w", key, err)
	}
	return true, decode(item, v)
}

// list decodes every value under prefix and returns them sorted by order. A
// value that keyOf says belongs under another key is corrupt: the key is the
// index's only way to find it, so the two must agree.
func list[T any](x *Index, prefix []byte, keyOf func(*T) []byte, order func(a, b T) int) ([]T, error) {
	var out []T
	err := x.view(func(txn *badger.Txn) error {
		return scan(txn, prefix, true, func(item *badger.Item) error {
			var v T
			if err := decode(item, &v); err != nil {
				return err
			}
			if want := keyOf(&v); !bytes.Equal(item.Key(), want) {
				return corrupt(item.Key(), "value belongs under key %q", want)
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

// exists reports whether any key lies under prefix. Inside a read-write
// transaction it sees that transaction's own pending sets and deletes.
func exists(txn *badger.Txn, prefix []byte) (first []byte, ok bool) {
	opts := badger.DefaultIteratorOptions
	opts.Prefix = prefix
	opts.PrefetchValues = false
	it := txn.NewIterator(opts)
	defer it.Close()
	it.Seek(prefix)
	if !it.ValidForPrefix(prefix) {
		return nil, false
	}
	return it.Item().KeyCopy(nil), true
}

// setJSON marshals v under key.
func setJSON(txn *badger.Txn, key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return invalid("encode %q: %v", key, err)
	}
	return txn.Set(key, b)
}

// deleteIntents deletes the named intents; absent ones are ignored.
func deleteIntents(txn *badger.Txn, keys []IntentKey) error {
	for _, k := range keys {
		if err := txn.Delete(intentKey(k)); err != nil {
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
