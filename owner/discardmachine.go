package owner

import (
	"fmt"
	"slices"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/messages"
)

// discard is what a discard throws away: snapshots that no checkpoint will
// name.
type discard struct {
	// Tag is the round's tag: the provider's snapshots listed with it are
	// discarded too (one whose reply was lost). "" lists nothing.
	Tag string
	// Taken are the snapshots the round's sessions took.
	Taken []messages.SnapshotReply
	// Late are snapshots that came after their round gave up on them.
	Late []string
	// Round says the discard is a commit round's: once its snapshots are
	// tombstoned the round is settled.
	Round  bool
	Reason string
}

// discarding is a discard's decisions: the snapshots are tombstoned first
// (from then on the tombstones account for them, and a round's is
// settled), then deleted, each tombstone cleared once its snapshot is
// gone. A failed tombstone write deletes nothing: the round stays loose, so
// the incarnation's rounds intent stays, by whose mark a restart finds its
// snapshots (late ones among them).
type discarding struct {
	d     discard
	ids   []string
	phase discardPhase
}

// discardPhase is what the machine waits for.
type discardPhase int

const (
	dsStart discardPhase = iota
	dsListed
	dsTombstoned
	dsDeleted
	dsDone
)

var discardPhases = [...]string{"start", "listed", "tombstoned", "deleted", "done"}

func (p discardPhase) String() string { return discardPhases[p] }

func newDiscarding(d discard) *discarding { return &discarding{d: d} }

func (m *discarding) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		if m.d.Tag == "" {
			return m.tombstone(nil)
		}
		m.phase = dsListed
		return []effect{effListByTag{RoundTag: m.d.Tag}}
	case inListed:
		return m.tombstone(in.IDs)
	case inWritten:
		m.phase = dsDone
		if in.Err != nil {
			if m.d.Round {
				return []effect{logAt(logrus.ErrorLevel, "could not tombstone a failed commit's snapshots; this run's rounds intent stays, by which a restart finds them", logrus.Fields{"error": in.Err.Error()}), effDone{}}
			}
			return []effect{logAt(logrus.WarnLevel, "could not tombstone a late snapshot", logrus.Fields{"error": in.Err.Error()}), effDone{}}
		}
		var out []effect
		if m.d.Round {
			out = append(out, effRoundSettled{})
		}
		if len(m.ids) == 0 {
			return append(out, effDone{})
		}
		m.phase = dsDeleted
		return append(out, effDelete{IDs: m.ids})
	case inDeleted:
		m.phase = dsDone
		return append(afterDelete(in), effDone{})
	}
	panic(fmt.Sprintf("owner: discard waiting for %s got %T", m.phase, in))
}

// tombstone tombstones what the round took, the late snapshots and listed.
func (m *discarding) tombstone(listed []string) []effect {
	ids := map[string]bool{}
	for _, t := range m.d.Taken {
		if t.SnapshotID != "" {
			ids[t.SnapshotID] = true
		}
	}
	for _, id := range append(slices.Clone(m.d.Late), listed...) {
		ids[id] = true
	}
	m.ids = sortedKeys(ids)
	m.phase = dsTombstoned
	return []effect{effTombstone{IDs: m.ids, Reason: m.d.Reason}}
}
