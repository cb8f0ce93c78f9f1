package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A sandbox with a host uid of its own (see uidrange.Range) sees the trees the
// provider keeps as the storage uid (Options.UID, 65534) through idmapped
// mounts, its views: what the storage uid owns on disk is the sandbox's uid
// to it, and what the sandbox's uid writes lands on disk as the storage
// uid. Snapshots, forks and images stay the storage uid's whichever
// sandbox made them, and a fork gets its tree under a uid of its own at no
// cost. Views live under <sandbox>/.views; each is detached before the
// sandbox's directory is removed (see detachViews), so that no removal goes
// through one into what it shows.

// viewsDirName is the directory of a sandbox's views.
const viewsDirName = ".views"

// idmapNS returns a user namespace (an open descriptor) that maps root to
// root and the storage ids to the sandbox's: an idmapped mount made with
// it shows a file the storage uid owns as the sandbox's uid's, and one
// root owns as root's. The helper process makes it (see nsMaker), within
// ctx.
func (p *Provider) idmapNS(ctx context.Context, ids owner) (int, error) {
	return p.ns.make(ctx, owner{p.uid, p.gid}, ids)
}

// idmapMount mounts at dst a view of src through the user namespace nsfd
// (see idmapNS), read-only when ro. It shows src's own mount only, none
// mounted beneath it.
func idmapMount(src, dst string, nsfd int, ro bool) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("view of %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV, Userns_fd: uint64(nsfd)}
	if ro {
		attr.Attr_set |= unix.MOUNT_ATTR_RDONLY
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("view of %s: idmap: %w", src, err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("view of %s: %w", src, err)
	}
	return nil
}

// views are where a sandbox with a uid of its own finds what it uses.
type views struct {
	dir string // <sandbox>/.views
	// root is the provider's root, read-only: overlay layers under it.
	root string
}

func viewsOf(sandboxDir string) views {
	d := filepath.Join(sandboxDir, viewsDirName)
	return views{dir: d, root: filepath.Join(d, "root")}
}

// sb is the view of the sandbox's own directory, writable.
func (v views) sb() string { return filepath.Join(v.dir, "sb") }

// disk is the view of the sandbox's disk, writable.
func (v views) disk() string { return filepath.Join(v.dir, diskDirName) }

// viewOf is where host path h, in s's directory or on its disk, is seen
// through s's views.
func (s *sandbox) viewOf(h string) string {
	v := viewsOf(s.dir)
	if s.hasDisk && within(h, s.diskDir()) {
		return filepath.Join(v.disk(), strings.TrimPrefix(h, s.diskDir()))
	}
	return filepath.Join(v.sb(), strings.TrimPrefix(h, s.dir))
}

// makeViews mounts s's views for the sandbox uid ids (through userns, a
// namespace made for ids ahead, which the caller closes; -1: one is made
// when a view is): its directory, the
// provider's root (in overlay mode), each of lowers outside the root, and
// each writable cache or mount; it returns the paths to use for lowers,
// the upper and work directories, and the mounts. Views already mounted
// (a server restarted while the sandbox lived) are kept. A view that
// failed stays to be detached with the others (see detachViews).
func (p *Provider) makeViews(ctx context.Context, s *sandbox, ids owner, userns int, lowers []string, mounts []cacheMount) (viewLowers []string, upper, work string, viewMounts []cacheMount, err error) {
	v := viewsOf(s.dir)
	if err := os.MkdirAll(v.dir, 0o711); err != nil {
		return nil, "", "", nil, err
	}
	nsfd := userns
	defer func() {
		if nsfd >= 0 && nsfd != userns {
			unix.Close(nsfd)
		}
	}()
	// through is the view dst of src, mounted unless it is already.
	through := func(dst, src string, ro bool) (string, error) {
		if isMountRoot(dst) {
			return dst, nil
		}
		if nsfd < 0 {
			if nsfd, err = p.idmapNS(ctx, ids); err != nil {
				return "", err
			}
		}
		return dst, idmapMount(src, dst, nsfd, ro)
	}
	if _, err := through(v.sb(), s.dir, false); err != nil {
		return nil, "", "", nil, err
	}
	if s.hasDisk {
		if _, err := through(v.disk(), s.diskDir(), false); err != nil {
			return nil, "", "", nil, err
		}
	}
	for i, l := range lowers {
		if rel, ok := strings.CutPrefix(l, p.root+"/"); ok {
			if _, err := through(v.root, p.root, true); err != nil {
				return nil, "", "", nil, err
			}
			viewLowers = append(viewLowers, filepath.Join(v.root, rel))
			continue
		}
		dst, err := through(filepath.Join(v.dir, "l"+strconv.Itoa(i)), l, true)
		if err != nil {
			return nil, "", "", nil, err
		}
		viewLowers = append(viewLowers, dst)
	}
	for i, m := range mounts {
		switch {
		case m.ro, m.layered:
		case within(m.host, s.dir):
			m.host = s.viewOf(m.host)
		default:
			if m.host, err = through(filepath.Join(v.dir, "m"+strconv.Itoa(i)), m.host, false); err != nil {
				return nil, "", "", nil, err
			}
		}
		viewMounts = append(viewMounts, m)
	}
	return viewLowers, s.viewOf(s.upperDir()), s.viewOf(s.workDir()), viewMounts, nil
}

// detachViews detaches every view of the sandbox directory dir. It is
// called before dir is removed: a removal must never go through a view
// into a cache, a mount or the provider's root.
func detachViews(dir string) {
	v := viewsOf(dir)
	entries, err := os.ReadDir(v.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(v.dir, e.Name())
		for i := 0; i < 8 && isMountRoot(p); i++ {
			_ = unmount(p)
		}
	}
}

// isMountRoot reports whether p is the root of a mount (a bind of the same
// filesystem too, which a change of device would not tell).
func isMountRoot(p string) bool {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, 0, &st); err != nil {
		return false
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// removeSandboxDir removes a sandbox's directory (or one moved to the
// trash), its overlay, views and disk detached first (see
// detachSandboxMounts); it refuses when one stays mounted.
func removeSandboxDir(dir string) error {
	detachSandboxMounts(dir)
	v := viewsOf(dir)
	entries, _ := os.ReadDir(v.dir)
	for _, e := range entries {
		if isMountRoot(filepath.Join(v.dir, e.Name())) {
			return fmt.Errorf("remove %s: view %s is still mounted", dir, e.Name())
		}
	}
	for _, m := range []string{"fs", diskDirName} {
		if isMountRoot(filepath.Join(dir, m)) {
			return fmt.Errorf("remove %s: %s is still mounted", dir, m)
		}
	}
	return os.RemoveAll(dir)
}
