package owner

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/snapshotindex"
)

// restoring is the machine of a restore, once the caller holds the
// control turn: find the checkpoint (by its dir's records, by its id, or
// the latest committed with its dir), pick the records asked for, check
// them all before the provider is touched, fork them all, and install them
// all or none; then the superseded sandboxes are stopped, best effort. A
// restore writes no intent: a crash mid-restore leaves forks that carry
// this incarnation's labels, which the next start's sweep of earlier
// incarnations stops, and nothing in the index to undo.
type restoring struct {
	req      RestoreRequest
	provider string
	labels   labeller

	phase restorePhase
	// reading is the id of the checkpoint read from the index.
	reading string
	records []snapshotindex.Record
	// installs are the sessions the forks make, as installed.
	installs []RestoredSession
	res      RestoreResult
}

// restorePhase is what the machine waits for.
type restorePhase int

const (
	rsStart restorePhase = iota
	rsDir
	rsDirRecords
	rsDirKnown
	rsImported
	rsFound
	rsCheckpoint
	rsSessions
	rsForked
	rsInstalled
	rsSuperseded
	rsDone
)

var restorePhases = [...]string{"start", "dir", "dir-records", "dir-known", "imported", "found", "checkpoint", "sessions", "forked", "installed", "superseded", "done"}

func (p restorePhase) String() string { return restorePhases[p] }

// Effects of a restore.
type (
	// effLookDir looks the checkpoint's dir up: inDir.
	effLookDir struct{ Dir string }
	// effReadDirRecords reads this server's records under the dir:
	// inDirRecords.
	effReadDirRecords struct{ Req RestoreRequest }
	// effImport commits a checkpoint read from its records into an index
	// that lacks it: inStored.
	effImport struct {
		Meta    snapshotindex.CheckpointMeta
		Records []snapshotindex.Record
	}
	// effFindByDir finds the latest checkpoint committed with Dir: inFound.
	effFindByDir struct{ Dir string }
	// effFork forks every record's snapshot (at most parallelism at
	// once), labelled for the checkpoint: inForked.
	effFork struct {
		CheckpointID string
		Records      []snapshotindex.Record
	}
	// effStopForks stops the forks of a failed restore, and those the
	// provider lists as this incarnation's forks of the checkpoint that no
	// session holds (a fork whose call failed after the effect).
	effStopForks struct {
		CheckpointID string
		Forks        []provider.Handle
	}
	// effInstall gives each session its sandbox (a fork), a new session
	// actor each: inInstalled.
	effInstall struct{ Sessions []RestoredSession }
	// effUndoInstall undoes an install that failed in part: it ends the
	// sessions installed and stops the forks of the others.
	effUndoInstall struct {
		Sessions []string
		Forks    []provider.Handle
	}
	// effSuperseded remembers sandboxes as superseded by a fork.
	effSuperseded struct{ IDs []string }
)

// Inputs of a restore.
type (
	inDir struct{ Gone bool }
	// inDirRecords: the checkpoint id the dir's manifest names and the
	// records under it, sorted by session; NoManifest when the dir holds
	// none of this server's (the index is asked instead); Err when they
	// cannot be read or parsed.
	inDirRecords struct {
		ID         string
		Records    []snapshotindex.Record
		NoManifest bool
		Err        error
	}
	inFound struct {
		Meta snapshotindex.CheckpointMeta
		OK   bool
		Err  error
	}
	// inForked: the forks, index-aligned with the records (zero where it
	// failed) with the time each returned, the failures by session, and
	// the snapshots the provider does not have.
	inForked struct {
		Forks   []provider.Handle
		At      []time.Time
		Failed  map[string]string
		Missing []string
	}
	// inInstalled: each session's refusal, index-aligned with the
	// install (nil where it was installed); Err when nothing was asked
	// (the owner closed).
	inInstalled struct {
		Errs []error
		Err  error
	}
)

func (e effLookDir) String() string        { return "look up " + e.Dir }
func (e effReadDirRecords) String() string { return "read records under " + e.Req.CheckpointDir }
func (e effFindByDir) String() string      { return "find checkpoint of " + e.Dir }
func (e effImport) String() string {
	return "import " + e.Meta.ID + " from " + e.Meta.CheckpointDir + " " + recordsText(e.Records)
}
func (e effFork) String() string { return "fork " + e.CheckpointID + " " + recordsText(e.Records) }
func (e effStopForks) String() string {
	return "stop forks of " + e.CheckpointID + " " + handlesText(e.Forks)
}
func (e effInstall) String() string {
	var parts []string
	for _, s := range e.Sessions {
		p := fmt.Sprintf("%s:%s from %s data %s", s.SessionID, s.Sandbox.Handle.SandboxID, s.Sandbox.FromSnapshot, s.Sandbox.Data)
		if !s.Sandbox.ExpiresAt.IsZero() {
			p += " until " + s.Sandbox.ExpiresAt.UTC().Format(time.TimeOnly)
		}
		parts = append(parts, p)
	}
	return "install [" + strings.Join(parts, "; ") + "]"
}
func (e effUndoInstall) String() string {
	return "undo install: end " + bracket(e.Sessions) + " stop " + handlesText(e.Forks)
}
func (e effSuperseded) String() string { return "superseded " + bracket(e.IDs) }

func handlesText(hs []provider.Handle) string {
	var ids []string
	for _, h := range hs {
		id := h.SandboxID
		if id == "" {
			id = "-"
		}
		ids = append(ids, id)
	}
	return bracket(ids)
}

func newRestoring(req RestoreRequest, providerName string, labels labeller) *restoring {
	return &restoring{req: req, provider: providerName, labels: labels, res: RestoreResult{CheckpointID: req.CheckpointID}}
}

func (m *restoring) await(p restorePhase, e ...effect) []effect {
	m.phase = p
	return e
}

// fail ends the restore with err, which says ErrRestoreFailed.
func (m *restoring) fail(err error) []effect {
	m.phase = rsDone
	if !errors.Is(err, ErrRestoreFailed) {
		err = fmt.Errorf("%w: %w", ErrRestoreFailed, err)
	}
	return []effect{effDone{Err: err}}
}

func (m *restoring) step(in input) []effect {
	switch in := in.(type) {
	case inStart:
		if m.phase == rsStart {
			if m.req.CheckpointDir != "" {
				return m.await(rsDir, effLookDir{Dir: m.req.CheckpointDir})
			}
			return m.byIndex()
		}
	case inDir:
		if m.phase == rsDir {
			// A directory the controller deleted is no checkpoint, even
			// while the index still holds what it named.
			if in.Gone {
				return m.fail(fmt.Errorf("%w: checkpoint_dir %s does not exist", ErrInvalidRecord, m.req.CheckpointDir))
			}
			return m.await(rsDirRecords, effReadDirRecords{Req: m.req})
		}
	case inDirRecords:
		if m.phase == rsDirRecords {
			switch {
			case in.NoManifest:
				return m.byIndex()
			case in.Err != nil:
				return m.fail(fmt.Errorf("%w: %w", ErrInvalidRecord, in.Err))
			case m.req.CheckpointID != "" && in.ID != m.req.CheckpointID:
				return m.fail(fmt.Errorf("%w: %s holds checkpoint %q, not %q", ErrInvalidRecord, m.req.CheckpointDir, in.ID, m.req.CheckpointID))
			}
			// The records are the dir's; the index says whether the
			// checkpoint was committed there, or takes it in.
			m.reading, m.records = in.ID, in.Records
			return m.await(rsDirKnown, effReadCheckpoint{ID: in.ID})
		}
	case inStored:
		if m.phase == rsImported {
			if errors.Is(in.Err, snapshotindex.ErrInvalid) {
				return m.fail(fmt.Errorf("%w: %w", ErrInvalidRecord, in.Err))
			}
			if in.Err != nil {
				return m.fail(in.Err)
			}
			return append([]effect{logAt(logrus.InfoLevel, "checkpoint read from its records into a fresh index", logrus.Fields{"checkpoint_id": in.Meta.ID, "records": len(m.records)})},
				m.source(snapshotindex.Checkpoint{Meta: in.Meta, Records: m.records})...)
		}
	case inFound:
		if m.phase == rsFound {
			if in.Err != nil {
				return m.fail(fmt.Errorf("find the checkpoint of %s: %w", m.req.CheckpointDir, in.Err))
			}
			if !in.OK {
				return m.fail(fmt.Errorf("%w: no checkpoint was committed with checkpoint_dir %s", ErrUnknownCheckpoint, m.req.CheckpointDir))
			}
			return m.read(in.Meta.ID)
		}
	case inCheckpoint:
		if m.phase == rsDirKnown {
			switch {
			case errors.Is(in.Err, snapshotindex.ErrNotFound):
				m.phase = rsImported
				return []effect{effImport{Meta: snapshotindex.CheckpointMeta{ID: m.reading, CheckpointDir: m.req.CheckpointDir}, Records: m.records}}
			case in.Err != nil:
				return m.fail(in.Err)
			}
			in.Ck.Records = m.records
		}
		if m.phase == rsCheckpoint || m.phase == rsDirKnown {
			if errors.Is(in.Err, snapshotindex.ErrNotFound) {
				return m.fail(fmt.Errorf("%w: %q", ErrUnknownCheckpoint, m.reading))
			}
			if in.Err != nil {
				return m.fail(in.Err)
			}
			ck := in.Ck
			if m.req.CheckpointDir != "" && ck.Meta.CheckpointDir != "" && ck.Meta.CheckpointDir != m.req.CheckpointDir {
				return m.fail(fmt.Errorf("%w: checkpoint %s was committed with checkpoint_dir %s, not %s", ErrInvalidRecord, m.reading, ck.Meta.CheckpointDir, m.req.CheckpointDir))
			}
			return m.source(ck)
		}
	case inSessions:
		if m.phase == rsSessions {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			live := make(map[string]bool, len(in.Refs))
			for _, r := range in.Refs {
				live[r.SessionID] = true
			}
			if err := validateRecords(m.records, m.provider, live); err != nil {
				return m.fail(err)
			}
			return m.await(rsForked, effFork{CheckpointID: m.req.CheckpointID, Records: m.records})
		}
	case inForked:
		if m.phase == rsForked {
			if len(in.Failed) > 0 {
				err := fmt.Errorf("%w: %d of %d forks failed: %s", ErrRestoreFailed, len(in.Failed), len(m.records), joinFailures(in.Failed))
				if len(in.Missing) > 0 {
					err = missingSnapshots(err, m.provider, in.Missing)
				}
				return append([]effect{effStopForks{CheckpointID: m.req.CheckpointID, Forks: in.Forks}}, m.fail(err)...)
			}
			m.installs = m.sessions(in.Forks, in.At)
			return m.await(rsInstalled, effInstall{Sessions: m.installs})
		}
	case inInstalled:
		if m.phase == rsInstalled {
			if in.Err != nil {
				return m.fail(in.Err)
			}
			// All or none: one session refused (a seed of it raced the
			// restore) undoes the others.
			var undo effUndoInstall
			var refused error
			for i, s := range m.installs {
				if err := in.Errs[i]; err != nil {
					undo.Forks = append(undo.Forks, s.Sandbox.Handle)
					if refused == nil {
						refused = fmt.Errorf("install session %q: %w", s.SessionID, err)
					}
					continue
				}
				undo.Sessions = append(undo.Sessions, s.SessionID)
			}
			if refused != nil {
				return append([]effect{undo}, m.fail(refused)...)
			}
			m.res.Sessions = m.installs
			old := make([]provider.Handle, 0, len(m.records))
			ids := make([]string, 0, len(m.records))
			for _, r := range m.records {
				old = append(old, r.Sandbox)
				ids = append(ids, r.Sandbox.SandboxID)
			}
			return m.await(rsSuperseded, effSuperseded{IDs: ids}, effStopHandles{Handles: old})
		}
	case inStopped:
		if m.phase == rsSuperseded {
			m.res.Superseded, m.res.SupersedeFailed = in.Stopped, in.Failed
			m.phase = rsDone
			return []effect{
				logAt(logrus.InfoLevel, "checkpoint restored", logrus.Fields{"checkpoint_id": m.req.CheckpointID, "sessions": len(m.res.Sessions), "superseded": len(in.Stopped)}),
				effDone{},
			}
		}
	}
	panic(fmt.Sprintf("owner: a restore waiting for %s got %T", m.phase, in))
}

// sessions are the sessions the forks make (see restoredSession).
func (m *restoring) sessions(forks []provider.Handle, at []time.Time) []RestoredSession {
	out := make([]RestoredSession, len(m.records))
	for i, r := range m.records {
		out[i] = restoredSession(m.labels, r, forks[i], at[i])
	}
	return out
}

// restoredSession is the session a record's fork makes: the record's
// sandbox on the fork, restored from its snapshot, its lease running from
// at, when the fork returned (the provider's began with the fork). The
// shell makes each session's actor with it as the fork returns, and the
// install lists that actor when the machine's session is the same.
func restoredSession(labels labeller, r snapshotindex.Record, fork provider.Handle, at time.Time) RestoredSession {
	sb := sandbox.Sandbox{
		Handle:       fork,
		Spec:         labels.spec(r.Spec, r.SessionID, nil),
		Workdir:      r.Workdir,
		Data:         r.Data,
		Restored:     true,
		FromSnapshot: r.SnapshotID,
	}
	if len(sb.Data) == 0 {
		sb.Data = json.RawMessage("{}")
	}
	if ttl := r.Spec.TTL(); ttl > 0 {
		sb.ExpiresAt = at.Add(ttl)
	}
	return RestoredSession{SessionID: r.SessionID, Episode: r.Episode, Sandbox: sb}
}

// byIndex finds the checkpoint in the index: by its id, or the latest
// committed with the request's dir.
func (m *restoring) byIndex() []effect {
	if m.req.CheckpointID != "" {
		return m.read(m.req.CheckpointID)
	}
	if m.req.CheckpointDir == "" {
		return m.fail(fmt.Errorf("%w: neither a checkpoint id nor a checkpoint dir", ErrUnknownCheckpoint))
	}
	return m.await(rsFound, effFindByDir{Dir: m.req.CheckpointDir})
}

func (m *restoring) read(id string) []effect {
	m.reading = id
	return m.await(rsCheckpoint, effReadCheckpoint{ID: id})
}

// source picks the records of ck the request asks for.
func (m *restoring) source(ck snapshotindex.Checkpoint) []effect {
	m.req.CheckpointID, m.res.CheckpointID = ck.Meta.ID, ck.Meta.ID
	records := inScope(ck.Records, func(r snapshotindex.Record) string { return r.SessionID }, m.req.Sessions)
	if m.req.Sessions != nil && len(records) != len(m.req.Sessions) {
		return m.fail(fmt.Errorf("%w: checkpoint %q does not hold every requested session", ErrInvalidRecord, m.req.CheckpointID))
	}
	if m.req.Episodes != nil {
		records = inScope(records, func(r snapshotindex.Record) string { return r.Episode }, m.req.Episodes)
		if len(records) == 0 {
			m.phase = rsDone
			return []effect{effDone{}}
		}
	}
	m.records = records
	return m.await(rsSessions, effListSessions{})
}
