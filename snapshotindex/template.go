package snapshotindex

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Template is a snapshot a keyed setup left: every seed of Key forks it
// instead of running the setup again. The index keeps it across restarts,
// and a sweep accounts for its snapshot as it does for a checkpoint's.
type Template struct {
	Key        string          `json:"key"`
	SnapshotID string          `json:"snapshot_id"`
	Provider   string          `json:"provider"`
	Workdir    string          `json:"workdir,omitempty"`
	Data       json.RawMessage `json:"data,omitempty"`
	CreatedAt  time.Time       `json:"created_at"`
}

// PutTemplate writes (or replaces) the template of t.Key and deletes the
// intents clearIntents, in one transaction. A zero CreatedAt is set to
// now; a snapshot tombstoned is ErrInvalid.
func (x *engine) PutTemplate(t Template, clearIntents ...IntentKey) error {
	err := checkIntentKeys(clearIntents)
	if err == nil && (t.Key == "" || t.SnapshotID == "") {
		err = invalid("template %q with snapshot %q: both are required", t.Key, t.SnapshotID)
	}
	if err == nil {
		t.CreatedAt = stamp(t.CreatedAt)
		err = x.update(func(txn kvTxn) error {
			dead, err := txn.get(tombKey(t.SnapshotID), func([]byte) error { return nil })
			if err != nil {
				return err
			}
			if dead {
				return invalid("template %q names snapshot %q, which is tombstoned", t.Key, t.SnapshotID)
			}
			if err := setJSON(txn, templateKey(t.Key), t); err != nil {
				return err
			}
			return deleteIntents(txn, clearIntents)
		})
	}
	if err != nil {
		return fmt.Errorf("snapshotindex: put template %q: %w", t.Key, err)
	}
	return nil
}

// Templates returns every template, sorted by key.
func (x *engine) Templates() ([]Template, error) {
	ts, err := list(x, []byte(pfxTemplate),
		func(t *Template) []byte { return templateKey(t.Key) },
		func(a, b Template) int { return strings.Compare(a.Key, b.Key) })
	if err != nil {
		return nil, fmt.Errorf("snapshotindex: templates: %w", err)
	}
	return ts, nil
}

// DropTemplates deletes the templates of keys and writes tombstones (their
// snapshots', normally), in one transaction. Absent keys are ignored.
func (x *engine) DropTemplates(keys []string, tombstones []Tombstone) error {
	ts, err := checkTombstones(tombstones)
	if err == nil {
		err = x.update(func(txn kvTxn) error {
			for _, k := range keys {
				if err := txn.delete(templateKey(k)); err != nil {
					return err
				}
			}
			return putTombstones(txn, ts)
		})
	}
	if err != nil {
		return fmt.Errorf("snapshotindex: drop templates: %w", err)
	}
	return nil
}
