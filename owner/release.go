package owner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/sirupsen/logrus"

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
	snap := o.caps.Snapshotter
	if snap == nil || len(ts) == 0 {
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
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return res, fmt.Errorf("release: waiting for another control operation: %w", err)
	}
	defer o.ctl.Unlock()
	all, err := o.index.Checkpoints()
	if err != nil {
		return res, err
	}
	drops, err := o.dropExcept(all, kept, DropReleased)
	if err != nil {
		return res, err
	}
	res.Dropped = dropIDs(drops)
	needed := o.fates.liveSnapshots()
	res.Deleted, res.Deferred, res.Failed, err = o.deleteDropped(ctx, drops, needed)
	if err != nil {
		return res, err
	}
	o.releaseLeftovers(ctx, kept, needed, &res)
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("release: %d snapshots could not be deleted (tombstoned; a retry deletes them)", len(res.Failed))
	}
	return res, nil
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

// dropExcept drops every checkpoint of all that kept does not name and
// tombstones the snapshots no kept checkpoint names, in one index
// transaction: the decision of a release, and of a directory gone. The
// caller holds ctl.
func (o *Owner) dropExcept(all []snapshotindex.CheckpointMeta, kept []string, reason string) ([]dropped, error) {
	refs, err := o.index.ReferencedSnapshots()
	if err != nil {
		return nil, err
	}
	plan := planRelease(all, refs, kept)
	if err := o.index.Drop(plan.Drop, o.tombstones(toSet(plan.Tombstones), reasonText(reason))); err != nil {
		return nil, err
	}
	dirs := map[string]string{}
	for _, m := range all {
		dirs[m.ID] = m.CheckpointDir
	}
	out := make([]dropped, len(plan.Drop))
	at := map[string]int{}
	for i, id := range plan.Drop {
		out[i] = dropped{ID: id, Dir: dirs[id]}
		at[id] = i
	}
	for _, snap := range plan.Tombstones {
		for _, c := range refs[snap] {
			if i, ok := at[c]; ok {
				out[i].Snapshots = append(out[i].Snapshots, snap)
			}
		}
	}
	o.ret.count(reason, len(out))
	return out, nil
}

func reasonText(reason string) string {
	if reason == DropDirGone {
		return "checkpoint_dir gone"
	}
	return "released"
}

// deleteDropped deletes every tombstoned snapshot no live sandbox stands on
// (needed), then logs each drop with the snapshots it deleted. The caller
// holds ctl.
func (o *Owner) deleteDropped(ctx context.Context, drops []dropped, needed map[string]bool) (deleted, deferred []string, failed map[string]string, err error) {
	ts, err := o.index.Tombstones()
	if err != nil {
		return nil, nil, nil, err
	}
	var now []snapshotindex.Tombstone
	for _, t := range ts {
		if needed[t.SnapshotID] {
			deferred = append(deferred, t.SnapshotID)
			continue
		}
		now = append(now, t)
	}
	var inUse []string
	deleted, inUse, failed = o.deleteTombstoned(ctx, now)
	deferred = append(deferred, inUse...)
	gone := toSet(deleted)
	for _, d := range drops {
		var del, pending []string
		for _, s := range d.Snapshots {
			if gone[s] {
				del = append(del, s)
			} else {
				pending = append(pending, s)
			}
		}
		o.log.WithFields(logrus.Fields{"checkpoint_id": d.ID, "checkpoint_dir": d.Dir, "snapshots_deleted": del, "snapshots_pending": pending}).Info("checkpoint dropped")
	}
	return deleted, deferred, failed, nil
}

// Checkpoints lists the committed checkpoints (nil unless exported).
func (o *Owner) Checkpoints() ([]snapshotindex.CheckpointMeta, error) {
	if o.index == nil {
		return nil, nil
	}
	return o.index.Checkpoints()
}
