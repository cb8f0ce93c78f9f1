package snapshotindex

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestTemplates(t *testing.T) { forEach(t, testTemplates) }

func testTemplates(t *testing.T, x Store, reopen func() Store) {
	at := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	in := []Template{
		{Key: "task/b", SnapshotID: "snap-b", Provider: "fake", Workdir: "/w", Data: json.RawMessage(`{"a":1}`), CreatedAt: at},
		{Key: "task%a", SnapshotID: "snap-a", Provider: "fake", CreatedAt: at},
	}
	for _, tm := range in {
		if err := x.PutTemplate(tm); err != nil {
			t.Fatal(err)
		}
	}
	got, err := x.Templates()
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Template{in[1], in[0]}, got); d != "" {
		t.Fatalf("Templates (-want +got):\n%s", d)
	}
	// A zero time is stamped; a key or snapshot missing is refused.
	if err := x.PutTemplate(Template{Key: "c", SnapshotID: "snap-c"}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, x.PutTemplate(Template{Key: "", SnapshotID: "s"}), ErrInvalid)
	wantErr(t, x.PutTemplate(Template{Key: "k", SnapshotID: ""}), ErrInvalid)

	// A put clears the build's intent in its transaction; an intent key
	// without a kind is refused.
	if err := x.PutIntent(Intent{Kind: "template", ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, x.PutTemplate(Template{Key: "d", SnapshotID: "snap-d"}, IntentKey{ID: "t1"}), ErrInvalid)
	if err := x.PutTemplate(Template{Key: "d", SnapshotID: "snap-d"}, IntentKey{Kind: "template", ID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if ins, err := x.Intents(""); err != nil || len(ins) != 0 {
		t.Fatalf("intents after the put: %v, %v", ins, err)
	}
	if err := x.DropTemplates([]string{"d"}, nil); err != nil {
		t.Fatal(err)
	}

	// A drop removes the templates and tombstones their snapshots in one
	// transaction; a tombstoned snapshot cannot become a template again.
	if err := x.DropTemplates([]string{"task/b", "absent"}, []Tombstone{{SnapshotID: "snap-b", Reason: "template unused", At: at}}); err != nil {
		t.Fatal(err)
	}
	wantErr(t, x.PutTemplate(Template{Key: "task/b", SnapshotID: "snap-b"}), ErrInvalid)
	// A tombstone the index refuses (a checkpoint names the snapshot)
	// drops nothing.
	mustCommit(t, x, CheckpointMeta{ID: "k"}, []Record{testRecord("s1", "named", 500)})
	wantErr(t, x.DropTemplates([]string{"c"}, []Tombstone{{SnapshotID: "named"}}), ErrInvalid)
	wantErr(t, x.DropTemplates([]string{"c"}, []Tombstone{{SnapshotID: ""}}), ErrInvalid)

	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	x = reopen()
	got, err = x.Templates()
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{}
	for _, tm := range got {
		keys = append(keys, tm.Key)
		if tm.CreatedAt.IsZero() {
			t.Fatalf("template %q has no time", tm.Key)
		}
	}
	if d := cmp.Diff([]string{"c", "task%a"}, keys); d != "" {
		t.Fatalf("after the drop (-want +got):\n%s", d)
	}
	ts, _ := x.Tombstones()
	if d := cmp.Diff([]string{"snap-b"}, tombIDs(ts)); d != "" {
		t.Fatalf("tombstones (-want +got):\n%s", d)
	}
}
