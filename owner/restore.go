package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/messages"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sched"
	"github.com/sandboxowner/owner/snapshotindex"
)

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

// RestoredSession is one installed session.
type RestoredSession struct {
	SessionID string
	Episode   string
	Sandbox   sandbox.Sandbox
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
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return res, fmt.Errorf("%w: waiting for another control operation: %w", ErrRestoreFailed, err)
	}
	defer o.ctl.Unlock()
	m := newRestoring(req, o.prov.Name(), o.labeller())
	err := o.run(ctx, m)
	return m.res, err
}

// forkAll forks every record's snapshot, at most parallelism at once. The
// returned handles are index-aligned with records (zero where it failed),
// as are the times they returned. As each fork returns, the actor of its
// session is made, unlisted (see prepare).
func (o *Owner) forkAll(ctx context.Context, checkpointID string, records []snapshotindex.Record) ([]provider.Handle, []time.Time, map[string]string, []string) {
	snap := o.caps.Snapshotter
	labels := o.labeller()
	forks := make([]provider.Handle, len(records))
	at := make([]time.Time, len(records))
	var mu sync.Mutex
	failed := map[string]string{}
	var missing []string
	fail := func(sid string, err error) {
		mu.Lock()
		defer mu.Unlock()
		failed[sid] = err.Error()
	}
	prep := o.startPreparer(len(records))
	o.each(ctx, len(records), true, func(i int) {
		r := records[i]
		if err := ctx.Err(); err != nil {
			fail(r.SessionID, err)
			return
		}
		spec := o.labelled(r.Spec, r.SessionID, map[string]string{LabelRestore: checkpointID})
		h, err := snap.Fork(ctx, spec, r.SnapshotID)
		if err != nil {
			fail(r.SessionID, fmt.Errorf("could not be re-created from snapshot %q: %w", r.SnapshotID, err))
			if errors.Is(err, provider.ErrSnapshotNotFound) {
				mu.Lock()
				missing = append(missing, r.SnapshotID)
				mu.Unlock()
			}
			return
		}
		forks[i], at[i] = h, o.clk.Now()
		prep.add(restoredSession(labels, r, h, at[i]))
	})
	prep.finish()
	// Sessions whose turn never came (the context ended while they waited
	// for a slot) were not forked.
	mu.Lock()
	for i, r := range records {
		if forks[i].SandboxID == "" && failed[r.SessionID] == "" {
			failed[r.SessionID] = cmp.Or(ctx.Err(), errNotForked).Error()
		}
	}
	mu.Unlock()
	slices.Sort(missing)
	return forks, at, failed, missing
}

// preparer has the actors of the forks' sessions made (client.prepare) on
// a goroutine of its own, one at a time, yielding the processor after
// each. Made on the fork's worker, a spawn ran between a fork's return and
// its worker's next fork, and the worker that found the supervisor's
// mailbox idle ran every spawn the wave's other workers queued meanwhile:
// the next wave started later by the spawns of this one. Yielding puts the
// spawns behind the workers, in the time the forks wait on the provider.
type preparer struct {
	ask      *client
	rt       sched.Runtime
	queue    chan RestoredSession
	finished atomic.Bool
	done     chan struct{}
}

// startPreparer starts the preparer of n forks.
func (o *Owner) startPreparer(n int) *preparer {
	p := &preparer{ask: o.ask, rt: o.rt, queue: make(chan RestoredSession, n), done: make(chan struct{})}
	o.rt.Go(p.run)
	return p
}

func (p *preparer) run() {
	defer close(p.done)
	for {
		p.rt.Await(context.Background(), func() bool { return len(p.queue) > 0 || p.finished.Load() })
		s, ok := <-p.queue
		if !ok {
			return
		}
		p.ask.prepare(s)
		runtime.Gosched()
	}
}

// add queues s; it never waits (the queue has room for every fork).
func (p *preparer) add(s RestoredSession) { p.queue <- s }

// finish returns once the actor of every session added was asked for.
func (p *preparer) finish() {
	p.finished.Store(true)
	close(p.queue)
	p.rt.Await(context.Background(), func() bool { return sched.Closed(p.done) })
	<-p.done
}

// errNotForked: a fork that neither ran nor failed, its context not ended
// (none: every call runs unless the context ends first).
var errNotForked = errors.New("not forked")

// withListedForks adds to forks the sandboxes this incarnation forked for
// the checkpoint that the provider lists: a fork whose call failed after
// the effect never reported its id.
func (o *Owner) withListedForks(checkpointID string, forks []provider.Handle) []provider.Handle {
	l := o.caps.Lister
	if l == nil {
		return forks
	}
	ctx, cancel := context.WithTimeout(o.base, timeouts.Listing)
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
		if _, _, fate := o.SandboxFate(s.Handle.SandboxID); fate == sandbox.FateLive {
			continue
		}
		out = append(out, s.Handle)
	}
	return out
}

// undoInstall ends the sessions of an install that failed as a whole and
// stops the forks no session took.
func (o *Owner) undoInstall(sessions []string, forks []provider.Handle) {
	ctx, cancel := context.WithTimeout(o.base, timeouts.Cleanup)
	for _, sid := range sessions {
		if _, err := o.stopSession(ctx, sid, messages.StopRetire); err != nil {
			o.log.WithError(err).Warn("could not undo a restored session")
		}
	}
	cancel()
	o.stopHandles(forks)
}
