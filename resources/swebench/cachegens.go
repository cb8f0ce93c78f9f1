package swebench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
)

// A writable cache of a template (its Go build cache) is a series of
// generations, each a complete tree that never changes once published:
// caches/<name> is the first (the environment step's), and
// caches/<name>.gens/NNNNNNNN the later ones, each a copy of the one
// before it plus what a validation compiled. (A copy, not hard links: a
// link changes the change time of the file it links, which the purge of
// every eval standing on it would take for a write of its own.) Every sandbox mounts the
// newest generation as the lower layer of an overlay whose upper layer is
// its own, validations included: nothing a sandbox does changes a layer
// another stands on, so no eval's purge (which takes what changed since
// the eval began for its own writes) ever sees another's refresh or
// addition. A generation is kept as long as the environment: a sandbox, or
// a fork of it from a checkpoint, names it in its spec.
const (
	cacheGensSuffix = ".gens"
	cacheGenDigits  = 8
	// harvestMountPrefix is where a validation sees, for each writable
	// cache, the directory it copies what it added to the cache into.
	harvestMountPrefix = CacheMountDir + "/.new-"
)

// currentCacheGen is the newest published generation of the cache whose
// first generation is base, and its number (0 for base itself).
func currentCacheGen(base string) (string, int) {
	entries, err := os.ReadDir(base + cacheGensSuffix)
	if err != nil {
		return base, 0
	}
	best, bestN := base, 0
	for _, e := range entries {
		n, ok := cacheGenNumber(e.Name())
		if ok && e.IsDir() && n > bestN {
			best, bestN = filepath.Join(base+cacheGensSuffix, e.Name()), n
		}
	}
	return best, bestN
}

// cacheGenNumber parses a published generation's name.
func cacheGenNumber(name string) (int, bool) {
	if len(name) != cacheGenDigits {
		return 0, false
	}
	n, err := strconv.Atoi(name)
	return n, err == nil && n > 0
}

// harvestDir makes, for a validation of env, a fresh directory per
// writable cache (under the cache's generations, on its file system) into
// which the validation copies what it added: the directory's own change
// time, taken before the sandbox starts, tells its new files from the
// generation's.
func (s *Server) harvestDir(env *Environment) (string, error) {
	s.sweepHarvests(env, time.Now())
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	dir := filepath.Join(env.Dir, envCaches, ".harvest-"+hex.EncodeToString(rnd[:]))
	for _, name := range s.writableCaches() {
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			os.RemoveAll(dir)
			return "", err
		}
	}
	return dir, nil
}

// sweepHarvests removes the harvest directories of env that a server
// stopped mid-validation left (its own removes each as the validation
// ends): those made longer ago than a validation can run, with an hour to
// spare for a server whose evaluation_timeout is longer.
func (s *Server) sweepHarvests(env *Environment, now time.Time) {
	dir := filepath.Join(env.Dir, envCaches)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	limit := s.cfg.evaluationTimeout() + 2*s.cfg.setupTimeout() + time.Hour
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".harvest-") {
			continue
		}
		if fi, err := e.Info(); err == nil && now.Sub(fi.ModTime()) > limit {
			_ = os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// writableCaches are the names of the configured caches sandboxes write
// layers of their own over, sorted.
func (s *Server) writableCaches() []string {
	var out []string
	for name := range s.cfg.Caches {
		if s.cfg.writable(name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// harvestScript copies, in a validation's sandbox once its eval ended,
// every file of each writable cache written since its harvest directory
// was made (what the validation wrote: the generation under it is older)
// into that directory, at the same relative path. Written means changed
// (ctime) and modified (mtime) since, and not stamped ahead: where the
// sandbox's layer is a copy made at its start (unisolated), every file
// changed then, but the copy keeps each file's mtime. The paths come in
// NG_CACHE_<i> and NG_NEW_<i> (environment values: unisolated, they are
// rewritten to the host's directories).
const harvestScript = `set -e
i=0
while :; do
	eval "c=\${NG_CACHE_$i-} h=\${NG_NEW_$i-}"
	[ -n "$c" ] || break
	t=$(find "$h" -maxdepth 0 -printf '%C@')
	cd "$c"
	find . -type f -newerct "@$t" -newermt "@$t" ! -newermt @4102444800 -exec cp --parents -p -t "$h" {} +
	i=$((i + 1))
done
`

// harvest runs harvestScript in the validation's sandbox h, whose harvest
// directory on the host is dir.
func (s *Server) harvest(ctx context.Context, p provider.Provider, h provider.Handle) error {
	vars := map[string]string{}
	for i, name := range s.writableCaches() {
		vars["NG_CACHE_"+strconv.Itoa(i)] = CacheMountDir + "/" + name
		vars["NG_NEW_"+strconv.Itoa(i)] = harvestMountPrefix + name
	}
	res, err := run(ctx, p, h, harvestScript, vars, s.cfg.setupTimeout())
	if err != nil {
		return err
	}
	if res.ExitCode != 0 {
		return fmt.Errorf("exit %d: %s", res.ExitCode, lastLines(res.Stdout+res.Stderr, 4))
	}
	return nil
}

// publishHarvest publishes, for each writable cache of env, the next
// generation: the current one with the files of the harvest directory dir
// it lacks (stamped ahead for the build cache, as the environment's first
// generation is). Nothing is published for a cache to which the validation
// added nothing. dir is removed.
func (s *Server) publishHarvest(ctx context.Context, env *Environment, dir string, log logrus.FieldLogger) {
	defer os.RemoveAll(dir)
	for _, name := range s.writableCaches() {
		gen, added, err := addCacheGen(ctx, env.cacheBase(name), filepath.Join(dir, name), s.cfg.Caches[name] == stdBuildCache)
		fields := logrus.Fields{"cache": name, "env_dir": env.Dir}
		switch {
		case err != nil:
			log.WithError(err).WithFields(fields).Warn("swebench: what the validation added to the cache could not be kept; gradings compile it again")
		case added > 0:
			log.WithFields(fields).WithFields(logrus.Fields{"generation": gen, "files": added}).Info("swebench: the validation's additions to the cache published as its next generation")
		}
	}
}

// addCacheGen publishes, under the cache's lock, a generation of the cache
// whose first is base: a copy of the current one plus the files of added
// it lacks, which are moved in. It returns the new generation's directory and how many files
// it added (0: nothing new, nothing published).
func addCacheGen(ctx context.Context, base, added string, stamp bool) (string, int, error) {
	unlock, err := lockFile(base + cacheGensSuffix + ".lock")
	if err != nil {
		return "", 0, err
	}
	defer unlock()
	cur, n := currentCacheGen(base)
	// A staging directory found under the lock is one a holder that died
	// mid-copy left.
	if entries, err := os.ReadDir(base + cacheGensSuffix); err == nil {
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".tmp-") {
				_ = os.RemoveAll(filepath.Join(base+cacheGensSuffix, e.Name()))
			}
		}
	}
	var fresh []string
	err = filepath.WalkDir(added, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(added, path)
		if _, err := os.Lstat(filepath.Join(cur, rel)); err == nil {
			return nil
		}
		fresh = append(fresh, rel)
		return nil
	})
	if err != nil || len(fresh) == 0 {
		return "", 0, err
	}
	if err := os.MkdirAll(base+cacheGensSuffix, 0o755); err != nil {
		return "", 0, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	staging := filepath.Join(base+cacheGensSuffix, ".tmp-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(staging) // a no-op once renamed
	if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", cur, staging).CombinedOutput(); err != nil {
		return "", 0, fmt.Errorf("copy generation %s: %w: %s", cur, err, lastLines(string(out), 4))
	}
	for _, rel := range fresh {
		dst := filepath.Join(staging, rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return "", 0, err
		}
		if err := os.Rename(filepath.Join(added, rel), dst); err != nil {
			return "", 0, err
		}
		if stamp {
			if err := os.Chtimes(dst, buildCacheStamp(), buildCacheStamp()); err != nil {
				return "", 0, err
			}
		}
	}
	gen := filepath.Join(base+cacheGensSuffix, fmt.Sprintf("%0*d", cacheGenDigits, n+1))
	if err := os.Rename(staging, gen); err != nil {
		return "", 0, err
	}
	return gen, len(fresh), nil
}

// cacheBase is the first generation of the named cache of the template.
func (e *Environment) cacheBase(name string) string { return filepath.Join(e.Dir, envCaches, name) }

// cacheDir is the template's directory of the named cache that sandboxes
// mount: its newest generation.
func (e *Environment) cacheDir(name string) string {
	dir, _ := currentCacheGen(e.cacheBase(name))
	return dir
}
