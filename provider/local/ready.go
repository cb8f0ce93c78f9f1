package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/flock"

	"github.com/sandboxowner/owner/provider/local/uidrange"
)

// DefaultReadyIDs is Options.ReadyIDs when zero.
const DefaultReadyIDs = 2

// maxReadyNamespaces bounds how many ids a provider keeps with only their
// uids taken and namespaces made (see readyNamespaces).
const maxReadyNamespaces = 64

// readyNamespaces is how many ids, beyond those made ahead in full, a
// provider keeps with their uids taken and namespaces made, once a start
// outran those made in full: a group of sandboxes started at once (a
// group of rollouts of one task, each a fork of its template) outruns
// the few made in full, and the namespace is then the slowest step each
// start makes itself (a process cloned into it, in the helper, under the
// load the group makes). A namespace made ahead holds a uid and a little
// kernel memory, no process: up to maxReadyNamespaces, and one per 1,024
// uids of the range, so that a small range's uids go to sandboxes. They
// are made only on demand (see newSandboxID and ExpectStarts): 64
// namespaces are 64 processes cloned, which a provider whose starts come
// one at a time (most of the tests, a server with few sessions) never
// needs.
func (p *Provider) readyNamespaces() int {
	if p.uids == nil {
		return 0
	}
	first, last := p.uids.Bounds()
	return min(maxReadyNamespaces, (last-first+1)/1024)
}

// A sandbox with a uid of its own sees its trees through views whose
// mapping comes from a user namespace made for its uid (see idmapNS): a
// process cloned into a new namespace, its maps written, its namespace
// opened. That is a fork and an exec of the whole server, the slowest
// step of a start (tens of milliseconds on a loaded machine). Its inputs
// are known before any start asks: the sandbox's id is drawn by the
// provider, its uid follows from the id (see uidrange.Range.Take). So a
// few are made ahead: readyIDs keeps ids drawn, their uids taken and
// their namespaces made, and a start takes one. The uids and namespaces
// live only in memory: a server that dies loses them, and the uids they
// held are free again when the next server reads its sandboxes.
//
// With a disk limit the other slow step is the sandbox's disk: its image
// copied and loop-mounted (tens of milliseconds more). A ready id then
// also has its directory made under <root>/ready, its disk mounted in it
// (and, in overlay mode, its views: see makeViews), which a start renames
// into place (a mount moves with the directory
// that holds it). Those directories are on disk: the next exclusive
// provider's New removes what a dead server left, and Reap removes any
// that no start of this provider holds (see removeReadyDirs).
type readyIDs struct {
	p   *Provider
	max int
	// nsOnly: ids with their uids and namespaces made, no directory.
	nsOnly bool
	// parallel is how many a fill makes at once.
	parallel int

	// ctx ends at close: it bounds the fills' waits (a namespace).
	ctx    context.Context
	cancel context.CancelFunc

	mu    sync.Mutex
	ready []readyID
	// want is how many a fill keeps ready: for readyNS up to max,
	// raised by demand (see take and expect); for those made in full,
	// max or, when more starts are expected, expected (see expect).
	want int
	// expected counts, for those made in full, the starts told of (see
	// ExpectStarts) that neither came nor were cancelled.
	expected int
	// making counts the ids the fill's workers are making, workers the
	// workers that run.
	making, workers int
	fill            chan struct{} // closed when the fill that runs ends; nil: none runs
	made            bool          // a fill has made one
	closed          bool
	// expiry gives back, for those made in full, what expected starts
	// that never came were kept for, once expectedBy passed with none
	// coming (see expect); nil: none armed.
	expiry     clock.Timer
	expectedBy time.Time

	// taken, when set by a test, runs in a fill once it took a uid,
	// before it makes the namespace; settling before settle waits.
	taken, settling func()
}

func newReadyIDs(p *Provider, max int, nsOnly bool) *readyIDs {
	ctx, cancel := context.WithCancel(context.Background())
	r := &readyIDs{p: p, max: max, nsOnly: nsOnly, parallel: 1, want: max, ctx: ctx, cancel: cancel}
	if nsOnly {
		// Made on demand only (see want), several at once: a namespace
		// is mostly a wait for the helper, whose clones run side by side.
		r.parallel, r.want = nsFillParallel, 0
	}
	return r
}

// ExpectStarts: n more starts will come soon (seeds waiting for their
// template's build, each to fork it once it is built). Up to n are made
// ahead while they wait, several at once, so that the first group of a
// fresh provider finds what each start needs made, as later groups do.
//
// Where sandboxes have disks, those are ids made in full (directory,
// disk mounted, views; a fork's disk mount is otherwise the slowest step
// left on its own path), made once: each start that takes one lowers the
// number kept back towards the usual few. What was made for starts that
// will not come is given back (directory removed, disk unmounted) as
// soon as it is known: when StartsCancelled says so, when no start was
// expected for expectedStartsTTL of the provider's clock (a hint that
// outlived its seeds), at Close; after a crash the next server's New, its
// Reap and the sweep remove the directories (see SweepMadeAhead). Without
// disks they are namespaces, kept ready from then on (see
// readyNamespaces: a uid and a little kernel memory each, in memory
// only). A provider that makes nothing ahead makes nothing.
func (p *Provider) ExpectStarts(n int) {
	if p.disks != nil {
		p.ready.expect(n)
		return
	}
	p.readyNS.expect(n)
}

// StartsCancelled: n of the starts ExpectStarts told of will not come
// (their seeds were cancelled or failed, or found a sandbox elsewhere).
// Where sandboxes have disks, the ids made in full for them beyond the
// usual few are given back at once.
func (p *Provider) StartsCancelled(n int) {
	if p.disks != nil {
		p.ready.cancelExpected(n)
	}
}

// expectedStartsTTL bounds how long ids made in full for expected starts
// are kept when none of those starts comes (nor another expectation):
// longer than a template's build takes, most of the time, so that a group
// finds its forks' disks made; a bound on a hint whose seeds went without
// a word.
const expectedStartsTTL = 10 * time.Minute

// nsFillParallel is how many namespaces a fill of readyNS asks the
// helper for at once.
const nsFillParallel = 8

// readyID is a new sandbox's id, its uid (nil: sandboxes have none of
// their own) and, made ahead, the user namespace its views map through
// (an open descriptor; -1: none) and its directory under the ready
// directory, with its disk mounted (dir). done ends the id's pending
// mark (see markPending), which keeps Reap off its directory; nil: none.
type readyID struct {
	id   string
	ids  *owner
	nsfd int
	dir  bool
	done func()
}

// newSandboxID draws a new sandbox's id and takes its uid, where
// sandboxes get uids of their own: one made ahead if one is ready. The
// caller owns what it got: the uid, and the namespace it closes. A start
// that finds none made in full although some were made (starts took them
// all) outran them: then, or when starts are expected (see
// ExpectStarts), are namespaces made ahead (see readyNamespaces).
func (p *Provider) newSandboxID() (readyID, error) {
	got, ok, outran := p.ready.take(true)
	if ok {
		return got, nil
	}
	if got, ok, _ := p.readyNS.take(outran); ok {
		return got, nil
	}
	got = readyID{id: newID(sandboxPrefix), nsfd: -1}
	if p.uids == nil {
		return got, nil
	}
	uid, err := p.uids.Take(got.id)
	if errors.Is(err, uidrange.ErrExhausted) {
		// The last free uids went to ids made ahead meanwhile.
		for _, r := range []*readyIDs{p.ready, p.readyNS} {
			if r.settle() {
				if ahead, ok, _ := r.take(false); ok {
					return ahead, nil
				}
			}
		}
	}
	if err != nil {
		return readyID{}, err
	}
	got.ids = &owner{uid, uid}
	return got, nil
}

// take returns an id made ahead, if one is, and, when fill, starts
// making more; ok is false when none was ready, outran when none was
// ready although some had been made (starts took them all). The first
// start of a provider makes its own: a provider that starts no sandbox
// makes none ahead. For readyNS, fill raises the number kept to max
// (see newSandboxID), and any take makes up for it once demand raised
// that number (see expect).
func (r *readyIDs) take(fill bool) (got readyID, ok, outran bool) {
	if r == nil {
		return readyID{}, false, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return readyID{}, false, false
	}
	ok = len(r.ready) > 0
	if ok {
		got = r.ready[0]
		r.ready = r.ready[1:]
	}
	switch {
	case fill && !r.nsOnly:
		// A start came, an expected one as far as a hint can tell,
		// whether or not one was ready for it: one fewer is kept for
		// those, never fewer than max.
		r.expected = max(0, r.expected-1)
		r.want = max(r.max, r.expected)
	case ok:
		// One fewer is kept, never fewer than max; a want within max
		// stays as it is.
		r.want = max(min(r.want, r.max), r.want-1)
	}
	outran = !ok && r.made
	if fill {
		r.want = max(r.want, r.max)
	}
	if fill || r.nsOnly {
		r.topUpLocked() // readyNS keeps what demand asked for
	}
	return got, ok, outran
}

// expect: n more starts will come. readyNS keeps at least n ready, up to
// max, from now on; those made in full count them (expected, up to
// maxReadyNamespaces) and keep that many ready, or max, until starts take
// them, they are cancelled or expectedStartsTTL passes with no more told
// (see ExpectStarts). It starts making what is missing.
func (r *readyIDs) expect(n int) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	if r.nsOnly {
		r.want = max(r.want, min(n, r.max))
		r.topUpLocked()
		return
	}
	r.expected = min(r.expected+n, maxReadyNamespaces)
	r.want = max(r.max, r.expected)
	r.topUpLocked()
	if r.expected > 0 {
		r.expectedBy = r.p.clk.Now().Add(expectedStartsTTL)
		if r.expiry == nil {
			r.expiry = r.p.clk.AfterFunc(expectedStartsTTL, r.expire)
		}
	}
}

// cancelExpected: n expected starts will not come; what was kept for them
// beyond max is given back (see ExpectStarts).
func (r *readyIDs) cancelExpected(n int) {
	if r == nil || r.nsOnly {
		return
	}
	r.mu.Lock()
	r.expected = max(0, r.expected-n)
	r.want = max(r.max, r.expected)
	surplus := r.surplusLocked()
	r.mu.Unlock()
	giveBackAll(r.p, surplus)
}

// expire runs when expectedBy may have passed: then no expected start
// came for expectedStartsTTL, and what was kept for them is given back;
// otherwise it waits for the rest.
func (r *readyIDs) expire() {
	r.mu.Lock()
	r.expiry = nil
	if r.closed || r.expected == 0 {
		r.mu.Unlock()
		return
	}
	if left := r.expectedBy.Sub(r.p.clk.Now()); left > 0 {
		r.expiry = r.p.clk.AfterFunc(left, r.expire)
		r.mu.Unlock()
		return
	}
	r.expected, r.want = 0, r.max
	surplus := r.surplusLocked()
	r.mu.Unlock()
	if len(surplus) > 0 {
		r.p.log.WithField("ids", len(surplus)).Info("local: sandbox ids made ahead for starts that did not come given back")
	}
	giveBackAll(r.p, surplus)
}

// surplusLocked takes out of ready what is beyond want, to be given back.
func (r *readyIDs) surplusLocked() []readyID {
	if len(r.ready) <= r.want {
		return nil
	}
	surplus := slices.Clone(r.ready[r.want:])
	r.ready = r.ready[:r.want]
	return surplus
}

// giveBackAll gives back each of ids.
func giveBackAll(p *Provider, ids []readyID) {
	for _, got := range ids {
		got.giveBack(p)
	}
}

// topUpLocked starts the workers that make what is missing of want, up
// to parallel at once; nsFillParallel while starts are expected beyond
// max.
func (r *readyIDs) topUpLocked() {
	parallel := r.parallel
	if r.want > r.max {
		parallel = nsFillParallel
	}
	for missing := r.want - len(r.ready) - r.making; missing > 0 && r.workers < parallel; missing-- {
		if r.fill == nil {
			r.fill = make(chan struct{})
		}
		r.workers++
		go r.fillUp()
	}
}

// fillUp is a fill's worker: it makes ids until want are ready or being
// made, the range has no uid left, or a namespace cannot be made (a
// start then makes its own and says why). The last worker to end ends
// the fill.
func (r *readyIDs) fillUp() {
	r.mu.Lock()
	for !r.closed && len(r.ready)+r.making < r.want {
		r.making++
		r.mu.Unlock()
		got, err := r.make(r.ctx)
		r.mu.Lock()
		r.making--
		if err != nil {
			break
		}
		r.ready, r.made = append(r.ready, got), true
		if surplus := r.surplusLocked(); len(surplus) > 0 {
			// Expected starts cancelled while it was made: given back
			// before the fill ends (settle waits for it).
			r.mu.Unlock()
			giveBackAll(r.p, surplus)
			r.mu.Lock()
		}
	}
	r.workers--
	if r.workers == 0 {
		close(r.fill)
		r.fill = nil
	}
	r.mu.Unlock()
}

// make draws an id, takes its uid and makes its namespace (where
// sandboxes have uids of their own, in overlay mode; an id of readyNS
// comes with both), and makes its directory with its disk mounted (where
// sandboxes have disks; not for readyNS). One made in full takes an id of
// readyNS if one is ready, without making more: only a start that outran
// those made in full asks for more (see newSandboxID).
func (r *readyIDs) make(ctx context.Context) (_ readyID, err error) {
	got := readyID{id: newID(sandboxPrefix), nsfd: -1}
	if !r.nsOnly {
		if ns, ok, _ := r.p.readyNS.take(false); ok {
			got = ns // its uid taken and namespace made already
		}
	}
	defer func() {
		if err != nil {
			got.giveBack(r.p)
		}
	}()
	if r.p.uids != nil && got.ids == nil {
		uid, err := r.p.uids.Take(got.id)
		if err != nil {
			return readyID{}, err
		}
		got.ids = &owner{uid, uid}
		if r.taken != nil {
			r.taken()
		}
		if r.p.overlay {
			if got.nsfd, err = r.p.idmapNS(ctx, *got.ids); err != nil {
				return readyID{}, err
			}
		}
	}
	if r.p.disks != nil && !r.nsOnly {
		got.done = r.p.markPending(got.id)
		got.dir = true
		dir := filepath.Join(r.p.readyDir(), got.id)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return readyID{}, err
		}
		img := filepath.Join(dir, diskImageName)
		if err := r.p.disks.make(img); err != nil {
			return readyID{}, fmt.Errorf("disk: %w", err)
		}
		if err := mountDisk(img, filepath.Join(dir, diskDirName)); err != nil {
			return readyID{}, err
		}
		if got.nsfd >= 0 {
			// The views every overlay sandbox of its uid has: its
			// directory, its disk and the root (where its lowest layers
			// are); a start adds those of its image's own.
			s := &sandbox{id: got.id, dir: dir, hasDisk: true}
			if _, _, _, _, err := r.p.makeViews(ctx, s, *got.ids, got.nsfd, []string{r.p.emptyDir()}, nil); err != nil {
				return readyID{}, err
			}
		}
	}
	return got, nil
}

// giveBack undoes what was made ahead for an id no start will use: its
// directory (disk and all) removed, its namespace closed, its uid free.
func (got readyID) giveBack(p *Provider) {
	if got.dir {
		if err := removeSandboxDir(filepath.Join(p.readyDir(), got.id)); err != nil {
			p.log.WithError(err).WithField("sandbox_id", got.id).Warn("local: remove a sandbox directory made ahead (Reap retries)")
		}
	}
	if got.nsfd >= 0 {
		unix.Close(got.nsfd)
	}
	if got.ids != nil {
		p.uids.Release(got.ids.uid, got.id)
	}
	if got.done != nil {
		got.done()
	}
}

// removeReadyDirs removes the directories under the ready directory that
// no id made ahead by this provider holds: what a server that died had
// made ahead, or a start failed to clean. It returns their ids.
func (p *Provider) removeReadyDirs() ([]string, error) {
	entries, err := os.ReadDir(p.readyDir())
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range entries {
		if p.isPending(e.Name()) {
			continue
		}
		if err := removeSandboxDir(filepath.Join(p.readyDir(), e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}

// SweepMadeAhead removes the directories made ahead (disks mounted) that
// a server which died left under the root, and returns their ids: the
// sweep's part after a crash, with no server on the root. While a server
// holds the root (its lock, Options.Exclusive) it removes nothing: they
// are that server's, whose Reap removes what it does not hold.
func (p *Provider) SweepMadeAhead() ([]string, error) {
	p.mu.Lock()
	held := p.lock != nil
	p.mu.Unlock()
	if !held {
		f, err := lockRoot(p.root)
		if errors.Is(err, ErrRootLocked) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		defer flock.Release(f)
	}
	return p.removeReadyDirs()
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

// close makes no more, ends the wait of the fill that runs and waits for
// it, and gives back every id ready.
func (r *readyIDs) close() {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	if r.expiry != nil {
		r.expiry.Stop()
		r.expiry = nil
	}
	r.mu.Unlock()
	r.cancel()
	r.settle()
	r.mu.Lock()
	ready := r.ready
	r.ready = nil
	r.mu.Unlock()
	giveBackAll(r.p, ready)
}
