package owner

import (
	"encoding/json"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// recovering is the machine of a fresh owner's start: every intent is
// settled (an earlier incarnation's rounds intent has the snapshots of its
// rounds that no checkpoint names tombstoned, found by its mark; a commit's
// that never committed, written by earlier versions, has the snapshots of
// its round tombstoned, by their tag; any other is dropped), every
// tombstoned snapshot is deleted, this incarnation's rounds intent is
// written, and the sandboxes an earlier incarnation of this server left
// running are stopped (a fresh process holds no session, so they serve
// nobody).
type recovering struct {
	// index: the owner exports (it has an index to recover); list: the
	// provider lists its sandboxes.
	index, list       bool
	name, incarnation string

	phase   recoverPhase
	intents []snapshotindex.Intent
	// at is the intent being settled; tag its round's tag (a rounds
	// intent's: its mark), refs the snapshots checkpoints name.
	at   int
	tag  string
	refs map[string][]string
	// own says this incarnation's rounds intent is written.
	own bool
}

// recoverPhase is what the machine waits for.
type recoverPhase int

const (
	rvStart recoverPhase = iota
	rvIntents
	rvCheckpoint
	rvRefs
	rvListed
	rvSettled
	rvTombstones
	rvDeleted
	rvOwn
	rvSandboxes
	rvStopped
	rvDone
)

var recoverPhases = [...]string{"start", "intents", "checkpoint", "refs", "listed", "settled", "tombstones", "deleted", "own", "sandboxes", "stopped", "done"}

func (p recoverPhase) String() string { return recoverPhases[p] }

// Effects of a recovery.
type (
	// effReadIntents reads the intents: inIntents.
	effReadIntents struct{}
	// effDeleteIntent drops an intent: inWritten.
	effDeleteIntent struct{ Key snapshotindex.IntentKey }
	// effListByTag lists the provider's snapshots of a round: inListed.
	effListByTag struct{ RoundTag string }
	// effListMarked lists the provider's snapshots of the commit rounds of
	// the incarnation whose mark is Mark: inListed.
	effListMarked struct{ Mark string }
	// effPutIntent writes an intent whose body names Tag: inWritten.
	effPutIntent struct{ Kind, ID, Tag string }
	// effListSandboxes lists the provider's sandboxes: inSandboxes.
	effListSandboxes struct{}
	// effStopHandles stops sandboxes no session holds: inStopped.
	effStopHandles struct{ Handles []provider.Handle }
	// effEnded remembers sandboxes as ended (for SandboxFate).
	effEnded struct{ IDs []string }
)

// Inputs of a recovery.
type (
	inIntents struct {
		Intents []snapshotindex.Intent
		Err     error
	}
	inListed    struct{ IDs []string }
	inSandboxes struct {
		List []provider.SandboxInfo
		Err  error
	}
	inStopped struct {
		Stopped []string
		Failed  map[string]string
	}
)

func (effReadIntents) String() string    { return "read intents" }
func (e effDeleteIntent) String() string { return "delete intent " + e.Key.Kind + " " + e.Key.ID }
func (e effListByTag) String() string    { return "list snapshots tagged " + e.RoundTag }
func (e effListMarked) String() string   { return "list snapshots marked " + e.Mark }
func (e effPutIntent) String() string {
	return fmt.Sprintf("put intent %s %s tag=%s", e.Kind, e.ID, e.Tag)
}
func (effListSandboxes) String() string { return "list sandboxes" }
func (e effStopHandles) String() string {
	var ids []string
	for _, h := range e.Handles {
		ids = append(ids, h.SandboxID)
	}
	return "stop " + bracket(ids)
}
func (e effEnded) String() string { return "ended " + bracket(e.IDs) }

func newRecovering(index, list bool, name, incarnation string) *recovering {
	return &recovering{index: index, list: list, name: name, incarnation: incarnation}
}

func (m *recovering) await(p recoverPhase, e ...effect) []effect {
	m.phase = p
	return e
}

func (m *recovering) fail(err error) []effect {
	m.phase = rvDone
	return []effect{effDone{Err: fmt.Errorf("recover snapshot index: %w", err)}}
}

func (m *recovering) key() snapshotindex.IntentKey {
	in := m.intents[m.at]
	return snapshotindex.IntentKey{Kind: in.Kind, ID: in.ID}
}

func (m *recovering) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		if m.phase == rvStart {
			if !m.index {
				return m.sweep()
			}
			return m.await(rvIntents, effReadIntents{})
		}
	case inIntents:
		if m.phase == rvIntents {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			m.intents = in.Intents
			m.at = -1
			return m.next()
		}
	case inCheckpoint:
		if m.phase == rvCheckpoint {
			var body commitIntent
			if in.Err == nil || json.Unmarshal(m.intents[m.at].Body, &body) != nil || body.Tag == "" {
				// Committed (the intent outlived its transaction), or
				// nothing to find its snapshots by.
				return m.await(rvSettled, effDeleteIntent{Key: m.key()})
			}
			m.tag = body.Tag
			return m.await(rvListed, effListByTag{RoundTag: body.Tag})
		}
	case inRefs:
		if m.phase == rvRefs {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			m.refs = in.Refs
			return m.await(rvListed, effListMarked{Mark: m.tag})
		}
	case inListed:
		if m.phase == rvListed {
			id := m.intents[m.at].ID
			switch m.intents[m.at].Kind {
			case intentRounds:
				// What a checkpoint names was recorded; the rest was
				// taken by rounds that never committed.
				var loose []string
				for _, s := range sortedSet(in.IDs) {
					if len(m.refs[s]) == 0 {
						loose = append(loose, s)
					}
				}
				var out []effect
				if len(loose) > 0 {
					out = append(out, logAt(logrus.WarnLevel, "commits of an earlier run did not finish before it stopped; deleting their snapshots", logrus.Fields{"incarnation": id, "snapshots": len(loose)}))
				}
				return m.await(rvSettled, append(out, effTombstone{IDs: loose, Reason: "unfinished commits of incarnation " + id, Clear: []snapshotindex.IntentKey{m.key()}})...)
			case intentTemplate:
				return m.await(rvSettled,
					logAt(logrus.WarnLevel, "a template's build did not finish before the last stop; deleting its snapshot", logrus.Fields{"template": id, "snapshots": len(toSet(in.IDs))}),
					effTombstone{IDs: sortedSet(in.IDs), Reason: "unfinished template " + id, Clear: []snapshotindex.IntentKey{m.key()}})
			}
			return m.await(rvSettled,
				logAt(logrus.WarnLevel, "a commit did not finish before the last stop; deleting its snapshots", logrus.Fields{"checkpoint_id": id, "snapshots": len(toSet(in.IDs))}),
				effTombstone{IDs: sortedSet(in.IDs), Reason: "unfinished commit " + id, Clear: []snapshotindex.IntentKey{m.key()}})
		}
	case inWritten:
		switch m.phase {
		case rvSettled:
			if in.Err != nil {
				return m.fail(in.Err)
			}
			return m.next()
		case rvOwn:
			if in.Err != nil {
				return m.fail(in.Err)
			}
			return m.sweep()
		}
	case inTombstones:
		if m.phase == rvTombstones {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			if len(in.IDs) == 0 {
				return m.sweep()
			}
			return m.await(rvDeleted, effDelete{IDs: in.IDs})
		}
	case inDeleted:
		if m.phase == rvDeleted {
			out := afterDelete(in)
			if len(in.Failed) > 0 {
				out = append(out, logAt(logrus.WarnLevel, "tombstoned snapshots could not be deleted at startup", logrus.Fields{"failed": len(in.Failed)}))
			}
			return append(out, m.sweep()...)
		}
	case inSandboxes:
		if m.phase == rvSandboxes {
			if in.Err != nil {
				return []effect{
					logAt(logrus.WarnLevel, "listing sandboxes at startup failed; earlier sandboxes are left to their leases", logrus.Fields{logrus.ErrorKey: in.Err}),
					m.done(),
				}
			}
			var stale []provider.Handle
			for _, s := range in.List {
				if s.Metadata[LabelOwner] == m.name && s.Metadata[LabelIncarnation] != m.incarnation {
					stale = append(stale, s.Handle)
				}
			}
			if len(stale) == 0 {
				return []effect{m.done()}
			}
			return m.await(rvStopped, effStopHandles{Handles: stale})
		}
	case inStopped:
		if m.phase == rvStopped {
			return []effect{
				effEnded{IDs: in.Stopped},
				logAt(logrus.WarnLevel, "stopped sandboxes an earlier run of this server left behind", logrus.Fields{"stopped": len(in.Stopped), "failed": len(in.Failed)}),
				m.done(),
			}
		}
	}
	panic(fmt.Sprintf("owner: a recovery waiting for %s got %T", m.phase, in))
}

func (m *recovering) done() effect {
	m.phase = rvDone
	return effDone{}
}

// next settles the next intent, or reads the tombstones after the last.
func (m *recovering) next() []effect {
	m.at++
	if m.at == len(m.intents) {
		return m.await(rvTombstones, effReadTombstones{})
	}
	in := m.intents[m.at]
	switch in.Kind {
	case intentCommit:
		return m.await(rvCheckpoint, effReadCheckpoint{ID: in.ID})
	case intentRounds:
		var body commitIntent
		if json.Unmarshal(in.Body, &body) != nil || body.Tag == "" {
			return m.await(rvSettled, effDeleteIntent{Key: m.key()})
		}
		m.tag = body.Tag
		return m.await(rvRefs, effReadRefs{})
	case intentTemplate:
		// The build never recorded its template (that clears the intent):
		// the snapshot it may have taken carries its tag.
		var body commitIntent
		if json.Unmarshal(in.Body, &body) != nil || body.Tag == "" {
			return m.await(rvSettled, effDeleteIntent{Key: m.key()})
		}
		m.tag = body.Tag
		return m.await(rvListed, effListByTag{RoundTag: body.Tag})
	}
	// A restore's forks carry this server's labels: the sweep of earlier
	// incarnations stops them.
	return m.await(rvSettled, effDeleteIntent{Key: m.key()})
}

// sweep writes this incarnation's rounds intent, before any commit can
// run, then lists the sandboxes, on a provider that lists.
func (m *recovering) sweep() []effect {
	if m.index && !m.own {
		m.own = true
		return m.await(rvOwn, effPutIntent{Kind: intentRounds, ID: m.incarnation, Tag: roundsMark(m.incarnation)})
	}
	if !m.list {
		return []effect{m.done()}
	}
	return m.await(rvSandboxes, effListSandboxes{})
}

func sortedSet(ids []string) []string {
	return sortedKeys(toSet(ids))
}
