package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/provider"
)

// A snapshot written to a shared snapshot dir is forked by a provider on
// another root (another machine's), in every mode, overlay included: the
// snapshot is a whole tree, not a layer over the first root's images. The
// second provider deletes it through the shared dir.
func TestSnapshotDirIsForkedFromAnotherRoot(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, m mode) {
		shared := t.TempDir()
		a := newProvider(t, m, Options{SnapshotDir: shared, Templates: map[string]string{"notes": ""}})
		b := newProvider(t, m, Options{SnapshotDir: shared, Templates: map[string]string{"notes": ""}})
		h := start(t, a, provider.Spec{Image: "notes"})
		writeFile(t, a, h, "notes.txt", "one\n")
		// A second snapshot stands on the first in overlay mode without a
		// shared dir; here it must not.
		snapshot(t, a, h)
		mustRun(t, a, h, "echo two >> notes.txt")
		id := snapshot(t, a, h)
		if _, err := os.Stat(filepath.Join(shared, id, "meta.json")); err != nil {
			t.Fatalf("the snapshot is not in the shared dir: %v", err)
		}
		ctx := context.Background()
		// The first machine is gone: nothing of its root may be needed.
		if err := a.Stop(ctx, h); err != nil {
			t.Fatal(err)
		}
		for _, d := range []string{a.imagesDir(), a.emptyDir(), a.trashDir()} {
			if err := os.RemoveAll(d); err != nil {
				t.Fatal(err)
			}
		}
		f, err := b.Fork(ctx, provider.Spec{}, id)
		if err != nil {
			t.Fatalf("fork on the other root: %v", err)
		}
		if got := readFile(t, b, f, "notes.txt"); got != "one\ntwo\n" {
			t.Fatalf("forked notes %q", got)
		}
		if err := b.Stop(ctx, f); err != nil {
			t.Fatal(err)
		}
		// Another server's snapshot, still being written (no record yet).
		writing := filepath.Join(shared, "snap-0123456789abcdef")
		if err := os.Mkdir(writing, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := b.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(writing); err != nil {
			t.Fatalf("a collection removed a snapshot another server is writing: %v", err)
		}
		if _, err := os.Stat(filepath.Join(shared, id)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the deleted snapshot is still in the shared dir: %v", err)
		}
	})
}

// Without a shared dir a snapshot stays on its machine: another root's
// fork is ErrSnapshotNotFound, naming the snapshot.
func TestSnapshotWithoutSnapshotDirStaysOnItsRoot(t *testing.T) {
	t.Parallel()
	m := mode{"none-copy", IsolationNone, OverlayOff}
	a := newProvider(t, m, Options{Templates: map[string]string{"notes": ""}})
	b := newProvider(t, m, Options{Templates: map[string]string{"notes": ""}})
	h := start(t, a, provider.Spec{Image: "notes"})
	id := snapshot(t, a, h)
	_, err := b.Fork(context.Background(), provider.Spec{}, id)
	if !errors.Is(err, provider.ErrSnapshotNotFound) || !strings.Contains(err.Error(), id) {
		t.Fatalf("fork of another root's snapshot: %v", err)
	}
}
