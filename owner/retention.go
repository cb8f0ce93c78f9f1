package owner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/retention"
)

// A controller that never calls release (NeMo Gym's collection
// checkpointer keeps its two newest checkpoint directories and deletes the
// rest) still says what it keeps: the directories that exist. With
// FollowDirs the owner drops a committed checkpoint whose checkpoint_dir is
// gone as a release that no longer keeps it would (package retention says
// when a directory counts as gone), at the start of every commit and on a
// period.

// RetentionConfig is checkpoint.retention.*.
type RetentionConfig struct {
	// FollowDirs drops a checkpoint whose directory is gone.
	FollowDirs bool
	// Grace is how long a directory must be seen gone (at two checks at
	// least this far apart) before its checkpoint is dropped.
	Grace time.Duration
	// Every starts a check loop on the clock with this period (zero: no
	// loop; the caller calls CheckRetention, as the simulation does).
	Every time.Duration
	// Dirs is the file system of the directories (nil: Records when it is
	// a retention.FS, else the operating system's).
	Dirs retention.FS
}

// retentionState is what the checks remember and count.
type retentionState struct {
	mu         sync.Mutex
	m          retention.Machine
	last       retention.Decision
	drops      map[string]uint64 // by drop reason
	unreadable map[string]uint64 // by retention reason
}

func newRetentionState(grace time.Duration) *retentionState {
	r := &retentionState{m: retention.Machine{Grace: grace}, drops: map[string]uint64{}, unreadable: map[string]uint64{}}
	for _, reason := range []string{DropReleased, DropDirGone} {
		r.drops[reason] = 0
	}
	for _, reason := range retention.Reasons() {
		r.unreadable[reason] = 0
	}
	return r
}

func (r *retentionState) count(reason string, n int) {
	r.mu.Lock()
	r.drops[reason] += uint64(n)
	r.mu.Unlock()
}

// RetentionStatus is what /health shows of the retention checks.
type RetentionStatus struct {
	FollowDirs bool
	Grace      time.Duration
	// Pending are the checkpoints whose directory the last check saw
	// gone, not yet for the grace.
	Pending []retention.Pending
	// Unreadable are the checkpoints whose directory the last check could
	// not read.
	Unreadable []retention.Problem
	// Drops counts the checkpoints dropped, by reason (release, dir_gone).
	Drops map[string]uint64
	// UnreadableDirs counts the lookups that could not read a directory,
	// by reason.
	UnreadableDirs map[string]uint64
}

// RetentionStatus reports the checks' counts and what the last one saw.
func (o *Owner) RetentionStatus() RetentionStatus {
	r := o.ret
	r.mu.Lock()
	defer r.mu.Unlock()
	return RetentionStatus{
		FollowDirs:     o.followsDirs(),
		Grace:          r.m.Grace,
		Pending:        slices.Clone(r.last.Pending),
		Unreadable:     slices.Clone(r.last.Unreadable),
		Drops:          maps.Clone(r.drops),
		UnreadableDirs: maps.Clone(r.unreadable),
	}
}

func (o *Owner) followsDirs() bool {
	return o.mode == ModeExported && o.cfg.Checkpoint.Retention.FollowDirs
}

// RetentionResult is what a check found and did.
type RetentionResult struct {
	// Dropped are the checkpoints dropped because their directory is gone.
	Dropped []string
	// Deleted, Deferred and Failed are the snapshots deleted, left to a
	// live fork standing on them, and whose delete failed (as a release's).
	Deleted  []string
	Deferred []string
	Failed   map[string]string
	Pending  []retention.Pending
	// Unreadable are the directories that could not be read: nothing of
	// their checkpoints is deleted.
	Unreadable []retention.Problem
}

// CheckRetention looks every committed checkpoint's directory up, drops
// those gone for the grace, and deletes the snapshots no kept checkpoint
// and no live sandbox needs, as a release does. Without FollowDirs it does
// nothing.
func (o *Owner) CheckRetention(ctx context.Context) (RetentionResult, error) {
	var res RetentionResult
	if !o.followsDirs() {
		return res, nil
	}
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return res, fmt.Errorf("retention check: waiting for another control operation: %w", err)
	}
	defer o.ctl.Unlock()
	drops, dec, err := o.followDirs()
	res.Dropped, res.Pending, res.Unreadable = dropIDs(drops), dec.Pending, dec.Unreadable
	if err != nil {
		return res, err
	}
	m := newDropDelete(drops, o.liveSnapshots())
	err = o.run(ctx, m)
	res.Deleted, res.Deferred, res.Failed = m.res.Deleted, m.res.Deferred, m.res.Failed
	return res, err
}

// followDirs looks the directories up and drops the checkpoints whose
// directory is gone, tombstoning their snapshots. A commit in flight is
// not in the index yet, so it is never judged. The caller holds ctl.
func (o *Owner) followDirs() ([]dropped, retention.Decision, error) {
	all, err := o.index.Checkpoints()
	if err != nil {
		return nil, retention.Decision{}, err
	}
	ckpts := make([]retention.Checkpoint, 0, len(all))
	looked := map[string]retention.Observation{}
	for _, m := range all {
		c := retention.Checkpoint{ID: m.ID, Dir: m.CheckpointDir}
		if c.Dir != "" {
			obs, ok := looked[c.Dir]
			if !ok {
				obs = retention.Look(o.dirs, c.Dir)
				looked[c.Dir] = obs
			}
			c.Obs = obs
		}
		ckpts = append(ckpts, c)
	}
	r := o.ret
	r.mu.Lock()
	dec := r.m.Step(ckpts, o.clk.Now())
	r.last = dec
	for _, p := range dec.Unreadable {
		r.unreadable[p.Reason]++
	}
	r.mu.Unlock()
	for _, p := range dec.Unreadable {
		l := o.log.WithFields(logrus.Fields{"checkpoint_id": p.ID, "checkpoint_dir": p.Dir, "reason": p.Reason, "error": p.Detail})
		if p.First {
			l.Warn("checkpoint directory could not be read: its checkpoint is kept")
		} else {
			l.Debug("checkpoint directory still could not be read")
		}
	}
	if len(dec.Drop) == 0 {
		return nil, dec, nil
	}
	gone := toSet(dec.Drop)
	var kept []string
	for _, m := range all {
		if !gone[m.ID] {
			kept = append(kept, m.ID)
		}
	}
	m := newDirDrop(all, kept)
	err = o.run(context.Background(), m)
	return m.drops, dec, err
}

// followDirsAtCommit is the check a commit makes before its round: the
// drops are decided and recorded now, their snapshots deleted in the
// background once the commit is over (a delete must not hold the commit
// up). Errors are logged: they never fail the commit.
func (o *Owner) followDirsAtCommit() {
	if !o.followsDirs() {
		return
	}
	drops, _, err := o.followDirs()
	if err != nil {
		o.log.WithError(err).Warn("checking the checkpoint directories failed; the next check retries")
	}
	if len(drops) == 0 {
		return
	}
	o.bg.Go(o.rt, func() {
		if o.ctl.Lock(o.base, o.rt) != nil {
			return // closing: the tombstones stay for a later release or start
		}
		defer o.ctl.Unlock()
		if err := o.run(o.base, newDropDelete(drops, o.liveSnapshots())); err != nil {
			o.log.WithError(err).Warn("deleting the snapshots of dropped checkpoints failed; the next check retries")
		}
	})
}

// retentionLoop checks on the period, and sooner when a drop falls due.
func (o *Owner) retentionLoop(every time.Duration) {
	o.tickLoop(every, func(time.Time) time.Duration {
		if _, err := o.CheckRetention(o.base); err != nil {
			o.log.WithError(err).Warn("checkpoint retention check failed; the next one retries")
		}
		return o.nextCheck(every)
	})
}

// nextCheck is the wait until the next check: the period, or less when a
// drop falls due before it.
func (o *Owner) nextCheck(every time.Duration) time.Duration {
	o.ret.mu.Lock()
	next := o.ret.last.Next
	o.ret.mu.Unlock()
	if next.IsZero() {
		return every
	}
	return max(min(next.Sub(o.clk.Now()), every), 0)
}

// CheckpointsHeld counts the committed checkpoints the index holds (0
// unless exported).
func (o *Owner) CheckpointsHeld() (int, error) {
	if o.index == nil {
		return 0, nil
	}
	all, err := o.index.Checkpoints()
	return len(all), err
}

// dirsOf is the file system checkpoint directories are looked up on.
func dirsOf(c CheckpointConfig) retention.FS {
	if c.Retention.Dirs != nil {
		return c.Retention.Dirs
	}
	if d, ok := c.Records.(retention.FS); ok {
		return d
	}
	return retention.OS{}
}
