package beneath

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
	dirfd, err := OpenTree(top)
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
		got := PathErr("read", "a/b", c.err)
		if !errors.Is(got, c.want) {
			t.Errorf("PathErr(%v) = %v, want it to wrap %v", c.err, got, c.want)
		}
		if c.want != provider.ErrPathEscape && errors.Is(got, provider.ErrPathEscape) {
			t.Errorf("PathErr(%v) = %v: a path escape", c.err, got)
		}
	}
	// An ENOTDIR from a name that is not a symlink stays ENOTDIR.
	top := t.TempDir()
	if err := os.WriteFile(filepath.Join(top, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	dirfd, err := OpenTree(top)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	if err := LinkErr(dirfd, "f", unix.ENOTDIR); err != unix.ENOTDIR {
		t.Errorf("linkErr of a file: %v, want ENOTDIR", err)
	}
	if err := LinkErr(dirfd, "f", unix.EACCES); err != unix.EACCES {
		t.Errorf("linkErr of another error: %v, want it unchanged", err)
	}
}

// A path that leaves the workdir by its spelling (a climb, an absolute path
// elsewhere, a NUL, an empty name) is a path escape; one inside it is
// relative to the tree's top.
func TestRelRefusesPathsThatLeaveTheWorkdir(t *testing.T) {
	cases := []struct {
		in, want string
		escape   bool
	}{
		{"a", "a", false}, {"./a/../b", "b", false}, {".", ".", false},
		{"/sandbox", ".", false}, {"/sandbox/", ".", false}, {"/sandbox/a/b", "a/b", false},
		{"/sandbox/a/../../x", "", true}, {"/sandboxx", "", true}, {"/", "", true},
		{"..", "", true}, {"../a", "", true}, {"a/../..", "", true}, {"", "", true}, {"a\x00b", "", true},
	}
	for _, c := range cases {
		got, err := Rel("/sandbox", c.in)
		if c.escape {
			if !errors.Is(err, provider.ErrPathEscape) {
				t.Errorf("Rel(%q) = %q, %v; want ErrPathEscape", c.in, got, err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Rel(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// openFDs counts the descriptors this process holds.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("SKIP: no /proc/self/fd to count descriptors in")
	}
	return len(ents)
}

// tree makes top/d/e/f and the symlinks ld -> d, d/lf -> e/f, d/le -> e.
func tree(t *testing.T) string {
	t.Helper()
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
	return top
}

// opened names what fd is ("file" or "dir") and closes it, or names err's
// errno; a refusal's descriptor is -1, never one a caller could close by
// mistake.
func opened(t *testing.T, fd int, err error) string {
	t.Helper()
	if err != nil {
		if fd != -1 {
			t.Errorf("%v: descriptor %d, want -1", err, fd)
		}
		var errno unix.Errno
		if !errors.As(err, &errno) {
			t.Fatalf("not an errno: %v", err)
		}
		return unix.ErrnoName(errno)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return "dir"
	}
	return "file"
}

// Open opens a path inside the tree and refuses a symlink anywhere on the
// way, the last component's included, and a climb out of the tree; "." and
// "" are the top itself. It leaves no descriptor of its own open.
func TestOpenRefusesLinksAndClimbs(t *testing.T) {
	top := tree(t)
	dirfd, err := OpenTree(top)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	before := openFDs(t)
	got := map[string]string{}
	for _, rel := range []string{".", "", "d/e/f", "d/e", "ld/e/f", "d/le/f", "d/lf", "ld", "../x", "d/missing"} {
		fd, err := Open(dirfd, rel, unix.O_RDONLY)
		got[rel] = opened(t, fd, err)
	}
	want := map[string]string{
		".": "dir", "": "dir", "d/e/f": "file", "d/e": "dir",
		"ld/e/f": "ELOOP", "d/le/f": "ELOOP", "d/lf": "ELOOP", "ld": "ELOOP", "../x": "EXDEV",
		"d/missing": "ENOENT",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("opens (-want +got):\n%s", diff)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the opens, %d before", after, before)
	}
	// The walk without openat2 closes what it opened on the way, whether it
	// ends in a file or a refusal, and never the caller's directory.
	walked := map[string]string{}
	for _, rel := range []string{"d/e/f", "d/le/f", "d/e/missing", "d/../d", "..", "d/e/f/g"} {
		fd, err := openByParts(dirfd, rel, unix.O_RDONLY)
		walked[rel] = opened(t, fd, err)
	}
	wantWalked := map[string]string{"d/e/f": "file", "d/le/f": "ELOOP", "d/e/missing": "ENOENT", "d/../d": "EXDEV", "..": "EXDEV", "d/e/f/g": "ENOTDIR"}
	if diff := cmp.Diff(wantWalked, walked); diff != "" {
		t.Errorf("walks (-want +got):\n%s", diff)
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after the walks, %d before", after, before)
	}
	if fd, err := Open(dirfd, "d", unix.O_RDONLY); err != nil {
		t.Errorf("the tree's top after the walks: %v", err)
	} else {
		unix.Close(fd)
	}
}

// A sandbox's tree whose top is a symlink or missing is not opened.
func TestOpenTreeRefusesALinkedTop(t *testing.T) {
	top := tree(t)
	got := map[string]string{}
	for _, p := range []string{"ld", "none", "d/e/f"} {
		fd, err := OpenTree(filepath.Join(top, p))
		got[p] = opened(t, fd, errors.Unwrap(err))
	}
	want := map[string]string{"ld": "ENOTDIR", "none": "ENOENT", "d/e/f": "ENOTDIR"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("OpenTree (-want +got):\n%s", diff)
	}
}

// MakeDirs opens a directory of the tree, making the missing ones on the
// way (given to the owner when there is one) and keeping the
// ones there; a symlink on the way is ELOOP and a file ENOTDIR. "." is a
// descriptor of the top of its own.
func TestMakeDirsMakesWhatIsMissingAndRefusesLinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: giving directories to another uid needs root")
	}
	const uid, gid = 4242, 4343
	top := tree(t)
	dirfd, err := OpenTree(top)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(dirfd)
	before := openFDs(t)
	type made struct {
		Result   string
		UID, GID uint32
	}
	got := map[string]made{}
	for _, c := range []struct {
		rel string
		own *Owner
	}{
		{"d/n1/n2", &Owner{uid, gid}},
		{"d/mine", nil},
		{"d/e", &Owner{uid, gid}},
		{".", &Owner{uid, gid}},
		{"ld/x", &Owner{uid, gid}},
		{"d/le/x", nil},
		{"d/e/f/x", nil},
	} {
		fd, err := MakeDirs(dirfd, c.rel, c.own)
		m := made{Result: opened(t, fd, err)}
		var st unix.Stat_t
		if err == nil && unix.Lstat(filepath.Join(top, c.rel), &st) == nil {
			m.UID, m.GID = st.Uid, st.Gid
		}
		got[c.rel] = m
	}
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "d/n1"), &st); err != nil {
		t.Fatal(err)
	}
	got["d/n1"] = made{"made on the way", st.Uid, st.Gid}
	want := map[string]made{
		"d/n1/n2": {"dir", uid, gid},
		"d/n1":    {"made on the way", uid, gid},
		"d/mine":  {"dir", 0, 0},
		"d/e":     {"dir", 0, 0},
		".":       {"dir", 0, 0},
		"ld/x":    {Result: "ELOOP"},
		"d/le/x":  {Result: "ELOOP"},
		"d/e/f/x": {Result: "ENOTDIR"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("MakeDirs (-want +got):\n%s", diff)
	}
	for _, p := range []string{"x", "d/e/x"} {
		if _, err := os.Lstat(filepath.Join(top, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s made through a link: %v", p, err)
		}
	}
	if after := openFDs(t); after != before {
		t.Errorf("%d descriptors open after MakeDirs, %d before", after, before)
	}
	// A tree that is not open: EBADF.
	fd, err := MakeDirs(-1, "x", nil)
	if got := opened(t, fd, err); got != "EBADF" {
		t.Errorf("MakeDirs under no tree: %s, want EBADF", got)
	}
}
