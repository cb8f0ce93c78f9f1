package owner

import (
	"context"
	"fmt"

	"github.com/sandboxowner/owner/snapshotindex"
)

// PendingDeletes counts the snapshots tombstoned but not yet deleted (in
// use by a live fork, or whose delete failed): a later release, restart or
// the sweep deletes them.
func (o *Owner) PendingDeletes() (int, error) {
	if o.index == nil {
		return 0, nil
	}
	ts, err := o.index.Tombstones()
	return len(ts), err
}

// ReleaseResult is what a release deleted.
type ReleaseResult struct {
	Dropped []string // checkpoints dropped from the index
	Deleted []string // snapshots deleted
	// Deferred are tombstoned snapshots a live fork still stands on; a
	// later release deletes them.
	Deferred []string
	Failed   map[string]string
}

// Release keeps the checkpoints in kept, drops the others from the index,
// and deletes every snapshot that no kept checkpoint and no live session
// needs. It is idempotent and crash-safe: the drop and the tombstones are one
// transaction, the deletes follow, and a tombstone is cleared only once its
// snapshot is gone.
func (o *Owner) Release(ctx context.Context, kept []string) (ReleaseResult, error) {
	var res ReleaseResult
	switch o.mode {
	case ModeOff:
		return res, ErrCheckpointingOff
	case ModeRestartOnly:
		return res, nil
	}
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return res, fmt.Errorf("release: waiting for another control operation: %w", err)
	}
	defer o.ctl.Unlock()
	m := newRelease(kept, o.keptSnapshots(), o.caps.Lister != nil, o.name, o.incarnation)
	err := o.run(ctx, m)
	return m.res, err
}

// Drop reasons: what dropped a checkpoint from the index.
const (
	// DropReleased: a release did not keep it.
	DropReleased = "release"
	// DropDirGone: its checkpoint_dir was seen gone for the grace.
	DropDirGone = "dir_gone"
)

// dropped is one checkpoint a drop removed from the index, with the
// snapshots only it named (tombstoned by the drop).
type dropped struct {
	ID, Dir   string
	Snapshots []string
}

func dropIDs(ds []dropped) []string {
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.ID)
	}
	return ids
}

func reasonText(reason string) string {
	if reason == DropDirGone {
		return "checkpoint_dir gone"
	}
	return "released"
}

// Checkpoints lists the committed checkpoints (nil unless exported).
func (o *Owner) Checkpoints() ([]snapshotindex.CheckpointMeta, error) {
	if o.index == nil {
		return nil, nil
	}
	return o.index.Checkpoints()
}
