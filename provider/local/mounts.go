package local

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
)

// MountsOption is the Spec.ProviderOptions key of host directories a
// sandbox's commands see at paths of their own, besides the tree and the
// named caches: a list of Mount ({"host", "path", "mode"}). It serves
// directories that belong to an image rather than to the provider (a
// template's module cache, say). Like caches, mounts are outside the tree:
// snapshots do not copy them, and a fork whose spec names them gets them
// again (a fresh copy for MountCopy). Isolated, they are bound at
// their path; unisolated, environment values naming a mount's path are
// rewritten to its directory on the host, and MountReadOnly is not enforced.
const MountsOption = "mounts"

// Mount modes.
const (
	// MountReadOnly shows the host directory read-only.
	MountReadOnly = "ro"
	// MountReadWrite shows the host directory read-write.
	MountReadWrite = "rw"
	// MountCopy gives the sandbox a writable copy of the host directory of
	// its own, made at start in the sandbox's directory and removed with
	// it: the host directory is only read, and nothing one sandbox writes
	// reaches another.
	MountCopy = "copy"
	// MountOverlay is MountCopy without the copy: where the provider
	// isolates sandboxes and mounts overlays, the sandbox sees an overlay
	// whose one lower layer is the host directory and whose upper layer is
	// its own (in its directory, removed with it), so that a start costs a
	// mount, not a copy of the whole directory. Elsewhere it is a copy.
	// Entries the storage uid does not own stay their owner's (a copy
	// gives every entry to the sandbox). The host directory should not
	// change while sandboxes stand on it: an entry added meanwhile may or
	// may not show, which suits a content-addressed cache (Go's build
	// cache) and nothing that needs one consistent state.
	MountOverlay = "overlay"
)

// Mount is one entry of MountsOption.
type Mount struct {
	// Host is an absolute directory on the host, outside the provider's root.
	Host string `json:"host"`
	// Path is where the sandbox sees it: absolute, not /, neither holding
	// nor inside the workdir.
	Path string `json:"path"`
	// Mode is MountReadOnly, MountReadWrite, MountCopy or MountOverlay.
	Mode string `json:"mode"`
	// Lower are, for MountOverlay and MountCopy only, host directories
	// stacked under Host, the nearest first: the sandbox sees what overlayfs
	// shows of Host over them (an entry of a nearer layer hides the same
	// path's in the farther ones; whiteouts are honoured, opaque directories
	// are not in a copy). Host and Lower are only read. The kernel bounds
	// how many layers an overlay stacks (and the length of their paths): a
	// caller keeps its stacks short.
	Lower []string `json:"lower,omitempty"`
}

// mountsOf parses spec's mounts option (any JSON-shaped value: the spec may
// have been read back from its metadata file) and returns them as cache
// mounts, a MountCopy entry pointing at its copy under sandboxDir.
func (p *Provider) mountsOf(spec provider.Spec, workdir, sandboxDir string) ([]cacheMount, error) {
	ms, err := decodeMounts(spec)
	if err != nil {
		return nil, err
	}
	out := make([]cacheMount, 0, len(ms))
	for i, m := range ms {
		name := MountsOption + "[" + strconv.Itoa(i) + "]"
		for _, h := range append([]string{m.Host}, m.Lower...) {
			if !filepath.IsAbs(h) || filepath.Clean(h) != h {
				return nil, fmt.Errorf("local: %s: host %q is not a clean absolute path: %w", name, h, provider.ErrInvalidSpec)
			}
			if within(h, p.root) || within(p.root, h) {
				return nil, fmt.Errorf("local: %s: host %q overlaps the provider's root: %w", name, h, provider.ErrInvalidSpec)
			}
		}
		if len(m.Lower) > 0 && m.Mode != MountOverlay && m.Mode != MountCopy {
			return nil, fmt.Errorf("local: %s: lower layers under a mount of mode %q (only %s and %s stack them): %w", name, m.Mode, MountOverlay, MountCopy, provider.ErrInvalidSpec)
		}
		at, err := cleanWorkdir(m.Path)
		if err != nil {
			return nil, fmt.Errorf("local: %s: %v: %w", name, err, provider.ErrInvalidSpec)
		}
		if within(at, workdir) || within(workdir, at) {
			return nil, fmt.Errorf("local: %s at %s overlaps the workdir %s: %w", name, at, workdir, provider.ErrInvalidSpec)
		}
		if p.ctr != nil {
			if err := p.ctr.checkWorkdir(at); err != nil {
				return nil, fmt.Errorf("local: %s: %v: %w", name, err, provider.ErrInvalidSpec)
			}
		}
		cm := cacheMount{name: name, host: m.Host, path: at}
		switch m.Mode {
		case MountReadOnly:
			cm.ro = true
		case MountReadWrite:
		case MountCopy:
			cm.host = mountCopyDir(sandboxDir, i)
		case MountOverlay:
			cm.host, cm.layered = mountCopyDir(sandboxDir, i), p.layeredMounts()
		default:
			return nil, fmt.Errorf("local: %s: mode %q (want %s, %s, %s or %s): %w", name, m.Mode, MountReadOnly, MountReadWrite, MountCopy, MountOverlay, provider.ErrInvalidSpec)
		}
		out = append(out, cm)
	}
	return out, nil
}

// decodeMounts reads spec's mounts option, whatever JSON-shaped value holds
// it ([]Mount in process, []any once read back from a metadata file).
func decodeMounts(spec provider.Spec) ([]Mount, error) {
	raw, ok := spec.ProviderOptions[MountsOption]
	if !ok || raw == nil {
		return nil, nil
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("local: provider option %q: %v: %w", MountsOption, err, provider.ErrInvalidSpec)
	}
	var ms []Mount
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ms); err != nil {
		return nil, fmt.Errorf("local: provider option %q must be a list of {host, path, mode}: %v: %w", MountsOption, err, provider.ErrInvalidSpec)
	}
	return ms, nil
}

func mountCopyDir(sandboxDir string, i int) string {
	return filepath.Join(sandboxDir, "mounts", strconv.Itoa(i))
}

// checkMountHosts checks that every mount's host directory exists.
func checkMountHosts(spec provider.Spec) error {
	ms, err := decodeMounts(spec)
	if err != nil {
		return err
	}
	for i, m := range ms {
		for _, h := range append([]string{m.Host}, m.Lower...) {
			if fi, err := os.Stat(h); err != nil || !fi.IsDir() {
				return fmt.Errorf("local: %s[%d]: %s is not a directory: %w", MountsOption, i, h, provider.ErrInvalidSpec)
			}
		}
	}
	return nil
}

// copyMounts makes the sandbox's copies of its MountCopy entries (and of
// its MountOverlay ones where they are not overlays).
func (p *Provider) copyMounts(ctx context.Context, spec provider.Spec, sandboxDir string) error {
	ms, err := decodeMounts(spec)
	if err != nil {
		return err
	}
	for i, m := range ms {
		if m.Mode != MountCopy && (m.Mode != MountOverlay || p.layeredMounts()) {
			continue
		}
		dst := mountCopyDir(sandboxDir, i)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
		}
		layers := append([]string{m.Host}, m.Lower...)
		if err := copyTree(ctx, layers[len(layers)-1], dst, p.copyWorkers, p.owner()); err != nil {
			return fmt.Errorf("local: %s[%d]: copy %s: %w", MountsOption, i, layers[len(layers)-1], err)
		}
		// Each nearer layer is copied beside the copy and moved over it.
		for j := len(layers) - 2; j >= 0; j-- {
			tmp := dst + ".merge"
			if err := os.RemoveAll(tmp); err != nil {
				return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
			}
			if err := copyTree(ctx, layers[j], tmp, p.copyWorkers, p.owner()); err != nil {
				return fmt.Errorf("local: %s[%d]: copy %s: %w", MountsOption, i, layers[j], err)
			}
			if err := mergeTree(tmp, dst); err != nil {
				return fmt.Errorf("local: %s[%d]: stack %s: %w", MountsOption, i, layers[j], err)
			}
			if err := os.RemoveAll(tmp); err != nil {
				return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
			}
		}
	}
	return nil
}

// mergeTree moves the entries of src over those of dst, as an overlay
// whose upper layer is src would show them: a directory in both is merged,
// anything else of src replaces dst's entry, and a whiteout (a character
// device; a copy keeps no other) removes it.
func mergeTree(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		from, to := filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())
		if e.IsDir() {
			if fi, err := os.Lstat(to); err == nil && fi.IsDir() {
				if err := mergeTree(from, to); err != nil {
					return err
				}
				continue
			}
		}
		if err := os.RemoveAll(to); err != nil {
			return err
		}
		if e.Type()&fs.ModeCharDevice != 0 {
			continue
		}
		if err := os.Rename(from, to); err != nil {
			return err
		}
	}
	return nil
}

// layeredMounts reports whether MountOverlay entries are overlays: the
// provider mounts overlays, and binds mounts into containers (unisolated
// commands are pointed at a host directory, which must then be a copy).
func (p *Provider) layeredMounts() bool { return p.overlay && p.ctr != nil }

// Where a MountOverlay entry's writable layer and overlayfs's work
// directory are, beside its mount point.
func mountUpperDir(sandboxDir string, i int) string { return mountCopyDir(sandboxDir, i) + ".upper" }
func mountWorkDir(sandboxDir string, i int) string  { return mountCopyDir(sandboxDir, i) + ".work" }

// mountLayers mounts the overlays of s's MountOverlay entries that are not
// mounted yet (a new sandbox's, or an adopted one's after a reboot). With a
// uid of its own (ids), the host directory and the sandbox's layer are
// seen through views, as its tree's are: the storage uid's entries are the
// sandbox's uid's.
func (p *Provider) mountLayers(ctx context.Context, s *sandbox, spec provider.Spec, ids *owner) error {
	if !p.layeredMounts() {
		return nil
	}
	ms, err := decodeMounts(spec)
	if err != nil {
		return err
	}
	nsfd := -1
	defer func() {
		if nsfd >= 0 {
			unix.Close(nsfd)
		}
	}()
	for i, m := range ms {
		target := mountCopyDir(s.writableDir(), i)
		if m.Mode != MountOverlay || isMountRoot(target) {
			continue
		}
		upper, work := mountUpperDir(s.writableDir(), i), mountWorkDir(s.writableDir(), i)
		for _, d := range []string{target, upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
			}
		}
		if err := p.owner().chown(upper); err != nil {
			return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
		}
		lowers := append([]string{m.Host}, m.Lower...)
		if ids != nil {
			v := viewsOf(s.dir)
			for j, l := range lowers {
				// c<i> for Host, as before there were lower layers: a
				// sandbox adopted after a restart keeps its views.
				view := filepath.Join(v.dir, "c"+strconv.Itoa(i))
				if j > 0 {
					view += "." + strconv.Itoa(j)
				}
				if !isMountRoot(view) {
					if nsfd < 0 {
						if nsfd, err = p.idmapNS(ctx, *ids); err != nil {
							return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
						}
					}
					if err := idmapMount(l, view, nsfd, true); err != nil {
						return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
					}
				}
				lowers[j] = view
			}
			upper, work = s.viewOf(upper), s.viewOf(work)
		}
		if err := mountOverlay(target, lowers, upper, work); err != nil {
			return fmt.Errorf("local: %s[%d]: %w", MountsOption, i, err)
		}
	}
	return nil
}

// detachLayers detaches the MountOverlay overlays under the sandbox
// directory dir (on its disk too): they hold its views.
func detachLayers(dir string) {
	for _, d := range []string{filepath.Join(dir, "mounts"), filepath.Join(dir, diskDirName, "mounts")} {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		for _, e := range entries {
			p := filepath.Join(d, e.Name())
			for i := 0; i < 8 && isMountRoot(p); i++ {
				_ = unmount(p)
			}
		}
	}
}
