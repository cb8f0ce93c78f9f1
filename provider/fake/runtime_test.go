package fake_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/sched"
)

// bounded runs fn and fails the test if it has not returned within a
// minute of wall time: the calls under test wait on virtual time only, so
// one that waits on the wall clock or blocks outside the scheduler would
// otherwise hang the test binary instead of failing it.
func bounded(t *testing.T, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("%s: still blocked after a minute of wall time", what)
	}
}

func newDetFake(seed uint64) (*sched.Det, *fake.Provider) {
	det := sched.NewDet(seed, t0)
	return det, fake.New(fake.Options{Clock: det, Runtime: det})
}

// TestLatencyOnADetIsVirtual: on a Det, a call's latency passes on the
// Det's clock: the call completes once the scheduler has moved its time by
// exactly the latency, and two calls in flight wait it side by side.
func TestLatencyOnADetIsVirtual(t *testing.T) {
	det, p := newDetFake(1)
	defer det.Close()
	h := start(t, p, provider.Spec{})
	const lat = 2 * time.Second
	p.SetLatency(fake.OpExec, lat)
	var began []time.Duration
	p.SetHook(func(c fake.Call) {
		if c.Op == fake.OpExec && c.Phase == fake.PhaseBegin {
			began = append(began, det.Now().Sub(t0))
		}
	})

	// From the driver: the call runs the scheduler until its latency passed.
	bounded(t, "Exec from the driver", func() {
		if _, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "echo a >> f"}); err != nil {
			t.Error(err)
		}
	})
	if got := det.Now().Sub(t0); got != lat {
		t.Fatalf("after one call the Det's clock moved %v, want the latency %v", got, lat)
	}

	// Two coroutines: both wait the same latency at once.
	var ended []time.Duration
	for range 2 {
		det.Go(func() {
			if _, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "echo b >> f"}); err != nil {
				t.Error(err)
			}
			ended = append(ended, det.Now().Sub(t0))
		})
	}
	bounded(t, "two Execs on coroutines", func() { det.RunUntil(func() bool { return len(ended) == 2 }) })
	if diff := cmp.Diff([]time.Duration{2 * lat, 2 * lat}, ended); diff != "" {
		t.Fatalf("the two concurrent calls ended at (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]time.Duration{0, lat, lat}, began); diff != "" {
		t.Fatalf("calls began at (-want +got):\n%s", diff)
	}
	files, _ := p.Files(h.SandboxID)
	if diff := cmp.Diff("a\nb\nb\n", files["/workspace/f"]); diff != "" {
		t.Fatalf("file after the calls (-want +got):\n%s", diff)
	}
}

// TestHangOnADetEndsWithItsDeadline: a hung call on a Det returns when its
// context, a deadline on the Det's clock, expires: the scheduler moves time
// to the deadline while the call waits.
func TestHangOnADetEndsWithItsDeadline(t *testing.T) {
	det, p := newDetFake(2)
	defer det.Close()
	h := start(t, p, provider.Spec{})
	p.HangNext(fake.OpSnapshot, 1)
	const after = 30 * time.Second
	ctx, cancel := clock.WithTimeout(context.Background(), det, after)
	defer cancel()
	var err error
	bounded(t, "a hung Snapshot from the driver", func() { _, err = p.Snapshot(ctx, h, "n") })
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung Snapshot = %v, want DeadlineExceeded", err)
	}
	if got := det.Now().Sub(t0); got != after {
		t.Fatalf("the hung call returned %v after it began, want at its deadline %v", got, after)
	}
	if ids := p.SnapshotIDs(); len(ids) != 0 {
		t.Fatalf("a hung Snapshot had an effect: %v", ids)
	}

	// On a coroutine too, while the driver only runs the scheduler.
	p.HangNext(fake.OpSnapshot, 1)
	ctx2, cancel2 := clock.WithTimeout(context.Background(), det, after)
	defer cancel2()
	var err2 error
	done := false
	det.Go(func() {
		_, err2 = p.Snapshot(ctx2, h, "n")
		done = true
	})
	bounded(t, "a hung Snapshot on a coroutine", func() { det.RunUntil(func() bool { return done }) })
	if !errors.Is(err2, context.DeadlineExceeded) || det.Now().Sub(t0) != 2*after {
		t.Fatalf("hung Snapshot on a coroutine = %v at %v, want DeadlineExceeded at %v", err2, det.Now().Sub(t0), 2*after)
	}
}

// TestLatencyOnTheRealRuntimeWaitsOnTheClock: with Runtime set to the real
// runtime (whose Await returns at once), a call still waits its latency on
// Clock: here a Manual clock that is moved only once the call's context
// has a deadline on it and the latency timer is armed, so the context
// ends first and the call has no effect.
func TestLatencyOnTheRealRuntimeWaitsOnTheClock(t *testing.T) {
	m := clock.NewManual(t0)
	p := fake.New(fake.Options{Clock: m, Runtime: sched.Real{}})
	h := start(t, p, provider.Spec{})
	p.SetLatency(fake.OpExec, time.Hour)
	ctx, cancel := clock.WithTimeout(context.Background(), m, time.Second)
	defer cancel()
	returned := make(chan struct{})
	moved := make(chan struct{})
	go func() {
		defer close(moved)
		// The deadline and the call's latency timer.
		if m.WaitPending(2, returned) {
			m.Advance(time.Second)
		}
	}()
	_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo x > f"})
	close(returned)
	<-moved
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Exec with an hour's latency and a second's deadline = %v, want DeadlineExceeded", err)
	}
	if files, _ := p.Files(h.SandboxID); len(files) != 0 {
		t.Fatalf("an Exec that never waited out its latency had an effect: %v", files)
	}
}
