package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
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
}

// CommitError says which sessions failed a commit.
type CommitError struct {
	CheckpointID string
	Failed       map[string]string
	Err          error
}

func (e *CommitError) Error() string {
	var parts []string
	for _, sid := range sortedKeys(e.Failed) {
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

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

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
	if o.mode == ModeRestartOnly {
		return res, nil
	}
	if req.CheckpointID == "" {
		return res, fmt.Errorf("%w: empty checkpoint id", ErrCommitFailed)
	}
	o.ctl.Lock()
	defer o.ctl.Unlock()
	log := o.log.WithField("checkpoint", req.CheckpointID)

	if ck, err := o.index.Checkpoint(req.CheckpointID); err == nil {
		res.Existing, res.Meta = true, ck.Meta
		for _, r := range ck.Records {
			res.Sessions = append(res.Sessions, r.SessionID)
		}
		return res, nil
	} else if !errors.Is(err, snapshotindex.ErrNotFound) {
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
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
	res.Skipped = rr.Skipped
	if len(rr.Failed) > 0 {
		o.discardRound(tag, rr.Taken, intent, "commit "+req.CheckpointID+" failed")
		log.WithField("failed", len(rr.Failed)).Warn("checkpoint commit failed; its snapshots were deleted")
		return res, &CommitError{CheckpointID: req.CheckpointID, Failed: rr.Failed}
	}

	records := make([]snapshotindex.Record, 0, len(rr.Taken))
	for _, t := range rr.Taken {
		spec := t.Sandbox.Spec
		// The snapshot holds the filesystem; the seed's files would only
		// bloat the record (and must not be replayed over a fork).
		spec.Files = nil
		records = append(records, snapshotindex.Record{
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
		res.Sessions = append(res.Sessions, t.SessionID)
	}
	meta, err := o.index.Commit(snapshotindex.CheckpointMeta{
		ID:            req.CheckpointID,
		CommittedAt:   o.clk.Now(),
		CheckpointDir: req.CheckpointDir,
		Scope:         req.Scope,
	}, records, intent)
	if err != nil {
		o.discardRound(tag, rr.Taken, intent, "index refused commit "+req.CheckpointID)
		return res, &CommitError{CheckpointID: req.CheckpointID, Err: err}
	}
	res.Meta = meta
	log.WithFields(logrus.Fields{"records": len(records), "skipped": len(rr.Skipped), "took": o.clk.Now().Sub(started)}).Info("checkpoint committed")

	if req.Stop && o.cfg.Checkpoint.OnStop == OnStopKill {
		res.Parked, res.ParkFailed = o.stopMany(ctx, res.Sessions, messages.StopPark)
		if len(res.ParkFailed) > 0 {
			log.WithField("failed", res.ParkFailed).Warn("some exported sandboxes could not be parked")
		}
	}
	return res, nil
}

// runRound hands a round to the coordinator and waits for its result. The
// wait is not bounded by the caller's context: the round ends by its own
// deadline, and its result is needed to clean up.
func (o *Owner) runRound(m *actors.StartRound) (*actors.RoundResult, error) {
	// The coordinator answers by the deadline plus its drain grace; the
	// bound only guards against a lost reply.
	ctx, cancel := clock.WithDeadline(context.Background(), o.clk, m.Deadline.Add(actors.DrainGrace+time.Minute))
	defer cancel()
	v, err := o.ask(ctx, o.coord, m)
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
	ctx, cancel := context.WithTimeout(o.base, 10*time.Minute)
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
	for sid, snaps := range bySession {
		if pid, err := o.lookup(sid); err == nil && pid != nil {
			o.system.Root.Send(pid, &messages.SnapshotsDiscarded{SnapshotIDs: snaps})
		}
	}
	o.deleteTombstoned(ctx, ts)
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

// listSnapshotsByTag finds the provider's snapshots of the round of tag
// (nil when the provider cannot list).
func (o *Owner) listSnapshotsByTag(ctx context.Context, tag string) []string {
	l, ok := o.prov.(provider.Lister)
	if !ok {
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

// deleteTombstoned deletes the snapshots (at most parallelism at once) and
// clears the tombstones of those deleted. A failed delete keeps its
// tombstone for the next release or restart. It returns the deleted ids and
// the failures.
func (o *Owner) deleteTombstoned(ctx context.Context, ts []snapshotindex.Tombstone) ([]string, map[string]string) {
	snap, ok := o.prov.(provider.Snapshotter)
	if !ok || len(ts) == 0 {
		return nil, nil
	}
	deleted, failed := o.eachOutcome(ctx, len(ts), true, func(i int) (string, error) {
		return ts[i].SnapshotID, snap.DeleteSnapshot(ctx, ts[i].SnapshotID)
	})
	if len(deleted) > 0 {
		if err := o.index.ClearTombstones(deleted); err != nil {
			o.log.WithError(err).Warn("could not clear tombstones; the next release retries the deletes")
		}
	}
	if len(failed) > 0 {
		o.log.WithField("failed", len(failed)).Warn("some snapshots could not be deleted; their tombstones stay")
	}
	return deleted, failed
}

// each runs fn for 0..n-1 concurrently and waits; limited runs hold the
// checkpoint limiter around each call. A context that ends stops the
// waiting ones.
func (o *Owner) each(ctx context.Context, n int, limited bool, fn func(i int)) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if limited {
				if err := o.limiter.Acquire(ctx); err != nil {
					return
				}
				defer o.limiter.Release()
			}
			fn(i)
		}(i)
	}
	wg.Wait()
}

// eachOutcome is each for calls that each concern one id: fn returns the id
// and the call's error ("" for an item with nothing to do). It returns the
// ids that succeeded, sorted, and the failures by id.
func (o *Owner) eachOutcome(ctx context.Context, n int, limited bool, fn func(i int) (string, error)) ([]string, map[string]string) {
	var mu sync.Mutex
	var done []string
	failed := map[string]string{}
	o.each(ctx, n, limited, func(i int) {
		id, err := fn(i)
		if id == "" {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed[id] = err.Error()
			return
		}
		done = append(done, id)
	})
	sort.Strings(done)
	return done, failed
}

// stopMany stops sessions' sandboxes for reason, in parallel (the sessions
// bound their provider calls with the limiter).
func (o *Owner) stopMany(ctx context.Context, sessionIDs []string, reason messages.StopReason) ([]string, map[string]string) {
	return o.eachOutcome(ctx, len(sessionIDs), false, func(i int) (string, error) {
		sid := sessionIDs[i]
		h, err := o.stopSession(ctx, sid, reason)
		if err == nil && h == nil {
			return "", nil // held no sandbox: nothing stopped
		}
		return sid, err
	})
}

// RetireResult is what a retire stopped.
type RetireResult struct {
	Stopped []string
	Failed  map[string]string
}

// Retire stops the sandboxes of discarded attempts and keeps their
// snapshots. It is idempotent; a failed stop keeps the session so that a
// retry stops it.
func (o *Owner) Retire(ctx context.Context, sessionIDs []string) (RetireResult, error) {
	o.ctl.Lock()
	defer o.ctl.Unlock()
	stopped, failed := o.stopMany(ctx, sessionIDs, messages.StopRetire)
	res := RetireResult{Stopped: stopped, Failed: failed}
	if len(failed) > 0 {
		return res, fmt.Errorf("retire: %d of %d sessions could not be stopped", len(failed), len(sessionIDs))
	}
	return res, nil
}

// RestoreRequest asks for the sessions of a checkpoint to be forked back.
type RestoreRequest struct {
	// CheckpointID names the checkpoint; empty, the latest committed with
	// CheckpointDir is restored.
	CheckpointID string
	// CheckpointDir, when set, must be the directory the checkpoint was
	// committed with.
	CheckpointDir string
	// Sessions limits the restore to these sessions (each must be in the
	// checkpoint); nil restores all.
	Sessions []string
	// Episodes, when not nil, limits the restore to the records labelled
	// with one of these episodes (those the checkpoint lacks are skipped).
	Episodes []string
}

// restoreSource reads the checkpoint a restore names: by id, or the latest
// committed with its dir, which must match when both are given.
func (o *Owner) restoreSource(req RestoreRequest) (snapshotindex.Checkpoint, error) {
	id := req.CheckpointID
	if id == "" {
		if req.CheckpointDir == "" {
			return snapshotindex.Checkpoint{}, fmt.Errorf("%w: neither a checkpoint id nor a checkpoint dir", ErrUnknownCheckpoint)
		}
		meta, ok, err := o.index.FindByDir(req.CheckpointDir)
		if err != nil {
			return snapshotindex.Checkpoint{}, fmt.Errorf("find the checkpoint of %s: %w", req.CheckpointDir, err)
		}
		if !ok {
			return snapshotindex.Checkpoint{}, fmt.Errorf("%w: no checkpoint was committed with checkpoint_dir %s", ErrUnknownCheckpoint, req.CheckpointDir)
		}
		id = meta.ID
	}
	ck, err := o.index.Checkpoint(id)
	if errors.Is(err, snapshotindex.ErrNotFound) {
		return ck, fmt.Errorf("%w: %q", ErrUnknownCheckpoint, id)
	}
	if err != nil {
		return ck, err
	}
	if req.CheckpointDir != "" && ck.Meta.CheckpointDir != "" && ck.Meta.CheckpointDir != req.CheckpointDir {
		return ck, fmt.Errorf("%w: checkpoint %s was committed with checkpoint_dir %s, not %s", ErrInvalidRecord, id, ck.Meta.CheckpointDir, req.CheckpointDir)
	}
	return ck, nil
}

// RestoredSession is one installed session.
type RestoredSession struct {
	SessionID string
	Episode   string
	Sandbox   Sandbox
}

// RestoreResult is what a restore installed.
type RestoreResult struct {
	CheckpointID string
	Sessions     []RestoredSession
	// Superseded are the checkpoint's original sandboxes the restore
	// stopped; SupersedeFailed those it could not stop (best effort).
	Superseded      []string
	SupersedeFailed map[string]string
}

// Restore forks every session of a checkpoint back, all or none: every
// record is validated before the provider is touched, the forks run in
// parallel, and if one fails every fork made is stopped and nothing is
// installed. Then the superseded sandboxes are stopped, best effort.
func (o *Owner) Restore(ctx context.Context, req RestoreRequest) (RestoreResult, error) {
	res := RestoreResult{CheckpointID: req.CheckpointID}
	switch o.mode {
	case ModeOff:
		return res, ErrCheckpointingOff
	case ModeRestartOnly:
		return res, fmt.Errorf("%w: a restart_only owner cannot restore session state", ErrRestoreFailed)
	}
	o.ctl.Lock()
	defer o.ctl.Unlock()
	ck, err := o.restoreSource(req)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrRestoreFailed, err)
	}
	req.CheckpointID, res.CheckpointID = ck.Meta.ID, ck.Meta.ID
	records := inScope(ck.Records, func(r snapshotindex.Record) string { return r.SessionID }, req.Sessions)
	if req.Sessions != nil && len(records) != len(req.Sessions) {
		return res, fmt.Errorf("%w: %w: checkpoint %q does not hold every requested session", ErrRestoreFailed, ErrInvalidRecord, req.CheckpointID)
	}
	if req.Episodes != nil {
		records = inScope(records, func(r snapshotindex.Record) string { return r.Episode }, req.Episodes)
		if len(records) == 0 {
			return res, nil
		}
	}
	live, err := o.liveSet()
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrRestoreFailed, err)
	}
	if err := validateRecords(records, o.prov.Name(), live); err != nil {
		return res, fmt.Errorf("%w: %w", ErrRestoreFailed, err)
	}
	// A restore writes no intent: a crash mid-restore leaves forks that
	// carry this incarnation's labels, which the next start's sweep of
	// earlier incarnations stops, and nothing in the index to undo.
	forks, failed := o.forkAll(ctx, req.CheckpointID, records)
	if len(failed) > 0 {
		o.stopHandles(o.withListedForks(req.CheckpointID, forks))
		return res, fmt.Errorf("%w: %d of %d forks failed: %s", ErrRestoreFailed, len(failed), len(records), joinFailures(failed))
	}
	installed, err := o.install(records, forks)
	if err != nil {
		return res, fmt.Errorf("%w: %w", ErrRestoreFailed, err)
	}
	res.Sessions = installed

	old := make([]provider.Handle, 0, len(records))
	for _, r := range records {
		o.fates.set(r.Sandbox.SandboxID, FateSuperseded)
		old = append(old, r.Sandbox)
	}
	res.Superseded, res.SupersedeFailed = o.stopHandles(old)
	o.log.WithFields(logrus.Fields{"checkpoint": req.CheckpointID, "sessions": len(installed), "superseded": len(res.Superseded)}).Info("checkpoint restored")
	return res, nil
}

func joinFailures(failed map[string]string) string {
	var parts []string
	for _, k := range sortedKeys(failed) {
		parts = append(parts, k+": "+failed[k])
	}
	return strings.Join(parts, "; ")
}

// liveSet is the set of sessions the owner tracks.
func (o *Owner) liveSet() (map[string]bool, error) {
	refs, err := o.sessions()
	if err != nil {
		return nil, err
	}
	live := make(map[string]bool, len(refs))
	for _, r := range refs {
		live[r.SessionID] = true
	}
	return live, nil
}

// forkAll forks every record's snapshot, at most parallelism at once. The
// returned handles are index-aligned with records (zero where it failed).
func (o *Owner) forkAll(ctx context.Context, checkpointID string, records []snapshotindex.Record) ([]provider.Handle, map[string]string) {
	snap := o.prov.(provider.Snapshotter)
	forks := make([]provider.Handle, len(records))
	var mu sync.Mutex
	failed := map[string]string{}
	fail := func(sid string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed[sid] = err.Error()
	}
	o.each(ctx, len(records), true, func(i int) {
		r := records[i]
		if err := ctx.Err(); err != nil {
			fail(r.SessionID, err)
			return
		}
		spec := o.labelled(r.Spec, r.SessionID, map[string]string{LabelRestore: checkpointID})
		h, err := snap.Fork(ctx, spec, r.SnapshotID)
		if err != nil {
			fail(r.SessionID, err)
			return
		}
		forks[i] = h
	})
	if err := ctx.Err(); err != nil {
		// Sessions whose turn never came were not forked.
		for i, r := range records {
			mu.Lock()
			if forks[i].SandboxID == "" && failed[r.SessionID] == "" {
				failed[r.SessionID] = err.Error()
			}
			mu.Unlock()
		}
	}
	return forks, failed
}

// withListedForks adds to forks the sandboxes this incarnation forked for
// the checkpoint that the provider lists: a fork whose call failed after
// the effect never reported its id.
func (o *Owner) withListedForks(checkpointID string, forks []provider.Handle) []provider.Handle {
	l, ok := o.prov.(provider.Lister)
	if !ok {
		return forks
	}
	ctx, cancel := context.WithTimeout(o.base, time.Minute)
	defer cancel()
	list, err := l.ListSandboxes(ctx)
	if err != nil {
		o.log.WithError(err).Warn("listing sandboxes after a failed restore failed")
		return forks
	}
	known := map[string]bool{}
	for _, h := range forks {
		known[h.SandboxID] = true
	}
	out := append([]provider.Handle(nil), forks...)
	for _, s := range list {
		if s.Metadata[LabelRestore] != checkpointID || s.Metadata[LabelIncarnation] != o.incarnation || known[s.Handle.SandboxID] {
			continue
		}
		// An earlier restore of the same checkpoint made forks with the
		// same labels: those a session holds are not this restore's.
		if _, _, fate := o.SandboxFate(s.Handle.SandboxID); fate == FateLive {
			continue
		}
		out = append(out, s.Handle)
	}
	return out
}

// install spawns a session actor holding each fork. The spawns go to the
// supervisor all at once, sharing one reply slot with room for every
// answer, and the answers are then collected: one round trip (or one
// future) per session would hold the restore that long. If one cannot be installed
// (a seed of the same session raced the restore), the installed ones are
// ended and the other forks stopped: all or none.
func (o *Owner) install(records []snapshotindex.Record, forks []provider.Handle) ([]RestoredSession, error) {
	select {
	case <-o.closed:
		return nil, ErrClosed
	default:
	}
	now := o.clk.Now()
	sbs := make([]messages.Sandbox, len(records))
	replies := make(messages.ReplyTo, len(records))
	at := make(map[string]int, len(records))
	for i, r := range records {
		sb := &sbs[i]
		*sb = messages.Sandbox{
			Handle:       forks[i],
			Spec:         o.labelled(r.Spec, r.SessionID, nil),
			Workdir:      r.Workdir,
			Data:         r.Data,
			Restored:     true,
			FromSnapshot: r.SnapshotID,
		}
		if len(sb.Data) == 0 {
			sb.Data = json.RawMessage("{}")
		}
		if ttl := r.Spec.TTL(); ttl > 0 {
			sb.ExpiresAt = now.Add(ttl)
		}
		o.fates.hold(r.SessionID, sb.Handle, sb.FromSnapshot)
		at[r.SessionID] = i
		o.system.Root.Send(o.sup, &messages.SpawnSession{SessionID: r.SessionID, Install: sb, Snapshots: []string{r.SnapshotID}, Reply: replies})
	}
	wait, cancelWait := context.WithTimeout(context.Background(), time.Minute)
	defer cancelWait()
	installed := make([]bool, len(records))
	errs := make([]error, len(records))
	for range records {
		v, err := o.await(wait, o.sup, replies)
		if err != nil {
			// Whatever answers are missing count as not installed.
			break
		}
		ref := v.(*messages.SessionRef)
		i := at[ref.SessionID]
		installed[i], errs[i] = ref.Err == nil, ref.Err
	}
	out := make([]RestoredSession, 0, len(records))
	var notInstalled []provider.Handle
	var firstErr error
	for i, r := range records {
		if !installed[i] {
			notInstalled = append(notInstalled, forks[i])
			if firstErr == nil {
				err := errs[i]
				if err == nil {
					err = errors.New("the supervisor did not answer")
				}
				firstErr = fmt.Errorf("install session %q: %w", r.SessionID, err)
			}
			continue
		}
		out = append(out, RestoredSession{SessionID: r.SessionID, Episode: r.Episode, Sandbox: sbs[i]})
	}
	if firstErr == nil {
		return out, nil
	}
	ctx, cancel := context.WithTimeout(o.base, 10*time.Minute)
	for _, done := range out {
		if _, serr := o.stopSession(ctx, done.SessionID, messages.StopRetire); serr != nil {
			o.log.WithError(serr).Warn("could not undo a restored session")
		}
	}
	cancel()
	o.stopHandles(notInstalled)
	return nil, firstErr
}

// stopHandles stops sandboxes that no session holds, at most parallelism
// at once, and reports which stopped.
func (o *Owner) stopHandles(hs []provider.Handle) ([]string, map[string]string) {
	ctx, cancel := context.WithTimeout(o.base, 10*time.Minute)
	defer cancel()
	return o.eachOutcome(ctx, len(hs), true, func(i int) (string, error) {
		if hs[i].SandboxID == "" {
			return "", nil
		}
		return hs[i].SandboxID, stopRetrying(ctx, o.prov, hs[i])
	})
}

// stopRetrying stops a sandbox no session holds, retrying a failed stop up
// to three times while ctx lasts: nothing else would stop it (a startup
// sweep's, a failed restore's forks, a superseded one).
func stopRetrying(ctx context.Context, p provider.Provider, h provider.Handle) error {
	var err error
	for i := 0; i < 3; i++ {
		if err = p.Stop(ctx, h); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
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
	o.ctl.Lock()
	defer o.ctl.Unlock()
	all, err := o.index.Checkpoints()
	if err != nil {
		return res, err
	}
	refs, err := o.index.ReferencedSnapshots()
	if err != nil {
		return res, err
	}
	plan := planRelease(all, refs, kept)
	if err := o.index.Drop(plan.Drop, o.tombstones(toSet(plan.Tombstones), "released")); err != nil {
		return res, err
	}
	res.Dropped = plan.Drop
	ts, err := o.index.Tombstones()
	if err != nil {
		return res, err
	}
	needed := o.fates.liveSnapshots()
	var now []snapshotindex.Tombstone
	for _, t := range ts {
		if needed[t.SnapshotID] {
			res.Deferred = append(res.Deferred, t.SnapshotID)
			continue
		}
		now = append(now, t)
	}
	res.Deleted, res.Failed = o.deleteTombstoned(ctx, now)
	if len(res.Failed) > 0 {
		return res, fmt.Errorf("release: %d snapshots could not be deleted (tombstoned; a retry deletes them)", len(res.Failed))
	}
	return res, nil
}

func toSet(ids []string) map[string]bool {
	m := make(map[string]bool, len(ids))
	for _, id := range ids {
		m[id] = true
	}
	return m
}

// Checkpoints lists the committed checkpoints (nil unless exported).
func (o *Owner) Checkpoints() ([]snapshotindex.CheckpointMeta, error) {
	if o.index == nil {
		return nil, nil
	}
	return o.index.Checkpoints()
}

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
		o.log.WithFields(logrus.Fields{"checkpoint": in.ID, "snapshots": len(ids)}).Warn("a commit did not finish before the last stop; deleting its snapshots")
		if err := o.index.AddTombstones(o.tombstones(ids, "unfinished commit "+in.ID), key); err != nil {
			return err
		}
	}
	ts, err := o.index.Tombstones()
	if err != nil {
		return err
	}
	if _, failed := o.deleteTombstoned(ctx, ts); len(failed) > 0 {
		o.log.WithField("failed", len(failed)).Warn("tombstoned snapshots could not be deleted at startup")
	}
	return nil
}

// sweepIncarnations stops sandboxes that an earlier incarnation of this
// server left running: a fresh process holds no session, so they serve
// nobody (a restore forks from snapshots, not from them).
func (o *Owner) sweepIncarnations(ctx context.Context) {
	l, ok := o.prov.(provider.Lister)
	if !ok {
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
		o.fates.set(id, FateEnded)
	}
	o.log.WithFields(logrus.Fields{"stopped": len(stopped), "failed": len(failed)}).Warn("stopped sandboxes an earlier run of this server left behind")
}
