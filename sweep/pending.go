package sweep

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/snapshotindex"
)

// PendingOptions say which pending deletes (tombstoned snapshots) to retry.
type PendingOptions struct {
	Provider provider.Provider
	Index    snapshotindex.Store
	// After leaves a tombstone younger than this to the operation that
	// wrote it (it deletes its own); Now is the time.
	After time.Duration
	Now   time.Time
	// InUse are the snapshots live sandboxes were forked from: they are
	// not tried (a copy-on-write fork stands on them).
	InUse map[string]bool
	// Parallelism bounds concurrent deletes (default 8).
	Parallelism int
}

// PendingReport is what a retry of the pending deletes found and did.
type PendingReport struct {
	// Pending counts the tombstones read.
	Pending int
	// Waiting are those younger than After.
	Waiting []Waiting
	// Deferred are those a live fork stands on (known to the server, or
	// refused by the provider as in use).
	Deferred []string
	// Deleted are those deleted (their tombstones cleared); Failed those
	// whose delete failed (id -> error), kept for the next retry.
	Deleted []string
	Failed  map[string]string
}

// RetryPending deletes the tombstoned snapshots old enough that no live
// fork stands on, and clears the tombstones of those deleted. A tombstone
// stays until its snapshot is gone, so a crash between the delete and the
// clear only repeats a delete (of nothing).
func RetryPending(ctx context.Context, opts PendingOptions) (PendingReport, error) {
	rep := PendingReport{Failed: map[string]string{}}
	if opts.Index == nil {
		return rep, fmt.Errorf("%w: no index", ErrIndexUnreadable)
	}
	ts, err := opts.Index.Tombstones()
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrIndexUnreadable, err)
	}
	rep.Pending = len(ts)
	var try []string
	for _, t := range ts {
		switch due := t.At.Add(opts.After); {
		case opts.Now.Before(due):
			rep.Waiting = append(rep.Waiting, Waiting{Kind: KindPendingDelete, ID: t.SnapshotID, Since: t.At, Due: due})
		case opts.InUse[t.SnapshotID]:
			rep.Deferred = append(rep.Deferred, t.SnapshotID)
		default:
			try = append(try, t.SnapshotID)
		}
	}
	if len(try) == 0 {
		return rep, nil
	}
	snap := opts.Provider.Capabilities().Snapshotter
	if snap == nil {
		return rep, fmt.Errorf("sweep: provider %q cannot delete snapshots", opts.Provider.Name())
	}
	var inUse []string
	rep.Deleted, inUse, rep.Failed = removeEach(opts.Parallelism, try, func(i int) error {
		return snap.DeleteSnapshot(ctx, try[i])
	})
	rep.Deferred = append(rep.Deferred, inUse...)
	slices.Sort(rep.Deferred)
	if len(rep.Deleted) > 0 {
		if err := opts.Index.ClearTombstones(rep.Deleted); err != nil {
			return rep, fmt.Errorf("sweep: clearing the tombstones of deleted snapshots (the next retry deletes them again): %w", err)
		}
	}
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("sweep: %d of %d pending deletes failed", len(rep.Failed), len(try))
	}
	return rep, nil
}
