package records

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// writeUnder writes a participant's lines under root/rel as a commit does.
func writeUnder(t *testing.T, root, rel string, p Participant, ls ...string) string {
	t.Helper()
	dir := filepath.Join(root, rel)
	if _, err := (Writer{FS: OS{}, Participant: p}).Write(dir, filepath.Base(rel), lines(ls...), nil); err != nil {
		t.Fatal(err)
	}
	return dir
}

// Every participant's records at any depth are read, any kind or
// instance; every non-null snapshot_id counts wherever it is nested; the
// controller's own files are ignored.
func TestRetainedUnderCollectsEveryNamedSnapshot(t *testing.T) {
	root := t.TempDir()
	writeUnder(t, root, "ck-2", part,
		`{"episode_id": {"rollout_id": "r1", "attempt": 0}, "session_id": "s1", "state": {"sandbox": {"snapshot_id": "snap-a", "descriptor": {"sandbox_id": "sb-1"}}}, "owner": null}`,
		`{"session_id": "s2", "state": {"snapshot_id": "snap-b"}}`)
	writeUnder(t, root, "deeper/ck-3", Participant{Kind: "agent", Instance: "a1"},
		`{"session": {"sandbox": {"snapshot_id": "snap-c"}}, "list": [{"snapshot_id": null}, {"snapshot_id": "snap-d"}]}`)
	for name, body := range map[string]string{"LATEST": "ck-2", "ck-2/collection.json": `{"snapshot_id": "not-a-record"}`, "manifest.json": "{}"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := RetainedUnder(root)
	if err != nil {
		t.Fatal(err)
	}
	want := Retained{
		Snapshots:    map[string]bool{"snap-a": true, "snap-b": true, "snap-c": true, "snap-d": true},
		Sandboxes:    map[string]bool{"sb-1": true},
		Participants: 2,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("retained (-want +got):\n%s", diff)
	}
}

// A root that is not a directory, or records that do not verify, fail the
// whole read: nothing may be deleted on a partial view.
func TestRetainedUnderFailsClosed(t *testing.T) {
	root := t.TempDir()
	file := filepath.Join(root, "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := RetainedUnder(file); err == nil || !strings.Contains(err.Error(), "is not a directory") {
		t.Fatalf("a file as root: %v", err)
	}
	if _, err := RetainedUnder(filepath.Join(root, "missing")); err == nil {
		t.Fatal("a missing root was read")
	}
	dir := writeUnder(t, root, "ck", part, `{"snapshot_id": "snap-a"}`)
	ents, _ := filepath.Glob(filepath.Join(dir, "gym", "resources", "notes", "records-*.jsonl"))
	if len(ents) != 1 {
		t.Fatalf("records files %v", ents)
	}
	if err := os.WriteFile(ents[0], []byte(`{"snapshot_id": "snap-b"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := RetainedUnder(root); err == nil || !strings.Contains(err.Error(), "cannot read retained checkpoint state") {
		t.Fatalf("tampered records: %v", err)
	}
}
