package http_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/records"
)

// TestCrashRestoreScenario is the crash-and-restore walk: a notes session is
// checkpointed, drifts, its server dies without shutdown, and a fresh server
// on the same state_dir and backend restores it; the controller's re-seed of
// the next attempt with the same cookie continues in the fork.
func TestCrashRestoreScenario(t *testing.T) {
	h := newHarness(t)
	a := &agent{}

	seed := h.post(a, "/ng-rollout/r1/seed_session", map[string]any{"instance_id": "row-1", "extra": []int{1, 2}})
	tok := h.ok(seed, "seed")["seed_token"]
	if tok == nil || tok == "" {
		t.Fatalf("seed reply has no token: %s", seed.body)
	}
	if diff := cmp.Diff(map[string]string{httpapi.HeaderVerify: "wait"}, seed.header); diff != "" {
		t.Errorf("seed headers (-want +got):\n%s", diff)
	}
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "one"}), "append one")
	original := h.sandboxID(a)

	prep := h.ok(h.control("prepare", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "prepare")
	if prep["phase"] != "prepared" {
		t.Fatalf("prepare: %v", prep)
	}
	commit := h.ok(h.control("commit", map[string]any{
		"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/controller/ck1",
		"episode_ids": []any{ep("r1", 0)},
	}), "commit")
	manifest := commit["manifest"].(map[string]any)
	if commit["phase"] != "committed" || manifest["checkpoint_id"] != "ck1" || manifest["record_count"] != 1.0 || manifest["records_sha256"] == "" {
		t.Fatalf("commit reply: %v", commit)
	}
	if diff := cmp.Diff([]any{"r1"}, commit["episode_ids"]); diff != "" {
		t.Errorf("commit episode_ids (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(writtenManifest(t, h, "/controller/ck1"), manifest); diff != "" {
		t.Errorf("the reply's manifest is not the one written under checkpoint_dir (-written +reply):\n%s", diff)
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "resume")
	// Drift after the checkpoint: the restore must not bring it back.
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "two"}), "append two (drift)")

	h.crash()
	h.restart()

	restore := h.ok(h.control("restore", map[string]any{
		"checkpoint_id": "ck1", "deadline_ts": h.deadline(), "checkpoint_dir": "/controller/ck1",
		"episode_ids": []any{ep("r1", 0)},
	}), "restore")
	want := map[string]any{"phase": "restored", "source_checkpoint_id": "ck1", "restored": []any{"r1-a1"}}
	if diff := cmp.Diff(want, restore); diff != "" {
		t.Errorf("restore reply (-want +got):\n%s", diff)
	}
	if h.live(original) {
		t.Errorf("superseded sandbox %s still runs", original)
	}
	h.ok(h.control("resume", map[string]any{"checkpoint_id": "ck1", "deadline_ts": h.deadline()}), "resume after restore")

	reseed := h.ok(h.post(a, "/ng-rollout/r1-a1/seed_session", map[string]any{"instance_id": "row-1"}), "re-seed")
	if reseed["seed_token"] != tok {
		t.Errorf("re-seed token %v, want the checkpointed %v", reseed["seed_token"], tok)
	}
	fork := h.sandboxID(a)
	if fork == original || !h.live(fork) {
		t.Fatalf("re-seed got sandbox %s (live %v), want a live fork of %s", fork, h.live(fork), original)
	}
	h.ok(h.post(a, "/ng-rollout/r1-a1/append_note", map[string]any{"line": "two"}), "append two in the fork")
	verify := h.ok(h.post(a, "/ng-rollout/r1-a1/verify", map[string]any{"expected_notes": []string{"one", "two"}, "responses_create_params": map[string]any{}}), "verify")
	if verify["reward"] != 1.0 {
		t.Fatalf("verify: %v", verify)
	}
	if h.live(fork) {
		t.Errorf("verify left the fork %s running", fork)
	}
	h.want(h.post(a, "/sandbox_access", nil), 404, httpapi.CodeNoSandboxAccess, "access after verify")
	st := h.ok(h.control("status", nil), "status")
	if st["phase"] != "idle" || st["mode"] != "exported" || st["report"].(map[string]any)["counts"].(map[string]any)["sessions"] != 0.0 {
		t.Errorf("status after verify: %v", st)
	}

	// The checkpoint is no longer needed: release deletes its snapshot.
	rel := h.ok(h.control("release", map[string]any{"kept_checkpoint_ids": []string{}}), "release")
	if diff := cmp.Diff([]any{"ck1"}, rel["dropped"]); diff != "" {
		t.Errorf("release dropped (-want +got):\n%s", diff)
	}
	if n := h.fake().Stats().LiveSnapshots; n != 0 {
		t.Errorf("%d snapshots left after release", n)
	}
}

// TestRestoreOfAnEarlierCheckpointRewardsZero: a session restored from a checkpoint
// taken before the note was appended verifies to 0.
func TestRestoreOfAnEarlierCheckpointRewardsZero(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.checkpoint("ck1", "/d")
	h.op("resume", "ck1", nil)
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "one"}), "append")
	h.crash()
	h.restart()
	h.op("restore", "rs", map[string]any{"source_checkpoint_id": "ck1", "episode_ids": []any{ep("r1", 0)}})
	h.op("resume", "rs", nil)
	h.ok(h.post(a, "/ng-rollout/r1-a1/seed_session", nil), "re-seed")
	v := h.ok(h.post(a, "/ng-rollout/r1-a1/verify", map[string]any{"expected_notes": []string{"one"}}), "verify")
	if v["reward"] != 0.0 {
		t.Fatalf("verify after losing the note: %v", v)
	}
}

// writtenManifest reads and verifies the records a commit wrote under
// dir and returns their manifest as the reply carries it.
func writtenManifest(t *testing.T, h *harness, dir string) map[string]any {
	t.Helper()
	m, err := records.Read(h.ckdirs, dir, records.Participant{Kind: "resources", Instance: "notes"}, func([]byte) error { return nil })
	if err != nil {
		t.Fatal(err)
	}
	return map[string]any{"checkpoint_id": m.CheckpointID, "instance": m.Instance, "kind": m.Kind, "record_count": float64(m.RecordCount),
		"records_file": m.RecordsFile, "records_sha256": m.RecordsSHA256, "schema_version": float64(m.SchemaVersion)}
}
