package local

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/uidrange"
)

// DefaultReadyIDs is Options.ReadyIDs when zero.
const DefaultReadyIDs = 2

// A sandbox with a uid of its own sees its trees through views whose
// mapping comes from a user namespace made for its uid (see idmapNS): a
// process cloned into a new namespace, its maps written, its namespace
// opened. That is a fork and an exec of the whole server, the slowest
// step of a start (tens of milliseconds on a loaded machine). Its inputs
// are known before any start asks: the sandbox's id is drawn by the
// provider, its uid follows from the id (see uidrange.Range.Take). So a
// few are made ahead: readyIDs keeps ids drawn, their uids taken and
// their namespaces made, and a start takes one. Nothing of them is on
// disk: a server that dies loses them, and the uids they held are free
// again when the next server reads its sandboxes.
type readyIDs struct {
	p   *Provider
	max int

	mu     sync.Mutex
	ready  []readyID
	fill   chan struct{} // closed when the fill that runs ends; nil: none runs
	closed bool

	// taken, when set by a test, runs in a fill once it took a uid,
	// before it makes the namespace; settling before settle waits.
	taken, settling func()
}

// readyID is a new sandbox's id, its uid (nil: sandboxes have none of
// their own) and, made ahead, the user namespace its views map through
// (an open descriptor; -1: none).
type readyID struct {
	id   string
	ids  *owner
	nsfd int
}

// newSandboxID draws a new sandbox's id and takes its uid, where
// sandboxes get uids of their own: one made ahead if one is ready. The
// caller owns what it got: the uid, and the namespace it closes.
func (p *Provider) newSandboxID() (readyID, error) {
	if got, ok := p.ready.take(); ok {
		return got, nil
	}
	got := readyID{id: newID(sandboxPrefix), nsfd: -1}
	if p.uids == nil {
		return got, nil
	}
	uid, err := p.uids.Take(got.id)
	if errors.Is(err, uidrange.ErrExhausted) && p.ready.settle() {
		// The last free uid went to an id made ahead meanwhile.
		if ahead, ok := p.ready.take(); ok {
			return ahead, nil
		}
	}
	if err != nil {
		return readyID{}, err
	}
	got.ids = &owner{uid, uid}
	return got, nil
}

// take returns an id made ahead, if one is, and starts making more; ok is
// false when none was ready. The first start of a provider makes its own:
// a provider that starts no sandbox makes none ahead.
func (r *readyIDs) take() (readyID, bool) {
	if r == nil {
		return readyID{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return readyID{}, false
	}
	got, ok := readyID{}, len(r.ready) > 0
	if ok {
		got = r.ready[0]
		r.ready = r.ready[1:]
	}
	if r.fill == nil && len(r.ready) < r.max {
		r.fill = make(chan struct{})
		go r.fillUp(r.fill)
	}
	return got, ok
}

// fillUp makes ids until max are ready, the range has no uid left, or a
// namespace cannot be made (a start then makes its own and says why).
func (r *readyIDs) fillUp(done chan struct{}) {
	defer close(done)
	for {
		r.mu.Lock()
		if r.closed || len(r.ready) >= r.max {
			r.fill = nil
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		got, err := r.make()
		r.mu.Lock()
		if err != nil {
			r.fill = nil
			r.mu.Unlock()
			return
		}
		r.ready = append(r.ready, got)
		r.mu.Unlock()
	}
}

// make draws an id, takes its uid and makes its namespace.
func (r *readyIDs) make() (readyID, error) {
	id := newID(sandboxPrefix)
	uid, err := r.p.uids.Take(id)
	if err != nil {
		return readyID{}, err
	}
	if r.taken != nil {
		r.taken()
	}
	ids := &owner{uid, uid}
	fd, err := r.p.idmapNS(*ids)
	if err != nil {
		r.p.uids.Release(uid, id)
		return readyID{}, err
	}
	return readyID{id: id, ids: ids, nsfd: fd}, nil
}

// settle waits for the fill that runs, if one does, and reports whether
// one did.
func (r *readyIDs) settle() bool {
	if r == nil {
		return false
	}
	r.mu.Lock()
	fill := r.fill
	r.mu.Unlock()
	if fill == nil {
		return false
	}
	if r.settling != nil {
		r.settling()
	}
	<-fill
	return true
}

// close makes no more, waits for the fill that runs and gives back every
// id ready.
func (r *readyIDs) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.settle()
	r.mu.Lock()
	ready := r.ready
	r.ready = nil
	r.mu.Unlock()
	for _, got := range ready {
		unix.Close(got.nsfd)
		r.p.uids.Release(got.ids.uid, got.id)
	}
}
