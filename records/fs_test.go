package records

import (
	"errors"
	"syscall"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A MemFS answers lookups as the operating system does: a directory, a
// file, or ENOENT; RemoveAll takes a directory with everything under it and
// nothing beside it.
func TestMemFSLookupsAndRemoveAll(t *testing.T) {
	m := NewMemFS()
	for _, f := range []string{"/g/c1/gym/m.json", "/g/c2/m.json", "/g/c10/m.json"} {
		if err := m.WriteFile(f, []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	if fi, err := m.Lstat("/g/c1"); err != nil || !fi.IsDir() {
		t.Fatalf("lstat of a directory: %v %v", fi, err)
	}
	if fi, err := m.Lstat("/g/c2/m.json"); err != nil || fi.IsDir() || fi.Size() != 2 {
		t.Fatalf("lstat of a file: %v %v", fi, err)
	}
	if _, err := m.ReadDir("/g/c2/m.json"); !errors.Is(err, syscall.ENOTDIR) {
		t.Fatalf("readdir of a file: %v, want ENOTDIR", err)
	}
	m.RemoveAll("/g/c1")
	if _, err := m.Lstat("/g/c1"); !errors.Is(err, syscall.ENOENT) {
		t.Fatalf("lstat of a removed directory: %v, want ENOENT", err)
	}
	if _, err := m.ReadDir("/g"); err != nil {
		t.Fatalf("readdir of the parent: %v", err)
	}
	if diff := cmp.Diff([]string{"/g/c10/m.json", "/g/c2/m.json"}, m.Files()); diff != "" {
		t.Fatalf("files left (-want +got):\n%s", diff)
	}
}
