// Package retention decides which committed checkpoints a controller has
// let go of by deleting their directories, as NeMo Gym's collection
// checkpointer does (it keeps the newest checkpoint directories, deletes
// the rest, and never calls release).
//
// A Machine is pure: given the committed checkpoints, one Observation of
// each one's checkpoint_dir and the time, Step says which to drop. A
// directory counts as gone only when a lookup answered "no such file" while
// its parent was readable, at two checks at least the grace apart with no
// other answer between them; any other answer (an I/O or permission error,
// a stale handle, a missing or unreadable parent, a parent on another
// filesystem than when the directory was seen) is Unreadable and never
// counts. Look turns one lookup on an FS into an Observation.
package retention

import (
	"slices"
	"strings"
	"time"
)

// Status is what a lookup of a directory found.
type Status int

// Statuses.
const (
	// Present: the directory (or something under its name) exists.
	Present Status = iota
	// Gone: no such file, and the parent directory was read.
	Gone
	// Unreadable: anything else; Reason says what.
	Unreadable
)

// Reasons of Unreadable observations (the label of the unreadable-directory
// counter).
const (
	ReasonIO               = "io_error"
	ReasonPermission       = "permission_denied"
	ReasonStale            = "stale_file_handle"
	ReasonParentMissing    = "parent_missing"
	ReasonParentUnreadable = "parent_unreadable"
	// ReasonParentChanged: the parent is on another filesystem than when
	// the directory was last seen, as an unmounted filesystem's mount point
	// is.
	ReasonParentChanged = "parent_changed"
	ReasonOther         = "other"
)

// Reasons lists every reason, for counters that exist from the start.
func Reasons() []string {
	return []string{ReasonIO, ReasonPermission, ReasonStale, ReasonParentMissing, ReasonParentUnreadable, ReasonParentChanged, ReasonOther}
}

// Observation is one lookup of a checkpoint's directory.
type Observation struct {
	Status Status
	// Reason says why an Unreadable lookup was not an answer.
	Reason string
	// Detail is the error, for the log.
	Detail string
	// ParentDev is the device of the parent directory (0: unknown).
	ParentDev uint64
}

// Checkpoint is a committed checkpoint and what its directory looked like.
type Checkpoint struct {
	ID  string
	Dir string
	Obs Observation
}

// Pending is a checkpoint whose directory was seen gone, not yet for the
// grace.
type Pending struct {
	ID, Dir string
	Since   time.Time
	Due     time.Time
}

// Problem is a checkpoint whose directory could not be read.
type Problem struct {
	ID, Dir, Reason, Detail string
	// First: the previous check saw the directory otherwise (log it once).
	First bool
}

// Decision is what one Step decided.
type Decision struct {
	// Drop are the checkpoints to drop, sorted.
	Drop []string
	// Pending are the checkpoints whose directory was seen gone, by id.
	Pending []Pending
	// Unreadable are the checkpoints whose directory could not be read.
	Unreadable []Problem
	// Next is when the earliest pending drop becomes due (zero: none).
	Next time.Time
}

type seen struct {
	goneSince time.Time
	goneCheck uint64 // the check that first saw it gone; 0: not gone
	dev       uint64 // the parent's device when the directory was seen
	problem   string // the reason of the last Unreadable, "" otherwise
}

// Machine remembers what earlier checks saw. The zero value has no grace.
type Machine struct {
	Grace  time.Duration
	checks uint64
	by     map[string]*seen // by checkpoint id
}

// Step takes the checkpoints the index holds, each with an observation of
// its directory, at now. A checkpoint without a directory names nothing on
// disk and is never judged. What the machine knew of checkpoints not given
// is forgotten (they were dropped).
func (m *Machine) Step(ckpts []Checkpoint, now time.Time) Decision {
	m.checks++
	if m.by == nil {
		m.by = map[string]*seen{}
	}
	var d Decision
	keep := make(map[string]bool, len(ckpts))
	for _, c := range ckpts {
		if c.Dir == "" {
			continue
		}
		keep[c.ID] = true
		s := m.by[c.ID]
		if s == nil {
			s = &seen{}
			m.by[c.ID] = s
		}
		obs := c.Obs
		if obs.Status == Gone && s.dev != 0 && obs.ParentDev != 0 && obs.ParentDev != s.dev {
			obs = Observation{Status: Unreadable, Reason: ReasonParentChanged, Detail: "the parent directory is on another filesystem than when the directory was seen", ParentDev: obs.ParentDev}
		}
		switch obs.Status {
		case Present:
			s.goneCheck, s.goneSince, s.problem = 0, time.Time{}, ""
			if obs.ParentDev != 0 {
				s.dev = obs.ParentDev
			}
		case Gone:
			s.problem = ""
			if s.goneCheck == 0 {
				s.goneCheck, s.goneSince = m.checks, now
			}
			due := s.goneSince.Add(m.Grace)
			if s.goneCheck < m.checks && !now.Before(due) {
				d.Drop = append(d.Drop, c.ID)
				continue
			}
			d.Pending = append(d.Pending, Pending{ID: c.ID, Dir: c.Dir, Since: s.goneSince, Due: due})
			if d.Next.IsZero() || due.Before(d.Next) {
				d.Next = due
			}
		default:
			// Not an answer: the directory must be seen gone afresh.
			reason := obs.Reason
			if reason == "" {
				reason = ReasonOther
			}
			d.Unreadable = append(d.Unreadable, Problem{ID: c.ID, Dir: c.Dir, Reason: reason, Detail: obs.Detail, First: s.problem != reason})
			s.goneCheck, s.goneSince, s.problem = 0, time.Time{}, reason
		}
	}
	for id := range m.by {
		if !keep[id] {
			delete(m.by, id)
		}
	}
	slices.Sort(d.Drop)
	slices.SortFunc(d.Pending, func(a, b Pending) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(d.Unreadable, func(a, b Problem) int { return strings.Compare(a.ID, b.ID) })
	return d
}
