package owner

import (
	"context"
	"fmt"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// deleteTombstoned deletes the snapshots (at most parallelism at once) and
// clears the tombstones of those deleted. A failed delete keeps its
// tombstone for the next release or restart. It returns the deleted ids and
// the failures.
func (o *Owner) deleteTombstoned(ctx context.Context, ts []snapshotindex.Tombstone) ([]string, map[string]string) {
	snap, ok := o.prov.(provider.Snapshotter)
	if !ok || len(ts) == 0 {
		return nil, nil
	}
	deleted, failed := o.eachOutcome(ctx, len(ts), true, func(i int) (string, error) {
		return ts[i].SnapshotID, snap.DeleteSnapshot(ctx, ts[i].SnapshotID)
	})
	if len(deleted) > 0 {
		if err := o.index.ClearTombstones(deleted); err != nil {
			o.log.WithError(err).Warn("could not clear tombstones; the next release retries the deletes")
		}
	}
	if len(failed) > 0 {
		o.log.WithField("failed", len(failed)).Warn("some snapshots could not be deleted; their tombstones stay")
	}
	return deleted, failed
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
	res.Deleted, res.Failed = o.deleteTombstoned(ctx, now)
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
