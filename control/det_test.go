package control_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/sched"
)

// TestGateOnADetParksItsWaiters: on a Det, a request that waits at a
// closed gate parks its coroutine until the gate opens, and WaitIdle
// parks until the session's last request leaves.
func TestGateOnADetParksItsWaiters(t *testing.T) {
	det := sched.NewDet(1, t0)
	defer det.Close()
	g := control.NewGateOn(nil, det)
	g.Close()
	var log []string
	det.Go(func() {
		leave, err := g.Enter(ctx, control.Entry{Session: "s1", Wait: true})
		if err != nil {
			t.Error(err)
			return
		}
		log = append(log, "s1 admitted")
		leave()
	})
	det.Settle()
	if len(log) != 0 || g.Waiting() != 1 {
		t.Fatalf("at a closed gate: admitted %v, %d waiting; want none admitted, 1 waiting", log, g.Waiting())
	}
	g.Open()
	det.Settle()
	if diff := cmp.Diff([]string{"s1 admitted"}, log); diff != "" {
		t.Fatalf("after the gate opened (-want +got):\n%s", diff)
	}

	leave, err := g.Enter(ctx, control.Entry{Session: "s2"})
	if err != nil {
		t.Fatal(err)
	}
	det.Go(func() {
		if err := g.WaitIdle(ctx, []string{"s2"}); err != nil {
			t.Error(err)
		}
		log = append(log, "s2 idle")
	})
	det.Settle()
	if len(log) != 1 {
		t.Fatalf("WaitIdle returned with a request of s2 in flight: %v", log)
	}
	leave()
	det.Settle()
	if diff := cmp.Diff([]string{"s1 admitted", "s2 idle"}, log); diff != "" {
		t.Fatalf("after s2's request left (-want +got):\n%s", diff)
	}
}

// TestGateOnADetOpeningWinsOverAnEndedContext: a waiter that finds the
// gate open and its context ended when it gets the turn is admitted, every
// time, so a seed replays.
func TestGateOnADetOpeningWinsOverAnEndedContext(t *testing.T) {
	for i := range 32 {
		det := sched.NewDet(uint64(i), t0)
		g := control.NewGateOn(nil, det)
		g.Close()
		c, cancel := context.WithCancel(ctx)
		err := errors.New("still waiting")
		det.Go(func() {
			var leave func()
			if leave, err = g.Enter(c, control.Entry{Session: "s1", Wait: true}); err == nil {
				leave()
			}
		})
		det.Settle()
		cancel()
		g.Open()
		det.Settle()
		det.Close()
		if err != nil {
			t.Fatalf("run %d: Enter with the gate open and its context ended = %v, want admitted", i, err)
		}
	}
}

// detRig is a Machine whose hook runs and waits go through a Det, which is
// also its clock; the test goroutine drives it.
func detRig(t *testing.T) (*sched.Det, *hooks, *control.Machine) {
	det := sched.NewDet(1, t0)
	t.Cleanup(det.Close)
	h := &hooks{ready: true}
	m := control.New(control.Config{Instance: "notes", Hooks: h, Clock: det, Runtime: det, LeaseGrace: 600 * time.Second})
	return det, h, m
}

func detBase(det *sched.Det, id string, d time.Duration) control.Base {
	return control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(det.Now().Add(d))}
}

// TestMachineOnADetRunsItsHooksOnIt: a commit's hook runs as a coroutine
// of the Det and the caller's wait for it runs the scheduler, so a hook
// that takes ten seconds of virtual time answers the driver's Commit at
// exactly ten seconds; one that never ends leaves the caller waiting until
// its deadline on the Det's clock.
func TestMachineOnADetRunsItsHooksOnIt(t *testing.T) {
	det, h, m := detRig(t)
	h.commit = func(ctx context.Context, req control.CommitRequest) (control.CommitResult, error) {
		tm := det.NewTimer(10 * time.Second)
		det.Await(ctx, func() bool { return len(tm.C()) > 0 })
		if req.CheckpointID == "c2" {
			det.Await(ctx, func() bool { return false })
		}
		return control.CommitResult{Manifest: control.Manifest{CheckpointID: req.CheckpointID, RecordsSHA256: "h"}}, nil
	}
	if _, err := m.Prepare(ctx, control.PrepareRequest{Base: detBase(det, "c1", time.Minute)}); err != nil {
		t.Fatal(err)
	}
	rep, err := m.Commit(ctx, control.CommitRequest{Base: detBase(det, "c1", time.Minute), CheckpointDir: "/ck"})
	if err != nil {
		t.Fatalf("commit c1: %v", err)
	}
	if rep.Phase != control.PhaseCommitted {
		t.Fatalf("commit c1: phase %s", rep.Phase)
	}
	if got := det.Now().Sub(t0); got != 10*time.Second {
		t.Fatalf("commit c1 answered at %v, want when its hook returned (10s)", got)
	}
	if _, err := m.Resume(ctx, control.ResumeRequest{Base: detBase(det, "c1", time.Minute)}); err != nil {
		t.Fatal(err)
	}

	began := det.Now()
	if _, err := m.Prepare(ctx, control.PrepareRequest{Base: detBase(det, "c2", time.Minute)}); err != nil {
		t.Fatal(err)
	}
	_, err = m.Commit(ctx, control.CommitRequest{Base: detBase(det, "c2", 30*time.Second), CheckpointDir: "/ck"})
	wantCode(t, err, control.ErrDeadlineExceeded)
	if got := det.Now().Sub(began); got != 30*time.Second {
		t.Fatalf("the wait for a hung commit ended at %v, want at its deadline (30s)", got)
	}
}

// TestPrepareOnADetWaitsForReadiness: a prepare that finds the participant
// not ready waits through the Det until a notification says it is.
func TestPrepareOnADetWaitsForReadiness(t *testing.T) {
	det, h, m := detRig(t)
	h.set(func(h *hooks) { h.ready, h.blockers = false, []string{"r1"} })
	det.AfterFunc(2500*time.Millisecond, func() {
		h.set(func(h *hooks) { h.ready, h.blockers = true, nil })
		m.Notify()
	})
	rep, err := m.Prepare(ctx, control.PrepareRequest{Base: detBase(det, "c1", time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Phase != control.PhasePrepared {
		t.Fatalf("phase %s, want prepared", rep.Phase)
	}
	if got := det.Now().Sub(t0); got != 2500*time.Millisecond {
		t.Fatalf("prepared at %v, want when the participant became ready (2.5s)", got)
	}
}
