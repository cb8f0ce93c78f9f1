package local

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// describe lists everything copyTree promises to keep of each entry.
func describe(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	inodes := map[uint64]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		st := fi.Sys().(*syscall.Stat_t)
		desc := fmt.Sprintf("%v uid=%d gid=%d", fi.Mode(), st.Uid, st.Gid)
		if !fi.IsDir() {
			desc += fmt.Sprintf(" mtime=%d", st.Mtim.Nano())
		}
		switch {
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" size=%d sha=%x", len(b), sha256.Sum256(b))
			if st.Nlink > 1 {
				if first, ok := inodes[st.Ino]; ok {
					desc += " link-of=" + first
				} else {
					inodes[st.Ino] = rel
				}
			}
		case fi.Mode()&fs.ModeSymlink != 0:
			target, _ := os.Readlink(p)
			desc += " -> " + target
		case fi.Mode()&fs.ModeDevice != 0:
			desc += fmt.Sprintf(" rdev=%d", st.Rdev)
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			desc += " xattrs=" + xattrs(t, p)
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrs(t *testing.T, p string) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := syscall.Listxattr(p, buf)
	if err != nil {
		return "unsupported"
	}
	var names []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		val := make([]byte, 256)
		m, _ := syscall.Getxattr(p, name, val)
		names = append(names, name+"="+string(val[:max(m, 0)]))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func TestCopyTreeKeepsWhatCpAKeeps(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("SKIP: making the source tree (owners, a whiteout device, trusted.* xattrs) needs root")
	}
	src := filepath.Join(t.TempDir(), "src")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "a", "b"), 0o755))
	must(os.WriteFile(filepath.Join(src, "a", "b", "file"), []byte("hello"), 0o640))
	must(os.WriteFile(filepath.Join(src, "empty"), nil, 0o600))
	must(os.WriteFile(filepath.Join(src, "setuid"), []byte("x"), 0o755))
	must(os.Chmod(filepath.Join(src, "setuid"), 0o4755|fs.ModeSetuid))
	must(syscall.Chmod(filepath.Join(src, "setuid"), 0o4755))
	must(os.Link(filepath.Join(src, "a", "b", "file"), filepath.Join(src, "hardlink")))
	must(os.Symlink("a/b/file", filepath.Join(src, "rel-link")))
	must(os.Symlink("/nowhere", filepath.Join(src, "dangling")))
	must(syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644))
	must(syscall.Mknod(filepath.Join(src, "whiteout"), syscall.S_IFCHR, 0)) // an overlayfs whiteout
	must(os.Chown(filepath.Join(src, "a", "b", "file"), 1234, 5678))
	must(os.Lchown(filepath.Join(src, "rel-link"), 1234, 5678))
	must(syscall.Setxattr(filepath.Join(src, "a"), "trusted.overlay.opaque", []byte("y"), 0))
	must(syscall.Setxattr(filepath.Join(src, "empty"), "user.note", []byte("kept"), 0))
	// A directory that is read-only must still be filled.
	must(os.Mkdir(filepath.Join(src, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(src, "ro", "inside"), []byte("i"), 0o644))
	must(os.Chmod(filepath.Join(src, "ro"), 0o555))
	// A sparse file: 1 MiB of hole, 5 bytes, another MiB of hole.
	f, err := os.Create(filepath.Join(src, "sparse"))
	must(err)
	_, err = f.WriteAt([]byte("data!"), 1<<20)
	must(err)
	must(f.Truncate(2 << 20))
	must(f.Close())
	old := time.Date(2001, 2, 3, 4, 5, 6, 7, time.UTC)
	for _, p := range []string{"a/b/file", "empty", "sparse", "fifo"} {
		must(os.Chtimes(filepath.Join(src, p), old, old))
	}
	oldTS := syscall.NsecToTimespec(old.UnixNano())
	must(lutimes(filepath.Join(src, "rel-link"), &syscall.Stat_t{Atim: oldTS, Mtim: oldTS}))

	dst := filepath.Join(t.TempDir(), "dst")
	if err := copyTree(context.Background(), src, dst, 3, nil); err != nil {
		t.Fatal(err)
	}
	want := describe(t, src)
	delete(want, "fifo") // FIFOs, sockets and devices but whiteouts are skipped
	if d := cmp.Diff(want, describe(t, dst)); d != "" {
		t.Errorf("copy differs (-src +dst):\n%s", d)
	}
	var sst, dstSt syscall.Stat_t
	must(syscall.Stat(filepath.Join(src, "sparse"), &sst))
	must(syscall.Stat(filepath.Join(dst, "sparse"), &dstSt))
	if dstSt.Blocks > sst.Blocks+8 {
		t.Errorf("the sparse file's copy uses %d blocks, the original %d", dstSt.Blocks, sst.Blocks)
	}
	if err := copyTree(context.Background(), src, dst, 3, nil); err == nil {
		t.Errorf("copy onto an existing directory succeeded")
	}
}

func TestCopyTreeStopsWithItsContext(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	for i := range 50 {
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i)), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := copyTree(ctx, src, filepath.Join(t.TempDir(), "dst"), 2, nil)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("copy on a done context: %v", err)
	}
}

// A snapshot copy used to lstat an entry, then open it by path as root: a
// command swapping a file for a symlink in between got a host file's
// content into the snapshot. The hook swaps it at exactly that moment.
func TestCopyNeverFollowsALinkSwappedIn(t *testing.T) {
	t.Parallel()
	host := filepath.Join(t.TempDir(), "host-secret")
	if err := os.WriteFile(host, []byte("host secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "src")
	if err := os.MkdirAll(filepath.Join(src, "d"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"f", "d/g"} {
		if err := os.WriteFile(filepath.Join(src, f), []byte("mine"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	swap := func(rel string) {
		switch rel {
		case "f": // a file becomes a symlink to a host file
			_ = os.Remove(filepath.Join(src, "f"))
			_ = os.Symlink(host, filepath.Join(src, "f"))
		case "d": // a directory becomes a symlink to a host directory
			_ = os.Rename(filepath.Join(src, "d"), filepath.Join(src, "d-moved"))
			_ = os.Symlink(filepath.Dir(host), filepath.Join(src, "d"))
		}
	}
	dst := filepath.Join(t.TempDir(), "dst")
	if err := copyTreeHooked(context.Background(), src, dst, 2, nil, swap); err != nil {
		t.Fatal(err)
	}
	err := filepath.WalkDir(dst, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if b, _ := os.ReadFile(p); string(b) == "host secret" {
			t.Errorf("%s holds the host file's content", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"f", "d"} {
		if fi, err := os.Lstat(filepath.Join(dst, name)); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Errorf("%s in the copy: %v, %v; want the symlink copied as a symlink", name, fi, err)
		}
	}
}
