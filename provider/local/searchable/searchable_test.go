package searchable

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Make adds o+x to each directory from / down to dir that the
// sandbox's uid could not search, keeping setgid and sticky bits, and
// leaves one it can search (o+x, its owner's u+x, its group's g+x).
func TestSearchableAddsOnlyTheSearchBitWhereItIsMissing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: giving directories to another uid needs root")
	}
	const uid, gid = 4242, 4343
	base := t.TempDir()
	if _, err := Make(base, uid, gid); err != nil { // the test's own parents
		t.Fatal(err)
	}
	type dir struct {
		name     string
		mode     os.FileMode
		uid, gid int
	}
	chain := []dir{
		{"root-only", 0o700, 0, 0},
		{"setgid", 0o750 | os.ModeSetgid, 0, 0},
		{"owners", 0o700, uid, 0},
		{"groups", 0o710, 0, gid},
		{"sticky", 0o770 | os.ModeSticky, 0, 0},
		{"others", 0o701, 0, 0},
	}
	p := base
	for _, d := range chain {
		p = filepath.Join(p, d.name)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, d.uid, d.gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, d.mode); err != nil {
			t.Fatal(err)
		}
	}
	changed, err := Make(p, uid, gid)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(base, "root-only"), filepath.Join(base, "root-only", "setgid"), filepath.Join(base, "root-only", "setgid", "owners", "groups", "sticky")}
	if diff := cmp.Diff(want, changed); diff != "" {
		t.Errorf("changed (-want +got):\n%s", diff)
	}
	var modes []os.FileMode
	p = base
	for _, d := range chain {
		p = filepath.Join(p, d.name)
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		modes = append(modes, fi.Mode()&(os.ModePerm|os.ModeSetgid|os.ModeSticky))
	}
	wantModes := []os.FileMode{0o701, 0o751 | os.ModeSetgid, 0o700, 0o710, 0o771 | os.ModeSticky, 0o701}
	if diff := cmp.Diff(wantModes, modes); diff != "" {
		t.Errorf("modes (-want +got):\n%s", diff)
	}
	if _, err := Make(filepath.Join(base, "missing"), uid, gid); !os.IsNotExist(err) {
		t.Errorf("a missing directory: %v, want not exist", err)
	}
}
