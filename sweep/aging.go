package sweep

import (
	"time"

	"github.com/sandboxowner/owner/provider"
)

// Kinds of what a sweep removes: the names of its retention settings, its
// report and its metrics' labels. A template kind joins them with its own
// retention (unused for a while) when templates exist.
const (
	// KindSandbox: a sandbox of the server's that no session, checkpoint
	// or tombstone accounts for.
	KindSandbox = "sandbox"
	// KindSnapshot: a snapshot of the server's that no checkpoint (one a
	// release no longer names, or one of a commit that died), session or
	// tombstone accounts for.
	KindSnapshot = "snapshot"
	// KindPendingDelete: a tombstoned snapshot whose delete has not
	// happened (a fork stood on it, or the delete failed).
	KindPendingDelete = "pending_delete"
	// KindTemplate: a keyed setup's template no seed used for the
	// templates' retention (dropped, its snapshot deleted or pending).
	KindTemplate = "template"
)

// Kinds lists every kind, for reports and counters that exist from the
// start.
func Kinds() []string { return []string{KindSandbox, KindSnapshot, KindPendingDelete, KindTemplate} }

// Waiting is an unaccounted sandbox or snapshot not yet due for removal.
type Waiting struct {
	Kind, ID   string
	Since, Due time.Time
}

// Aging remembers since when each unaccounted sandbox and snapshot has been
// seen unaccounted. One is due once it was seen so at an earlier sweep and
// After has passed since the first sighting; one seen accounted for (or not
// listed) in between starts again. Requiring an earlier sighting even with
// After zero keeps a sandbox a seed is creating while a sweep lists (its
// session not yet listed) from being removed by that sweep.
type Aging struct {
	After  time.Duration
	sweeps uint64
	by     map[string]sighting
}

type sighting struct {
	since time.Time
	sweep uint64
}

// Step takes the unaccounted ids (a key per kind and id) at now and returns
// which are due, and the others' due times.
func (a *Aging) Step(unaccounted []string, now time.Time) (due map[string]bool, waiting map[string]Waiting) {
	a.sweeps++
	if a.by == nil {
		a.by = map[string]sighting{}
	}
	seen := make(map[string]bool, len(unaccounted))
	due, waiting = map[string]bool{}, map[string]Waiting{}
	for _, key := range unaccounted {
		seen[key] = true
		s, ok := a.by[key]
		if !ok {
			s = sighting{since: now, sweep: a.sweeps}
			a.by[key] = s
		}
		at := s.since.Add(a.After)
		if s.sweep < a.sweeps && !now.Before(at) {
			due[key] = true
			continue
		}
		waiting[key] = Waiting{Since: s.since, Due: at}
	}
	for key := range a.by {
		if !seen[key] {
			delete(a.by, key)
		}
	}
	return due, waiting
}

// hold keeps in rep only the due sandboxes and snapshots; the others move
// to Waiting.
func (a *Aging) hold(rep Report, now time.Time) Report {
	var keys []string
	for _, s := range rep.Sandboxes {
		keys = append(keys, KindSandbox+"/"+s.Handle.SandboxID)
	}
	for _, s := range rep.Snapshots {
		keys = append(keys, KindSnapshot+"/"+s.ID)
	}
	due, waiting := a.Step(keys, now)
	wait := func(kind, id string) {
		w := waiting[kind+"/"+id]
		w.Kind, w.ID = kind, id
		rep.Waiting = append(rep.Waiting, w)
	}
	var sbs []provider.SandboxInfo
	for _, s := range rep.Sandboxes {
		if due[KindSandbox+"/"+s.Handle.SandboxID] {
			sbs = append(sbs, s)
		} else {
			wait(KindSandbox, s.Handle.SandboxID)
		}
	}
	var snaps []provider.SnapshotInfo
	for _, s := range rep.Snapshots {
		if due[KindSnapshot+"/"+s.ID] {
			snaps = append(snaps, s)
		} else {
			wait(KindSnapshot, s.ID)
		}
	}
	rep.Sandboxes, rep.Snapshots = sbs, snaps
	return rep
}
