package owner_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sandbox"
)

func pool(size, refill int, idle time.Duration) cfgOpt {
	return func(c *owner.Config) {
		c.Pool = owner.PoolConfig{Size: size, RefillConcurrency: refill, MaxIdle: idle}
	}
}

// poolStarts counts the pools' starts that ended; wait(n) returns once n
// more have.
func poolStarts(o *owner.Owner) (wait func(n int)) {
	ended := make(chan struct{}, 1024)
	owner.SetPoolHook(o, func() { ended <- struct{}{} })
	return func(n int) {
		for range n {
			<-ended
		}
	}
}

// A seed claims a started sandbox of its spec's pool; the first misses and
// the pool fills behind it; each hit refills it. Pooled sandboxes are lent
// once: a group seeding at once gets as many sandboxes as seeds.
func TestPoolHitsAndRefills(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(4, 2, 0))
	wait := poolStarts(o)
	first := seed(t, o, "s0")
	wait(4)
	if st := o.PoolStats(); st != (owner.PoolStats{Misses: 1, Ready: 4}) {
		t.Fatalf("after the first seed: %+v", st)
	}
	ids := map[string]string{first.Handle.SandboxID: "s0"}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 1; i <= 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid := fmt.Sprintf("s%d", i)
			sb, err := o.StartSessionSandbox(context.Background(), sid, provider.Spec{Image: "notes"}, notesSetup("tok-"+sid), "")
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, ok := ids[sb.Handle.SandboxID]; ok {
				t.Errorf("%s and %s got the same sandbox %s", sid, other, sb.Handle.SandboxID)
			}
			ids[sb.Handle.SandboxID] = sid
		}()
	}
	wg.Wait()
	st := o.PoolStats()
	if st.Hits < 4 || st.Hits+st.Misses != 9 {
		t.Fatalf("stats %+v: want at least the 4 ready claimed, 9 seeds", st)
	}
	// Every session runs its own setup in its own sandbox.
	for _, sid := range []string{"s0", "s3", "s8"} {
		err := o.Do(context.Background(), sid, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
			b, err := p.ReadFile(ctx, sb.Handle, ".seed_token")
			if err == nil && string(b) != "tok-"+sid {
				err = fmt.Errorf("token %q", b)
			}
			return err
		})
		if err != nil {
			t.Errorf("%s: %v", sid, err)
		}
	}
	// Close stops the sessions' sandboxes and the pool's.
	if err := o.Close(); err != nil {
		t.Fatal(err)
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 {
		t.Fatalf("sandboxes left after Close: %v", live)
	}
}

// A sandbox that waits the idle time unclaimed is stopped, and its pool
// fills again only at the next claim; a sweep keeps what the pools hold.
func TestPoolIdleAndHoldings(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(2, 2, time.Minute))
	wait := poolStarts(o)
	s0 := seed(t, o, "s0")
	wait(2)
	held := holdings(t, o)
	var heldIDs []string
	for id := range held.Sandboxes {
		heldIDs = append(heldIDs, id)
	}
	slices.Sort(heldIDs)
	if d := cmp.Diff(e.fk.LiveSandboxIDs(), heldIDs); d != "" || len(heldIDs) != 3 {
		t.Fatalf("holdings: the session's and the pool's sandboxes (-live +held):\n%s", d)
	}
	o.PoolTick(e.clk.Now().Add(time.Minute - 1))
	if st := o.PoolStats(); st.Ready != 2 || st.Expired != 0 {
		t.Fatalf("before the idle time: %+v", st)
	}
	o.PoolTick(e.clk.Now().Add(time.Minute))
	if st := o.PoolStats(); st.Ready != 0 || st.Expired != 2 || st.Starting != 0 {
		t.Fatalf("after the idle time: %+v", st)
	}
	if d := cmp.Diff([]string{s0.Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
	seed(t, o, "s1")
	wait(2)
	if st := o.PoolStats(); st.Ready != 2 || st.Misses != 2 {
		t.Fatalf("after the next claim: %+v", st)
	}
}

// A keyed seed's pool holds forks of its template: a hit is a fork with
// the setup's data and files, and no setup runs for it.
func TestPoolOfATemplate(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(2, 1, 0))
	wait := poolStarts(o)
	var runs atomic.Int64
	first, err := seedTask(o, "a", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	wait(2)
	sb, err := seedTask(o, "b", &runs, "")
	if err != nil {
		t.Fatal(err)
	}
	if st := o.PoolStats(); st.Hits != 1 || st.Misses != 1 {
		t.Fatalf("stats %+v", st)
	}
	files, _ := e.fk.Files(sb.Handle.SandboxID)
	if runs.Load() != 1 || sb.FromSnapshot != first.FromSnapshot || string(sb.Data) != `{"task":"task-1"}` || files["/workspace/task.txt"] != "task-1" || sb.Workdir != first.Workdir {
		t.Fatalf("a pool hit: setups %d, %+v, files %v", runs.Load(), sb, files)
	}
	// Dropping the template stops its pool's forks before its snapshot
	// goes.
	wait(1)
	if err := o.EndSessionSandbox(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if err := o.EndSessionSandbox(context.Background(), "b"); err != nil {
		t.Fatal(err)
	}
	rep, err := o.ExpireTemplates(context.Background(), e.clk.Now().Add(1))
	if err != nil || len(rep.Deleted) != 1 {
		t.Fatalf("expiry %+v, %v", rep, err)
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 || o.PoolStats().Ready != 0 {
		t.Fatalf("the dropped template's pool left %v (%+v)", live, o.PoolStats())
	}
}

// After a crash, a fresh owner stops what the pools of the one before had
// started (they carry its incarnation).
func TestPoolAfterACrash(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(3, 3, 0))
	wait := poolStarts(o)
	seed(t, o, "s0")
	wait(3)
	o.Abandon()
	if n := len(e.fk.LiveSandboxIDs()); n != 4 {
		t.Fatalf("%d sandboxes live after the crash, want 4", n)
	}
	e.open()
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 {
		t.Fatalf("sandboxes left after the restart: %v", live)
	}
}

// A pool's start that fails after the provider made the sandbox (its id
// never reported) stops what the provider made, for an unkeyed pool's
// start and a template pool's fork alike.
func TestPoolStartFailingAfterItsEffectLeavesNothing(t *testing.T) {
	for name, tc := range map[string]struct {
		op   fake.Op
		seed func(t *testing.T, o *owner.Owner, sid string) sandbox.Sandbox
	}{
		"start": {fake.OpStart, seed},
		"fork": {fake.OpFork, func(t *testing.T, o *owner.Owner, sid string) sandbox.Sandbox {
			var runs atomic.Int64
			sb, err := seedTask(o, sid, &runs, "")
			if err != nil {
				t.Fatal(err)
			}
			return sb
		}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			o := e.open(pool(1, 1, 0))
			wait := poolStarts(o)
			s0 := tc.seed(t, o, "s0")
			wait(1)
			e.fk.FailAfterEffect(tc.op, 1)
			// The clean-up's listing sees its start still counted: Starting
			// 0 means no pool call is left in flight.
			var during atomic.Int64
			during.Store(-1)
			e.fk.SetHook(func(c fake.Call) {
				if c.Op == fake.OpList && c.Phase == fake.PhaseBegin {
					during.Store(int64(o.PoolStats().Starting))
				}
			})
			s1 := tc.seed(t, o, "s1")
			wait(1)
			if st := o.PoolStats(); st.Failed != 1 || st.Hits != 1 || st.Starting != 0 || during.Load() != 1 {
				t.Fatalf("stats %+v, starting during the clean-up %d: want the refill after the hit failed, counted until cleaned up", st, during.Load())
			}
			want := []string{s0.Handle.SandboxID, s1.Handle.SandboxID}
			slices.Sort(want)
			if d := cmp.Diff(want, e.fk.LiveSandboxIDs()); d != "" {
				t.Fatalf("live: the sessions' only (-want +got):\n%s", d)
			}
		})
	}
}

// A pooled sandbox's lease is renewed on the owner's tick once a third of
// it has passed, as a lent one's is; a seed claiming it gets the renewed
// lease; one whose renewal fails is stopped.
func TestPoolRenewsLeases(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(1, 1, 0), func(c *owner.Config) { c.DefaultTTL = 90 * time.Second })
	wait := poolStarts(o)
	t0 := e.clk.Now()
	s0 := seed(t, o, "s0")
	wait(1)
	pooledID := func() string {
		for _, id := range e.fk.LiveSandboxIDs() {
			if id != s0.Handle.SandboxID {
				return id
			}
		}
		t.Fatal("no pooled sandbox")
		return ""
	}
	p1 := pooledID()
	expiry := func(id string) time.Time {
		info, ok := e.fk.Sandbox(id)
		if !ok {
			t.Fatalf("%s is gone", id)
		}
		return info.ExpiresAt
	}
	if err := o.Tick(t0.Add(29 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := expiry(p1); !got.Equal(t0.Add(90 * time.Second)) {
		t.Fatalf("renewed before a third of its lease: expires %v", got)
	}
	if err := o.Tick(t0.Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if got := expiry(p1); !got.Equal(t0.Add(120 * time.Second)) {
		t.Fatalf("after a third of its lease: expires %v, want t0+120s", got)
	}
	s1 := seed(t, o, "s1")
	wait(1)
	if s1.Handle.SandboxID != p1 || !s1.ExpiresAt.Equal(t0.Add(120*time.Second)) {
		t.Fatalf("the claim got %s expiring %v, want %s at t0+120s", s1.Handle.SandboxID, s1.ExpiresAt, p1)
	}
	p2 := ""
	for _, id := range e.fk.LiveSandboxIDs() {
		if id != s0.Handle.SandboxID && id != s1.Handle.SandboxID {
			p2 = id
		}
	}
	e.fk.FailNext(fake.OpRenew, 1)
	o.PoolTick(t0.Add(30 * time.Second))
	if _, ok := e.fk.Sandbox(p2); ok || o.PoolStats().Expired != 1 || o.PoolStats().Ready != 0 {
		t.Fatalf("a pooled sandbox whose renewal failed: live %t, stats %+v", ok, o.PoolStats())
	}
}

// A seed that finds its pool empty starts a sandbox of its own; when that
// start fails after the provider made the sandbox, it is stopped, as the
// pool's own start that failed alike is.
func TestPoolMissStartFailingAfterItsEffectLeavesNothing(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(1, 1, 0))
	wait := poolStarts(o)
	// The seed's start and the refill its miss begins both fail after
	// their effect, in whichever order they reach the provider.
	e.fk.FailAfterEffect(fake.OpStart, 2)
	if _, err := o.StartSessionSandbox(context.Background(), "s0", provider.Spec{Image: "notes"}, notesSetup("tok"), ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected start failure", err)
	}
	wait(1)
	if st := o.PoolStats(); st.Misses != 1 || st.Failed != 1 {
		t.Fatalf("stats %+v: want one miss and its refill failed", st)
	}
	if live := e.fk.LiveSandboxIDs(); len(live) != 0 {
		t.Fatalf("live %v, want none", live)
	}
}

// The owner's own loop, on the injected clock, stops a pooled sandbox
// unclaimed for the pools' idle time: it checks every quarter of it.
func TestPoolIdleLoopStopsWhatWaitedUnclaimed(t *testing.T) {
	e := newEnv(t)
	stopped := make(chan string, 4)
	o := e.open(pool(1, 1, time.Minute))
	wait := poolStarts(o)
	s0 := seed(t, o, "s0")
	wait(1)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpStop && c.Phase == fake.PhaseEnd {
			stopped <- c.SandboxID
		}
	})
	for range 4 {
		e.clk.WaitPending(1, nil) // the loop waits on its timer
		e.clk.Advance(15 * time.Second)
	}
	select {
	case id := <-stopped:
		if id == s0.Handle.SandboxID {
			t.Fatalf("the loop stopped the session's sandbox %s", id)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("the pooled sandbox idle for a minute was not stopped")
	}
	if d := cmp.Diff([]string{s0.Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
}

// Without a pool size there are no pools: a seed starts its own sandbox
// and nothing is counted.
func TestNoPoolsWithoutASize(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(0, 1, time.Minute))
	seed(t, o, "s0")
	if st := o.PoolStats(); st != (owner.PoolStats{}) {
		t.Fatalf("stats without pools: %+v", st)
	}
	if n := len(e.fk.LiveSandboxIDs()); n != 1 {
		t.Fatalf("%d sandboxes live, want the session's only", n)
	}
}

// A sandbox claimed from a pool is held by its session, and once that
// session ended it is no longer among what the owner holds.
func TestAClaimedSandboxLeavesTheHoldingsWithItsSession(t *testing.T) {
	e := newEnv(t)
	o := e.open(pool(1, 1, 0))
	wait := poolStarts(o)
	seed(t, o, "s0")
	wait(1)
	s1 := seed(t, o, "s1")
	wait(1)
	if o.PoolStats().Hits != 1 {
		t.Fatalf("s1 missed the pool: %+v", o.PoolStats())
	}
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	held := holdings(t, o)
	if held.Sandboxes[s1.Handle.SandboxID] || len(held.Sandboxes) != 2 {
		t.Fatalf("holdings %v: want s0's and the pool's, not the ended s1's %s", held.Sandboxes, s1.Handle.SandboxID)
	}
}

// A start that fails after the provider made its sandbox stops that
// sandbox only: another server's sandbox on the same provider, numbered
// alike, stays.
func TestAFailedStartStopsOnlyItsOwnersSandbox(t *testing.T) {
	e := newEnv(t)
	other := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.Name = "other"; c.Incarnation = "other" })
	kept := seed(t, other, "s0")
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false; c.Incarnation = "this" })
	e.fk.FailAfterEffect(fake.OpStart, 1)
	if _, err := o.StartSessionSandbox(context.Background(), "s0", provider.Spec{Image: "notes"}, notesSetup("tok"), ""); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected start failure", err)
	}
	if d := cmp.Diff([]string{kept.Handle.SandboxID}, e.fk.LiveSandboxIDs()); d != "" {
		t.Fatalf("live (-want +got):\n%s", d)
	}
}

// When the listing that looks for a failed start's sandbox fails too, the
// sandbox is left for the next start or sweep, and the operator is told.
func TestAFailedStartWhoseListingFailsIsToldOf(t *testing.T) {
	const warning = "listing sandboxes after a failed start failed"
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.Checkpoint.Enabled = false })
	e.fk.FailAfterEffect(fake.OpStart, 1)
	e.fk.FailNext(fake.OpList, 1)
	if _, err := o.StartSessionSandbox(context.Background(), "s0", provider.Spec{}, nil, "/w"); !errors.Is(err, provider.ErrInjected) {
		t.Fatalf("got %v, want the injected start failure", err)
	}
	if n := len(e.fk.LiveSandboxIDs()); n != 1 || warnings(e.hook, warning) != 1 {
		t.Fatalf("%d sandboxes live, %d warnings; want the one made, told once", n, warnings(e.hook, warning))
	}
}
