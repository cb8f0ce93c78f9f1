package swebench_test

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// The kept template directory of a source tree is used by every test
// binary of that tree running at once (two go test runs, two worktrees at
// the same commit): each holds a shared lock on <dir>.lock for its life,
// and a directory is removed only under the exclusive lock, so never under
// a binary whose sandboxes stand on it. A run that did not end well leaves
// a mark (unfinishedMark) that the next binary finding itself alone
// removes with the directory: what a failed or killed run kept (a
// validation that timed out on a loaded machine, say) must not become the
// next run's outcome.

// unfinishedMark prefixes the mark each binary leaves in the directory
// while it runs; a successful end removes its own.
const unfinishedMark = ".unfinished-"

// claim is a test binary's hold on a kept template directory.
type claim struct {
	dir  string
	lock *os.File
	mark string
}

// claimShared takes the shared hold on parent/key (made if missing). When
// the binary is alone and an earlier run left its mark, the directory is
// emptied first. When others are running and one of them, or an earlier
// run, left a mark, the marks cannot be told apart: it is used as it is.
func claimShared(parent, key string) (*claim, error) {
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, err
	}
	dir := filepath.Join(parent, key)
	f, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if flock(f, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		if marked(dir) {
			if err := os.RemoveAll(dir); err != nil {
				f.Close()
				return nil, fmt.Errorf("remove the unfinished run's %s: %w", dir, err)
			}
		}
		err = flock(f, syscall.LOCK_SH) // downgrade: others may join now
	} else {
		err = flock(f, syscall.LOCK_SH)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
	}
	if err := touchDir(dir); err != nil {
		f.Close()
		return nil, err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	c := &claim{dir: dir, lock: f, mark: filepath.Join(dir, unfinishedMark+hex.EncodeToString(rnd[:]))}
	if err := os.WriteFile(c.mark, []byte(fmt.Sprintf("pid %d\n", os.Getpid())), 0o644); err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

// release ends the hold. A successful run removes its mark; a failed one
// keeps it and, when no other binary holds the directory, removes the
// directory at once.
func (c *claim) release(ok bool) {
	defer c.lock.Close()
	if ok {
		_ = os.Remove(c.mark)
		return
	}
	if flock(c.lock, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
		_ = os.RemoveAll(c.dir)
	}
}

// marked reports whether dir holds a run's unfinished mark.
func marked(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), unfinishedMark) {
			return true
		}
	}
	return false
}

// keptTrees bounds how many other source trees' directories a sweep
// leaves, however recently they were used: each holds a gigabyte or more of
// environments, and a working day of commits makes dozens of trees.
const keptTrees = 3

// sweepUnused removes the kept directories of other source trees unused
// for a day, and all but the keptTrees most recently used of the rest, that
// no binary holds (their lock files stay: removing one while a binary opens
// it would give two binaries two different locks).
func sweepUnused(parent, key string, now time.Time) {
	type tree struct {
		name   string
		used   time.Time
		shared bool // the standard-library layers, the module proxy's answers: shared by every tree, only the day counts
	}
	var others []tree
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		name := e.Name()
		if name == key || strings.HasSuffix(name, ".lock") {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		others = append(others, tree{name, info.ModTime(), strings.HasPrefix(name, ".")})
	}
	// Newest first: a tree beyond the first keptTrees goes, and anything
	// unused for a day.
	slices.SortFunc(others, func(a, b tree) int { return b.used.Compare(a.used) })
	trees := 0
	for _, o := range others {
		if !o.shared {
			trees++
		}
		if (o.shared || trees <= keptTrees) && now.Sub(o.used) <= 24*time.Hour {
			continue
		}
		dir := filepath.Join(parent, o.name)
		f, err := os.OpenFile(dir+".lock", os.O_RDWR|os.O_CREATE, 0o644)
		if err != nil {
			continue
		}
		if flock(f, syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			_ = os.RemoveAll(dir)
		}
		f.Close()
	}
}

// flock is syscall.Flock retried on EINTR.
func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// seedFromEarlierTree gives a new tree's kept directory the environments'
// caches of earlier finished runs of other trees: for each repository, each
// good environment's gobuild and gomod caches in the newest finished tree
// that has any, hard-linked (only ever read: a server copies them) under
// <repo>/seed-<key>.env/, where a server building an environment of that
// repository finds them as another commit's and starts its caches as a copy
// of them (seedCaches). Per repository, not only from the newest tree: a run
// of a few tests (-run) finishes a tree that lacks the other repositories,
// and the next tree's gin and caddy then started cold. Go's caches are
// addressed by content, so whatever another tree's run left can be unused
// but never wrong; the environment steps and validations still run, with
// this tree's code, and make their own outcomes. The module cache spares
// the step its downloads from the kept module proxy answers: for gin and
// caddy the pinned toolchain's zip, fetched, hashed and unzipped for each,
// was the package's largest CPU cost after the sandboxes' compiles (about a
// tenth of a new tree's run), where a copy of the cache is a fraction of it.
func seedFromEarlierTree(parent string, c *claim) {
	if entries, _ := os.ReadDir(c.dir); len(entries) > 1 {
		return // not new: the binary's own mark is its one entry
	}
	type tree struct {
		dir string
		mod time.Time
	}
	var trees []tree
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		dir := filepath.Join(parent, e.Name())
		if !e.IsDir() || dir == c.dir || strings.HasPrefix(e.Name(), ".") || marked(dir) {
			continue
		}
		if info, err := e.Info(); err == nil {
			trees = append(trees, tree{dir, info.ModTime()})
		}
	}
	slices.SortFunc(trees, func(a, b tree) int { return b.mod.Compare(a.mod) })
	seeded := map[string]bool{} // repositories
	for _, from := range trees {
		for _, repo := range seedFromTree(from.dir, c, seeded) {
			seeded[repo] = true
		}
	}
}

// seedFromTree links into c the caches of the good environments of tree
// from whose repositories are not in done, and returns those repositories.
func seedFromTree(from string, c *claim, done map[string]bool) []string {
	// Held shared: no failed run or sweep removes it meanwhile.
	f, err := os.OpenFile(from+".lock", os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil
	}
	defer f.Close()
	if flock(f, syscall.LOCK_SH|syscall.LOCK_NB) != nil || marked(from) {
		return nil
	}
	var repos []string
	envs, _ := filepath.Glob(filepath.Join(from, "*", "*.env", "*", "env.json"))
	for _, m := range envs {
		b, err := os.ReadFile(m)
		var env struct{ OK bool }
		if err != nil || json.Unmarshal(b, &env) != nil || !env.OK {
			continue
		}
		envDir := filepath.Dir(m)
		repo := filepath.Base(filepath.Dir(filepath.Dir(envDir)))
		if done[repo] {
			continue
		}
		dst := filepath.Join(c.dir, repo, "seed-"+filepath.Base(from)+".env", filepath.Base(envDir))
		if err := os.MkdirAll(filepath.Join(dst, "caches"), 0o755); err != nil {
			continue
		}
		linked := true
		for _, cache := range []string{"gobuild", "gomod"} {
			src := filepath.Join(envDir, "caches", cache)
			if _, err := os.Stat(src); err != nil {
				continue // a repository without modules
			}
			if exec.Command("cp", "-al", src, filepath.Join(dst, "caches")+"/").Run() != nil {
				linked = false
				break
			}
		}
		if !linked {
			_ = os.RemoveAll(dst)
			continue
		}
		_ = os.WriteFile(filepath.Join(dst, "env.json"), b, 0o644)
		if !slices.Contains(repos, repo) {
			repos = append(repos, repo)
		}
	}
	return repos
}
