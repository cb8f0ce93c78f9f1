package control_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
)

// TestMachineDefaults: a machine configured with nothing but its hooks and
// clock reports kind "resources", gives a lease of deadline + 600 s, refuses
// a deadline more than an hour ahead, and re-checks readiness every second
// while a prepare waits. (Its file sorts before det_test.go: with a zero
// poll interval the scheduler tests there spin, and under -failfast this
// test fails first.)
func TestMachineDefaults(t *testing.T) {
	h := &hooks{}
	clk := clock.NewManual(t0)
	m := control.New(control.Config{Instance: "notes", Hooks: h, Clock: clk})
	if st := m.Status(); st.Kind != "resources" || st.Instance != "notes" {
		t.Errorf("status names kind %q instance %q, want resources notes", st.Kind, st.Instance)
	}
	base := func(id string, d time.Duration) control.Base {
		return control.Base{CheckpointID: id, DeadlineTS: control.UnixSeconds(clk.Now().Add(d))}
	}
	_, err := m.Prepare(ctx, control.PrepareRequest{Base: base("far", time.Hour+time.Second)})
	wantCode(t, err, control.ErrInvalidRequest)

	// Readiness is polled on the clock: a prepare that is not ready leaves
	// one timer pending, a second ahead. A poll that never waited would
	// call Readiness without end; after 50 calls the hooks turn ready so
	// that such a prepare returns and the test fails instead of hanging.
	calls := 0
	h.set(func(h *hooks) { h.blockers = []string{"r1"} })
	polled := make(chan struct{}, 1)
	h.asked = polled
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := m.Prepare(ctx, control.PrepareRequest{Base: base("c1", time.Hour)}); err != nil {
			t.Errorf("prepare: %v", err)
		}
	}()
	go func() {
		for {
			select {
			case <-polled:
				if calls++; calls == 50 {
					h.set(func(h *hooks) { h.ready = true })
				}
			case <-done:
				return
			}
		}
	}()
	if !clk.WaitPending(1, done) {
		t.Fatal("the prepare returned without waiting on the clock")
	}
	if at, _ := clk.Next(); !at.Equal(t0.Add(time.Second)) {
		t.Errorf("next readiness check at %v, want a second after the start", at.Sub(t0))
	}
	st := m.Status()
	if st.LeaseExpiresAt == nil || *st.LeaseExpiresAt != control.UnixSeconds(t0.Add(time.Hour+600*time.Second)) {
		t.Errorf("lease expires at %v, want deadline + 600 s", st.LeaseExpiresAt)
	}
	h.set(func(h *hooks) { h.ready = true })
	clk.Advance(time.Second)
	<-done
}

// TestLongestCheckpointID: a checkpoint id of MaxIDLen characters is
// accepted (one longer is refused, see TestInvalidRequests).
func TestLongestCheckpointID(t *testing.T) {
	r := newRig(t)
	id := strings.Repeat("c", control.MaxIDLen)
	if rep := r.prepare(id); rep.Phase != control.PhasePrepared {
		t.Errorf("prepare of a %d-character id: %+v", control.MaxIDLen, rep)
	}
}

// TestWireTimestamps: deadline_ts keeps its fraction of a second both ways.
func TestWireTimestamps(t *testing.T) {
	at := time.Unix(1796292000, 500_000_000).UTC()
	if got := control.FromUnixSeconds(1796292000.5).UTC(); !got.Equal(at) {
		t.Errorf("FromUnixSeconds(1796292000.5) = %v, want %v", got, at)
	}
	if got := control.UnixSeconds(at); got != 1796292000.5 {
		t.Errorf("UnixSeconds = %v, want 1796292000.5", got)
	}
}

// TestErrorText: an error reads "code: detail", or just its code without a
// detail.
func TestErrorText(t *testing.T) {
	if got := control.ErrStaleCheckpoint.Error(); got != "stale_checkpoint" {
		t.Errorf("an error without detail reads %q", got)
	}
	if got := control.ErrStaleCheckpoint.With("c%d was resumed", 1).Error(); got != "stale_checkpoint: c1 was resumed" {
		t.Errorf("an error with detail reads %q", got)
	}
}
