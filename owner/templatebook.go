package owner

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"
)

// templateBook decides what a keyed seed does. A resources server whose
// setup is a pure function of a key (a task's id) seeds with that key; the
// first seed of a key builds the key's template (start, setup, snapshot),
// the seeds that come while it builds wait for that build (one flight), and
// every seed once it is ready forks it. A build that fails fails every seed
// that waited for it with its error, and nothing is kept: the next seed
// builds again.
//
// It is pure: no lock, goroutine, provider or index. The shell
// (template.go) holds it under a mutex and does what it decides.
type templateBook struct {
	// flight numbers the builds; each build has its own.
	flight  uint64
	entries map[string]*tmplEntry
	// waiting counts the seeds waiting for each build in flight.
	waiting map[uint64]int
	// ended are the builds that ended while seeds waited for them, until
	// each of those has woken (wake) or left (leave).
	ended map[uint64]*flightEnd
}

// tmplEntry is a key's template: being built (ready nil) or ready.
type tmplEntry struct {
	flight  uint64
	ready   *tmplReady
	lastUse time.Time
}

// tmplReady is a built template: its snapshot, and what the setup left.
type tmplReady struct {
	SnapshotID string
	Workdir    string
	Data       json.RawMessage
}

type flightEnd struct {
	key     string
	waiters int
	ready   *tmplReady
	err     error
}

// tmplAction is what a seed does.
type tmplAction int

const (
	// tmplBuild: build the template (this seed's flight), then call built
	// or failed.
	tmplBuild tmplAction = iota
	// tmplWait: wait until the flight ends, then call wake.
	tmplWait
	// tmplFork: fork the ready template.
	tmplFork
	// tmplFail: the build waited for failed with Err.
	tmplFail
)

var tmplActions = [...]string{"build", "wait", "fork", "fail"}

func (a tmplAction) String() string { return tmplActions[a] }

// tmplDecision is the book's answer to a seed.
type tmplDecision struct {
	Action tmplAction
	Key    string
	Flight uint64
	// Ready is the template to fork (tmplFork).
	Ready tmplReady
	// Err is the build's failure (tmplFail).
	Err error
	// Waiting is how many seeds wait for the flight, this one included
	// (tmplWait).
	Waiting int
}

func (d tmplDecision) String() string {
	switch d.Action {
	case tmplFork:
		return fmt.Sprintf("fork %s snapshot=%s", d.Key, d.Ready.SnapshotID)
	case tmplFail:
		return fmt.Sprintf("fail %s: %v", d.Key, d.Err)
	case tmplWait:
		return fmt.Sprintf("wait %s flight=%d waiting=%d", d.Key, d.Flight, d.Waiting)
	default:
		return fmt.Sprintf("%s %s flight=%d", d.Action, d.Key, d.Flight)
	}
}

func newTemplateBook() *templateBook {
	return &templateBook{entries: map[string]*tmplEntry{}, waiting: map[uint64]int{}, ended: map[uint64]*flightEnd{}}
}

// seed is a seed of key at now: fork what is ready, wait for the build in
// flight, or build.
func (b *templateBook) seed(key string, now time.Time) tmplDecision {
	e := b.entries[key]
	switch {
	case e == nil:
		b.flight++
		b.entries[key] = &tmplEntry{flight: b.flight, lastUse: now}
		return tmplDecision{Action: tmplBuild, Key: key, Flight: b.flight}
	case e.ready == nil:
		b.waiting[e.flight]++
		return tmplDecision{Action: tmplWait, Key: key, Flight: e.flight, Waiting: b.waiting[e.flight]}
	default:
		e.lastUse = now
		return tmplDecision{Action: tmplFork, Key: key, Flight: e.flight, Ready: *e.ready}
	}
}

// built ends flight with its template ready; it returns how many seeds
// waited for it (each to be woken).
func (b *templateBook) built(key string, flight uint64, r tmplReady, now time.Time) int {
	e := b.entries[key]
	if e != nil && e.flight == flight {
		e.ready = &r
		e.lastUse = now
	}
	return b.end(flight, &flightEnd{key: key, ready: &r})
}

// failed ends flight with err: the key has no template (the next seed
// builds again); it returns how many seeds waited for it.
func (b *templateBook) failed(key string, flight uint64, err error) int {
	if e := b.entries[key]; e != nil && e.flight == flight {
		delete(b.entries, key)
	}
	return b.end(flight, &flightEnd{key: key, err: err})
}

func (b *templateBook) end(flight uint64, f *flightEnd) int {
	f.waiters = b.waiting[flight]
	delete(b.waiting, flight)
	if f.waiters > 0 {
		b.ended[flight] = f
	}
	return f.waiters
}

// wake is a seed that waited for flight, once it ended: fork what it built
// or fail with its error.
func (b *templateBook) wake(flight uint64) tmplDecision {
	f := b.ended[flight]
	if f == nil {
		// Not ended (or woken more often than seeds waited): nothing to
		// act on, which the shell never asks.
		return tmplDecision{Action: tmplFail, Flight: flight, Err: fmt.Errorf("template build %d has not ended", flight)}
	}
	b.leaveEnded(flight, f)
	if f.err != nil {
		return tmplDecision{Action: tmplFail, Key: f.key, Flight: flight, Err: f.err}
	}
	return tmplDecision{Action: tmplFork, Key: f.key, Flight: flight, Ready: *f.ready}
}

// leave is a seed that stopped waiting for flight (its context ended).
func (b *templateBook) leave(flight uint64) {
	if f := b.ended[flight]; f != nil {
		b.leaveEnded(flight, f)
		return
	}
	if b.waiting[flight] > 0 {
		b.waiting[flight]--
	}
}

func (b *templateBook) leaveEnded(flight uint64, f *flightEnd) {
	f.waiters--
	if f.waiters <= 0 {
		delete(b.ended, flight)
	}
}

// lost forgets key's template if it is snapshotID (a fork found the
// snapshot gone), so that the next seed builds again. It reports whether
// it forgot it.
func (b *templateBook) lost(key, snapshotID string) bool {
	e := b.entries[key]
	if e == nil || e.ready == nil || e.ready.SnapshotID != snapshotID {
		return false
	}
	delete(b.entries, key)
	return true
}

// load makes key's template ready as the index keeps it, used as of now (a
// fresh owner finds the templates of the one before).
func (b *templateBook) load(key string, r tmplReady, now time.Time) {
	if _, ok := b.entries[key]; ok {
		return
	}
	b.flight++
	b.entries[key] = &tmplEntry{flight: b.flight, ready: &r, lastUse: now}
}

// expire forgets the ready templates no seed used since before, and
// returns them by key. Templates being built are never expired.
func (b *templateBook) expire(before time.Time) map[string]tmplReady {
	out := map[string]tmplReady{}
	for k, e := range b.entries {
		if e.ready != nil && e.lastUse.Before(before) {
			out[k] = *e.ready
			delete(b.entries, k)
		}
	}
	return out
}

// takeAll forgets every ready template and returns them by key (a closing
// owner without an index deletes them).
func (b *templateBook) takeAll() map[string]tmplReady {
	return b.expire(time.Unix(1<<62, 0))
}

// snapshots are the ready templates' snapshots.
func (b *templateBook) snapshots() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(b.entries)) {
		if r := b.entries[k].ready; r != nil {
			out = append(out, r.SnapshotID)
		}
	}
	return out
}

// String is the book's state, for the scripts.
func (b *templateBook) String() string {
	var s string
	for _, k := range slices.Sorted(maps.Keys(b.entries)) {
		e := b.entries[k]
		if e.ready == nil {
			s += fmt.Sprintf("%s: building flight=%d waiting=%d\n", k, e.flight, b.waiting[e.flight])
			continue
		}
		s += fmt.Sprintf("%s: ready snapshot=%s flight=%d last_use=%s\n", k, e.ready.SnapshotID, e.flight, e.lastUse.UTC().Format("15:04:05"))
	}
	for _, f := range slices.Sorted(maps.Keys(b.ended)) {
		s += fmt.Sprintf("flight %d ended: %d to wake\n", f, b.ended[f].waiters)
	}
	if s == "" {
		return "empty"
	}
	return s
}
