package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/flock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/provider/local/uidrange"
)

var overlayContainer = mode{"container-overlay", IsolationContainer, OverlayOn}

// readyNow waits for the fill that runs and lists the ids made ahead.
func readyNow(p *Provider) []readyID {
	p.ready.settle()
	p.ready.mu.Lock()
	defer p.ready.mu.Unlock()
	return append([]readyID(nil), p.ready.ready...)
}

// A provider's first start makes its own id, uid and namespace and has
// more made ahead; the next start takes the first made ahead (its id, its
// uid) and runs commands in a tree it owns; Close gives back the uids of
// those still ready.
func TestAStartTakesAnIDMadeAhead(t *testing.T) {
	p := newProvider(t, overlayContainer, Options{})
	if p.ready == nil {
		t.Skip("SKIP: sandboxes here get no uid of their own")
	}
	if got := readyNow(p); len(got) != 0 {
		t.Fatalf("%d ids made before any start", len(got))
	}
	start(t, p, provider.Spec{})
	ahead := readyNow(p)
	if len(ahead) != DefaultReadyIDs {
		t.Fatalf("%d ids made ahead after a start, want %d", len(ahead), DefaultReadyIDs)
	}
	h := start(t, p, provider.Spec{Files: map[string]string{"f": "x"}})
	if h.SandboxID != ahead[0].id {
		t.Errorf("started %s, want the id made ahead %s", h.SandboxID, ahead[0].id)
	}
	s, err := p.live(context.Background(), h, false)
	if err != nil {
		t.Fatal(err)
	}
	if s.meta.UID != ahead[0].ids.uid || s.meta.GID != ahead[0].ids.gid {
		t.Errorf("uid/gid %d/%d, want the ones made ahead %d/%d", s.meta.UID, s.meta.GID, ahead[0].ids.uid, ahead[0].ids.gid)
	}
	if got := mustRun(t, p, h, "cat f && echo y > g && stat -c %u f g"); got != "x0\n0\n" {
		t.Errorf("the tree through views made with the namespace made ahead: %q", got)
	}
	again := readyNow(p)
	if len(again) != DefaultReadyIDs || again[0].id != ahead[1].id {
		t.Errorf("after a take: %d ready, first %v; want %d, first %s", len(again), again, DefaultReadyIDs, ahead[1].id)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	var back []int
	for _, r := range again {
		uid, err := p.uids.Take(r.id)
		if err != nil {
			t.Fatal(err)
		}
		back = append(back, uid)
	}
	want := []int{again[0].ids.uid, again[1].ids.uid}
	if d := cmp.Diff(want, back); d != "" {
		t.Errorf("the uids made ahead are not free again after Close (-want +got):\n%s", d)
	}
	if _, ok, _ := p.ready.take(true); ok {
		t.Error("an id taken after Close")
	}
}

// With ReadyIDs negative none is made ahead.
func TestReadyIDsOff(t *testing.T) {
	p := newProvider(t, overlayContainer, Options{ReadyIDs: -1})
	if p.ready != nil {
		t.Errorf("ids made ahead with ReadyIDs -1: %+v", p.ready)
	}
	start(t, p, provider.Spec{})
}

// A uid range's last free uid, taken by a fill as a start looks for one,
// is the start's: it waits for the fill and takes what it made.
func TestTheLastUIDGoesToTheStartThroughAFill(t *testing.T) {
	p := newProvider(t, overlayContainer, Options{UIDRange: "1879113000-1879113001"})
	if p.ready == nil {
		t.Skip("SKIP: sandboxes here get no uid of their own")
	}
	ctx := context.Background()
	a := start(t, p, provider.Spec{})
	if got := readyNow(p); len(got) != 1 {
		t.Fatalf("%d ids made ahead with one uid left, want 1", len(got))
	}
	start(t, p, provider.Spec{}) // takes the one made ahead
	if _, err := p.Start(ctx, provider.Spec{}); !errors.Is(err, uidrange.ErrExhausted) {
		t.Fatalf("a third start in a range of two: %v, want ErrExhausted", err)
	}
	readyNow(p)
	if err := p.Stop(ctx, a); err != nil {
		t.Fatal(err)
	}

	// A fill takes the freed uid and holds it while the start looks.
	holding, release, waiting := make(chan struct{}), make(chan struct{}), make(chan struct{})
	letGo := sync.OnceFunc(func() { close(release) })
	t.Cleanup(letGo) // before the provider's: Close waits for the fill
	p.ready.mu.Lock()
	p.ready.taken = func() {
		close(holding)
		<-release
	}
	p.ready.settling = func() { close(waiting) }
	p.ready.mu.Unlock()
	if _, ok, _ := p.ready.take(true); ok {
		t.Fatal("an id was ready")
	}
	<-holding
	done := make(chan error, 1)
	go func() {
		_, err := p.Start(ctx, provider.Spec{})
		done <- err
	}()
	select {
	case <-waiting:
	case err := <-done:
		t.Fatalf("a start while a fill held the last uid: %v, without waiting for the fill", err)
	}
	letGo()
	p.ready.mu.Lock()
	p.ready.taken, p.ready.settling = nil, nil
	p.ready.mu.Unlock()
	if err := <-done; err != nil {
		t.Errorf("a start while a fill held the last uid: %v", err)
	}
}

// readyDirs lists the directories made ahead under p's root.
func readyDirs(t *testing.T, p *Provider) []string {
	t.Helper()
	entries, err := os.ReadDir(p.readyDir())
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// With a disk limit an id made ahead has its directory made and its disk
// mounted; a start takes them, and its sandbox's writes are bound by that
// disk. Close removes the directories still ready, disks and all.
func TestAStartTakesADiskMadeAhead(t *testing.T) {
	containerModes(t, func(t *testing.T, m mode) {
		{
			p := newDiskProvider(t, m, Limits{DiskMB: 8})
			start(t, p, provider.Spec{})
			ahead := readyNow(p)
			var ids []string
			for _, r := range ahead {
				if !r.dir || !isMountRoot(filepath.Join(p.readyDir(), r.id, diskDirName)) {
					t.Fatalf("id %s made ahead without its disk mounted", r.id)
				}
				ids = append(ids, r.id)
			}
			slices.Sort(ids) // as ReadDir lists them
			if d := cmp.Diff(ids, readyDirs(t, p)); d != "" {
				t.Errorf("directories made ahead (-ids +dirs):\n%s", d)
			}
			// A Reap leaves what this provider made ahead alone.
			if _, err := p.Reap(context.Background()); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(ids, readyDirs(t, p)); d != "" {
				t.Errorf("after a Reap, directories made ahead (-ids +dirs):\n%s", d)
			}

			h := startAhead(t, p, ahead[0].id)
			if res := run(t, p, h, "cat f && "+fillDisk); res.ExitCode == 0 || res.Stdout != "x" || !strings.Contains(res.Stderr, "No space left") {
				t.Errorf("16 MiB written to the 8 MiB disk made ahead: %+v, want x and ENOSPC", res)
			}
			readyNow(p)
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			noneMadeAhead(t, p, "Close")
		}
	})
}

// A server that dies leaves the directories it made ahead, disks mounted.
// The next server's Reap removes them (it holds none of them), as does an
// exclusive provider's New at once; a start whose id was made ahead by a
// provider whose directory went meanwhile makes its own.
func TestDirectoriesMadeAheadThatAServerLeftAreRemoved(t *testing.T) {
	m := overlayContainer
	ctx := context.Background()
	p := newDiskProvider(t, m, Limits{DiskMB: 8})
	start(t, p, provider.Spec{})
	ahead := readyNow(p)
	if len(readyDirs(t, p)) != len(ahead) || len(ahead) == 0 {
		t.Fatalf("%d directories made ahead for %d ids", len(readyDirs(t, p)), len(ahead))
	}

	next := newProvider(t, m, Options{Root: p.root, Limits: Limits{DiskMB: 8}})
	if _, err := next.Reap(ctx); err != nil {
		t.Fatal(err)
	}
	noneMadeAhead(t, p, "a Reap")

	h := startAhead(t, p, ahead[0].id)
	if got := mustRun(t, p, h, "cat f"); got != "x" {
		t.Errorf("f: %q", got)
	}

	readyNow(p)
	if len(readyDirs(t, p)) == 0 {
		t.Fatal("nothing made ahead after a start")
	}
	newProvider(t, m, Options{Root: p.root, Limits: Limits{DiskMB: 8}, Exclusive: true})
	noneMadeAhead(t, p, "an exclusive New")
}

// startAhead starts a sandbox holding f ("x") and checks it took the id
// made ahead want and has its disk mounted in its directory.
func startAhead(t *testing.T, p *Provider, want string) provider.Handle {
	t.Helper()
	h := start(t, p, provider.Spec{Files: map[string]string{"f": "x"}})
	if h.SandboxID != want {
		t.Fatalf("started %s, want the id made ahead %s", h.SandboxID, want)
	}
	if !isMountRoot(filepath.Join(p.sandboxDir(h.SandboxID), diskDirName)) {
		t.Error("the sandbox's disk is not mounted in its directory")
	}
	return h
}

// noneMadeAhead checks that no directory made ahead, nor its mounts, is
// left under p's root after what.
func noneMadeAhead(t *testing.T, p *Provider, what string) {
	t.Helper()
	if got := readyDirs(t, p); len(got) != 0 {
		t.Errorf("directories made ahead left after %s: %v", what, got)
	}
	if got := localtest.MountsUnder(t, p.readyDir()); len(got) != 0 {
		t.Errorf("mounts made ahead left after %s: %v", what, got)
	}
}

// Beyond the ids made ahead in full, a provider keeps more with their
// uids taken and namespaces made (not in a small uid range), once a start
// outran those made in full: starts one at a time make none; a start that
// finds none made in full, though some were, has them made; a start that
// finds none made in full takes one of those; Close gives back the rest.
func TestAStartBeyondThoseMadeInFullTakesANamespaceMadeAhead(t *testing.T) {
	if small := newProvider(t, overlayContainer, Options{UIDRange: "1879112000-1879113022"}); small.readyNS != nil {
		t.Errorf("namespaces made ahead in a range of 1,023 uids: %d", small.readyNS.max)
	}
	p := newProvider(t, overlayContainer, Options{})
	if p.uids == nil {
		t.Skip("SKIP: sandboxes here get no uid of their own")
	}
	if p.readyNS == nil {
		t.Fatal("no namespaces made ahead in the default uid range")
	}
	if p.readyNS.max != maxReadyNamespaces {
		t.Errorf("%d namespaces to make ahead in the default uid range, want %d", p.readyNS.max, maxReadyNamespaces)
	}
	p.readyNS.mu.Lock()
	p.readyNS.max = 4 // as many as tell what happens, for less of the test's time
	p.readyNS.mu.Unlock()
	readyNS := func() []readyID {
		p.readyNS.settle()
		p.readyNS.mu.Lock()
		defer p.readyNS.mu.Unlock()
		return append([]readyID(nil), p.readyNS.ready...)
	}

	start(t, p, provider.Spec{})
	readyNow(p)
	start(t, p, provider.Spec{}) // takes one made in full
	readyNow(p)
	if got := readyNS(); len(got) != 0 {
		t.Fatalf("%d namespaces made ahead by starts that each found one made in full", len(got))
	}
	// Starts took all those made in full.
	for {
		got, ok, _ := p.ready.take(false)
		if !ok {
			break
		}
		got.giveBack(p)
	}
	start(t, p, provider.Spec{})
	readyNow(p) // its fill takes up to DefaultReadyIDs of them
	made := map[int]bool{}
	for _, r := range readyNS() {
		if r.nsfd < 0 || r.dir {
			t.Errorf("an id made ahead with its namespace only: namespace %d, directory %v", r.nsfd, r.dir)
		}
		made[r.ids.uid] = true
	}
	if want := p.readyNS.max - DefaultReadyIDs; len(made) < want {
		t.Fatalf("%d namespaces made ahead after a start outran those made in full, want at least %d", len(made), want)
	}

	p.ready.close() // none made in full any more
	h := start(t, p, provider.Spec{Files: map[string]string{"f": "x"}})
	s, err := p.live(context.Background(), h, false)
	if err != nil {
		t.Fatal(err)
	}
	if !made[s.meta.UID] {
		t.Errorf("the start took uid %d, none of those whose namespaces were made ahead", s.meta.UID)
	}
	if got := mustRun(t, p, h, "cat f && echo y > g && stat -c %u f g"); got != "x0\n0\n" {
		t.Errorf("the tree through views made with a namespace made ahead: %q", got)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if left := readyNS(); len(left) != 0 {
		t.Errorf("%d namespaces still held after Close", len(left))
	}
	if _, ok, _ := p.readyNS.take(false); ok {
		t.Error("a namespace taken after Close")
	}
}

// readyNSNow waits for the fill of namespaces that runs and lists those
// made ahead.
func readyNSNow(p *Provider) []readyID {
	p.readyNS.settle()
	p.readyNS.mu.Lock()
	defer p.readyNS.mu.Unlock()
	return append([]readyID(nil), p.readyNS.ready...)
}

// noDisks: sandboxes without disks of their own.
var noDisks = Options{Limits: Limits{DiskMB: -1}}

// Where sandboxes have no disks, starts a provider is told to expect
// find their namespaces made ahead (the seeds of a group that wait for
// their template's build): n expected on a fresh provider are made, n
// starts at once each take one of them, and n are kept ready after.
func TestExpectedStartsFindTheirNamespacesMade(t *testing.T) {
	p := newProvider(t, overlayContainer, noDisks)
	if p.readyNS == nil || p.disks != nil {
		t.Skip("SKIP: sandboxes here get no uid of their own")
	}
	p.ready.close() // none made in full: a start takes a namespace made ahead or makes its own
	const n = 4
	p.ExpectStarts(n)
	made := map[int]bool{}
	for _, r := range readyNSNow(p) {
		if r.nsfd < 0 || r.dir {
			t.Errorf("an id made ahead for an expected start: namespace %d, directory %v", r.nsfd, r.dir)
		}
		made[r.ids.uid] = true
	}
	if len(made) != n {
		t.Fatalf("%d namespaces made for %d expected starts", len(made), n)
	}
	var uids []int
	for _, h := range startAtOnce(t, p, n) {
		s, err := p.live(context.Background(), h, false)
		if err != nil {
			t.Fatal(err)
		}
		uids = append(uids, s.meta.UID)
	}
	for _, uid := range uids {
		if !made[uid] {
			t.Errorf("a start took uid %d, none of those whose namespaces were made for it", uid)
		}
	}
	if got := readyNSNow(p); len(got) != n {
		t.Errorf("%d namespaces ready after the group took its %d, want %d kept", len(got), n, n)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if left := readyNSNow(p); len(left) != 0 {
		t.Errorf("%d namespaces still held after Close", len(left))
	}
}

// startAtOnce starts n sandboxes at once.
func startAtOnce(t *testing.T, p *Provider, n int) []provider.Handle {
	t.Helper()
	hs := make([]provider.Handle, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h, err := p.Start(context.Background(), provider.Spec{})
			if err != nil {
				t.Error(err)
			}
			hs[i] = h
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	return hs
}

// Where sandboxes have disks, starts a provider is told to expect find
// ids made in full for them (directory, disk mounted): n expected on a
// fresh provider are made, n starts at once each take one, and then only
// the usual DefaultReadyIDs are kept (the loop devices of the others
// freed); Close removes what is left.
func TestExpectedStartsFindTheirDisksMade(t *testing.T) {
	p := newDiskProvider(t, overlayContainer, Limits{DiskMB: 8})
	const n = DefaultReadyIDs + 3
	p.ExpectStarts(n)
	made := map[string]bool{}
	for _, r := range readyNow(p) {
		if !r.dir || !isMountRoot(filepath.Join(p.readyDir(), r.id, diskDirName)) {
			t.Errorf("id %s made ahead for an expected start without its disk mounted", r.id)
		}
		made[r.id] = true
	}
	if len(made) != n {
		t.Fatalf("%d ids made in full for %d expected starts", len(made), n)
	}
	for _, h := range startAtOnce(t, p, n) {
		if !made[h.SandboxID] {
			t.Errorf("started %s, none of the ids made for the expected starts", h.SandboxID)
		}
	}
	if got := readyNow(p); len(got) != DefaultReadyIDs {
		t.Errorf("%d ids made in full ready after the expected starts came, want the usual %d", len(got), DefaultReadyIDs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if got := readyDirs(t, p); len(got) != 0 {
		t.Errorf("directories made ahead left after Close: %v", got)
	}
}

// A fill for expected starts asks for nsFillParallel at once, where
// sandboxes have disks (ids made in full) and where they have none
// (namespaces): each of them has taken its uid before any has its
// namespace.
func TestExpectedStartsAreMadeSeveralAtOnce(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
		fill func(p *Provider) *readyIDs
	}{
		{"disks", Options{Limits: Limits{DiskMB: 8}}, func(p *Provider) *readyIDs { return p.ready }},
		{"namespaces", noDisks, func(p *Provider) *readyIDs { return p.readyNS }},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newProvider(t, overlayContainer, c.opts)
			r := c.fill(p)
			if r == nil || p.uids == nil || (p.disks != nil) != (c.name == "disks") {
				t.Skip("SKIP: sandboxes here get no uid of their own, or no disk")
			}
			all, done := make(chan struct{}), make(chan struct{})
			var arrived atomic.Int64
			r.mu.Lock()
			r.taken = func() {
				if arrived.Add(1) == nsFillParallel {
					close(all)
				}
				select {
				case <-all:
				case <-done:
				}
			}
			r.mu.Unlock()
			t.Cleanup(func() { close(done) }) // before the provider's: Close waits for the fill
			p.ExpectStarts(2 * nsFillParallel)
			select {
			case <-all:
			case <-time.After(time.Minute): // a hang guard only
				t.Fatalf("%d being made at once, want %d", arrived.Load(), nsFillParallel)
			}
			r.settle()
			r.mu.Lock()
			defer r.mu.Unlock()
			if len(r.ready) != 2*nsFillParallel {
				t.Errorf("%d made for %d expected starts", len(r.ready), 2*nsFillParallel)
			}
		})
	}
}

// madeAhead counts the directories made ahead under p's root and the
// mounts under them (a disk each, and its views in overlay mode), after
// the fill that runs.
func madeAhead(t *testing.T, p *Provider) (ready, dirs, mounts int) {
	t.Helper()
	return len(readyNow(p)), len(readyDirs(t, p)), len(localtest.MountsUnder(t, p.readyDir()))
}

// Ids made in full for expected starts that will not come (their seeds
// cancelled or failed) are given back when the provider is told so:
// directory removed, disk unmounted; the usual DefaultReadyIDs stay. A
// cancellation while they are being made gives back what is made after
// it too.
func TestCancelledStartsGiveTheirDisksBack(t *testing.T) {
	p := newDiskProvider(t, overlayContainer, Limits{DiskMB: 8})
	const n = DefaultReadyIDs + 3
	p.ExpectStarts(n)
	ready, dirs, mounts := madeAhead(t, p)
	if ready != n || dirs != n || mounts < n {
		t.Fatalf("for %d expected starts: %d ready, %d directories, %d mounts", n, ready, dirs, mounts)
	}
	perID := mounts / n
	p.StartsCancelled(3)
	if ready, dirs, mounts := madeAhead(t, p); ready != DefaultReadyIDs || dirs != DefaultReadyIDs || mounts != DefaultReadyIDs*perID {
		t.Errorf("3 of %d expected starts cancelled: %d ready, %d directories, %d mounts; want %d, %d, %d",
			n, ready, dirs, mounts, DefaultReadyIDs, DefaultReadyIDs, DefaultReadyIDs*perID)
	}
	p.StartsCancelled(n - 3) // the rest, whose ids were the usual ones

	// Cancelled as they are made.
	p.ExpectStarts(n)
	p.StartsCancelled(n)
	if ready, dirs, mounts := madeAhead(t, p); ready != DefaultReadyIDs || dirs != DefaultReadyIDs || mounts != DefaultReadyIDs*perID {
		t.Errorf("%d expected starts cancelled at once: %d ready, %d directories, %d mounts; want %d, %d, %d",
			n, ready, dirs, mounts, DefaultReadyIDs, DefaultReadyIDs, DefaultReadyIDs*perID)
	}
	// A start that came took one and lowered what is kept for the rest.
	p.ExpectStarts(n)
	readyNow(p)
	start(t, p, provider.Spec{})
	p.StartsCancelled(1)
	if ready, dirs, _ := madeAhead(t, p); ready != n-2 || dirs != n-2 {
		t.Errorf("one of %d expected starts came, one cancelled: %d ready, %d directories; want %d", n, ready, dirs, n-2)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	noneMadeAhead(t, p, "Close")
}

// An id a fill was making when its expected start was cancelled is given
// back as soon as it is made (directory removed, disk unmounted), before
// the fill ends: the usual DefaultReadyIDs stay.
func TestAnIDMadeAfterItsStartWasCancelledIsGivenBack(t *testing.T) {
	p := newDiskProvider(t, overlayContainer, Limits{DiskMB: 8})
	p.ExpectStarts(DefaultReadyIDs)
	if ready, dirs, _ := madeAhead(t, p); ready != DefaultReadyIDs || dirs != DefaultReadyIDs {
		t.Fatalf("for %d expected starts: %d ready, %d directories", DefaultReadyIDs, ready, dirs)
	}
	_, _, mounts := madeAhead(t, p)
	// The one more made for the next expected start is held once it took
	// its uid until that start was cancelled.
	taken, release := make(chan struct{}), make(chan struct{})
	p.ready.taken = func() {
		close(taken)
		<-release
	}
	p.ExpectStarts(1)
	<-taken
	p.StartsCancelled(1)
	close(release)
	if ready, dirs, got := madeAhead(t, p); ready != DefaultReadyIDs || dirs != DefaultReadyIDs || got != mounts {
		t.Errorf("the expected start cancelled while its id was made: %d ready, %d directories, %d mounts; want %d, %d, %d",
			ready, dirs, got, DefaultReadyIDs, DefaultReadyIDs, mounts)
	}
	p.ready.taken = nil
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	noneMadeAhead(t, p, "Close")
}

// An id made in full with a namespace of its own has its views made
// ahead too (a start then only adds its image's); given back, its
// namespace's descriptor is closed.
func TestAnIDMadeAheadHasItsViewsAndGivesBackItsNamespace(t *testing.T) {
	p := newDiskProvider(t, overlayContainer, Limits{DiskMB: 8})
	if p.uids == nil || !p.overlay {
		t.Skip("SKIP: sandboxes here get no namespace of their own")
	}
	p.ExpectStarts(DefaultReadyIDs + 1)
	ready := readyNow(p)
	if len(ready) != DefaultReadyIDs+1 {
		t.Fatalf("%d ready for %d expected starts", len(ready), DefaultReadyIDs+1)
	}
	for _, r := range ready {
		if r.nsfd < 0 {
			t.Fatalf("%s made ahead without a namespace", r.id)
		}
		if views := localtest.MountsUnder(t, filepath.Join(p.readyDir(), r.id, viewsDirName)); len(views) == 0 {
			t.Errorf("%s made ahead without its views", r.id)
		}
	}
	last := ready[len(ready)-1]
	p.StartsCancelled(1)
	if _, err := unix.FcntlInt(uintptr(last.nsfd), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the namespace of %s, given back: fcntl of its descriptor %d: %v, want EBADF (closed)", last.id, last.nsfd, err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	noneMadeAhead(t, p, "Close")
}

// Ids made in full for expected starts that neither come nor are
// cancelled (a hint that outlived its seeds) are given back once
// expectedStartsTTL of the provider's clock passed since the last start
// was expected.
func TestExpectedStartsThatNeverComeAreGivenBack(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC))
	p := newProvider(t, overlayContainer, Options{Limits: Limits{DiskMB: 8}, Clock: clk})
	if p.disks == nil {
		t.Skipf("SKIP: the disk limit is not enforced here: %v", p.diskErr)
	}
	p.ExpectStarts(3)
	if ready, dirs, _ := madeAhead(t, p); ready != 3 || dirs != 3 {
		t.Fatalf("for 3 expected starts: %d ready, %d directories", ready, dirs)
	}
	clk.Advance(expectedStartsTTL - time.Second)
	p.ExpectStarts(1) // the bound runs from here
	if ready, dirs, _ := madeAhead(t, p); ready != 4 || dirs != 4 {
		t.Fatalf("for 4 expected starts: %d ready, %d directories", ready, dirs)
	}
	clk.Advance(2 * time.Second)
	if ready, dirs, _ := madeAhead(t, p); ready != 4 || dirs != 4 {
		t.Fatalf("within the bound of the last expected start: %d ready, %d directories, want 4", ready, dirs)
	}
	clk.Advance(expectedStartsTTL)
	if ready, dirs, mounts := madeAhead(t, p); ready != DefaultReadyIDs || dirs != DefaultReadyIDs || mounts == 0 {
		t.Errorf("past the bound: %d ready, %d directories, %d mounts; want the usual %d", ready, dirs, mounts, DefaultReadyIDs)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	noneMadeAhead(t, p, "Close")
}

// A server that died with ids made ahead for expected starts left their
// directories, disks mounted: the sweep (no server on the root) removes
// them; while the server holds the root it removes nothing of its.
func TestTheSweepRemovesWhatADeadServerMadeAhead(t *testing.T) {
	server := newProvider(t, overlayContainer, Options{Limits: Limits{DiskMB: 8}, Exclusive: true})
	if server.disks == nil {
		t.Skipf("SKIP: the disk limit is not enforced here: %v", server.diskErr)
	}
	server.ExpectStarts(DefaultReadyIDs + 2)
	readyNow(server)
	left := readyDirs(t, server)
	if len(left) != DefaultReadyIDs+2 {
		t.Fatalf("%d directories made ahead, want %d", len(left), DefaultReadyIDs+2)
	}
	sweeper := newProvider(t, overlayContainer, Options{Root: server.root, Limits: Limits{DiskMB: 8}})
	if removed, err := sweeper.SweepMadeAhead(); err != nil || len(removed) != 0 {
		t.Fatalf("the sweep while the server holds the root: removed %v, %v; want nothing", removed, err)
	}
	if d := cmp.Diff(left, readyDirs(t, server)); d != "" {
		t.Fatalf("the server's directories after the sweep (-before +after):\n%s", d)
	}
	// Nor does another provider's reap on the root.
	if _, err := sweeper.Reap(context.Background()); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(left, readyDirs(t, server)); d != "" {
		t.Fatalf("the server's directories after another provider's reap (-before +after):\n%s", d)
	}
	// The server dies: its lock goes with it, and nothing is given back.
	server.mu.Lock()
	lock := server.lock
	server.lock = nil
	server.mu.Unlock()
	if err := flock.Release(lock); err != nil {
		t.Fatal(err)
	}
	server.ready.mu.Lock()
	server.ready.ready = nil
	server.ready.mu.Unlock()

	removed, err := sweeper.SweepMadeAhead()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(left, removed); d != "" {
		t.Errorf("removed by the sweep (-left by the dead server +removed):\n%s", d)
	}
	noneMadeAhead(t, server, "the sweep")
}
