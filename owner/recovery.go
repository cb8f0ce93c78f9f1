package owner

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// recover cleans up after a predecessor that did not shut down: snapshots
// tombstoned but not deleted, commit rounds that never committed, and
// sandboxes still running under an earlier incarnation of this server.
func (o *Owner) recover(ctx context.Context) error {
	if o.index != nil {
		if err := o.recoverIndex(ctx); err != nil {
			return fmt.Errorf("recover snapshot index: %w", err)
		}
	}
	o.sweepIncarnations(ctx)
	return nil
}

func (o *Owner) recoverIndex(ctx context.Context) error {
	intents, err := o.index.Intents("")
	if err != nil {
		return err
	}
	for _, in := range intents {
		key := snapshotindex.IntentKey{Kind: in.Kind, ID: in.ID}
		if in.Kind != intentCommit {
			// A restore's forks carry this server's labels: the sweep of
			// earlier incarnations stops them.
			if err := o.index.DeleteIntent(key); err != nil {
				return err
			}
			continue
		}
		_, cerr := o.index.Checkpoint(in.ID)
		var body commitIntent
		if cerr == nil || json.Unmarshal(in.Body, &body) != nil || body.Tag == "" {
			if err := o.index.DeleteIntent(key); err != nil {
				return err
			}
			continue
		}
		ids := toSet(o.listSnapshotsByTag(ctx, body.Tag))
		o.log.WithFields(logrus.Fields{"checkpoint_id": in.ID, "snapshots": len(ids)}).Warn("a commit did not finish before the last stop; deleting its snapshots")
		if err := o.index.AddTombstones(o.tombstones(ids, "unfinished commit "+in.ID), key); err != nil {
			return err
		}
	}
	ts, err := o.index.Tombstones()
	if err != nil {
		return err
	}
	if del := o.deleteTombstoned(ctx, snapshotIDs(ts)); len(del.Failed) > 0 {
		o.log.WithField("failed", len(del.Failed)).Warn("tombstoned snapshots could not be deleted at startup")
	}
	return nil
}

// sweepIncarnations stops sandboxes that an earlier incarnation of this
// server left running: a fresh process holds no session, so they serve
// nobody (a restore forks from snapshots, not from them).
func (o *Owner) sweepIncarnations(ctx context.Context) {
	l := o.caps.Lister
	if l == nil {
		return
	}
	list, err := l.ListSandboxes(ctx)
	if err != nil {
		o.log.WithError(err).Warn("listing sandboxes at startup failed; earlier sandboxes are left to their leases")
		return
	}
	var stale []provider.Handle
	for _, s := range list {
		if s.Metadata[LabelOwner] == o.name && s.Metadata[LabelIncarnation] != o.incarnation {
			stale = append(stale, s.Handle)
		}
	}
	if len(stale) == 0 {
		return
	}
	stopped, failed := o.stopHandles(stale)
	for _, id := range stopped {
		o.fates.set(id, sandbox.FateEnded)
	}
	o.log.WithFields(logrus.Fields{"stopped": len(stopped), "failed": len(failed)}).Warn("stopped sandboxes an earlier run of this server left behind")
}
