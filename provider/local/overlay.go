package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// maxMountData is the limit this package keeps the overlay mount options
// under: the kernel takes at most a page of them.
const maxMountData = 3500

// maxLayers bounds an overlay sandbox's lower layers. A snapshot of a sandbox
// that already stands on this many is taken flat (a full copy of its tree)
// so that fork chains do not grow without end.
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
	data := "lowerdir=" + strings.Join(lowers, ":") + ",upperdir=" + upper + ",workdir=" + work
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
// through it, and removes what it made.
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
	if err := os.WriteFile(filepath.Join(lower, "a"), []byte("a"), 0o644); err != nil {
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
	if err := os.Remove(filepath.Join(merged, "a")); err != nil {
		return fmt.Errorf("probe: write through the overlay: %w", err)
	}
	fi, err := os.Lstat(filepath.Join(upper, "a"))
	if err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return errors.New("probe: the overlay made no whiteout in its upper layer")
	}
	return nil
}
