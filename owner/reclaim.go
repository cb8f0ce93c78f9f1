package owner

import (
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/snapshotindex"
)

// reclaim is the machine of a release and of a retention check: drop the
// checkpoints not kept and tombstone the snapshots only they name (one
// index transaction), delete the tombstoned snapshots no live sandbox
// stands on, and (a release, on a provider that lists) delete what earlier
// runs of this server left.
type reclaim struct {
	kept   []string
	reason string // DropReleased or DropDirGone
	// needed are the snapshots live sandboxes were forked from: their
	// deletes are deferred.
	needed map[string]bool
	// leftovers: look for the snapshots earlier runs left, through the
	// provider's labels (name, incarnation).
	leftovers         bool
	name, incarnation string
	// dropOnly stops after the drop: a check at commit deletes later.
	// deleteOnly starts after it, with the drops given.
	dropOnly, deleteOnly bool
	// strict fails the operation when a snapshot could not be deleted (a
	// release); a retention check only reports it.
	strict bool

	phase reclaimPhase
	all   []snapshotindex.CheckpointMeta
	refs  map[string][]string
	// plan is the drop decided; drops what it dropped.
	plan     releasePlan
	drops    []dropped
	deferred []string
	// left are the snapshots earlier runs left.
	left []string
	res  ReleaseResult
}

// reclaimPhase is what the machine waits for.
type reclaimPhase int

const (
	rcStart reclaimPhase = iota
	rcCheckpoints
	rcRefs
	rcDrop
	rcTombstones
	rcDelete
	rcKept
	rcLeftRefs
	rcList
	rcLeftTombstone
	rcLeftDelete
	rcDone
)

var reclaimPhases = [...]string{"start", "checkpoints", "refs", "drop", "tombstones", "delete", "kept", "left-refs", "list", "left-tombstone", "left-delete", "done"}

func (p reclaimPhase) String() string { return reclaimPhases[p] }

// newRelease is a release keeping kept.
func newRelease(kept []string, needed map[string]bool, leftovers bool, name, incarnation string) *reclaim {
	return &reclaim{kept: kept, reason: DropReleased, needed: needed, leftovers: leftovers, name: name, incarnation: incarnation, strict: true}
}

// newDirDrop drops the checkpoints of all that kept does not name, whose
// directories are gone, and stops there.
func newDirDrop(all []snapshotindex.CheckpointMeta, kept []string) *reclaim {
	return &reclaim{kept: kept, reason: DropDirGone, all: all, dropOnly: true}
}

// newDropDelete deletes the tombstoned snapshots after drops.
func newDropDelete(drops []dropped, needed map[string]bool) *reclaim {
	return &reclaim{drops: drops, needed: needed, deleteOnly: true, res: ReleaseResult{Dropped: dropIDs(drops)}}
}

// begin is the first effect: the checkpoints to decide on, unless given;
// the tombstones, when the drops are.
func (m *reclaim) begin() []effect {
	switch {
	case m.deleteOnly:
		return m.await(rcTombstones, effReadTombstones{})
	case m.all != nil:
		return m.await(rcRefs, effReadRefs{})
	}
	return m.await(rcCheckpoints, effReadCheckpoints{})
}

func (m *reclaim) await(p reclaimPhase, e ...effect) []effect {
	m.phase = p
	return e
}

func (m *reclaim) done(err error) []effect {
	m.phase = rcDone
	return []effect{effDone{Err: err}}
}

// finish ends the operation with its result.
func (m *reclaim) finish() []effect {
	if m.strict && len(m.res.Failed) > 0 {
		return m.done(fmt.Errorf("release: %d snapshots could not be deleted (tombstoned; a retry deletes them)", len(m.res.Failed)))
	}
	return m.done(nil)
}

// leftoversFailed ends a release whose look for leftovers failed: the
// release itself did what it had to.
func (m *reclaim) leftoversFailed(err error) []effect {
	return append([]effect{logAt(logrus.WarnLevel, "could not look for snapshots earlier runs left; the next release looks again", logrus.Fields{logrus.ErrorKey: err})}, m.finish()...)
}

func (m *reclaim) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		if m.phase == rcStart {
			return m.begin()
		}
	case inCheckpoints:
		if m.phase == rcCheckpoints {
			if in.Err != nil {
				return m.done(in.Err)
			}
			m.all = in.All
			return m.await(rcRefs, effReadRefs{})
		}
	case inRefs:
		switch m.phase {
		case rcRefs:
			if in.Err != nil {
				return m.done(in.Err)
			}
			m.refs = in.Refs
			m.plan = planRelease(m.all, m.refs, m.kept)
			return m.await(rcDrop, effDrop{IDs: m.plan.Drop, Tombstones: m.plan.Tombstones, Reason: reasonText(m.reason)})
		case rcLeftRefs:
			if in.Err != nil {
				return m.leftoversFailed(in.Err)
			}
			m.refs = in.Refs
			return m.await(rcList, effListSnapshots{})
		}
	case inWritten:
		switch m.phase {
		case rcDrop:
			if in.Err != nil {
				return m.done(in.Err)
			}
			m.drops = dropsOf(m.all, m.refs, m.plan)
			m.res.Dropped = dropIDs(m.drops)
			out := []effect{effCountDrops{Reason: m.reason, N: len(m.drops)}}
			if m.dropOnly {
				return append(out, m.done(nil)...)
			}
			return append(out, m.await(rcTombstones, effReadTombstones{})...)
		case rcLeftTombstone:
			if in.Err != nil {
				return m.leftoversFailed(in.Err)
			}
			return m.await(rcLeftDelete, effDelete{IDs: m.left})
		}
	case inTombstones:
		if m.phase == rcTombstones {
			if in.Err != nil {
				return m.done(in.Err)
			}
			var now []string
			for _, id := range in.IDs {
				if m.needed[id] {
					m.deferred = append(m.deferred, id)
					continue
				}
				now = append(now, id)
			}
			if len(now) == 0 {
				// Nothing to delete: as a delete of nothing.
				return m.deleted(inDeleted{})
			}
			return m.await(rcDelete, effDelete{IDs: now})
		}
	case inDeleted:
		switch m.phase {
		case rcDelete:
			return m.deleted(in)
		case rcLeftDelete:
			out := afterDelete(in)
			out = append(out, logAt(logrus.InfoLevel, "deleted snapshots earlier runs of this server left", logrus.Fields{"deleted": len(in.Deleted), "in_use": len(in.InUse), "failed": len(in.Failed)}))
			m.res.Deleted = append(m.res.Deleted, in.Deleted...)
			m.res.Deferred = append(m.res.Deferred, in.InUse...)
			for id, why := range in.Failed {
				if m.res.Failed == nil {
					m.res.Failed = map[string]string{}
				}
				m.res.Failed[id] = why
			}
			return append(out, m.finish()...)
		}
	case inKept:
		if m.phase == rcKept {
			if in.Missing != "" {
				return append([]effect{logAt(logrus.InfoLevel, "a kept checkpoint is not in this server's index; snapshots earlier runs left stay until a release that keeps only known checkpoints, or `server sweep -retain-from`", logrus.Fields{logrus.ErrorKey: in.Err, "checkpoint_id": in.Missing})}, m.finish()...)
			}
			return m.await(rcLeftRefs, effReadRefs{})
		}
	case inSnapshots:
		if m.phase == rcList {
			if in.Err != nil {
				return m.leftoversFailed(in.Err)
			}
			ids := map[string]bool{}
			for _, s := range in.Snaps {
				md := s.Metadata
				if md[LabelOwner] != m.name || md[LabelIncarnation] == m.incarnation || len(m.refs[s.ID]) > 0 || m.needed[s.ID] {
					continue
				}
				ids[s.ID] = true
			}
			if len(ids) == 0 {
				return m.finish()
			}
			m.left = sortedKeys(ids)
			return m.await(rcLeftTombstone, effTombstone{IDs: m.left, Reason: "left by an earlier run"})
		}
	}
	panic(fmt.Sprintf("owner: a release waiting for %s got %T", m.phase, in))
}

// deleted is the end of the deletes of the drops: the tombstones of those
// deleted cleared, a line per drop, then the leftovers of a release.
func (m *reclaim) deleted(in inDeleted) []effect {
	out := afterDelete(in)
	gone := toSet(in.Deleted)
	for _, d := range m.drops {
		var del, pending []string
		for _, s := range d.Snapshots {
			if gone[s] {
				del = append(del, s)
			} else {
				pending = append(pending, s)
			}
		}
		out = append(out, logAt(logrus.InfoLevel, "checkpoint dropped", logrus.Fields{"checkpoint_id": d.ID, "checkpoint_dir": d.Dir, "snapshots_deleted": del, "snapshots_pending": pending}))
	}
	m.res.Deleted = in.Deleted
	m.res.Deferred = append(m.deferred, in.InUse...)
	m.res.Failed = in.Failed
	if !m.leftovers {
		return append(out, m.finish()...)
	}
	if len(m.kept) == 0 {
		return append(out, m.await(rcLeftRefs, effReadRefs{})...)
	}
	return append(out, m.await(rcKept, effCheckKept{IDs: m.kept})...)
}

// dropsOf is what a drop of plan removed: each checkpoint with its
// directory and the snapshots only it named.
func dropsOf(all []snapshotindex.CheckpointMeta, refs map[string][]string, plan releasePlan) []dropped {
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
	return out
}
