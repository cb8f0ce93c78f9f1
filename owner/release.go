package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// deleteTombstoned deletes the snapshots (at most parallelism at once) and
// clears the tombstones of those deleted. A failed delete keeps its
// tombstone for the next release or restart. It returns the deleted ids,
// those a live sandbox forked from still stands on (the provider refused
// them as in use: pending, not failed; a later release, restart or the
// sweep deletes them) and the failures.
func (o *Owner) deleteTombstoned(ctx context.Context, ts []snapshotindex.Tombstone) (deleted, inUse []string, failed map[string]string) {
	snap, ok := o.prov.(provider.Snapshotter)
	if !ok || len(ts) == 0 {
		return nil, nil, nil
	}
	var mu sync.Mutex
	deleted, failed = o.eachOutcome(ctx, len(ts), true, func(i int) (string, error) {
		id := ts[i].SnapshotID
		err := snap.DeleteSnapshot(ctx, id)
		if errors.Is(err, provider.ErrSnapshotInUse) {
			mu.Lock()
			inUse = append(inUse, id)
			mu.Unlock()
			return "", nil // neither deleted nor failed
		}
		return id, err
	})
	slices.Sort(inUse)
	if len(deleted) > 0 {
		if err := o.index.ClearTombstones(deleted); err != nil {
			o.log.WithError(err).Warn("could not clear tombstones; the next release retries the deletes")
		}
	}
	if len(failed) > 0 {
		o.log.WithField("failed", len(failed)).Warn("some snapshots could not be deleted; their tombstones stay")
	}
	if len(inUse) > 0 {
		o.log.WithField("in_use", len(inUse)).Info("some snapshots are still in use by a sandbox forked from them; their deletes are pending")
	}
	return deleted, inUse, failed
}

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
	o.ctl.Lock(o.rt)
	defer o.ctl.Unlock()
	all, err := o.index.Checkpoints()
	if err != nil {
		return res, err
	}
	refs, err := o.index.ReferencedSnapshots()
	if err != nil {
		return res, err
	}
	plan := planRelease(all, refs, kept)
	if err := o.index.Drop(plan.Drop, o.tombstones(toSet(plan.Tombstones), "released")); err != nil {
		return res, err
	}
	res.Dropped = plan.Drop
	ts, err := o.index.Tombstones()
	if err != nil {
		return res, err
	}
	needed := o.fates.liveSnapshots()
	var now []snapshotindex.Tombstone
	for _, t := range ts {
		if needed[t.SnapshotID] {
			res.Deferred = append(res.Deferred, t.SnapshotID)
			continue
		}
		now = append(now, t)
	}
	var inUse []string
	res.Deleted, inUse, res.Failed = o.deleteTombstoned(ctx, now)
	res.Deferred = append(res.Deferred, inUse...)
	o.releaseLeftovers(ctx, kept, needed, &res)
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("release: %d snapshots could not be deleted (tombstoned; a retry deletes them)", len(res.Failed))
	}
	return res, nil
}

// Checkpoints lists the committed checkpoints (nil unless exported).
func (o *Owner) Checkpoints() ([]snapshotindex.CheckpointMeta, error) {
	if o.index == nil {
		return nil, nil
	}
	return o.index.Checkpoints()
}
