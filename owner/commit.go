package owner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sirupsen/logrus"
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
	m := newCommitting(req, o.prov.Name(), o.cfg.Checkpoint.OnStop == OnStopKill, o.cfg.Checkpoint.RoundTimeout, o.incarnation)
	err := o.run(ctx, m)
	return m.res, err
}

// stoppedMemory is how many stopped checkpoint ids the writer remembers:
// as many as the control plane remembers resumed ids.
const stoppedMemory = 64

// unstoredCommit is a commit whose snapshots were taken: what its store
// records, and what a discard deletes.
type unstoredCommit struct {
	tag     string
	taken   []messages.SnapshotReply
	meta    snapshotindex.CheckpointMeta
	records []snapshotindex.Record
	skipped []string
	began   time.Time
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
		o.bg.Go(o.rt, func() {
			o.discard(discard{Tag: u.tag, Taken: u.taken, Round: true, Reason: "commit " + id + " stopped by a resume"})
		})
	}
}

// runRound hands a round to the coordinator and waits for its result. The
// wait is not bounded by the caller's context: the round ends by its own
// deadline, and its result is needed to clean up.
func (o *Owner) runRound(m actors.StartRound) (*actors.RoundResult, error) {
	// The coordinator answers by the deadline plus its drain grace; the
	// bound only guards against a lost reply.
	ctx, cancel := clock.WithDeadline(context.Background(), o.clk, m.Deadline.Add(actors.DrainGrace+timeouts.RoundSlack))
	defer cancel()
	rr, err := o.ask.round(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("snapshot round: %w", err)
	}
	return rr, nil
}

// discard runs a discard's machine, its provider calls bounded by the
// cleanup timeout.
func (o *Owner) discard(d discard) {
	ctx, cancel := context.WithTimeout(o.base, timeouts.Cleanup)
	defer cancel()
	_ = o.run(ctx, newDiscarding(d))
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
	return o.listSnapshots(ctx, func(name string) bool { return hasTag(name, tag) })
}

// listSnapshots finds the provider's snapshots whose names match (nil when
// the provider cannot list).
func (o *Owner) listSnapshots(ctx context.Context, match func(name string) bool) []string {
	l := o.caps.Lister
	if l == nil {
		return nil
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		logs.ForRequest(ctx, o.log).WithError(err).Warn("listing snapshots failed")
		return nil
	}
	var out []string
	for _, s := range snaps {
		if match(s.Name) {
			out = append(out, s.ID)
		}
	}
	return out
}

// onOrphan deletes a snapshot that arrived after its round gave up on it.
func (o *Owner) onOrphan(sessionID, snapshotID string) {
	if o.index == nil {
		return
	}
	o.log.WithFields(logrus.Fields{"session_id": sessionID, "snapshot_id": snapshotID}).Warn("snapshot arrived after its checkpoint failed; deleting it")
	o.bg.Go(o.rt, func() {
		o.discard(discard{Late: []string{snapshotID}, Reason: "late snapshot of a failed commit"})
	})
}
