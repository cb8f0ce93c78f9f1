package app_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/fake"
)

// A checkpoint whose directory the controller deleted is dropped by the
// checks (here check_retention, with no grace: the second check that sees
// it gone), its snapshot deleted; /health shows the checkpoints held and
// what the checks follow, and the metrics count the drop by reason.
func TestRetentionFollowsDeletedDirectories(t *testing.T) {
	t.Parallel()
	fk := fake.New(fake.Options{})
	a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{}, func(c *app.Config) {
		c.Checkpoint.Retention.GraceS = 0
		c.Checkpoint.Retention.PeriodS = 3600
	})
	addr := a.Addr().String()
	if s, _, _ := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}"); s != 200 {
		t.Fatalf("seed: %d", s)
	}
	root := t.TempDir()
	d := time.Now().Add(time.Minute).Unix()
	for _, id := range []string{"ck1", "ck2"} {
		control(t, addr, "prepare", fmt.Sprintf(`{"checkpoint_id":%q,"deadline_ts":%d}`, id, d))
		control(t, addr, "commit", fmt.Sprintf(`{"checkpoint_id":%q,"deadline_ts":%d,"checkpoint_dir":%q,"episode_ids":[{"rollout_id":"r1","attempt":0}]}`, id, d, filepath.Join(root, id)))
		control(t, addr, "resume", fmt.Sprintf(`{"checkpoint_id":%q,"deadline_ts":%d}`, id, d))
	}
	snaps := fk.SnapshotIDs()
	if len(snaps) != 2 {
		t.Fatalf("snapshots %v, want one per checkpoint", snaps)
	}
	if err := os.RemoveAll(filepath.Join(root, "ck1")); err != nil {
		t.Fatal(err)
	}
	first := controlReply(t, addr, "check_retention", "{}")
	if pending := first["pending"].([]any); len(pending) != 1 || pending[0].(map[string]any)["checkpoint_id"] != "ck1" || len(first["dropped"].([]any)) != 0 {
		t.Fatalf("first check: %v", first)
	}
	second := controlReply(t, addr, "check_retention", "{}")
	if diff := cmp.Diff([]any{"ck1"}, second["dropped"]); diff != "" {
		t.Fatalf("second check dropped (-want +got):\n%s", diff)
	}
	left := fk.SnapshotIDs()
	if len(left) != 1 || len(second["deleted"].([]any)) != 1 || second["deleted"].([]any)[0] == left[0] {
		t.Fatalf("after the drop: snapshots %v, deleted %v", left, second["deleted"])
	}
	_, body := get(t, addr, "/health")
	var h map[string]any
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"follow_dirs": true, "grace_s": 0.0, "dirs_gone": []any{}, "dirs_unreadable": []any{}}
	if diff := cmp.Diff(want, h["retention"]); diff != "" || h["checkpoints_held"] != 1.0 || h["pending_snapshot_deletes"] != 0.0 {
		t.Fatalf("/health %s (retention -want +got):\n%s", body, diff)
	}
	fams := scrape(t, addr)
	check{"drops by retention", counter(t, fams, "sandboxowner_checkpoint_drops_total", map[string]string{"reason": "dir_gone"}), 1}.verify(t)
	check{"drops by release", counter(t, fams, "sandboxowner_checkpoint_drops_total", map[string]string{"reason": "release"}), 0}.verify(t)
	check{"unreadable directories", counter(t, fams, "sandboxowner_checkpoint_dirs_unreadable_total", map[string]string{"reason": "io_error"}), 0}.verify(t)
}

// Without follow_dirs the checks do nothing and /health shows none.
func TestRetentionOff(t *testing.T) {
	t.Parallel()
	fk := fake.New(fake.Options{})
	a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{}, func(c *app.Config) { c.Checkpoint.Retention.FollowDirs = false })
	addr := a.Addr().String()
	r := controlReply(t, addr, "check_retention", "{}")
	if r["follow_dirs"] != false {
		t.Fatalf("check while off: %v", r)
	}
	_, body := get(t, addr, "/health")
	var h map[string]any
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatal(err)
	}
	if _, ok := h["retention"]; ok || h["checkpoints_held"] != 0.0 {
		t.Fatalf("/health while off: %s", body)
	}
}
