package local

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"
)

// maxMountData is the limit this package keeps the overlay mount options
// under: the kernel takes at most a page of them.
const maxMountData = 3500

// maxLayers bounds an overlay sandbox's lower layers. A snapshot of a sandbox
// that already stands on this many is taken flat (a full copy of its tree)
// so that fork chains do not grow without end. A provider keeps it in a
// field, which its tests lower to reach a flattening in a few generations.
const maxLayers = 24

// overlayData returns the mount options for an overlay of lowers (topmost
// first) with upper and work, or an error when the kernel could not take them.
func overlayData(lowers []string, upper, work string) (string, error) {
	if len(lowers) == 0 {
		return "", errors.New("overlay: no lower layer")
	}
	for _, d := range append([]string{upper, work}, lowers...) {
		if strings.ContainsAny(d, ",:\\") {
			return "", fmt.Errorf("overlay: path %q has a character overlayfs options cannot hold", d)
		}
	}
	// metacopy: a chown copies up only the inode, not the data (see
	// ownedLayer); the layers that carry such inodes need it to be read.
	data := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work + ",metacopy=on"
	if len(data) > maxMountData {
		return "", fmt.Errorf("overlay: %d layers make %d bytes of mount options", len(lowers), len(data))
	}
	return data, nil
}

// mountOverlay mounts an overlay of lowers with upper and work at target.
func mountOverlay(target string, lowers []string, upper, work string) error {
	data, err := overlayData(lowers, upper, work)
	if err != nil {
		return err
	}
	if err := syscall.Mount("overlay", target, "overlay", 0, data); err != nil {
		return fmt.Errorf("mount overlay at %s: %w", target, err)
	}
	return nil
}

// unmount detaches whatever is mounted at target; nothing mounted is success.
func unmount(target string) error {
	err := syscall.Unmount(target, syscall.MNT_DETACH)
	if err == nil || errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOENT) {
		return nil
	}
	return fmt.Errorf("unmount %s: %w", target, err)
}

// isMountPoint reports whether dir is on another filesystem than its parent.
func isMountPoint(dir string) (bool, error) {
	var st, parent syscall.Stat_t
	if err := syscall.Stat(dir, &st); err != nil {
		return false, fmt.Errorf("stat %s: %w", dir, err)
	}
	if err := syscall.Stat(filepath.Dir(dir), &parent); err != nil {
		return false, fmt.Errorf("stat %s: %w", filepath.Dir(dir), err)
	}
	return st.Dev != parent.Dev, nil
}

// probeOverlay mounts and unmounts a small overlay under parent, writing
// through it and changing an owner (which must copy up only metadata), and
// removes what it made.
func probeOverlay(parent string) (err error) {
	if strings.ContainsAny(parent, ",:\\") {
		return fmt.Errorf("root %q has a character overlayfs options cannot hold", parent)
	}
	dir, err := os.MkdirTemp(parent, "overlay-probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer func() {
		if rmErr := os.RemoveAll(dir); rmErr != nil && err == nil {
			err = rmErr
		}
	}()
	lower, upper, work, merged := filepath.Join(dir, "l"), filepath.Join(dir, "u"), filepath.Join(dir, "w"), filepath.Join(dir, "m")
	for _, d := range []string{lower, upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("probe: %w", err)
		}
	}
	// Big enough that a data copy-up takes more blocks than the metadata a
	// metacopy-up may take (ext4 can put the overlay's xattrs in a block of
	// their own).
	const probeSize = 64 << 10
	if err := os.WriteFile(filepath.Join(lower, "a"), make([]byte, probeSize), 0o644); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if err := mountOverlay(merged, []string{lower}, upper, work); err != nil {
		return err
	}
	defer func() {
		if umErr := unmount(merged); umErr != nil && err == nil {
			err = umErr
		}
	}()
	if err := os.Lchown(filepath.Join(merged, "a"), 1, 1); err != nil {
		return fmt.Errorf("probe: chown through the overlay: %w", err)
	}
	if fi, err := os.Lstat(filepath.Join(upper, "a")); err != nil || fi.Sys().(*syscall.Stat_t).Blocks*512 >= probeSize {
		return errors.New("probe: a chown through the overlay copied the data up (no metacopy)")
	}
	if err := os.Remove(filepath.Join(merged, "a")); err != nil {
		return fmt.Errorf("probe: write through the overlay: %w", err)
	}
	fi, err := os.Lstat(filepath.Join(upper, "a"))
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return errors.New("probe: the overlay made no whiteout in its upper layer")
	}
	return nil
}

// ownedLayer returns a layer that, stacked on the template src, makes every
// entry of it owned by the sandbox's uid and gid: sandboxed commands run
// as that uid and must be able to change their tree. It holds only
// metadata (overlayfs metacopy inodes), is made once per template
// directory and kept under <root>/images, and is keyed by the template's
// path and its top directory's inode and change time: a template is not
// changed in place while sandboxes stand on it.
func (p *Provider) ownedLayer(ctx context.Context, src string) (string, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(src, &st); err != nil {
		return "", fmt.Errorf("image %s: %w", src, err)
	}
	sum := sha256.Sum256(fmt.Appendf(nil, "%s\x00%d\x00%d\x00%d.%d\x00%d:%d", src, st.Ino, st.Dev, st.Ctim.Sec, st.Ctim.Nsec, p.uid, p.gid))
	dir := filepath.Join(p.imagesDir(), hex.EncodeToString(sum[:8]))
	layer := filepath.Join(dir, "layer")
	p.imageMu.Lock()
	defer p.imageMu.Unlock()
	if _, err := os.Stat(layer); err == nil {
		return layer, nil
	}
	tmp, err := os.MkdirTemp(p.imagesDir(), "tmp-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	upper, work, merged := filepath.Join(tmp, "layer"), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	for _, d := range []string{upper, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
	}
	if err := mountOverlay(merged, []string{src}, upper, work); err != nil {
		return "", err
	}
	err = chownTree(ctx, merged, p.uid, p.gid)
	if umErr := unmount(merged); err == nil {
		err = umErr
	}
	if err != nil {
		return "", fmt.Errorf("image %s: own it as uid %d: %w", src, p.uid, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(upper, layer); err != nil {
		return "", err
	}
	p.log.WithFields(logrus.Fields{"image": src, "layer": layer}).Info("local: made the layer that gives an image's tree to the sandbox's uid")
	return layer, nil
}

// chownTree gives every entry under dir (dir included, symlinks
// themselves) to uid and gid. dir is the server's own (a fresh copy or
// mount no command has run in).
func chownTree(ctx context.Context, dir string, uid, gid int) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		return os.Lchown(p, uid, gid)
	})
}
