// Package sweep is the operator's leak sweep: it lists a
// provider's sandboxes and snapshots and reports those that no live session,
// committed checkpoint or tombstone accounts for; with Reap it deletes them.
//
// It fails closed: both provider listings and then the whole index (every
// checkpoint, verified against its hash, the snapshots they name, the
// tombstones) are read before anything is deleted, and any error there stops
// the sweep with nothing deleted. The listings come first: what is listed and
// then named by the index is kept, whereas an index read first would miss a
// name written after it.
//
// A running server sweeps on a period (Loop): then what its live sessions
// hold (Options.Held) is kept too, and an unaccounted sandbox or snapshot is
// removed only once an Aging has seen it unaccounted for its retention.
//
// Only what the server labelled is considered: sandboxes and snapshots whose
// ng.owner metadata is Options.Owner. Others (another server's, a person's)
// are counted as foreign and never touched.
package sweep

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"time"

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
	Index snapshotindex.Store
	// Retained, when set, replaces the index: what the checkpoint
	// directories under a root name (records.RetainedUnder) is accounted
	// for and nothing else, as Gym's sweep with --retain-from.
	Retained *records.Retained
	// Live holds the sandbox ids live sessions hold. The index is locked
	// while a server runs, so a sweep normally runs with the server down
	// and Live empty: then every sandbox the server labelled that no
	// checkpoint names is unaccounted for.
	Live map[string]bool
	// Held, when set, is read after the listings and before the index: what
	// a running server's sessions hold is kept.
	Held func() (Held, error)
	// Aging, when set, holds back the unaccounted ones it has not yet seen
	// unaccounted for its retention (Report.Waiting); Now is the time.
	Aging *Aging
	Now   time.Time
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
	// Waiting are the unaccounted ones the Aging holds back, by id.
	Waiting []Waiting
	// Stopped and Deleted are what Reap removed; Failed what it could not
	// (id -> error); InUse the snapshots the provider refused to delete
	// because a fork stands on them (not a failure: a later sweep retries).
	Stopped, Deleted, InUse []string
	Failed                  map[string]string
	// MadeAhead are what the provider had made ahead for starts that a
	// server which died left (the local provider's directories, disks
	// mounted: see MadeAheadSweeper), removed by Reap.
	MadeAhead []string
}

// MadeAheadSweeper is a provider that makes ahead, outside its listings,
// what starts need (the local provider: sandbox directories, disks
// mounted) and can remove what a server which died left; while a server
// runs on it, it removes nothing of that server's.
type MadeAheadSweeper interface {
	SweepMadeAhead() ([]string, error)
}

// Held is what a running server's sessions hold that the index may not
// name yet (owner.Quiet reads it).
type Held = owner.Holdings

// accounted is what the index accounts for.
type accounted struct {
	snapshots map[string]bool // named by a checkpoint or a template, or tombstoned
	sandboxes map[string]bool // named by a checkpoint record
}

// readIndex reads everything the sweep trusts from the index, or fails.
func readIndex(idx snapshotindex.Store) (accounted, error) {
	a := accounted{snapshots: map[string]bool{}, sandboxes: map[string]bool{}}
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
	tmpls, err := idx.Templates()
	if err != nil {
		return a, fmt.Errorf("%w: %w", ErrIndexUnreadable, err)
	}
	for _, t := range tmpls {
		a.snapshots[t.SnapshotID] = true
	}
	return a, nil
}

// Run sweeps: it lists the provider's sandboxes and snapshots, reads what
// the server holds and the index, reports what nothing accounts for and,
// with Reap, removes it (with an Aging, only what is due).
func Run(ctx context.Context, opts Options) (Report, error) {
	rep := Report{Failed: map[string]string{}}
	if opts.Owner == "" {
		return rep, errors.New("sweep: no owner name")
	}
	if opts.Retained == nil && opts.Index == nil {
		return rep, fmt.Errorf("%w: no index", ErrIndexUnreadable)
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
	var held Held
	if opts.Held != nil {
		if held, err = opts.Held(); err != nil {
			return rep, fmt.Errorf("sweep: what the sessions hold: %w; nothing was deleted", err)
		}
	}
	acc := accounted{}
	if opts.Retained != nil {
		acc.snapshots, acc.sandboxes = opts.Retained.Snapshots, opts.Retained.Sandboxes
	} else if acc, err = readIndex(opts.Index); err != nil {
		return rep, err
	}
	for _, s := range sbs {
		id := s.Handle.SandboxID
		switch {
		case s.Metadata[owner.LabelOwner] != opts.Owner:
			rep.Foreign++
		case opts.Live[id] || acc.sandboxes[id] || held.Sandboxes[id] || held.Sessions[s.Metadata[owner.LabelSession]]:
			rep.KeptSandboxes++
		default:
			rep.Sandboxes = append(rep.Sandboxes, s)
		}
	}
	for _, s := range snaps {
		switch {
		case s.Metadata[owner.LabelOwner] != opts.Owner:
			rep.Foreign++
		case acc.snapshots[s.ID] || held.Snapshots[s.ID]:
			rep.KeptSnapshots++
		default:
			rep.Snapshots = append(rep.Snapshots, s)
		}
	}
	sort.Slice(rep.Sandboxes, func(i, j int) bool { return rep.Sandboxes[i].Handle.SandboxID < rep.Sandboxes[j].Handle.SandboxID })
	sort.Slice(rep.Snapshots, func(i, j int) bool { return rep.Snapshots[i].ID < rep.Snapshots[j].ID })
	if opts.Aging != nil {
		rep = opts.Aging.hold(rep, opts.Now)
	}
	if !opts.Reap {
		return rep, nil
	}
	return reap(ctx, opts, rep)
}

// reap stops the unaccounted sandboxes, then deletes the unaccounted
// snapshots.
func reap(ctx context.Context, opts Options, rep Report) (Report, error) {
	var snap provider.Snapshotter
	if len(rep.Snapshots) > 0 {
		if snap = opts.Provider.Capabilities().Snapshotter; snap == nil {
			return rep, fmt.Errorf("sweep: provider %q cannot delete snapshots", opts.Provider.Name())
		}
	}
	// Sandboxes first: a server refuses to delete a snapshot while a
	// sandbox forked from it lives.
	sbIDs := make([]string, len(rep.Sandboxes))
	for i, s := range rep.Sandboxes {
		sbIDs[i] = s.Handle.SandboxID
	}
	var failed map[string]string
	rep.Stopped, _, failed = removeEach(opts.Parallelism, sbIDs, func(i int) error {
		return opts.Provider.Stop(ctx, rep.Sandboxes[i].Handle)
	})
	maps.Copy(rep.Failed, failed)
	if snap != nil {
		snapIDs := make([]string, len(rep.Snapshots))
		for i, s := range rep.Snapshots {
			snapIDs[i] = s.ID
		}
		rep.Deleted, rep.InUse, failed = removeEach(opts.Parallelism, snapIDs, func(i int) error {
			return snap.DeleteSnapshot(ctx, snapIDs[i])
		})
		maps.Copy(rep.Failed, failed)
	}
	removals := len(rep.Snapshots) + len(rep.Sandboxes)
	if m, ok := opts.Provider.(MadeAheadSweeper); ok {
		var err error
		removals++
		if rep.MadeAhead, err = m.SweepMadeAhead(); err != nil {
			rep.Failed["made ahead"] = err.Error()
		}
	}
	if len(rep.Failed) > 0 {
		return rep, fmt.Errorf("sweep: %d of %d removals failed", len(rep.Failed), removals)
	}
	return rep, nil
}

// removeEach runs remove for each of ids, at most parallelism at once
// (default 8), and sorts out the outcomes: done, in use (the provider
// refused a snapshot a fork stands on) and failed (id -> error).
func removeEach(parallelism int, ids []string, remove func(i int) error) (done, inUse []string, failed map[string]string) {
	if parallelism <= 0 {
		parallelism = 8
	}
	failed = map[string]string{}
	var mu sync.Mutex
	slots := make(chan struct{}, parallelism)
	var wg sync.WaitGroup
	for i := range ids {
		wg.Add(1)
		slots <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			err := remove(i)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, provider.ErrSnapshotInUse):
				inUse = append(inUse, ids[i])
			case err != nil:
				failed[ids[i]] = err.Error()
			default:
				done = append(done, ids[i])
			}
		}()
	}
	wg.Wait()
	sort.Strings(done)
	sort.Strings(inUse)
	return done, inUse, failed
}
