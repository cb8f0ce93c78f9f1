package local

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
)

// Where the kernel has no openat2 the tree is walked a component at a
// time: a symlink anywhere on the way (a directory's or the file's), or a
// climb, is refused as openat2 refuses it, and a plain path opens.
func TestTheWalkWithoutOpenat2RefusesLinksAndClimbs(t *testing.T) {
	top := t.TempDir()
	for _, d := range []string{"d", "d/e"} {
		if err := os.Mkdir(filepath.Join(top, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(top, "d/e/f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"ld": "d", "d/lf": "e/f", "d/le": "e"} {
		if err := os.Symlink(target, filepath.Join(top, link)); err != nil {
			t.Fatal(err)
		}
	}
	dirfd, err := openTree(top)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	got := map[string]string{}
	for _, rel := range []string{"d/e/f", "d/e", "ld/e/f", "d/le/f", "d/lf", "d/../d/e/f", "d/missing", "d/e/f/g"} {
		fd, err := openByParts(dirfd, rel, unix.O_RDONLY|unix.O_CLOEXEC)
		switch {
		case err == nil:
			var st unix.Stat_t
			if serr := unix.Fstat(fd, &st); serr != nil {
				t.Fatal(serr)
			}
			unix.Close(fd)
			got[rel] = "opened " + map[bool]string{true: "dir", false: "file"}[st.Mode&unix.S_IFMT == unix.S_IFDIR]
		default:
			got[rel] = unix.ErrnoName(err.(unix.Errno))
		}
	}
	want := map[string]string{
		"d/e/f": "opened file", "d/e": "opened dir",
		"ld/e/f": "ELOOP", "d/le/f": "ELOOP", "d/lf": "ELOOP", "d/../d/e/f": "EXDEV",
		"d/missing": "ENOENT", "d/e/f/g": "ENOTDIR",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("walks (-want +got):\n%s", diff)
	}
}

// A link or a climb is a path escape to the caller, a missing entry is
// fs.ErrNotExist, and any other error keeps its errno.
func TestPathErrorsKeepTheirKind(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
	}{
		{unix.ELOOP, provider.ErrPathEscape},
		{unix.EXDEV, provider.ErrPathEscape},
		{unix.ENOENT, os.ErrNotExist},
		{unix.ENOTDIR, unix.ENOTDIR},
	} {
		got := pathErr("read", "a/b", c.err)
		if !errors.Is(got, c.want) {
			t.Errorf("pathErr(%v) = %v, want it to wrap %v", c.err, got, c.want)
		}
		if c.want != provider.ErrPathEscape && errors.Is(got, provider.ErrPathEscape) {
			t.Errorf("pathErr(%v) = %v: a path escape", c.err, got)
		}
	}
	// An ENOTDIR from a name that is not a symlink stays ENOTDIR.
	top := t.TempDir()
	if err := os.WriteFile(filepath.Join(top, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dirfd, err := openTree(top)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	if err := linkErr(dirfd, "f", unix.ENOTDIR); err != unix.ENOTDIR {
		t.Errorf("linkErr of a file: %v, want ENOTDIR", err)
	}
	if err := linkErr(dirfd, "f", unix.EACCES); err != unix.EACCES {
		t.Errorf("linkErr of another error: %v, want it unchanged", err)
	}
}
