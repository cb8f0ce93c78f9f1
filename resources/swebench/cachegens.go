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
// generations, each a directory that never changes once published:
// caches/<name> is the first (the environment step's), and
// caches/<name>.gens/NNNNNNNN.delta the later ones, each holding only
// what a validation compiled that the generations under it lack. A
// sandbox stands on a chain: the newest generation over the ones before
// it, down to the nearest full one (the first, or a squash,
// caches/<name>.gens/NNNNNNNN: a copy of the chain it ends), as the lower
// layers of an overlay whose upper layer is its own, validations included.
// (Publishing a full copy per validation cost the whole cache's bytes each
// time; hard links change the change time of the file they link, which
// the purge of every eval standing on it would take for a write of its
// own.) Nothing a sandbox does changes a layer another stands on, so no
// eval's purge (which takes what changed since the eval began for its own
// writes) ever sees another's refresh or addition. The kernel bounds an
// overlay's layers: a chain that would grow past maxCacheChain is squashed
// into a full generation that the next chain starts from. A generation
// off the current chain is deleted once nothing stands on it (cachegc.go):
// a sandbox, or a fork of it from a checkpoint, names the chain it stands
// on in its spec.
const (
	cacheGensSuffix  = ".gens"
	cacheGenDigits   = 8
	cacheDeltaSuffix = ".delta"
	// maxCacheChain is how many layers a chain stacks at most, the full
	// generation it starts from included: the provider's overlay limit (a
	// page of mount options, some 3,500 bytes of paths) holds 16 of a
	// template's cache paths with room to spare.
	maxCacheChain = 16
	// harvestMountPrefix is where a validation sees, for each writable
	// cache, the directory it copies what it added to the cache into.
	harvestMountPrefix = CacheMountDir + "/.new-"
)

// currentCacheGen is the newest published generation of the cache whose
// first generation is base, and its number (0 for base itself).
func currentCacheGen(base string) (string, int) {
	chain := cacheChain(base)
	if chain[0] == base {
		return base, 0
	}
	n, _ := cacheGenNumber(filepath.Base(chain[0]))
	return chain[0], n
}

// cacheChain is the chain of layers a sandbox of the cache whose first
// generation is base stands on, the newest first: the newest generation
// and those under it down to the nearest full one.
func cacheChain(base string) []string {
	entries, err := os.ReadDir(base + cacheGensSuffix)
	if err != nil {
		return []string{base}
	}
	gens := map[int]string{}
	newest := 0
	for _, e := range entries {
		if n, ok := cacheGenNumber(e.Name()); ok && e.IsDir() {
			gens[n] = filepath.Join(base+cacheGensSuffix, e.Name())
			newest = max(newest, n)
		}
	}
	var chain []string
	for n := newest; n > 0; n-- {
		dir, ok := gens[n]
		if !ok {
			continue // never published (a number is taken once, under the lock)
		}
		chain = append(chain, dir)
		if !strings.HasSuffix(dir, cacheDeltaSuffix) {
			return chain
		}
	}
	return append(chain, base)
}

// cacheGenNumber parses a published generation's name: NNNNNNNN (full)
// or NNNNNNNN.delta.
func cacheGenNumber(name string) (int, bool) {
	name = strings.TrimSuffix(name, cacheDeltaSuffix)
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
// generation: the files of the harvest directory dir its chain lacks
// (stamped ahead for the build cache, as the environment's first
// generation is), over the chain. Nothing is published for a cache to
// which the validation added nothing. dir is removed.
func (s *Server) publishHarvest(ctx context.Context, env *Environment, dir string, log logrus.FieldLogger) {
	defer os.RemoveAll(dir)
	for _, name := range s.writableCaches() {
		gen, added, err := addCacheGen(ctx, env.cacheBase(name), filepath.Join(dir, name), s.cfg.Caches[name] == stdBuildCache)
		fields := logrus.Fields{"cache": name, "env_dir": env.Dir}
		switch {
		case err != nil:
			log.WithError(err).WithFields(fields).Warn("swebench: what the validation added to the cache could not be kept; gradings compile it again")
		case added > 0:
			log.WithFields(fields).WithFields(logrus.Fields{"generation": gen, "files": added, "squashed": !strings.HasSuffix(gen, cacheDeltaSuffix)}).Info("swebench: the validation's additions to the cache published as its next generation")
		}
	}
}

// addCacheGen publishes, under the cache's lock, a generation of the cache
// whose first is base: the files of added that the current chain lacks,
// moved in, as a delta over the chain, or, when the chain holds
// maxCacheChain layers already, as a full copy of the chain with them
// (squashed). It returns the new generation's directory and how many
// files it added (0: nothing new, nothing published).
func addCacheGen(ctx context.Context, base, added string, stamp bool) (string, int, error) {
	unlock, err := lockFile(base + cacheGensSuffix + ".lock")
	if err != nil {
		return "", 0, err
	}
	defer unlock()
	chain := cacheChain(base)
	_, n := currentCacheGen(base)
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
		for _, layer := range chain {
			if _, err := os.Lstat(filepath.Join(layer, rel)); err == nil {
				return nil
			}
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
	name := fmt.Sprintf("%0*d", cacheGenDigits, n+1)
	if len(chain) < maxCacheChain {
		name += cacheDeltaSuffix
		if err := os.Mkdir(staging, 0o755); err != nil {
			return "", 0, err
		}
	} else {
		// Squashed: the chain's layers copied farthest first, each
		// nearer one over them (a delta holds no path a farther layer
		// has, so nothing is overwritten).
		for i := len(chain) - 1; i >= 0; i-- {
			src, dst := chain[i], staging
			if i < len(chain)-1 {
				src, dst = src+"/.", dst+"/"
			}
			if out, err := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src, dst).CombinedOutput(); err != nil {
				return "", 0, fmt.Errorf("squash generation %s: %w: %s", chain[i], err, lastLines(string(out), 4))
			}
		}
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
	gen := filepath.Join(base+cacheGensSuffix, name)
	if err := os.Rename(staging, gen); err != nil {
		return "", 0, err
	}
	return gen, len(fresh), nil
}

// cacheBase is the first generation of the named cache of the template.
func (e *Environment) cacheBase(name string) string { return filepath.Join(e.Dir, envCaches, name) }

// cacheDir is the template's directory of the named cache that sandboxes
// mount: its newest generation (over the rest of its chain: cacheChain).
func (e *Environment) cacheDir(name string) string { return e.cacheChain(name)[0] }

// cacheChain is the chain of layers of the template's named cache that
// sandboxes stand on, the newest first: the one pinned for this copy of
// the template, or the current one.
func (e *Environment) cacheChain(name string) []string {
	if chain, ok := e.chains[name]; ok {
		return chain
	}
	return cacheChain(e.cacheBase(name))
}
