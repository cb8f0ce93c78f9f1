// Package sweep is the operator's leak sweep: it lists a
// provider's sandboxes and snapshots and reports those that no live session,
// committed checkpoint or tombstone accounts for; with Reap it deletes them.
//
// It fails closed: the whole index (every checkpoint, verified against its
// hash, the snapshots they name, the tombstones) and both provider listings
// are read before anything is deleted, and any error there stops the sweep
// with nothing deleted.
//
// Only what the server labelled is considered: sandboxes and snapshots whose
// ng.owner metadata is Options.Owner. Others (another server's, a person's)
// are counted as foreign and never touched.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
	"github.com/sandboxowner/owner/snapshotindex"
)

// ErrIndexUnreadable: the index could not be read whole; nothing was
// deleted.
var ErrIndexUnreadable = errors.New("sweep: the snapshot index cannot be read; nothing was deleted")

// ErrCannotList: the provider cannot list (or the listing failed); nothing
// was deleted.
var ErrCannotList = errors.New("sweep: the provider's sandboxes and snapshots cannot be listed; nothing was deleted")

// Options say what to sweep.
type Options struct {
	// Owner is the server's name: its sandboxes carry ng.owner = Owner.
	Owner string
	// Provider is listed (its Capabilities must have a Lister) and, with
	// Reap, stopped and deleted from.
	Provider provider.Provider
	// Index is the server's snapshot index.
	Index *snapshotindex.Index
	// Retained, when set, replaces the index: what the checkpoint
	// directories under a root name (records.RetainedUnder) is accounted
	// for and nothing else, as Gym's sweep with --retain-from.
	Retained *records.Retained
	// Live holds the sandbox ids live sessions hold. The index is locked
	// while a server runs, so a sweep normally runs with the server down
	// and Live empty: then every sandbox the server labelled that no
	// checkpoint names is unaccounted for.
	Live map[string]bool
	// Reap stops the unaccounted sandboxes and deletes the unaccounted
	// snapshots; without it the sweep only reports.
	Reap bool
	// Parallelism bounds concurrent deletes (default 8).
	Parallelism int
}

// Report is what a sweep found and did.
type Report struct {
	// Sandboxes and Snapshots are the unaccounted ones, sorted by id.
	Sandboxes []provider.SandboxInfo
	Snapshots []provider.SnapshotInfo
	// KeptSandboxes and KeptSnapshots count the accounted ones.
	KeptSandboxes, KeptSnapshots int
	// Foreign counts listed sandboxes and snapshots of other owners.
	Foreign int
	// Stopped and Deleted are what Reap removed; Failed what it could not
	// (id -> error).
	Stopped, Deleted []string
	Failed           map[string]string
}

// accounted is what the index accounts for.
type accounted struct {
	snapshots map[string]bool // named by a checkpoint, or tombstoned
	sandboxes map[string]bool // named by a checkpoint record
}

// readIndex reads everything the sweep trusts from the index, or fails.
func readIndex(idx *snapshotindex.Index) (accounted, error) {
	a := accounted{snapshots: map[string]bool{}, sandboxes: map[string]bool{}}
	if idx == nil {
		return a, fmt.Errorf("%w: no index", ErrIndexUnreadable)
	}
	metas, err := idx.Checkpoints()
	if err != nil {
		return a, fmt.Errorf("%w: %w", ErrIndexUnreadable, err)
	}
	for _, m := range metas {
		ck, err := idx.Checkpoint(m.ID)
		if err != nil {
			return a, fmt.Errorf("%w: checkpoint %s: %w", ErrIndexUnreadable, m.ID, err)
		}
		for _, r := range ck.Records {
			a.snapshots[r.SnapshotID] = true
			a.sandboxes[r.Sandbox.SandboxID] = true
		}
	}
	refs, err := idx.ReferencedSnapshots()
	if err != nil {
		return a, fmt.Errorf("%w: %w", ErrIndexUnreadable, err)
	}
	for id := range refs {
		a.snapshots[id] = true
	}
	ts, err := idx.Tombstones()
	if err != nil {
		return a, fmt.Errorf("%w: %w", ErrIndexUnreadable, err)
	}
	for _, t := range ts {
		a.snapshots[t.SnapshotID] = true
	}
	return a, nil
}

// Run sweeps: it reads the index and the provider's listings, reports what
// nothing accounts for and, with Reap, removes it.
func Run(ctx context.Context, opts Options) (Report, error) {
	rep := Report{Failed: map[string]string{}}
	if opts.Owner == "" {
		return rep, errors.New("sweep: no owner name")
	}
	acc := accounted{}
	if opts.Retained != nil {
		acc.snapshots, acc.sandboxes = opts.Retained.Snapshots, opts.Retained.Sandboxes
	} else {
		var err error
		if acc, err = readIndex(opts.Index); err != nil {
			return rep, err
		}
	}
	l := opts.Provider.Capabilities().Lister
	if l == nil {
		return rep, fmt.Errorf("%w: provider %q has no listing", ErrCannotList, opts.Provider.Name())
	}
	sbs, err := l.ListSandboxes(ctx)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrCannotList, err)
	}
	snaps, err := l.ListSnapshots(ctx)
	if err != nil {
		return rep, fmt.Errorf("%w: %w", ErrCannotList, err)
	}
	for _, s := range sbs {
		switch {
		case s.Metadata[owner.LabelOwner] != opts.Owner:
			rep.Foreign++
		case opts.Live[s.Handle.SandboxID] || acc.sandboxes[s.Handle.SandboxID]:
			rep.KeptSandboxes++
		default:
			rep.Sandboxes = append(rep.Sandboxes, s)
		}
	}
	for _, s := range snaps {
		switch {
		case s.Metadata[owner.LabelOwner] != opts.Owner:
			rep.Foreign++
		case acc.snapshots[s.ID]:
			rep.KeptSnapshots++
		default:
			rep.Snapshots = append(rep.Snapshots, s)
		}
	}
	sort.Slice(rep.Sandboxes, func(i, j int) bool { return rep.Sandboxes[i].Handle.SandboxID < rep.Sandboxes[j].Handle.SandboxID })
	sort.Slice(rep.Snapshots, func(i, j int) bool { return rep.Snapshots[i].ID < rep.Snapshots[j].ID })
	if !opts.Reap {
		return rep, nil
	}
	return reap(ctx, opts, rep)
}

// reap deletes the unaccounted snapshots, then stops the unaccounted
// sandboxes (as upstream's sweep: snapshots first).
func reap(ctx context.Context, opts Options, rep Report) (Report, error) {
	n := opts.Parallelism
	if n <= 0 {
		n = 8
	}
	var mu sync.Mutex
	each := func(count int, fn func(i int) (string, error), done *[]string) {
		slots := make(chan struct{}, n)
		var wg sync.WaitGroup
		for i := 0; i < count; i++ {
			wg.Add(1)
			slots <- struct{}{}
			go func(i int) {
				defer wg.Done()
				defer func() { <-slots }()
				id, err := fn(i)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					rep.Failed[id] = err.Error()
					return
				}
				*done = append(*done, id)
			}(i)
		}
		wg.Wait()
		sort.Strings(*done)
	}
	var snap provider.Snapshotter
	if len(rep.Snapshots) > 0 {
		if snap = opts.Provider.Capabilities().Snapshotter; snap == nil {
			return rep, fmt.Errorf("sweep: provider %q cannot delete snapshots", opts.Provider.Name())
		}
	}
	// Sandboxes first: a server refuses to delete a snapshot while a
	// sandbox forked from it lives.
	each(len(rep.Sandboxes), func(i int) (string, error) {
		h := rep.Sandboxes[i].Handle
		return h.SandboxID, opts.Provider.Stop(ctx, h)
	}, &rep.Stopped)
	if snap != nil {
		each(len(rep.Snapshots), func(i int) (string, error) {
			id := rep.Snapshots[i].ID
			return id, snap.DeleteSnapshot(ctx, id)
		}, &rep.Deleted)
	}
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("sweep: %d of %d removals failed", len(rep.Failed), len(rep.Snapshots)+len(rep.Sandboxes))
	}
	return rep, nil
}
