package http_test

import (
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

// TestCommitOutlivesItsDeadline: the export runs once, shielded from the
// controller's deadline_ts: the commit answers 409 deadline_exceeded at its
// deadline while the snapshot goes on, and a retry awaits that same export
// and answers with its result. One snapshot in all.
func TestCommitOutlivesItsDeadline(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.op("prepare", "ck1", nil)
	entered, release := blockOn(h.fake(), fake.OpSnapshot)
	commit := func(d time.Duration) <-chan reply {
		ch := make(chan reply, 1)
		body := map[string]any{"checkpoint_id": "ck1", "deadline_ts": control.UnixSeconds(h.clk.Now().Add(d)), "checkpoint_dir": "/d"}
		go func() { ch <- h.control("commit", body) }()
		return ch
	}
	first := commit(2 * time.Second)
	<-entered
	h.clk.Advance(2 * time.Second)
	h.want(<-first, 409, "deadline_exceeded", "commit past its deadline")
	retry := commit(time.Minute)
	// The retry awaits the export still running (or, if it arrives after
	// the export ended, gets its recorded reply): never a second export.
	release()
	r := h.ok(<-retry, "retried commit")
	if m := r["manifest"].(map[string]any); r["phase"] != "committed" || m["record_count"] != 1.0 {
		t.Errorf("retried commit: %v", r)
	}
	if s := h.fake().Stats(); s.Calls[fake.OpSnapshot] != 1 || s.LiveSnapshots != 1 {
		t.Errorf("%d snapshot calls, %d snapshots: want the one export", s.Calls[fake.OpSnapshot], s.LiveSnapshots)
	}
	h.op("resume", "ck1", nil)
}

// TestResumeDuringACommit: a resume while a commit snapshots stops the
// commit's writer and reopens admission within its own deadline, without
// waiting for the commit; the commit then records nothing and leaves no
// snapshot, and the episode goes on in its sandbox.
func TestResumeDuringACommit(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	sb := h.sandboxID(a)
	h.op("prepare", "ck1", nil)
	entered, release := blockOn(h.fake(), fake.OpSnapshot)
	committed := make(chan reply, 1)
	go func() {
		committed <- h.control("commit", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/d"})
	}()
	<-entered
	// A one-second deadline the clock never reaches: the resume answers
	// while the snapshot is still held.
	r := h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": control.UnixSeconds(h.clk.Now().Add(time.Second))}), "resume during the commit")
	if r["phase"] != "idle" || r["idempotent"] != false {
		t.Errorf("resume: %v", r)
	}
	if !h.srv.Gate().IsOpen() {
		t.Fatal("admission still closed after the resume")
	}
	// r1's sandbox is held by its snapshot; other work goes on.
	h.ok(h.post(&agent{}, "/ng-rollout/r2/seed_session", nil), "a seed with admission open")
	release()
	h.want(<-committed, 409, "stale_checkpoint", "the abandoned commit")
	if cks, _ := h.own.Checkpoints(); len(cks) != 0 {
		t.Errorf("the resumed commit recorded %v", cks)
	}
	if s := h.fake().Stats(); s.Calls[fake.OpSnapshot] != 1 || s.LiveSnapshots != 0 {
		t.Errorf("%d snapshot calls, %d snapshots left: want the abandoned commit's one, deleted", s.Calls[fake.OpSnapshot], s.LiveSnapshots)
	}
	if !h.live(sb) {
		t.Errorf("sandbox %s stopped by the abandoned commit", sb)
	}
}
