package swebench

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/flock"
	"github.com/sandboxowner/owner/provider/local"
)

// A cache's generations are deleted once nothing stands on them
// (collectCacheGens): not the current chain (what the next sandbox of the
// template mounts), nor a chain a sandbox is being started on (pinned),
// nor what a sandbox or snapshot of any server using the template names
// in its mounts (a fork from a checkpoint mounts its sandbox's chain
// again). Each server using a template records there where its provider
// keeps those (cacheUsersDir), so that another's collection counts them.
const (
	// cachePinsDir, under a cache's generations, holds a file per sandbox
	// being started (its chain), locked while its start runs.
	cachePinsDir = ".pins"
	// cacheUsersDir, under a template's caches, holds a file per provider
	// whose sandboxes stood on its caches (local.Users).
	cacheUsersDir = ".users"
	// cacheDeletedPrefix names, under a cache's generations, a generation
	// being deleted: renamed first, so that a half-deleted one is never
	// read as a generation.
	cacheDeletedPrefix = ".del-"
)

// pinCaches returns a copy of env whose caches' chains are fixed as they
// are now, and pinned until unpin, which the caller calls once the
// sandbox it starts on them has started (its provider's metadata then
// names them) or did not: a collection meanwhile, in this process or
// another, keeps them. hostMounts (the provider's Capabilities) is
// recorded as a user of the template's caches; empty (a provider that
// does not say), the template's generations are never collected.
func (s *Server) pinCaches(env *Environment, hostMounts string) (*Environment, func(), error) {
	if err := registerCacheUser(env, hostMounts); err != nil {
		return nil, nil, err
	}
	pinned := *env
	pinned.chains = map[string][]string{}
	var pins []*os.File
	unpin := func() {
		for _, f := range pins {
			name := f.Name()
			_ = flock.Release(f)
			_ = os.Remove(name)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(s.cfg.Caches)) {
		base := env.cacheBase(name)
		f, chain, err := pinChain(base)
		if err != nil {
			unpin()
			return nil, nil, fmt.Errorf("pin the %s cache's generations: %w", name, err)
		}
		pins = append(pins, f)
		pinned.chains[name] = chain
	}
	return &pinned, unpin, nil
}

// pinChain reads the chain of the cache whose first generation is base
// and pins it, under the cache's lock held shared (a collection holds it
// exclusively): a file naming it, locked for as long as it is open.
func pinChain(base string) (*os.File, []string, error) {
	if err := os.MkdirAll(filepath.Join(base+cacheGensSuffix, cachePinsDir), 0o755); err != nil {
		return nil, nil, err
	}
	unlock, err := lockFileShared(base + cacheGensSuffix + ".lock")
	if err != nil {
		return nil, nil, err
	}
	defer unlock()
	chain := cacheChain(base)
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	f, err := os.OpenFile(filepath.Join(base+cacheGensSuffix, cachePinsDir, hex.EncodeToString(rnd[:])), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return nil, nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, nil, err
	}
	if _, err := f.WriteString(strings.Join(chain, "\n")); err != nil {
		_ = flock.Release(f)
		os.Remove(f.Name())
		return nil, nil, err
	}
	return f, chain, nil
}

// unknownCacheUser is the record of a provider that does not say where
// what stands on its mounts is kept: from then on none of the template's
// generations is deleted.
const unknownCacheUser = "unknown"

// registerCacheUser records hostMounts as a user of env's caches (once;
// the file's name is its digest).
func registerCacheUser(env *Environment, hostMounts string) error {
	dir := filepath.Join(env.Dir, envCaches, cacheUsersDir)
	sum := sha256.Sum256([]byte(hostMounts))
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".json")
	if hostMounts == "" {
		path = filepath.Join(dir, unknownCacheUser)
	}
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// A temporary name of its own: the sandboxes of one server start
	// concurrently, and a name per process let one start's rename take
	// another's file from under it (ENOENT, and the start failed).
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.WriteString(hostMounts)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// hostsInUse are the host directories the sandboxes and snapshots of
// every provider recorded as a user of env's caches stand on. A user
// whose directories are gone is forgotten. An error (a user that cannot
// be read, or whose snapshots do not say) means nothing may be deleted.
func hostsInUse(env *Environment) (map[string]bool, error) {
	dir := filepath.Join(env.Dir, envCaches, cacheUsersDir)
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	inUse := map[string]bool{}
	for _, e := range entries {
		if e.Name() == unknownCacheUser {
			return nil, errors.New("a provider that does not say what stands on its mounts used the template's caches")
		}
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		path := filepath.Join(dir, e.Name())
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, err
		}
		var u local.Users
		if err := json.Unmarshal(b, &u); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if _, err := os.Stat(u.Sandboxes); errors.Is(err, fs.ErrNotExist) {
			if _, err := os.Stat(u.Snapshots); errors.Is(err, fs.ErrNotExist) {
				_ = os.Remove(path) // a provider gone with its sandboxes
				continue
			}
		}
		hosts, err := local.HostsInUse(u)
		if err != nil {
			return nil, err
		}
		for h := range hosts {
			// As the collection spells it too, whatever spelling of
			// the template's directory the user's server had.
			inUse[h], inUse[resolved(h)] = true, true
		}
	}
	return inUse, nil
}

// collectCacheGens deletes, for each of env's caches, the generations
// nothing stands on (see pinCaches), and what a collection that died
// left half deleted. It returns the generations deleted; an error leaves
// the rest in place. A cache with no generation off its current chain
// costs a directory read.
func (s *Server) collectCacheGens(env *Environment, log logrus.FieldLogger) []string {
	var deleted []string
	for _, name := range slices.Sorted(maps.Keys(s.cfg.Caches)) {
		base := env.cacheBase(name)
		if len(offChain(base)) == 0 {
			continue
		}
		d, err := collectCache(env, base)
		deleted = append(deleted, d...)
		if err != nil {
			log.WithError(err).WithFields(logrus.Fields{"env_dir": env.Dir, "cache": name}).Warn("swebench: deleting cache generations nothing stands on")
		}
	}
	if len(deleted) > 0 {
		log.WithFields(logrus.Fields{"env_dir": env.Dir, "generations": deleted}).Info("swebench: cache generations nothing stands on deleted")
	}
	return deleted
}

// offChain are the generations of the cache whose first is base that are
// not on its current chain (the first one included, when a squash took
// its place), and what a collection left half deleted.
func offChain(base string) []string {
	entries, err := os.ReadDir(base + cacheGensSuffix)
	if err != nil {
		return nil
	}
	chain := cacheChain(base)
	var out []string
	for _, e := range entries {
		dir := filepath.Join(base+cacheGensSuffix, e.Name())
		_, gen := cacheGenNumber(e.Name())
		if gen && !slices.Contains(chain, dir) || strings.HasPrefix(e.Name(), cacheDeletedPrefix) {
			out = append(out, dir)
		}
	}
	if !slices.Contains(chain, base) && !emptyDir(base) {
		out = append(out, base)
	}
	return out
}

// collectCache deletes, under the cache's lock, the generations off the
// current chain of env's cache whose first is base that no live pin names
// and that no user's sandbox or snapshot stands on (hostsInUse). The
// users are read after the pins: a start that unpinned since had written
// its sandbox's metadata first, and none pins while the lock is held. The
// first generation is emptied rather than removed: its path is the
// cache's.
func collectCache(env *Environment, base string) ([]string, error) {
	unlock, err := lockFile(base + cacheGensSuffix + ".lock")
	if err != nil {
		return nil, err
	}
	defer unlock()
	pinned, err := livePins(base)
	if err != nil {
		return nil, err
	}
	inUse, err := hostsInUse(env)
	if err != nil {
		return nil, fmt.Errorf("the generations in use cannot be told, none is deleted: %w", err)
	}
	var deleted []string
	var errs []error
	for _, dir := range offChain(base) {
		if strings.HasPrefix(filepath.Base(dir), cacheDeletedPrefix) {
			errs = append(errs, os.RemoveAll(dir))
			continue
		}
		if pinned[dir] || inUse[dir] || inUse[resolved(dir)] {
			continue
		}
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		doomed := filepath.Join(base+cacheGensSuffix, cacheDeletedPrefix+filepath.Base(dir)+"-"+hex.EncodeToString(rnd[:]))
		if err := os.Rename(dir, doomed); err != nil {
			errs = append(errs, err)
			continue
		}
		if dir == base {
			if err := os.Mkdir(base, 0o755); err != nil {
				errs = append(errs, err)
			}
		}
		deleted = append(deleted, dir)
		errs = append(errs, os.RemoveAll(doomed))
	}
	return deleted, errors.Join(errs...)
}

// livePins are the generations the live pins of the cache whose first is
// base name; a pin whose holder is gone (its lock free) is removed.
func livePins(base string) (map[string]bool, error) {
	dir := filepath.Join(base+cacheGensSuffix, cachePinsDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	pinned := map[string]bool{}
	for _, e := range entries {
		path := filepath.Join(dir, e.Name())
		f, err := os.Open(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue // unpinned meanwhile
		}
		if err != nil {
			return nil, err
		}
		if flock.TryExclusive(f) == nil {
			// Its holder is gone (or unpins now: it removes it).
			_ = os.Remove(path)
			_ = flock.Release(f)
			continue
		}
		b, err := os.ReadFile(path)
		f.Close()
		if err != nil {
			return nil, err
		}
		for _, l := range strings.Split(string(b), "\n") {
			pinned[l] = true
		}
	}
	return pinned, nil
}

// resolved is path with its symbolic links resolved, or path.
func resolved(path string) string {
	if r, err := filepath.EvalSymlinks(path); err == nil {
		return r
	}
	return path
}

// emptyDir: dir holds nothing (or is gone).
func emptyDir(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) == 0 || errors.Is(err, fs.ErrNotExist)
}
