package local

import (
	"fmt"
	"os"

	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/sandboxowner/owner/provider"
)

// CachesOption is the Spec.ProviderOptions key that asks for named shared
// caches: {"caches": {"<name>": "<absolute path in the sandbox>"}}. A cache
// is a host directory that every sandbox naming it shares, read-write (Go's
// module and build caches, say): Options.Caches[name], or <Root>/caches/<name>
// when the options do not place it. It is outside the sandbox's tree, so
// snapshots and forks do not copy it; a fork whose spec names it shares it
// again. Isolated, it is bind-mounted at its path. Unisolated nothing
// can be mounted: instead an environment value (the spec's or the
// request's) that is a cache's path, or a path under it, is rewritten to the
// cache's host directory, so that GOCACHE=/caches/gobuild works either way.
const CachesOption = "caches"

var cacheNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*$`)

// cacheMount is one cache a sandbox's commands see.
type cacheMount struct {
	name string
	host string // the directory on the host
	path string // where the sandbox sees it
	ro   bool   // bound read-only
	// layered: host is an overlay the provider mounted over views
	// already (MountOverlay), bound as it is.
	layered bool
}

// cacheMounts parses spec's caches option, sorted by path. Names and paths
// are checked: a path must be absolute, not /, and neither contain the
// workdir nor lie inside it.
func (p *Provider) cacheMounts(spec provider.Spec, workdir string) ([]cacheMount, error) {
	raw, ok := spec.ProviderOptions[CachesOption]
	if !ok || raw == nil {
		return nil, nil
	}
	named := map[string]string{}
	switch m := raw.(type) {
	case map[string]string:
		for k, v := range m {
			named[k] = v
		}
	case map[string]any:
		for k, v := range m {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("local: cache %q: its path must be a string, not %T: %w", k, v, provider.ErrInvalidSpec)
			}
			named[k] = s
		}
	default:
		return nil, fmt.Errorf("local: provider option %q must map cache names to paths, not %T: %w", CachesOption, raw, provider.ErrInvalidSpec)
	}
	mounts := make([]cacheMount, 0, len(named))
	seen := map[string]string{}
	for name, at := range named {
		if !cacheNameRE.MatchString(name) {
			return nil, fmt.Errorf("local: cache name %q: %w", name, provider.ErrInvalidSpec)
		}
		clean, err := cleanWorkdir(at)
		if err != nil {
			return nil, fmt.Errorf("local: cache %q: %v: %w", name, err, provider.ErrInvalidSpec)
		}
		if within(clean, workdir) || within(workdir, clean) {
			return nil, fmt.Errorf("local: cache %q at %s overlaps the workdir %s: %w", name, clean, workdir, provider.ErrInvalidSpec)
		}
		if other, dup := seen[clean]; dup {
			return nil, fmt.Errorf("local: caches %q and %q are both at %s: %w", other, name, clean, provider.ErrInvalidSpec)
		}
		seen[clean] = name
		if p.ctr != nil {
			if err := p.ctr.checkWorkdir(clean); err != nil {
				return nil, fmt.Errorf("local: cache %q: %v: %w", name, err, provider.ErrInvalidSpec)
			}
		}
		mounts = append(mounts, cacheMount{name: name, host: p.cacheDir(name), path: clean})
	}
	sort.Slice(mounts, func(i, j int) bool { return mounts[i].path < mounts[j].path })
	return mounts, nil
}

func within(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// cacheDir is the host directory of the named cache.
func (p *Provider) cacheDir(name string) string {
	if d, ok := p.cacheDirs[name]; ok {
		return d
	}
	return filepath.Join(p.root, "caches", name)
}

// makeCacheDirs creates the caches' host directories, which belong to own
// (the sandbox's uid, which writes them).
func makeCacheDirs(mounts []cacheMount, own *owner) error {
	for _, m := range mounts {
		if err := os.MkdirAll(m.host, 0o755); err != nil {
			return fmt.Errorf("local: cache %q: %w", m.name, err)
		}
		if err := own.chown(m.host); err != nil {
			return fmt.Errorf("local: cache %q: %w", m.name, err)
		}
	}
	return nil
}

// sandboxMounts are the caches and the mounts (MountsOption) of a sandbox
// whose directory is dir, sorted by path (so that a bind inside another
// comes after it), with the caches' host directories made.
func (p *Provider) sandboxMounts(spec provider.Spec, workdir, dir string, makeDirs bool) ([]cacheMount, error) {
	caches, err := p.cacheMounts(spec, workdir)
	if err != nil {
		return nil, err
	}
	if makeDirs {
		if err := makeCacheDirs(caches, p.owner()); err != nil {
			return nil, err
		}
	}
	mounts, err := p.mountsOf(spec, workdir, dir)
	if err != nil {
		return nil, err
	}
	if makeDirs && p.ctr != nil {
		for _, m := range mounts {
			if err := p.reach(m.host); err != nil {
				return nil, fmt.Errorf("local: %s: %w", m.name, err)
			}
			if m.ro || m.layered {
				continue // an overlay's upper layer is the sandbox's already
			}
			// Written by the sandbox's uid, like a cache.
			if err := p.owner().chown(m.host); err != nil {
				return nil, fmt.Errorf("local: %s: %w", m.name, err)
			}
		}
	}
	all := append(caches, mounts...)
	seen := map[string]string{}
	for _, m := range all {
		if other, dup := seen[m.path]; dup {
			return nil, fmt.Errorf("local: %s and %s are both at %s: %w", other, m.name, m.path, provider.ErrInvalidSpec)
		}
		seen[m.path] = m.name
	}
	sort.Slice(all, func(i, j int) bool { return all[i].path < all[j].path })
	return all, nil
}
