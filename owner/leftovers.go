package owner

import (
	"context"

	"github.com/sirupsen/logrus"
)

// releaseLeftovers adds to a release what reclaimLeftovers deletes; a
// failure to list is logged (the next release tries again).
func (o *Owner) releaseLeftovers(ctx context.Context, kept []string, needed map[string]bool, res *ReleaseResult) {
	deleted, inUse, failed, err := o.reclaimLeftovers(ctx, kept, needed)
	if err != nil {
		o.log.WithError(err).Warn("could not look for snapshots earlier runs left; the next release looks again")
		return
	}
	res.Deleted = append(res.Deleted, deleted...)
	res.Deferred = append(res.Deferred, inUse...)
	for id, why := range failed {
		if res.Failed == nil {
			res.Failed = map[string]string{}
		}
		res.Failed[id] = why
	}
}

// reclaimLeftovers deletes the snapshots that earlier runs of this server
// (its name, another incarnation) left and that no checkpoint in the index
// names: after a restore on a fresh state_dir the index knows only the
// restored checkpoint, and the snapshots of checkpoints the controller has
// since dropped are found only through the provider's labels. It runs only
// when every kept checkpoint is in the index (otherwise it cannot tell a
// kept checkpoint's snapshots from leftovers) and never touches a snapshot
// a live fork stands on (needed), which a later release deletes.
func (o *Owner) reclaimLeftovers(ctx context.Context, kept []string, needed map[string]bool) (deleted, inUse []string, failed map[string]string, err error) {
	l := o.caps.Lister
	if l == nil {
		return nil, nil, nil, nil
	}
	for _, id := range kept {
		if _, err := o.index.Checkpoint(id); err != nil {
			o.log.WithError(err).WithField("checkpoint_id", id).Info("a kept checkpoint is not in this server's index; snapshots earlier runs left stay until a release that keeps only known checkpoints, or `server sweep -retain-from`")
			return nil, nil, nil, nil
		}
	}
	refs, err := o.index.ReferencedSnapshots()
	if err != nil {
		return nil, nil, nil, err
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		return nil, nil, nil, err
	}
	ids := map[string]bool{}
	for _, s := range snaps {
		md := s.Metadata
		if md[LabelOwner] != o.name || md[LabelIncarnation] == o.incarnation || len(refs[s.ID]) > 0 || needed[s.ID] {
			continue
		}
		ids[s.ID] = true
	}
	if len(ids) == 0 {
		return nil, nil, nil, nil
	}
	ts := o.tombstones(ids, "left by an earlier run")
	if err := o.index.AddTombstones(ts); err != nil {
		return nil, nil, nil, err
	}
	deleted, inUse, failed = o.deleteTombstoned(ctx, ts)
	o.log.WithFields(logrus.Fields{"deleted": len(deleted), "in_use": len(inUse), "failed": len(failed)}).Info("deleted snapshots earlier runs of this server left")
	return deleted, inUse, failed, nil
}
