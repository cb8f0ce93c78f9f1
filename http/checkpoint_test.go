package http_test

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/provider/fake"
)

func TestLeaseExpiryReopensAdmission(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.op("prepare", "ck1", nil)
	done := h.waitingAppend(a, "/ng-rollout/r1/append_note")
	// The controller is gone: past deadline + grace the lease resumes.
	h.clk.Advance(time.Minute + control.DefaultLeaseGrace)
	if !h.srv.Machine().Tick() {
		t.Fatal("the lease did not expire")
	}
	h.ok(<-done, "the waiting append")
	st := h.ok(h.control("status", nil), "status")
	if st["phase"] != "idle" || st["checkpoint_id"] != nil {
		t.Errorf("status after the lease: %v", st)
	}
	h.want(h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"}), 409, "stale_checkpoint", "commit of the expired checkpoint")
}

// TestCommitLeavingOutARestoredSessionStopsItsFork: a restored session
// no request has claimed, outside the commit's scope, is deleted (not
// retired: no fence) and its snapshot kept for the first checkpoint.
func TestCommitLeavingOutARestoredSessionStopsItsFork(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.checkpoint("ck1", "/d1")
	h.crash()
	h.restart()
	h.op("restore", "ck1", map[string]any{"checkpoint_dir": "/d1", "episode_ids": []any{ep("r1", 0)}})
	h.op("resume", "ck1", nil)
	if n := len(h.fake().LiveSandboxIDs()); n != 1 {
		t.Fatalf("%d live sandboxes after the restore, want the fork", n)
	}
	h.op("prepare", "ck2", nil)
	c := h.op("commit", "ck2", map[string]any{"checkpoint_dir": "/d2", "episode_ids": []any{}})
	if diff := cmp.Diff([]any{}, c["episode_ids"]); diff != "" {
		t.Errorf("episode_ids (-want +got):\n%s", diff)
	}
	if n := len(h.fake().LiveSandboxIDs()); n != 0 {
		t.Errorf("%d sandboxes live, want the unclaimed fork stopped", n)
	}
	if n := h.fake().Stats().LiveSnapshots; n != 1 {
		t.Errorf("%d snapshots, want ck1's kept", n)
	}
	h.op("resume", "ck2", nil)
	// Not a retire: attempt 1 is not fenced.
	h.ok(h.post(a, "/ng-rollout/r1-a1/seed_session", nil), "seed of the next attempt")
}

func TestFailedSnapshotFailsTheCommitAndTheEpisodeGoesOn(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "prepare")
	h.fake().FailNext(fake.OpSnapshot, 1)
	r := h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"})
	if r.status != 500 || r.code() != "commit_failed" {
		t.Fatalf("commit with a failing snapshot: %d %s", r.status, r.body)
	}
	if st := h.ok(h.control("status", nil), "status"); st["phase"] != "prepared" {
		t.Errorf("phase after a failed commit: %v", st["phase"])
	}
	if cks, _ := h.own.Checkpoints(); len(cks) != 0 {
		t.Errorf("a failed commit recorded %v", cks)
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "resume")
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "one"}), "append after the failed commit")
	if got := h.sandboxID(a); got != sb {
		t.Errorf("sandbox %s after the failed commit, want the same %s", got, sb)
	}
}

func TestShutdownDoesNotWaitForAPreparesDeadline(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	appended, release := h.heldAppend(a, "/ng-rollout/r1/append_note")
	defer release()
	prepared := make(chan reply)
	go func() {
		prepared <- h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": control.UnixSeconds(h.clk.Now().Add(time.Hour))})
	}()
	m := h.srv.Machine()
	for ch := m.Changed(); ; ch = m.Changed() {
		if p, _ := m.Phase(); p == control.PhasePreparing {
			break
		}
		<-ch
	}
	stopped := make(chan struct{})
	go func() {
		h.stop()
		close(stopped)
	}()
	h.want(<-prepared, 409, "deadline_exceeded", "prepare cut by the shutdown")
	release()
	h.ok(<-appended, "the in-flight append is drained")
	<-stopped
}

// TestDeadlineTSBoundsTheCommitRound: the controller's deadline_ts reaches
// the owner's snapshot round, on the server's clock. A snapshot that hangs
// past it fails the commit, which is cleaned up as any failed commit: no
// checkpoint, no snapshot, the episode's sandbox still running.
func TestDeadlineTSBoundsTheCommitRound(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	h.op("prepare", "ck1", nil)
	began := make(chan struct{})
	var once sync.Once
	h.fake().SetHook(func(c fake.Call) {
		if c.Op == fake.OpSnapshot && c.Phase == fake.PhaseBegin {
			once.Do(func() { close(began) })
		}
	})
	h.fake().HangNext(fake.OpSnapshot, 1)
	replied := make(chan reply, 1)
	// Far below the owner's own 10-minute round timeout.
	go func() {
		replied <- h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": control.UnixSeconds(h.clk.Now().Add(30 * time.Second)), "checkpoint_dir": "/d"})
	}()
	<-began
	h.clk.Advance(30 * time.Second)
	// The reply races the round's end at the deadline: either the wait
	// gave up (the commit goes on) or the failed commit answered.
	if r := <-replied; !(r.status == 409 && r.code() == "deadline_exceeded") && !(r.status == 500 && r.code() == "commit_failed") {
		t.Fatalf("commit past its deadline: %d %s", r.status, r.body)
	}
	// Resume waits for the commit still running.
	h.op("resume", "ck1", nil)
	if cks, _ := h.own.Checkpoints(); len(cks) != 0 {
		t.Errorf("a commit past its deadline recorded %v", cks)
	}
	if n := h.fake().Stats().LiveSnapshots; n != 0 {
		t.Errorf("%d snapshots left by the failed commit", n)
	}
	if got := h.sandboxID(a); got != sb || !h.live(sb) {
		t.Errorf("sandbox %s (live %v) after the failed commit, want %s running", got, h.live(sb), sb)
	}
}
