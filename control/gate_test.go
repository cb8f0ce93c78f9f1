package control_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/racebuild"
)

// waitUntil blocks until cond holds, woken by the gate's changes.
func waitUntil(g *control.Gate, cond func() bool) {
	for {
		ch := g.Changed()
		if cond() {
			return
		}
		<-ch
	}
}

func TestGateCountsPerSession(t *testing.T) {
	notified := 0
	g := control.NewGate(func() { notified++ })
	a1, err := g.Enter(ctx, control.Entry{Session: "s1", Label: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	a2, _ := g.Enter(ctx, control.Entry{Session: "s1", Label: "r1"})
	b, _ := g.Enter(ctx, control.Entry{Session: "s2", Label: "r2-a1"})
	if g.Inflight() != 3 || g.InflightOf("s1") != 2 {
		t.Fatalf("inflight %d, s1 %d", g.Inflight(), g.InflightOf("s1"))
	}
	if diff := cmp.Diff([]string{"r1", "r2-a1"}, g.Busy()); diff != "" {
		t.Errorf("busy (-want +got):\n%s", diff)
	}
	a1()
	a1() // leaving twice counts once
	a2()
	b()
	if g.Inflight() != 0 || len(g.Busy()) != 0 || notified != 3 {
		t.Fatalf("after leaving: inflight %d busy %v notified %d", g.Inflight(), g.Busy(), notified)
	}
}

// A request without a label counts for its session and in Inflight, but is
// neither a blocker nor Blocking. The unlabelled session has two in flight
// and the labelled one one, so that counting the wrong ones shows.
func TestGateUnlabelledRequestsBlockNothing(t *testing.T) {
	g := control.NewGate(nil)
	a, _ := g.Enter(ctx, control.Entry{Session: "s1"})
	a2, _ := g.Enter(ctx, control.Entry{Session: "s1"})
	b, _ := g.Enter(ctx, control.Entry{Session: "s2", Label: "r2"})
	if g.Inflight() != 3 || g.InflightOf("s1") != 2 || g.Blocking() != 1 {
		t.Fatalf("inflight %d, s1 %d, blocking %d; want 3, 2, 1", g.Inflight(), g.InflightOf("s1"), g.Blocking())
	}
	if diff := cmp.Diff([]string{"r2"}, g.Busy()); diff != "" {
		t.Errorf("busy (-want +got):\n%s", diff)
	}
	a()
	a2()
	b()
	if g.Blocking() != 0 {
		t.Errorf("blocking %d after both left", g.Blocking())
	}
}

func TestGateWaitsWhileClosed(t *testing.T) {
	g := control.NewGate(nil)
	g.Close()
	// A request that need not wait is admitted at once.
	leave, err := g.Enter(ctx, control.Entry{Session: "s0"})
	if err != nil {
		t.Fatal(err)
	}
	leave()
	admitted := make(chan func())
	go func() {
		leave, err := g.Enter(ctx, control.Entry{Session: "s1", Wait: true})
		if err != nil {
			t.Errorf("enter: %v", err)
		}
		admitted <- leave
	}()
	waitUntil(g, func() bool { return g.Waiting() == 1 })
	if g.Inflight() != 0 {
		t.Fatal("a waiting request is counted in flight")
	}
	g.Open()
	(<-admitted)()
	if g.Waiting() != 0 {
		t.Errorf("waiting %d after the gate opened", g.Waiting())
	}
}

func TestGateShutdownReleasesWaiters(t *testing.T) {
	g := control.NewGate(nil)
	g.Close()
	errc := make(chan error)
	go func() {
		_, err := g.Enter(ctx, control.Entry{Session: "s1", Wait: true})
		errc <- err
	}()
	waitUntil(g, func() bool { return g.Waiting() == 1 })
	g.Shutdown()
	wantCode(t, <-errc, control.ErrShuttingDown)
	_, err := g.Enter(ctx, control.Entry{Session: "s2", Wait: true})
	wantCode(t, err, control.ErrShuttingDown)
}

func TestGateWaitGivesUpWithItsContext(t *testing.T) {
	g := control.NewGate(nil)
	g.Close()
	c, cancel := context.WithCancel(ctx)
	cancel()
	_, err := g.Enter(c, control.Entry{Session: "s1", Wait: true})
	wantCode(t, err, control.ErrAdmissionClosed)
	if g.Waiting() != 0 {
		t.Errorf("waiting %d after giving up", g.Waiting())
	}
}

func TestGateWaitIdle(t *testing.T) {
	g := control.NewGate(nil)
	leave, _ := g.Enter(ctx, control.Entry{Session: "s1"})
	other, _ := g.Enter(ctx, control.Entry{Session: "s2"})
	done := make(chan error)
	go func() { done <- g.WaitIdle(ctx, []string{"s1"}) }()
	leave()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithCancel(ctx)
	cancel()
	wantCode(t, g.WaitIdle(c, []string{"s2"}), control.ErrDeadlineExceeded)
	other()
}

// TestGateAdmitsNothingOnceAClosedGateDrained: a request enters while a
// checkpoint closes the gate, over and over; once the closer has seen no
// request in flight, none is admitted until the gate opens again (a
// request that read the gate open before the Close is counted where the
// closer looks).
func TestGateAdmitsNothingOnceAClosedGateDrained(t *testing.T) {
	g := control.NewGate(nil)
	var drained atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var bad atomic.Int64
	for i := range 8 {
		wg.Go(func() {
			e := control.Entry{Session: fmt.Sprintf("s%d", i), Label: fmt.Sprintf("k%d", i), Wait: true}
			for {
				select {
				case <-stop:
					return
				default:
				}
				leave, err := g.Enter(context.Background(), e)
				if err != nil {
					return
				}
				if drained.Load() {
					bad.Add(1)
				}
				leave()
			}
		})
	}
	for range 300 {
		g.Close()
		waitUntil(g, func() bool { return g.Inflight() == 0 && g.Blocking() == 0 })
		drained.Store(true)
		for range 20 {
			runtime.Gosched() // let the requests try to enter the drained gate
		}
		drained.Store(false)
		g.Open()
	}
	close(stop)
	g.Shutdown()
	wg.Wait()
	if n := bad.Load(); n != 0 {
		t.Fatalf("%d requests were admitted after the closed gate drained", n)
	}
}

// TestGateStaleLeaveCountsNothing: a request's leave called again after
// its ticket went to later requests leaves none of theirs; entering and
// leaving is one allocation.
func TestGateStaleLeaveCountsNothing(t *testing.T) {
	g := control.NewGate(nil)
	ctx := context.Background()
	stale, err := g.Enter(ctx, control.Entry{Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	stale()
	for i := range 100 {
		leave, err := g.Enter(ctx, control.Entry{Session: "s2"})
		if err != nil {
			t.Fatal(err)
		}
		stale()
		if n := g.InflightOf("s2"); n != 1 {
			t.Fatalf("entry %d: s2 has %d in flight after a stale leave, want 1", i, n)
		}
		leave()
	}
	if g.Inflight() != 0 {
		t.Fatalf("inflight %d after every leave", g.Inflight())
	}
	if racebuild.Enabled {
		return // allocation counts differ under -race
	}
	if n := testing.AllocsPerRun(100, func() {
		leave, _ := g.Enter(ctx, control.Entry{Session: "s3", Label: "r3"})
		leave()
	}); n > 1 {
		t.Fatalf("%v allocations to enter and leave, want 1", n)
	}
}
