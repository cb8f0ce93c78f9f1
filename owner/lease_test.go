package owner_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestOwnerRenewsTheLeasesItHolds: a sandbox with a TTL outlives it when the
// owner ticks past a third of it; one the owner no longer holds is reaped.
func TestOwnerRenewsTheLeasesItHolds(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	renewed := make(chan string, 4)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpRenew && c.Phase == fake.PhaseEnd && c.Err == nil {
			renewed <- c.SandboxID
		}
	})
	sb, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{TTLSeconds: 100}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	// Not due yet: nothing is renewed.
	e.clk.Advance(10 * time.Second)
	if err := o.Tick(e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(50 * time.Second) // 60 s of 100: past a third
	if err := o.Tick(e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-renewed:
		if got != sb.Handle.SandboxID {
			t.Fatalf("renewed %s, want %s", got, sb.Handle.SandboxID)
		}
	case <-time.After(time.Minute):
		t.Fatal("no renewal past a third of the lease")
	}
	if n := e.fk.Stats().Calls[fake.OpRenew]; n != 1 {
		t.Fatalf("%d renewals, want exactly 1 (the first tick was not due)", n)
	}
	e.clk.Advance(60 * time.Second) // 120 s: the original lease is over
	if reaped := e.fk.Reap(); len(reaped) != 0 {
		t.Fatalf("a renewed sandbox was reaped: %v", reaped)
	}
	if _, err := o.RequireSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	// A sandbox nobody renews is reaped once its TTL has passed.
	other, err := e.fk.Start(context.Background(), provider.Spec{TTLSeconds: 100})
	if err != nil {
		t.Fatal(err)
	}
	e.clk.Advance(101 * time.Second)
	reaped := e.fk.Reap()
	found := false
	for _, id := range reaped {
		found = found || id == other.SandboxID
	}
	if !found {
		t.Fatalf("the sandbox nobody renews was not reaped: %v", reaped)
	}
}

// TestDefaultTTLIsRenewedAtAThird: a spec without a TTL gets the provider's
// lease (Config.DefaultTTL), and the owner renews it once a third of it has
// passed.
func TestDefaultTTLIsRenewedAtAThird(t *testing.T) {
	e := newEnv(t)
	o := e.open(func(c *owner.Config) { c.DefaultTTL = 90 * time.Second })
	sb, err := o.StartSessionSandbox(context.Background(), "s1", provider.Spec{}, nil, "")
	if err != nil {
		t.Fatal(err)
	}
	if sb.Spec.TTLSeconds != 90 {
		t.Fatalf("spec TTL %v, want the default 90", sb.Spec.TTLSeconds)
	}
	info, _ := e.fk.Sandbox(sb.Handle.SandboxID)
	if want := e.clk.Now().Add(90 * time.Second); !info.ExpiresAt.Equal(want) {
		t.Fatalf("expires %v, want %v", info.ExpiresAt, want)
	}
	e.clk.Advance(29 * time.Second) // under a third
	if err := o.Tick(e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	if n := e.fk.Stats().Calls[fake.OpRenew]; n != 0 {
		t.Fatalf("%d renewals before a third of the lease", n)
	}
	renewed := make(chan struct{}, 1)
	e.fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpRenew && c.Phase == fake.PhaseEnd && c.Err == nil {
			renewed <- struct{}{}
		}
	})
	e.clk.Advance(2 * time.Second) // 31 s of 90: past a third
	if err := o.Tick(e.clk.Now()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-renewed:
	case <-time.After(time.Minute):
		t.Fatal("no renewal past a third of the lease")
	}
}
