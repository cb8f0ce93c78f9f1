package engine

import (
	"context"
	"errors"
	"maps"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/snapshotindex"
)

// The owner's retention of checkpoint directories, as the harness drives
// it: a grace, and a check loop the harness runs for the owner on the
// period (and when a drop falls due), as the server's own loop does.
const (
	retentionGrace  = 60 * time.Second
	retentionPeriod = 30 * time.Second
)

// chooseDirsGone draws, from rng, which directories of the checkpoints
// committed through the control plane the controller deletes (at least
// one; none when there are none).
func (r *run) chooseDirsGone(rng *rand.Rand) []string {
	var there []string
	for _, id := range r.m.checkpointIDs() {
		if _, err := r.ckdirs.Lstat(dirOf(id)); err == nil && r.m.ckpts[id].control {
			there = append(there, id)
		}
	}
	if len(there) == 0 {
		return nil
	}
	gone := subset(rng, there)
	if len(gone) == 0 {
		gone = []string{there[rng.IntN(len(there))]}
	}
	return gone
}

// deleteDirs has the controller delete the directories of gone and keep
// the rest: the model keeps only those.
func (r *run) deleteDirs(gone []string) {
	if len(gone) == 0 {
		return
	}
	r.fire(FaultDirGone)
	now := r.clk.Now()
	for _, id := range gone {
		ck, err := r.o.Index().Checkpoint(id)
		if err != nil {
			r.violate(Restorable, "checkpoint %s, whose directory is there, is not in the index: %v", id, err)
			return
		}
		g := &goneCheckpoint{ck: r.m.ckpts[id], at: now}
		for _, rec := range ck.Records {
			g.snaps = append(g.snaps, rec.SnapshotID)
		}
		r.ckdirs.RemoveAll(dirOf(id))
		r.m.gone[id] = g
		delete(r.m.ckpts, id)
	}
	r.tracef("the controller deletes the directories of %v and keeps %v", gone, r.m.checkpointIDs())
}

func dirOf(id string) string { return "/ck/" + id }

// followDirs moves the clock to target, running the owner's retention
// checks when its loop would: every period, and when a drop falls due.
func (r *run) followDirs(target time.Time) bool {
	if now := r.clk.Now(); now.After(r.nextCheck) {
		// The clock moved past a check outside an advance: the loop would
		// have checked then, so the deadlines move by as much.
		for _, g := range r.m.gone {
			g.slack += now.Sub(r.nextCheck)
		}
		r.nextCheck = now
	}
	for !r.nextCheck.After(target) {
		r.clk.Advance(r.nextCheck.Sub(r.clk.Now()))
		if !r.retentionCheck() {
			return false
		}
	}
	r.clk.Advance(target.Sub(r.clk.Now()))
	return true
}

// retentionCheck runs one check of the owner's and checks what it did: it
// drops only checkpoints whose directory is gone, and by its deadline every
// such checkpoint is out of the index with its snapshots deleted or
// tombstoned.
func (r *run) retentionCheck() bool {
	var res owner.RetentionResult
	err, crashed := r.guarded(func(ctx context.Context) error {
		var err error
		res, err = r.o.CheckRetention(ctx)
		return err
	})
	if crashed || err != nil {
		r.violate(Unexpected, "a retention check without a fault: crashed %v, %v", crashed, err)
		return false
	}
	now := r.clk.Now()
	r.tracef("retention check: dropped %v deleted %v deferred %v, %d dirs seen gone", res.Dropped, res.Deleted, res.Deferred, len(res.Pending))
	for _, id := range res.Dropped {
		if r.m.gone[id] == nil {
			r.violate(FollowsRetention, "a retention check dropped checkpoint %s, whose directory is there", id)
			return false
		}
	}
	r.nextCheck = now.Add(retentionPeriod)
	for _, p := range res.Pending {
		if p.Due.Before(r.nextCheck) {
			r.nextCheck = p.Due
		}
	}
	idx := r.o.Index()
	refs, err := idx.ReferencedSnapshots()
	if err != nil {
		r.violate(Unexpected, "referenced snapshots: %v", err)
		return false
	}
	ts, err := idx.Tombstones()
	if err != nil {
		r.violate(Unexpected, "tombstones: %v", err)
		return false
	}
	tomb := map[string]bool{}
	for _, t := range ts {
		tomb[t.SnapshotID] = true
	}
	for _, id := range slices.Sorted(maps.Keys(r.m.gone)) {
		g := r.m.gone[id]
		from := g.at
		if r.ownerStarted.After(from) {
			from = r.ownerStarted
		}
		deadline := from.Add(retentionGrace + retentionPeriod + g.slack)
		if now.Before(deadline) {
			continue
		}
		if _, err := idx.Checkpoint(id); !errors.Is(err, snapshotindex.ErrNotFound) {
			r.violate(FollowsRetention, "the directory of checkpoint %s went at %s; at %s (grace %v, period %v) the index still holds it (%v)",
				id, g.at.Format(time.TimeOnly), now.Format(time.TimeOnly), retentionGrace, retentionPeriod, err)
			return false
		}
		for _, snap := range g.snaps {
			if _, exists := r.fk.SnapshotInfo(snap); exists && len(refs[snap]) == 0 && !tomb[snap] {
				r.violate(FollowsRetention, "snapshot %s of checkpoint %s, whose directory went at %s, still exists at %s, neither named nor pending delete",
					snap, id, g.at.Format(time.TimeOnly), now.Format(time.TimeOnly))
				return false
			}
		}
		delete(r.m.gone, id)
	}
	return true
}
