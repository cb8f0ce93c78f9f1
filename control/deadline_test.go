package control_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
)

func TestPreparePastItsDeadlineLeavesAdmissionOpen(t *testing.T) {
	for _, late := range []time.Duration{time.Millisecond, time.Hour} {
		r := newRig(t)
		_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", -late)})
		wantCode(t, err, control.ErrDeadlineExceeded)
		if r.h.isClosed() || r.phase() != control.PhaseIdle {
			t.Fatalf("deadline %v ago: admission closed %v, phase %s; want open and idle", late, r.h.isClosed(), r.phase())
		}
		// Nothing was recorded: the same id with a deadline ahead prepares.
		if rep := r.prepare("c1"); rep.Phase != control.PhasePrepared {
			t.Fatalf("prepare after the refused one: phase %s", rep.Phase)
		}
	}
}

func TestDeadlineTooFarAheadIsInvalid(t *testing.T) {
	r := newRig(t)
	for _, ts := range []float64{1e18, 1e300, control.UnixSeconds(t0.Add(control.DefaultMaxDeadline + time.Second))} {
		_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: control.Base{CheckpointID: "c1", DeadlineTS: ts}})
		wantCode(t, err, control.ErrInvalidRequest)
	}
	if r.h.isClosed() {
		t.Fatal("a refused prepare closed admission")
	}
	// Exactly the limit is allowed.
	at := control.Base{CheckpointID: "c1", DeadlineTS: control.UnixSeconds(t0.Add(control.DefaultMaxDeadline))}
	if rep, err := r.m.Prepare(ctx, control.PrepareRequest{Base: at}); err != nil || rep.Phase != control.PhasePrepared {
		t.Fatalf("prepare at the limit: %+v, %v", rep, err)
	}
	_, err := r.m.Renew(ctx, control.RenewRequest{Base: control.Base{CheckpointID: "c1", DeadlineTS: 1e18}})
	wantCode(t, err, control.ErrInvalidRequest)
	if diff := cmp.Diff([]string{"close"}, r.h.calls()); diff != "" {
		t.Errorf("hook calls (-want +got):\n%s", diff)
	}
}

func TestMaxDeadlineIsConfigurable(t *testing.T) {
	h := &hooks{ready: true}
	r := &rig{t: t, h: h, clk: newRig(t).clk}
	r.m = control.New(control.Config{Hooks: h, Clock: r.clk, MaxDeadline: time.Minute})
	_, err := r.m.Prepare(ctx, control.PrepareRequest{Base: r.base("c1", 2*time.Minute)})
	wantCode(t, err, control.ErrInvalidRequest)
	if rep := r.prepare("c1"); rep.Phase != control.PhasePrepared {
		t.Fatalf("prepare within a minute: phase %s", rep.Phase)
	}
}
