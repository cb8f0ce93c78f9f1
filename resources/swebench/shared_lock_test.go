package swebench_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// Two test binaries of one source tree at once (two claims: flock locks
// are per open file, so one process stands in for two): a failed one
// leaves the directory the other's sandboxes stand on, and the next
// binary to find itself alone empties it.
func TestAFailedBinaryLeavesTheDirectoryAnotherHolds(t *testing.T) {
	parent := t.TempDir()
	a, err := claimShared(parent, "k")
	if err != nil {
		t.Fatal(err)
	}
	b, err := claimShared(parent, "k")
	if err != nil {
		t.Fatal(err)
	}
	inUse := filepath.Join(b.dir, "in-use")
	if err := os.WriteFile(inUse, []byte("b's cache entry"), 0o644); err != nil {
		t.Fatal(err)
	}
	a.release(false)
	if _, err := os.Stat(inUse); err != nil {
		t.Fatalf("a failed binary removed what another binary holds: %v", err)
	}
	b.release(true)
	c, err := claimShared(parent, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer c.release(true)
	if _, err := os.Stat(inUse); !os.IsNotExist(err) {
		t.Fatalf("the failed run's directory was used again (stat: %v)", err)
	}
}

// A binary alone that fails removes the directory at once; one that
// succeeds keeps it for the next.
func TestAKeptDirectoryOutlivesOnlyGoodRuns(t *testing.T) {
	parent := t.TempDir()
	entry := func(c *claim) string { return filepath.Join(c.dir, "entry") }
	a, err := claimShared(parent, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(entry(a), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	a.release(true)
	b, err := claimShared(parent, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(entry(b)); err != nil {
		t.Fatalf("a good run's directory was not kept: %v", err)
	}
	b.release(false)
	if _, err := os.Stat(b.dir); !os.IsNotExist(err) {
		t.Fatalf("a failed run alone kept its directory (stat: %v)", err)
	}
}

// The sweep removes other trees' directories unused for a day, unless a
// binary holds one.
func TestTheSweepSparesAHeldDirectory(t *testing.T) {
	parent := t.TempDir()
	held, err := claimShared(parent, "held")
	if err != nil {
		t.Fatal(err)
	}
	defer held.release(true)
	old := filepath.Join(parent, "old")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-48 * time.Hour)
	for _, d := range []string{held.dir, old} {
		if err := os.Chtimes(d, past, past); err != nil {
			t.Fatal(err)
		}
	}
	sweepUnused(parent, "mine", time.Now())
	if _, err := os.Stat(held.dir); err != nil {
		t.Errorf("the sweep removed a held directory: %v", err)
	}
	if _, err := os.Stat(old); !os.IsNotExist(err) {
		t.Errorf("the sweep kept an unused one (stat: %v)", err)
	}
}

// Of the other trees used within the day, the sweep keeps the keptTrees
// most recently used (and any a binary holds); what every tree shares (the
// standard-library layers, the module proxy's answers) goes only when
// unused for a day.
func TestTheSweepKeepsOnlyTheNewestTrees(t *testing.T) {
	parent := t.TempDir()
	now := time.Now()
	age := map[string]time.Duration{
		"t1": time.Hour, "t2": 2 * time.Hour, "t3": 3 * time.Hour, "t4": 4 * time.Hour, "t5": 5 * time.Hour,
		".gostd-a": 10 * time.Hour, ".goproxy": 9 * time.Hour, ".gostd-b": 30 * time.Hour,
	}
	for name, d := range age {
		dir := filepath.Join(parent, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(dir, now.Add(-d), now.Add(-d)); err != nil {
			t.Fatal(err)
		}
	}
	held, err := claimShared(parent, "t5")
	if err != nil {
		t.Fatal(err)
	}
	defer held.release(true)
	if err := os.Chtimes(held.dir, now.Add(-5*time.Hour), now.Add(-5*time.Hour)); err != nil {
		t.Fatal(err)
	}
	sweepUnused(parent, "mine", now)
	var left []string
	entries, _ := os.ReadDir(parent)
	for _, e := range entries {
		if e.IsDir() {
			left = append(left, e.Name())
		}
	}
	want := []string{".goproxy", ".gostd-a", "t1", "t2", "t3", "t5"}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("left after the sweep (-want +got):\n%s", diff)
	}
}

// A new tree's directory starts with the caches of the good environments
// of each repository's newest finished tree (linked where a server looks
// for another commit's), and nothing of a failed environment or an
// unfinished run.
func TestANewTreeStartsWithAnEarlierTreesCaches(t *testing.T) {
	parent := t.TempDir()
	env := func(key, name, okJSON string, mark bool) {
		repo, name, _ := strings.Cut(name, "/")
		if name == "" {
			repo, name = "ex__calc", repo
		}
		dir := filepath.Join(parent, key, repo, "abc.env", name)
		for _, cache := range []string{"gobuild", "gomod"} {
			if err := os.MkdirAll(filepath.Join(dir, "caches", cache), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(dir, "caches", cache, "entry-"+cache), []byte(key), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dir, "env.json"), []byte(okJSON), 0o644); err != nil {
			t.Fatal(err)
		}
		if mark {
			if err := os.WriteFile(filepath.Join(parent, key, unfinishedMark+"x"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	env("old", "good", `{"ok": true}`, false)
	env("old", "bad", `{"ok": false}`, false)
	env("unfinished", "good", `{"ok": true}`, true)
	// An older tree: its calc is older than old's, its gin the newest
	// there is (old, a run of a few tests, has none).
	env("older", "good", `{"ok": true}`, false)
	env("older", "ex__gin/good", `{"ok": true}`, false)
	for i, key := range []string{"old", "older"} {
		past := time.Now().Add(-time.Duration(i+1) * time.Hour)
		if err := os.Chtimes(filepath.Join(parent, key), past, past); err != nil {
			t.Fatal(err)
		}
	}
	c, err := claimShared(parent, "new")
	if err != nil {
		t.Fatal(err)
	}
	defer c.release(true)
	seedFromEarlierTree(parent, c)
	got, _ := filepath.Glob(filepath.Join(c.dir, "*", "*", "*", "caches", "*", "*"))
	seed := filepath.Join(c.dir, "ex__calc", "seed-old.env", "good", "caches")
	gin := filepath.Join(c.dir, "ex__gin", "seed-older.env", "good", "caches")
	want := []string{filepath.Join(seed, "gobuild", "entry-gobuild"), filepath.Join(seed, "gomod", "entry-gomod"),
		filepath.Join(gin, "gobuild", "entry-gobuild"), filepath.Join(gin, "gomod", "entry-gomod")}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("seeded caches (-want +got):\n%s", d)
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "ex__calc", "seed-old.env", "good", "env.json")); err != nil || string(b) != `{"ok": true}` {
		t.Errorf("the seed's env.json: %q %v", b, err)
	}
}
