package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
)

// CommitRequest asks for a checkpoint of the live sessions.
type CommitRequest struct {
	CheckpointID string
	// CheckpointDir is the controller's directory, recorded with the
	// checkpoint (restore can find a checkpoint by it).
	CheckpointDir string
	// Scope limits the export to these sessions; nil exports every live
	// session.
	Scope []string
	// Stop: the controller exits after this checkpoint. With on_stop kill
	// the exported sandboxes are stopped once the commit is durable.
	Stop bool
	// Episodes labels sessions with their episode (recorded per record).
	Episodes map[string]string
	// Deadline, on the owner's clock, bounds the snapshot round (the
	// controller's deadline_ts); the round also ends after
	// checkpoint.round_timeout. A round still running then fails and is
	// cleaned up as any failed commit. The caller's context does not bound
	// it: the round's result is needed to clean up.
	Deadline time.Time
}

// CommitResult is what a commit recorded.
type CommitResult struct {
	Mode Mode
	Meta snapshotindex.CheckpointMeta
	// Sessions are the exported session ids, sorted.
	Sessions []string
	// Skipped sessions were in setup or ended: not exported.
	Skipped []string
	// Existing is set when the checkpoint was already committed: nothing
	// was snapshotted again.
	Existing bool
	// Parked are the sessions a stop commit stopped; ParkFailed those it
	// could not stop (logged; the commit still succeeded).
	Parked     []string
	ParkFailed map[string]string
	// Manifest publishes the records written under CheckpointDir (zero
	// without a CheckpointDir).
	Manifest records.Manifest
}

// CommitError says which sessions failed a commit.
type CommitError struct {
	CheckpointID string
	Failed       map[string]string
	Err          error
}

func (e *CommitError) Error() string {
	var parts []string
	for _, sid := range slices.Sorted(maps.Keys(e.Failed)) {
		parts = append(parts, fmt.Sprintf("%s: %s", sid, e.Failed[sid]))
	}
	msg := fmt.Sprintf("checkpoint %q not committed", e.CheckpointID)
	if len(parts) > 0 {
		msg += "; " + strings.Join(parts, "; ")
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrCommitFailed) true.
func (e *CommitError) Is(target error) bool { return target == ErrCommitFailed }

// Unwrap exposes the underlying error, if any.
func (e *CommitError) Unwrap() error { return e.Err }

// Commit snapshots every live session's sandbox (at most parallelism
// provider calls at once) and records {sandbox, workdir, data} per session
// in one index transaction. If any session fails, nothing is recorded, the
// sandboxes keep running, and the snapshots this commit took are deleted.
// In restart_only mode it succeeds and records nothing.
func (o *Owner) Commit(ctx context.Context, req CommitRequest) (CommitResult, error) {
	if o.mode == ModeOff {
		return CommitResult{}, ErrCheckpointingOff
	}
	res := CommitResult{Mode: o.mode}
	if req.CheckpointID == "" {
		return res, fmt.Errorf("%w: empty checkpoint id", ErrCommitFailed)
	}
	if o.mode == ModeRestartOnly {
		// Nothing of this server is in a checkpoint: its records are none.
		var err error
		if res.Manifest, err = o.publishRecords(req.CheckpointID, req.CheckpointDir, nil); err != nil {
			return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
		}
		return res, nil
	}
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: fmt.Errorf("waiting for another control operation: %w", err)}
	}
	defer o.ctl.Unlock()
	o.followDirsAtCommit()
	log := o.log.WithField("checkpoint_id", req.CheckpointID)

	if ck, err := o.index.Checkpoint(req.CheckpointID); err == nil {
		res.Existing, res.Meta = true, ck.Meta
		for _, r := range ck.Records {
			res.Sessions = append(res.Sessions, r.SessionID)
		}
		// A commit whose records could not be written writes them now, as
		// they were cut; it never snapshots again.
		return o.republish(ctx, req, res, ck.Records)
	} else if !errors.Is(err, snapshotindex.ErrNotFound) {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}

	if err := o.writer.Lock(ctx, o.rt); err != nil {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	stopped := o.stopped.Has(req.CheckpointID)
	u := o.unstored[req.CheckpointID]
	o.writer.Unlock()
	if stopped {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: ErrCommitStopped}
	}
	if u != nil {
		// The snapshots are taken: store the same records again.
		if u.meta.CheckpointDir != req.CheckpointDir || !slices.Equal(u.meta.Scope, req.Scope) {
			return res, &CommitError{CheckpointID: req.CheckpointID, Err: fmt.Errorf("%w: a commit of %q with another dir or scope took its snapshots", snapshotindex.ErrConflict, req.CheckpointID)}
		}
		return o.store(ctx, req, u, log)
	}

	refs, err := o.sessions()
	if err != nil {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	refs = inScope(refs, func(r messages.SessionRef) string { return r.SessionID }, req.Scope)

	o.round++
	round := o.round
	tag := roundTag(o.incarnation, req.CheckpointID, round)
	unix := o.clk.Now().Unix()
	names := make(map[string]string, len(refs))
	for _, r := range refs {
		names[r.SessionID] = snapshotName(r.SessionID, unix, tag)
	}
	body, _ := json.Marshal(commitIntent{Tag: tag})
	intent := snapshotindex.IntentKey{Kind: intentCommit, ID: req.CheckpointID}
	if err := o.index.PutIntent(snapshotindex.Intent{Kind: intentCommit, ID: req.CheckpointID, Body: body, At: o.clk.Now()}); err != nil {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}

	deadline := o.clk.Now().Add(o.cfg.Checkpoint.RoundTimeout)
	if !req.Deadline.IsZero() && req.Deadline.Before(deadline) {
		deadline = req.Deadline
	}
	started := o.clk.Now()
	rr, err := o.runRound(&actors.StartRound{ID: round, Sessions: refs, Names: names, Deadline: deadline})
	if err != nil {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	if len(rr.Failed) > 0 {
		res.Skipped = rr.Skipped
		o.discardRound(tag, rr.Taken, intent, "commit "+req.CheckpointID+" failed")
		log.WithField("failed", len(rr.Failed)).Warn("checkpoint commit failed; its snapshots were deleted")
		return res, &CommitError{CheckpointID: req.CheckpointID, Failed: rr.Failed}
	}

	u = &unstoredCommit{tag: tag, taken: rr.Taken, intent: intent, skipped: rr.Skipped, began: started}
	u.records = make([]snapshotindex.Record, 0, len(rr.Taken))
	for _, t := range rr.Taken {
		spec := t.Sandbox.Spec
		// The snapshot holds the filesystem; the seed's files would only
		// bloat the record (and must not be replayed over a fork).
		spec.Files = nil
		u.records = append(u.records, snapshotindex.Record{
			SessionID:  t.SessionID,
			Episode:    req.Episodes[t.SessionID],
			Provider:   o.prov.Name(),
			Sandbox:    t.Sandbox.Handle,
			SnapshotID: t.SnapshotID,
			Spec:       spec,
			Workdir:    t.Sandbox.Workdir,
			Data:       t.Sandbox.Data,
			SnapshotAt: t.At,
		})
	}
	u.meta = snapshotindex.CheckpointMeta{
		ID:            req.CheckpointID,
		CommittedAt:   o.clk.Now(),
		CheckpointDir: req.CheckpointDir,
		Scope:         req.Scope,
	}
	return o.store(ctx, req, u, log)
}

// stoppedMemory is how many stopped checkpoint ids the writer remembers:
// as many as the control plane remembers resumed ids.
const stoppedMemory = 64

// unstoredCommit is a commit whose snapshots were taken: what its store
// records, and what a discard deletes.
type unstoredCommit struct {
	tag     string
	taken   []messages.SnapshotReply
	intent  snapshotindex.IntentKey
	meta    snapshotindex.CheckpointMeta
	records []snapshotindex.Record
	skipped []string
	began   time.Time
}

// store records a commit whose snapshots are taken. A store that fails
// keeps the commit for a retry, which stores the same records; a commit
// whose id StopCommit stopped is discarded instead.
func (o *Owner) store(ctx context.Context, req CommitRequest, u *unstoredCommit, log logrus.FieldLogger) (CommitResult, error) {
	res := CommitResult{Mode: o.mode, Skipped: u.skipped}
	// Not ctx: a store given up here would leave the snapshots taken; the
	// writer is held only across one store and one records write.
	_ = o.writer.Lock(context.Background(), o.rt)
	if o.stopped.Has(req.CheckpointID) {
		delete(o.unstored, req.CheckpointID)
		o.writer.Unlock()
		o.discardRound(u.tag, u.taken, u.intent, "commit "+req.CheckpointID+" stopped by a resume")
		log.Info("checkpoint commit stopped by a resume; its snapshots were deleted")
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: ErrCommitStopped}
	}
	meta, err := o.index.Commit(u.meta, u.records, u.intent)
	if err != nil {
		o.unstored[req.CheckpointID] = u
		o.writer.Unlock()
		log.WithError(err).Warn("checkpoint store failed; a retry stores the same records, a resume deletes its snapshots")
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	delete(o.unstored, req.CheckpointID)
	// The records under checkpoint_dir publish the commit, under the
	// writer's lock so that none is published once StopCommit returned. A
	// failed write leaves the checkpoint in the index: a retry writes its
	// records as they were cut (a release drops it if it is never kept).
	var pubErr error
	res.Manifest, pubErr = o.publishRecords(req.CheckpointID, req.CheckpointDir, u.records)
	o.writer.Unlock()
	res.Meta = meta
	for _, r := range u.records {
		res.Sessions = append(res.Sessions, r.SessionID)
	}
	if err := pubErr; err != nil {
		log.WithError(err).Warn("checkpoint records could not be written; a retry writes them")
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	log.WithFields(logrus.Fields{"records": len(u.records), "skipped": len(u.skipped), "took": o.clk.Now().Sub(u.began)}).Info("checkpoint committed")

	if req.Stop && o.cfg.Checkpoint.OnStop == OnStopKill {
		res.Parked, res.ParkFailed = o.stopMany(ctx, res.Sessions, messages.StopPark)
		if len(res.ParkFailed) > 0 {
			log.WithField("failed", res.ParkFailed).Warn("some exported sandboxes could not be parked")
		}
	}
	return res, nil
}

// StopCommit stops the writer of checkpoint id, as a resume does: it waits
// for a store in progress, and no commit of id is recorded after it
// returns. A commit of id still snapshotting deletes its snapshots when its
// round ends; one whose store failed has them deleted now, in the
// background.
func (o *Owner) StopCommit(id string) {
	// Unbounded on purpose: the writer is held only across one store and
	// one records write, and no commit may be recorded once this returns.
	_ = o.writer.Lock(context.Background(), o.rt)
	o.stopped.Put(id, struct{}{})
	u := o.unstored[id]
	delete(o.unstored, id)
	o.writer.Unlock()
	if u != nil {
		o.bg.Go(o.rt, func() { o.discardRound(u.tag, u.taken, u.intent, "commit "+id+" stopped by a resume") })
	}
}

// runRound hands a round to the coordinator and waits for its result. The
// wait is not bounded by the caller's context: the round ends by its own
// deadline, and its result is needed to clean up.
func (o *Owner) runRound(m *actors.StartRound) (*actors.RoundResult, error) {
	// The coordinator answers by the deadline plus its drain grace; the
	// bound only guards against a lost reply.
	ctx, cancel := clock.WithDeadline(context.Background(), o.clk, m.Deadline.Add(actors.DrainGrace+timeouts.RoundSlack))
	defer cancel()
	r := make(messages.ReplyTo, 1)
	m.Reply = r
	v, err := o.call(ctx, o.coord, m, r)
	if err != nil {
		return nil, fmt.Errorf("snapshot round: %w", err)
	}
	rr := v.(*actors.RoundResult)
	if rr.Busy {
		return nil, errors.New("snapshot round: another round is running")
	}
	return rr, nil
}

// discardRound tombstones and deletes every snapshot a failed round took:
// those it reported and, through the provider's listing, those whose call
// failed after the effect (their ids never reached the owner).
func (o *Owner) discardRound(tag string, taken []messages.SnapshotReply, intent snapshotindex.IntentKey, reason string) {
	ctx, cancel := context.WithTimeout(o.base, timeouts.Cleanup)
	defer cancel()
	ids := map[string]bool{}
	bySession := map[string][]string{}
	for _, t := range taken {
		if t.SnapshotID != "" {
			ids[t.SnapshotID] = true
			bySession[t.SessionID] = append(bySession[t.SessionID], t.SnapshotID)
		}
	}
	for _, id := range o.listSnapshotsByTag(ctx, tag) {
		ids[id] = true
	}
	ts := o.tombstones(ids, reason)
	if err := o.index.AddTombstones(ts, intent); err != nil {
		// The intent stays: a restart finds the snapshots by their tag.
		o.log.WithError(err).Error("could not tombstone a failed commit's snapshots")
		return
	}
	// In session order: the sends schedule mailboxes, and a deterministic
	// scheduler must see them in the same order every run.
	for _, sid := range slices.Sorted(maps.Keys(bySession)) {
		if pid, err := o.lookup(sid); err == nil && pid != nil {
			o.system.Root.Send(pid, &messages.SnapshotsDiscarded{SnapshotIDs: bySession[sid]})
		}
	}
	o.deleteTombstoned(ctx, snapshotIDs(ts))
}

func (o *Owner) tombstones(ids map[string]bool, reason string) []snapshotindex.Tombstone {
	now := o.clk.Now()
	out := make([]snapshotindex.Tombstone, 0, len(ids))
	for id := range ids {
		out = append(out, snapshotindex.Tombstone{SnapshotID: id, Provider: o.prov.Name(), Reason: reason, At: now})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SnapshotID < out[j].SnapshotID })
	return out
}

func snapshotIDs(ts []snapshotindex.Tombstone) []string {
	ids := make([]string, len(ts))
	for i, t := range ts {
		ids[i] = t.SnapshotID
	}
	return ids
}

// listSnapshotsByTag finds the provider's snapshots of the round of tag
// (nil when the provider cannot list).
func (o *Owner) listSnapshotsByTag(ctx context.Context, tag string) []string {
	l := o.caps.Lister
	if l == nil {
		return nil
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		o.log.WithError(err).Warn("listing snapshots failed")
		return nil
	}
	var out []string
	for _, s := range snaps {
		if hasTag(s.Name, tag) {
			out = append(out, s.ID)
		}
	}
	return out
}
