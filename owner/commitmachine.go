package owner

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
)

// committing is the machine of an exported commit, once the caller holds
// the control turn: a checkpoint the index holds has its records written
// again; a commit whose store failed stores the same records; otherwise the
// round snapshots the sessions in scope, under names that end with the
// incarnation's mark (its rounds intent, written at the start, lets a
// crash's successor find them: no write precedes the round), and the
// records are stored and published under the writer's turn (none once a
// resume stopped the writer). A failed round has its snapshots discarded;
// a stop commit parks the exported sandboxes.
type committing struct {
	req CommitRequest
	// provider names the records' provider; park says a stop commit
	// parks (on_stop kill); roundTimeout bounds the round.
	provider     string
	park         bool
	roundTimeout time.Duration
	incarnation  string

	phase    commitPhase
	existing []snapshotindex.Record
	refs     []messages.SessionRef
	tag      string
	began    time.Time
	u        *unstoredCommit
	res      CommitResult
}

// commitPhase is what the machine waits for.
type commitPhase int

const (
	cmStart commitPhase = iota
	cmCheckpoint
	cmRepublishTurn
	cmManifest
	cmRepublished
	cmWriterTurn
	cmSessions
	cmRoundNo
	cmRound
	cmStoreTurn
	cmStored
	cmPublished
	cmParked
	cmDone
)

var commitPhases = [...]string{"start", "checkpoint", "republish-turn", "manifest", "republished", "writer-turn", "sessions", "round-no", "round", "store-turn", "stored", "published", "parked", "done"}

func (p commitPhase) String() string { return commitPhases[p] }

// Effects of a commit; each but effUnlockWriter, effKeepUnstored,
// effForgetUnstored, effDiscard and effRoundSettled gives an input.
type (
	// effReadCheckpoint reads the checkpoint: inCheckpoint.
	effReadCheckpoint struct{ ID string }
	// effLockWriter takes the writer's turn (bounded by the caller's
	// context unless Unbounded) and reads what it guards of ID:
	// inWriter.
	effLockWriter struct {
		ID        string
		Unbounded bool
	}
	effUnlockWriter struct{}
	// effKeepUnstored keeps a commit whose store failed for a retry;
	// effForgetUnstored forgets it. The caller holds the writer.
	effKeepUnstored   struct{ U *unstoredCommit }
	effForgetUnstored struct{ ID string }
	// effReadManifest reads the manifest under Dir: inManifest.
	effReadManifest struct{ Dir string }
	// effPublish writes the records and their manifest under Dir:
	// inPublished.
	effPublish struct {
		ID, Dir string
		Records []snapshotindex.Record
	}
	// effListSessions lists the sessions: inSessions.
	effListSessions struct{}
	// effNewRound numbers a round: inRoundNo.
	effNewRound struct{}
	// effRound runs a snapshot round, loose until its snapshots are
	// recorded or tombstoned: inRound.
	effRound struct{ Start actors.StartRound }
	// effDiscard tombstones and deletes what a round took, and what the
	// provider lists with its tag; once tombstoned, the round is settled.
	effDiscard struct {
		Tag    string
		Taken  []messages.SnapshotReply
		Reason string
	}
	// effStore records the checkpoint in the index: inStored.
	effStore struct{ U *unstoredCommit }
	// effRoundSettled: a round's snapshots are recorded or tombstoned.
	effRoundSettled struct{}
	// effPark stops the sandboxes of sessions for a stop commit: inParked.
	effPark struct{ Sessions []string }
)

// Inputs of a commit.
type (
	inCheckpoint struct {
		Ck  snapshotindex.Checkpoint
		Err error
	}
	// inWriter: the writer's turn is held (unless Err), and what it
	// guards of the commit's id.
	inWriter struct {
		Stopped  bool
		Unstored *unstoredCommit
		Err      error
	}
	inManifest struct {
		M   records.Manifest
		Err error
	}
	inPublished struct {
		M   records.Manifest
		Err error
		Now time.Time
	}
	inSessions struct {
		Refs []messages.SessionRef
		Err  error
	}
	inRoundNo struct {
		N   uint64
		Now time.Time
	}
	inRound struct {
		R   *actors.RoundResult
		Err error
		Now time.Time
	}
	inStored struct {
		Meta snapshotindex.CheckpointMeta
		Err  error
	}
	inParked struct {
		Parked []string
		Failed map[string]string
	}
)

func (e effReadCheckpoint) String() string { return "read checkpoint " + e.ID }
func (e effLockWriter) String() string {
	if e.Unbounded {
		return "lock writer " + e.ID + " (unbounded)"
	}
	return "lock writer " + e.ID
}
func (effUnlockWriter) String() string     { return "unlock writer" }
func (e effKeepUnstored) String() string   { return "keep unstored " + e.U.meta.ID }
func (e effForgetUnstored) String() string { return "forget unstored " + e.ID }
func (e effReadManifest) String() string   { return "read manifest " + e.Dir }
func (e effPublish) String() string {
	return fmt.Sprintf("publish %s under %q: %s", e.ID, e.Dir, recordsText(e.Records))
}
func (effListSessions) String() string { return "list sessions" }
func (effNewRound) String() string     { return "new round" }
func (effRoundSettled) String() string { return "round settled" }
func (e effRound) String() string {
	var names []string
	for _, r := range e.Start.Sessions {
		names = append(names, r.SessionID+":"+e.Start.Names[r.SessionID])
	}
	return fmt.Sprintf("round %d %s deadline=%s", e.Start.ID, bracket(names), e.Start.Deadline.Format(time.TimeOnly))
}
func (e effDiscard) String() string {
	var ids []string
	for _, t := range e.Taken {
		ids = append(ids, t.SessionID+":"+t.SnapshotID)
	}
	return fmt.Sprintf("discard tag=%s taken=%s (%s)", e.Tag, bracket(ids), e.Reason)
}
func (e effStore) String() string {
	return fmt.Sprintf("store %s dir=%q scope=%s: %s", e.U.meta.ID, e.U.meta.CheckpointDir, bracket(e.U.meta.Scope), recordsText(e.U.records))
}
func (e effPark) String() string { return "park " + bracket(e.Sessions) }

func recordsText(rs []snapshotindex.Record) string {
	var out []string
	for _, r := range rs {
		s := r.SessionID + ":" + r.SnapshotID
		if r.Episode != "" {
			s += "@" + r.Episode
		}
		if len(r.Spec.Files) > 0 {
			s += "+files"
		}
		out = append(out, s)
	}
	return bracket(out)
}

func newCommitting(req CommitRequest, providerName string, park bool, roundTimeout time.Duration, incarnation string) *committing {
	return &committing{req: req, provider: providerName, park: park, roundTimeout: roundTimeout, incarnation: incarnation, res: CommitResult{Mode: ModeExported}}
}

func (m *committing) await(p commitPhase, e ...effect) []effect {
	m.phase = p
	return e
}

func (m *committing) fail(err error) []effect {
	m.phase = cmDone
	return []effect{effDone{Err: &CommitError{CheckpointID: m.req.CheckpointID, Err: err}}}
}

func (m *committing) done() []effect {
	m.phase = cmDone
	return []effect{effDone{}}
}

func (m *committing) log(level logrus.Level, msg string, fields logrus.Fields) effLog {
	f := logrus.Fields{"checkpoint_id": m.req.CheckpointID}
	for k, v := range fields {
		f[k] = v
	}
	return logAt(level, msg, f)
}

func (m *committing) step(in input) []effect {
	id := m.req.CheckpointID
	switch in := in.(type) {
	case inStart:
		if m.phase == cmStart {
			return m.await(cmCheckpoint, effReadCheckpoint{ID: id})
		}
	case inCheckpoint:
		if m.phase == cmCheckpoint {
			switch {
			case in.Err == nil:
				// A commit whose records could not be written writes them
				// now, as they were cut; it never snapshots again.
				m.res.Existing, m.res.Meta = true, in.Ck.Meta
				for _, r := range in.Ck.Records {
					m.res.Sessions = append(m.res.Sessions, r.SessionID)
				}
				m.existing = in.Ck.Records
				return m.await(cmRepublishTurn, effLockWriter{ID: id})
			case !errors.Is(in.Err, snapshotindex.ErrNotFound):
				return m.fail(in.Err)
			}
			return m.await(cmWriterTurn, effLockWriter{ID: id})
		}
	case inWriter:
		switch m.phase {
		case cmRepublishTurn:
			if in.Err != nil {
				return m.fail(in.Err)
			}
			// Once a resume stopped the writer nothing new is published:
			// the retry answers with the manifest already there, if any.
			if m.req.CheckpointDir != "" && in.Stopped {
				return m.await(cmManifest, effReadManifest{Dir: m.req.CheckpointDir})
			}
			return m.await(cmRepublished, effPublish{ID: id, Dir: m.req.CheckpointDir, Records: m.existing})
		case cmWriterTurn:
			if in.Err != nil {
				return m.fail(in.Err)
			}
			out := []effect{effUnlockWriter{}}
			switch u := in.Unstored; {
			case in.Stopped:
				return append(out, m.fail(ErrCommitStopped)...)
			case u != nil && (u.meta.CheckpointDir != m.req.CheckpointDir || !slices.Equal(u.meta.Scope, m.req.Scope)):
				return append(out, m.fail(fmt.Errorf("%w: a commit of %q with another dir or scope took its snapshots", snapshotindex.ErrConflict, id))...)
			case u != nil:
				// The snapshots are taken: store the same records again.
				return append(out, m.store(u)...)
			}
			return append(out, m.await(cmSessions, effListSessions{})...)
		case cmStoreTurn:
			if in.Stopped {
				m.res.Skipped = m.u.skipped
				return append([]effect{
					effForgetUnstored{ID: id},
					effUnlockWriter{},
					effDiscard{Tag: m.u.tag, Taken: m.u.taken, Reason: "commit " + id + " stopped by a resume"},
					m.log(logrus.InfoLevel, "checkpoint commit stopped by a resume; its snapshots were deleted", nil),
				}, m.fail(ErrCommitStopped)...)
			}
			return m.await(cmStored, effStore{U: m.u})
		}
	case inManifest:
		if m.phase == cmManifest {
			out := []effect{effUnlockWriter{}}
			if in.Err != nil || in.M.CheckpointID != id {
				return append(out, m.fail(ErrCommitStopped)...)
			}
			m.res.Manifest = in.M
			return append(out, m.done()...)
		}
	case inPublished:
		switch m.phase {
		case cmRepublished:
			out := []effect{effUnlockWriter{}}
			if in.Err != nil {
				return append(out, m.fail(in.Err)...)
			}
			m.res.Manifest = in.M
			return append(out, m.done()...)
		case cmPublished:
			// A failed write leaves the checkpoint in the index: a retry
			// writes its records as they were cut (a release drops it if
			// it is never kept).
			out := []effect{effUnlockWriter{}}
			m.res.Manifest = in.M
			for _, r := range m.u.records {
				m.res.Sessions = append(m.res.Sessions, r.SessionID)
			}
			if in.Err != nil {
				return append(append(out, m.log(logrus.WarnLevel, "checkpoint records could not be written; a retry writes them", logrus.Fields{logrus.ErrorKey: in.Err})), m.fail(in.Err)...)
			}
			out = append(out, m.log(logrus.InfoLevel, "checkpoint committed", logrus.Fields{"records": len(m.u.records), "skipped": len(m.u.skipped), "took": in.Now.Sub(m.u.began)}))
			if m.req.Stop && m.park {
				return append(out, m.await(cmParked, effPark{Sessions: m.res.Sessions})...)
			}
			return append(out, m.done()...)
		}
	case inSessions:
		if m.phase == cmSessions {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			m.refs = inScope(in.Refs, func(r messages.SessionRef) string { return r.SessionID }, m.req.Scope)
			return m.await(cmRoundNo, effNewRound{})
		}
	case inRoundNo:
		if m.phase == cmRoundNo {
			return m.startRound(in)
		}
	case inRound:
		if m.phase == cmRound {
			return m.roundDone(in)
		}
	case inStored:
		if m.phase == cmStored {
			if in.Err != nil {
				m.res.Skipped = m.u.skipped
				return append([]effect{
					effKeepUnstored{U: m.u},
					effUnlockWriter{},
					m.log(logrus.WarnLevel, "checkpoint store failed; a retry stores the same records, a resume deletes its snapshots", logrus.Fields{logrus.ErrorKey: in.Err}),
				}, m.fail(in.Err)...)
			}
			m.res.Meta = in.Meta
			m.res.Skipped = m.u.skipped
			// The records under checkpoint_dir publish the commit, under
			// the writer's turn so that none is published once a resume
			// stopped the writer.
			return m.await(cmPublished, effRoundSettled{}, effForgetUnstored{ID: id}, effPublish{ID: id, Dir: m.req.CheckpointDir, Records: m.u.records})
		}
	case inParked:
		if m.phase == cmParked {
			m.res.Parked, m.res.ParkFailed = in.Parked, in.Failed
			var out []effect
			if len(in.Failed) > 0 {
				out = append(out, m.log(logrus.WarnLevel, "some exported sandboxes could not be parked", logrus.Fields{"failed": in.Failed}))
			}
			return append(out, m.done()...)
		}
	}
	panic(fmt.Sprintf("owner: a commit waiting for %s got %T", m.phase, in))
}

// startRound names the round's snapshots by a tag that begins with the
// incarnation's mark, and runs it.
func (m *committing) startRound(in inRoundNo) []effect {
	m.began = in.Now
	m.tag = commitTag(m.incarnation, m.req.CheckpointID, in.N)
	m.u = &unstoredCommit{tag: m.tag, began: in.Now}
	deadline := in.Now.Add(m.roundTimeout)
	if !m.req.Deadline.IsZero() && m.req.Deadline.Before(deadline) {
		deadline = m.req.Deadline
	}
	names := make(map[string]string, len(m.refs))
	for _, r := range m.refs {
		names[r.SessionID] = snapshotName(r.SessionID, in.Now.Unix(), m.tag)
	}
	return m.await(cmRound, effRound{Start: actors.StartRound{ID: in.N, Sessions: m.refs, Names: names, Deadline: deadline}})
}

// roundDone stores a round that took every snapshot, and discards one that
// failed.
func (m *committing) roundDone(in inRound) []effect {
	id := m.req.CheckpointID
	if in.Err != nil {
		return m.fail(in.Err)
	}
	rr := in.R
	if len(rr.Failed) > 0 {
		m.res.Skipped = rr.Skipped
		m.phase = cmDone
		return []effect{
			effDiscard{Tag: m.tag, Taken: rr.Taken, Reason: "commit " + id + " failed"},
			m.log(logrus.WarnLevel, "checkpoint commit failed; its snapshots were deleted", logrus.Fields{"failed": len(rr.Failed)}),
			effDone{Err: &CommitError{CheckpointID: id, Failed: rr.Failed}},
		}
	}
	u := m.u
	u.taken, u.skipped = rr.Taken, rr.Skipped
	u.records = make([]snapshotindex.Record, 0, len(rr.Taken))
	for _, t := range rr.Taken {
		spec := t.Sandbox.Spec
		// The snapshot holds the filesystem; the seed's files would only
		// bloat the record (and must not be replayed over a fork).
		spec.Files = nil
		u.records = append(u.records, snapshotindex.Record{
			SessionID:  t.SessionID,
			Episode:    m.req.Episodes[t.SessionID],
			Provider:   m.provider,
			Sandbox:    t.Sandbox.Handle,
			SnapshotID: t.SnapshotID,
			Spec:       spec,
			Workdir:    t.Sandbox.Workdir,
			Data:       t.Sandbox.Data,
			SnapshotAt: t.At,
		})
	}
	u.meta = snapshotindex.CheckpointMeta{ID: id, CommittedAt: in.Now, CheckpointDir: m.req.CheckpointDir, Scope: m.req.Scope}
	return m.store(u)
}

// store records u under the writer's turn, not bounded by the caller's
// context: a store given up would leave the snapshots taken.
func (m *committing) store(u *unstoredCommit) []effect {
	m.u = u
	return m.await(cmStoreTurn, effLockWriter{ID: m.req.CheckpointID, Unbounded: true})
}

// commitIntentBody is the body of an intent naming tag.
func commitIntentBody(tag string) json.RawMessage {
	body, _ := json.Marshal(commitIntent{Tag: tag})
	return body
}
