package owner_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

// keyedSetup writes the task's file and returns it as session data; it
// counts its runs, and each run first waits for release (closed: no wait).
func keyedSetup(task string, runs *atomic.Int64, release <-chan struct{}, fail error) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		runs.Add(1)
		<-release
		if fail != nil {
			return nil, fail
		}
		if err := p.WriteFile(ctx, sb.Handle, "task.txt", []byte(task)); err != nil {
			return nil, err
		}
		return json.RawMessage(fmt.Sprintf(`{"task":%q}`, task)), nil
	}
}

var keyedSpec = provider.Spec{Image: "swe"}

// seedGroup seeds n sessions of key at once, the first one's setup held
// until the other n-1 wait for its build; it returns each seed's sandbox
// and error by session.
func seedGroup(t *testing.T, o *owner.Owner, key string, n int, setup func(release <-chan struct{}) sandbox.SetupFunc) (map[string]sandbox.Sandbox, map[string]error) {
	t.Helper()
	release := make(chan struct{})
	var waiting atomic.Int64
	owner.SetTemplateWaitHook(o, func() {
		if waiting.Add(1) == int64(n-1) {
			close(release)
		}
	})
	defer owner.SetTemplateWaitHook(o, nil)
	if n == 1 {
		close(release)
	}
	sbs, errs := map[string]sandbox.Sandbox{}, map[string]error{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		sid := fmt.Sprintf("%s-s%d", key, i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := o.StartKeyedSessionSandbox(context.Background(), sid, key, keyedSpec, setup(release), "")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[sid] = err
				return
			}
			sbs[sid] = sb
		}()
	}
	wg.Wait()
	return sbs, errs
}

// A group of 8 seeds of one key runs the setup once: every seed is a fork
// of one template with the setup's session data and files, and the sandbox
// the setup ran in is stopped.
func TestKeyedGroupRunsSetupOnce(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	sbs, errs := seedGroup(t, o, "task-1", 8, func(release <-chan struct{}) sandbox.SetupFunc {
		return keyedSetup("task-1", &runs, release, nil)
	})
	if len(errs) != 0 {
		t.Fatalf("seeds failed: %v", errs)
	}
	if runs.Load() != 1 || o.TemplateSetups() != 1 {
		t.Fatalf("setups run = %d (owner counts %d), want 1", runs.Load(), o.TemplateSetups())
	}
	snaps := map[string]bool{}
	var live []string
	for sid, sb := range sbs {
		snaps[sb.FromSnapshot] = true
		live = append(live, sb.Handle.SandboxID)
		if string(sb.Data) != `{"task":"task-1"}` {
			t.Errorf("%s: data %s", sid, sb.Data)
		}
		if sb.Workdir == "" {
			t.Errorf("%s: no workdir", sid)
		}
		files, _ := e.fk.Files(sb.Handle.SandboxID)
		if files["/workspace/task.txt"] != "task-1" {
			t.Errorf("%s: the fork lacks the setup's file: %v", sid, files)
		}
	}
	if len(snaps) != 1 || snaps[""] {
		t.Fatalf("forked from %v, want one template", snaps)
	}
	slices.Sort(live)
	if d := cmp.Diff(live, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live sandboxes: the template's builder still runs (-sessions' +live):\n%s", d)
	}
	ts, err := o.Index().Templates()
	if err != nil || len(ts) != 1 || !snaps[ts[0].SnapshotID] {
		t.Fatalf("index templates = %+v, %v", ts, err)
	}
	// Another key is another template; the same key later forks at once.
	if _, errs := seedGroup(t, o, "task-2", 1, func(release <-chan struct{}) sandbox.SetupFunc {
		return keyedSetup("task-2", &runs, release, nil)
	}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if _, err := seedTask(o, "late", &runs, ""); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 || o.Templates() != 2 {
		t.Fatalf("setups = %d, templates = %d; want 2, 2", runs.Load(), o.Templates())
	}
}

// expecting is the fake provider told of the starts the owner expects,
// and of those that will not come.
type expecting struct {
	*fake.Provider
	mu        sync.Mutex
	told      []int
	cancelled int
}

func (x *expecting) Capabilities() provider.Capabilities {
	c := x.Provider.Capabilities()
	c.StartsExpecter = x
	return c
}

func (x *expecting) ExpectStarts(n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.told = append(x.told, n)
}

func (x *expecting) StartsCancelled(n int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.cancelled += n
}

// counts are the starts told to expect, in all, and those cancelled.
func (x *expecting) counts() (told, cancelled int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, n := range x.told {
		told += n
	}
	return told, x.cancelled
}

// Each seed that waits for its template's build tells the provider that
// one more fork will come once it is built (the first also the builder's
// own), so that the provider makes ahead what each fork needs; a seed
// that forks a template built already tells nothing, and forks that came
// cancel nothing.
func TestSeedsWaitingForABuildAreExpectedByTheProvider(t *testing.T) {
	e := newEnv(t)
	x := &expecting{Provider: e.fk}
	o := e.open(func(c *owner.Config) { c.Provider = x })
	var runs atomic.Int64
	if _, errs := seedGroup(t, o, "task-1", 5, func(release <-chan struct{}) sandbox.SetupFunc {
		return keyedSetup("task-1", &runs, release, nil)
	}); len(errs) != 0 {
		t.Fatal(errs)
	}
	if _, err := seedTask(o, "late", &runs, ""); err != nil {
		t.Fatal(err)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	slices.Sort(x.told)
	if d := cmp.Diff([]int{1, 1, 1, 2}, x.told); d != "" {
		t.Errorf("starts the provider was told to expect (-want +got):\n%s", d)
	}
	if x.cancelled != 0 {
		t.Errorf("%d expected starts cancelled, though every seed forked", x.cancelled)
	}
}

// A seed the provider was told to expect a fork of, and that will not
// fork, tells it so: every seed of a group whose build failed (the
// builder's own fork included), and a waiting seed whose context ended;
// the builder of a group whose waiters left still forks, and cancels
// nothing. (The provider gives back what it made for them: see
// provider/local's TestCancelledStartsGiveTheirDisksBack.)
func TestSeedsThatWillNotForkCancelTheirExpectedStarts(t *testing.T) {
	e := newEnv(t)
	x := &expecting{Provider: e.fk}
	o := e.open(func(c *owner.Config) { c.Provider = x })
	var runs atomic.Int64
	boom := errors.New("clone failed: exit 128")
	if _, errs := seedGroup(t, o, "task-1", 5, func(release <-chan struct{}) sandbox.SetupFunc {
		return keyedSetup("task-1", &runs, release, boom)
	}); len(errs) != 5 {
		t.Fatalf("%d of 5 seeds failed, want all", len(errs))
	}
	if told, cancelled := x.counts(); told != 5 || cancelled != 5 {
		t.Fatalf("a failed build: %d starts told, %d cancelled; want 5, 5", told, cancelled)
	}

	// The builder holds its setup until two waiters came and left.
	release, building := make(chan struct{}), make(chan struct{})
	setup := func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		close(building)
		<-release
		return json.RawMessage(`{}`), nil
	}
	built := make(chan error, 1)
	go func() {
		_, err := o.StartKeyedSessionSandbox(context.Background(), "builder", "task-2", keyedSpec, setup, "")
		built <- err
	}()
	<-building
	waiting := make(chan struct{}, 2)
	owner.SetTemplateWaitHook(o, func() { waiting <- struct{}{} })
	defer owner.SetTemplateWaitHook(o, nil)
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, err := o.StartKeyedSessionSandbox(ctx, fmt.Sprintf("waiter-%d", i), "task-2", keyedSpec, setup, "")
			left <- err
		}()
	}
	<-waiting
	<-waiting
	cancel()
	for range 2 {
		if err := <-left; !errors.Is(err, context.Canceled) {
			t.Errorf("a waiter whose context ended: %v, want context.Canceled", err)
		}
	}
	close(release)
	if err := <-built; err != nil {
		t.Fatal(err)
	}
	if told, cancelled := x.counts(); told != 5+3 || cancelled != 5+2 {
		t.Fatalf("two waiters left, the builder forked: %d starts told, %d cancelled in all; want 8, 7", told, cancelled)
	}
}

// A seed that waited for the build, and then claims a fork from the
// template's warm pool instead of forking, cancels the start the provider
// was told to expect of it: the pool's fork was made without it. A seed
// the pool serves that never waited cancels nothing.
func TestASeedThePoolServesAfterWaitingCancelsItsExpectedStart(t *testing.T) {
	e := newEnv(t)
	x := &expecting{Provider: e.fk}
	o := e.open(func(c *owner.Config) { c.Provider = x }, pool(2, 2, 0))
	poolWait := poolStarts(o)
	var runs atomic.Int64
	release := make(chan struct{})
	building := make(chan struct{})
	setup := func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		close(building)
		return keyedSetup("task-1", &runs, release, nil)(ctx, p, sb)
	}
	built := make(chan error, 1)
	go func() {
		_, err := o.StartKeyedSessionSandbox(context.Background(), "builder", "task-1", keyedSpec, setup, "")
		built <- err
	}()
	<-building
	// The waiter, once it waits, lets the build end and holds on until the
	// builder forked (a pool miss) and the pool filled behind it; then it
	// wakes to a pool with forks ready.
	owner.SetTemplateWaitHook(o, func() {
		close(release)
		if err := <-built; err != nil {
			t.Error(err)
		}
		poolWait(2)
	})
	defer owner.SetTemplateWaitHook(o, nil)
	sb, err := o.StartKeyedSessionSandbox(context.Background(), "waiter", "task-1", keyedSpec, setup, "")
	if err != nil {
		t.Fatal(err)
	}
	if st := o.PoolStats(); st.Hits != 1 || st.Misses != 1 || string(sb.Data) != `{"task":"task-1"}` {
		t.Fatalf("the waiter: %+v, pool %+v; want a pool hit after the builder's miss", sb, st)
	}
	if told, cancelled := x.counts(); told != 2 || cancelled != 1 {
		t.Fatalf("the builder forked, the waiter claimed: %d starts told, %d cancelled; want 2, 1", told, cancelled)
	}
	// A seed of the built template claims from the pool without waiting:
	// it was never expected, and cancels nothing.
	if _, err := seedTask(o, "late", &runs, ""); err != nil {
		t.Fatal(err)
	}
	if st := o.PoolStats(); st.Hits != 2 {
		t.Fatalf("the late seed: pool %+v; want a second hit", st)
	}
	if told, cancelled := x.counts(); told != 2 || cancelled != 1 {
		t.Fatalf("a late seed the pool served: %d starts told, %d cancelled; want 2, 1", told, cancelled)
	}
}

// seedTask seeds sid with task-1's keyed setup, which does not wait,
// counting its runs in runs.
func seedTask(o *owner.Owner, sid string, runs *atomic.Int64, workdir string) (sandbox.Sandbox, error) {
	return o.StartKeyedSessionSandbox(context.Background(), sid, "task-1", keyedSpec, keyedSetup("task-1", runs, closed(), nil), workdir)
}

func closed() <-chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// A setup that fails fails every seed that waited for it with its error,
// and nothing is kept: no template, no sandbox; the next seed builds again.
func TestKeyedSetupFailureFailsTheGroup(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	boom := errors.New("clone failed: exit 128")
	_, errs := seedGroup(t, o, "task-1", 8, func(release <-chan struct{}) sandbox.SetupFunc {
		return keyedSetup("task-1", &runs, release, boom)
	})
	if len(errs) != 8 || runs.Load() != 1 {
		t.Fatalf("%d seeds failed after %d setups, want 8 after 1", len(errs), runs.Load())
	}
	for sid, err := range errs {
		if !errors.Is(err, boom) || !errors.Is(err, sandbox.ErrSetup) {
			t.Errorf("%s: %v, want the setup's error", sid, err)
		}
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 {
		t.Fatalf("sandboxes left: %v", live)
	}
	if ts, _ := o.Index().Templates(); len(ts) != 0 || o.Templates() != 0 {
		t.Fatalf("a failed setup was kept: %+v", ts)
	}
	if _, err := seedTask(o, "again", &runs, ""); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 {
		t.Fatalf("setups = %d, want 2 (built again)", runs.Load())
	}
}

// A fresh owner on the same index forks the templates of the one before
// without running their setup; an unused template expires (out of the
// index, its snapshot deleted) and the next seed builds it again.
func TestTemplatesOutliveTheOwnerAndExpire(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "/w")
	if err != nil {
		t.Fatal(err)
	}
	tmpl := sb.FromSnapshot
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := e.open()
	sb2, err := seedTask(o2, "b", &runs, "/w")
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 1 || sb2.FromSnapshot != tmpl || sb2.Workdir != "/w" || string(sb2.Data) != `{"task":"task-1"}` {
		t.Fatalf("after a restart: setups %d, fork of %q (want %q), workdir %q, data %s", runs.Load(), sb2.FromSnapshot, tmpl, sb2.Workdir, sb2.Data)
	}
	// Used at the clock's now: a cut at now keeps it, a later one drops it
	// (no fork stands on it once b ends).
	if err := o2.EndSessionSandbox(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	rep, err := o2.ExpireTemplates(context.Background(), e.clk.Now())
	if err != nil || len(rep.Dropped) != 0 {
		t.Fatalf("expire at the last use: %+v, %v", rep, err)
	}
	rep, err = o2.ExpireTemplates(context.Background(), e.clk.Now().Add(1))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(owner.TemplateExpiry{Dropped: []string{rep.Dropped[0]}, Deleted: []string{tmpl}, Failed: map[string]string{}}, rep); d != "" {
		t.Fatalf("expiry (-want +got):\n%s", d)
	}
	if _, ok := e.fk.SnapshotInfo(tmpl); ok {
		t.Fatal("the expired template's snapshot is still there")
	}
	if ts, _ := o2.Index().Templates(); len(ts) != 0 {
		t.Fatalf("index still has %+v", ts)
	}
	if tomb, _ := o2.Index().Tombstones(); len(tomb) != 0 {
		t.Fatalf("tombstones left: %+v", tomb)
	}
	if _, err := seedTask(o2, "c", &runs, "/w"); err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 {
		t.Fatalf("setups = %d, want 2", runs.Load())
	}
}

// A template whose snapshot was deleted behind the owner's back is built
// again by the seed that finds it gone.
func TestTemplateLostIsBuiltAgain(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := e.fk.DeleteSnapshot(context.Background(), sb.FromSnapshot); err != nil {
		t.Fatal(err)
	}
	sb2, err := seedTask(o, "b", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	if runs.Load() != 2 || sb2.FromSnapshot == sb.FromSnapshot || sb2.FromSnapshot == "" {
		t.Fatalf("setups %d, forked from %q then %q", runs.Load(), sb.FromSnapshot, sb2.FromSnapshot)
	}
}

// Without an index the templates last until Close, which deletes them;
// an empty key is an ordinary seed.
func TestTemplatesWithoutIndex(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false })
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	plain, err := o.StartKeyedSessionSandbox(context.Background(), "b", "", keyedSpec, keyedSetup("task-1", &runs, closed(), nil), "")
	if err != nil {
		t.Fatal(err)
	}
	if plain.FromSnapshot != "" || runs.Load() != 2 || o.TemplateSetups() != 1 {
		t.Fatalf("an unkeyed seed: from %q, setups %d (templates %d)", plain.FromSnapshot, runs.Load(), o.TemplateSetups())
	}
	if rep, err := o.ExpireTemplates(context.Background(), e.clk.Now().Add(1)); err != nil || len(rep.Dropped) != 0 {
		t.Fatalf("an owner without an index expired %+v, %v", rep, err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if ids := e.fk.SnapshotIDs(); slices.Contains(ids, sb.FromSnapshot) {
		t.Fatalf("Close left the template %s: %v", sb.FromSnapshot, ids)
	}
}

// A release after a restart keeps the templates an earlier run built,
// though no checkpoint names them: it takes only the leftovers of earlier
// runs that nothing accounts for.
func TestReleaseKeepsTemplatesOfEarlierRuns(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	o2 := e.open()
	if _, err := o2.Release(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(e.fk.SnapshotIDs(), sb.FromSnapshot) {
		t.Fatalf("the release took the template %s as a leftover", sb.FromSnapshot)
	}
	if _, err := seedTask(o2, "b", &runs, ""); err != nil || runs.Load() != 1 {
		t.Fatalf("after the release: %v, setups %d", err, runs.Load())
	}
}

// A template dropped while a fork stands on it is a pending delete: out of
// the index, its snapshot tombstoned and kept until the fork ends.
func TestTemplateExpiryWithAForkLive(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	rep, err := o.ExpireTemplates(context.Background(), e.clk.Now().Add(1))
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{sb.FromSnapshot}, rep.Deferred); d != "" || len(rep.Deleted) != 0 || len(rep.Dropped) != 1 {
		t.Fatalf("expiry %+v (-want deferred +got):\n%s", rep, d)
	}
	tomb, err := o.Index().Tombstones()
	if err != nil || len(tomb) != 1 || tomb[0].SnapshotID != sb.FromSnapshot || tomb[0].Reason != "template unused" {
		t.Fatalf("tombstones %+v, %v", tomb, err)
	}
	if !slices.Contains(e.fk.SnapshotIDs(), sb.FromSnapshot) || o.Templates() != 0 {
		t.Fatalf("the snapshot a fork stands on is gone, or the template still ready (%d)", o.Templates())
	}
}

// A template's start that fails after the provider made its sandbox (its
// id never reported) stops what the provider made, and the seed fails.
func TestTemplateStartFailingAfterItsEffectLeavesNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	e.fk.FailAfterEffect(fake.OpStart, 1)
	var runs atomic.Int64
	if _, err := seedTask(o, "a", &runs, ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected start failure", err)
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 || runs.Load() != 0 {
		t.Fatalf("left %v after a failed template start (setups %d)", live, runs.Load())
	}
}

// A template's snapshot whose call failed after its effect is found by its
// tag and deleted with the build's intent: the seed fails and nothing is
// left.
func TestTemplateSnapshotFailingAfterItsEffectLeavesNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	e.fk.FailAfterEffect(fake.OpSnapshot, 1)
	var runs atomic.Int64
	if _, err := seedTask(o, "a", &runs, ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected snapshot failure", err)
	}
	ins, err := o.Index().Intents("")
	if snaps := e.fk.SnapshotIDs(); len(snaps) != 0 || len(e.fk.LiveSandboxIDs()) != 0 || err != nil || !onlyRoundsOf(ins, o) {
		t.Fatalf("left snapshots %v, sandboxes %v, intents %v (%v)", snaps, e.fk.LiveSandboxIDs(), ins, err)
	}
}

// A crash between a template's snapshot and its record leaves an intent
// naming the snapshot's tag: the next start deletes the snapshot.
func TestTemplateBuildCutByACrash(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	crashed := make(chan struct{})
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseEnd {
			e.fk.SetHook(nil)
			o.Abandon()
			close(crashed)
		}
	})
	go func() {
		_, _ = seedTask(o, "a", &runs, "")
	}()
	<-crashed
	if len(e.fk.SnapshotIDs()) != 1 {
		t.Fatalf("snapshots after the crash: %v", e.fk.SnapshotIDs())
	}
	o2 := e.open()
	ts, err := o2.Index().Templates()
	if snaps := e.fk.SnapshotIDs(); len(snaps) != 0 || err != nil || len(ts) != 0 {
		t.Fatalf("after the restart: snapshots %v, templates %v (%v)", snaps, ts, err)
	}
}

// A keyed seed's fork that fails after the provider made it stops what the
// provider made; the seed fails, and the template stays.
func TestKeyedForkFailingAfterItsEffectLeavesNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	a, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	e.fk.FailAfterEffect(fake.OpFork, 1)
	if _, err := seedTask(o, "b", &runs, ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected fork failure", err)
	}
	if d := cmp.Diff([]string{a.Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" || o.Templates() != 1 {
		t.Fatalf("templates %d; live (-want +got):\n%s", o.Templates(), d)
	}
}

// A template's record names the workdir its seeds start in: the one the
// seeds give, else the pwd of the sandbox it was built in (the fake's
// /workspace), so that a restarted owner's forks start there too.
func TestTemplateRecordNamesItsWorkdir(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	var runs atomic.Int64
	if _, err := seedTask(o, "a", &runs, "/w"); err != nil {
		t.Fatal(err)
	}
	if _, err := seedTask(o, "b", &runs, ""); err != nil {
		t.Fatal(err)
	}
	ts, err := o.Index().Templates()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tm := range ts {
		got = append(got, tm.Workdir)
	}
	slices.Sort(got)
	if d := cmp.Diff([]string{"/w", "/workspace"}, got); d != "" {
		t.Fatalf("the templates' workdirs (-want +got):\n%s", d)
	}
}

// A template's sandbox that cannot be stopped after its snapshot is left
// for the next start or the sweep, and the operator is told; its seeds
// still fork the template.
func TestTemplateSandboxNotStoppedIsLogged(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	e.fk.FailNext(fake.OpStop, provider.StopAttempts)
	var runs atomic.Int64
	sb, err := seedTask(o, "a", &runs, "/w")
	if err != nil {
		t.Fatal(err)
	}
	var warned []string
	for _, en := range e.hook.AllEntries() {
		if en.Level == logrus.WarnLevel {
			warned = append(warned, en.Message)
		}
	}
	if d := cmp.Diff([]string{"could not stop a template's sandbox; the next start or sweep stops it"}, warned); d != "" {
		t.Fatalf("warnings (-want +got):\n%s", d)
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 2 || sb.FromSnapshot == "" {
		t.Fatalf("live sandboxes %v (want the fork %s and the template's), fork of %q", live, sb.Handle.SandboxID, sb.FromSnapshot)
	}
}
