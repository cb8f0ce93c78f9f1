package swebench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// gcFixture is a template whose build cache has a chain of maxCacheChain
// layers (its first generation and 15 deltas), a local provider (no
// isolation, copies: real directories, no privilege) and a server over
// them.
type gcFixture struct {
	s    *Server
	env  *Environment
	p    *local.Provider
	base string
	img  string
	log  logrus.FieldLogger
	next int
}

func newGCFixture(t *testing.T) *gcFixture {
	t.Helper()
	dir := t.TempDir()
	lg := logrus.New()
	lg.SetLevel(logrus.ErrorLevel)
	p, err := local.New(local.Options{Root: filepath.Join(dir, "root"), Isolation: "none", Overlay: "off", Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	f := &gcFixture{
		s:   &Server{cfg: Config{Caches: map[string]string{"gobuild": "GOCACHE"}, WritableCaches: []string{"gobuild"}}, log: lg},
		env: &Environment{Dir: filepath.Join(dir, "env")},
		p:   p, img: filepath.Join(dir, "img"), log: lg,
	}
	f.base = f.env.cacheBase("gobuild")
	writeFiles(t, f.base, map[string]string{"00/base-a": "base"})
	writeFiles(t, f.img, map[string]string{"README": "x"})
	for range maxCacheChain - 1 {
		f.publish(t)
	}
	if n := len(cacheChain(f.base)); n != maxCacheChain {
		t.Fatalf("a chain of %d layers, want %d", n, maxCacheChain)
	}
	return f
}

// publish publishes the cache's next generation (a squash at the bound).
func (f *gcFixture) publish(t *testing.T) string {
	t.Helper()
	f.next++
	added := filepath.Join(t.TempDir(), "h")
	writeFiles(t, added, map[string]string{fmt.Sprintf("%02x/e%d-a", f.next, f.next): "x"})
	gen, n, err := addCacheGen(context.Background(), f.base, added, true)
	if err != nil || n != 1 {
		t.Fatalf("publish: %s, %d, %v", gen, n, err)
	}
	return gen
}

// spec pins the template's caches and returns a grading sandbox's spec
// on them (its mounts as localMounts makes them) and the unpin.
func (f *gcFixture) spec(t *testing.T) (provider.Spec, func()) {
	t.Helper()
	pinned, unpin, err := f.s.pinCaches(f.env, f.p.Capabilities().HostMounts)
	if err != nil {
		t.Fatal(err)
	}
	mounts, _ := f.s.localMounts(pinned, roleGrading)
	return provider.Spec{Image: f.img, ProviderOptions: map[string]any{local.MountsOption: mounts}}, unpin
}

// generations are the cache's generations on disk: its first (while it
// holds anything) and those under its generations' directory.
func (f *gcFixture) generations(t *testing.T) []string {
	t.Helper()
	var out []string
	if !emptyDir(f.base) {
		out = append(out, f.base)
	}
	entries, err := os.ReadDir(f.base + cacheGensSuffix)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") || strings.HasPrefix(e.Name(), cacheDeletedPrefix) {
			out = append(out, filepath.Join(f.base+cacheGensSuffix, e.Name()))
		}
	}
	slices.Sort(out)
	return out
}

// Old generations of a template's build cache are deleted once nothing
// stands on them, and not before: each of what may stand on them alone
// keeps them, a sandbox started on them before the squash (it mounts
// them), a snapshot of one (a fork from a checkpoint mounts them again),
// a start in flight (its spec made on them, pinned); once it is gone every
// generation off the current chain goes (the first emptied), and the
// current chain is whole and starts sandboxes.
func TestGenerationsNothingStandsOnAreDeleted(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name string
		// stand puts something on the chain before the squash; gone
		// takes it away.
		stand func(t *testing.T, f *gcFixture) (gone func())
	}{
		{"a sandbox", func(t *testing.T, f *gcFixture) func() {
			spec, unpin := f.spec(t)
			h, err := f.p.Start(ctx, spec)
			unpin()
			if err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := f.p.Stop(ctx, h); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"a snapshot", func(t *testing.T, f *gcFixture) func() {
			spec, unpin := f.spec(t)
			h, err := f.p.Start(ctx, spec)
			unpin()
			if err != nil {
				t.Fatal(err)
			}
			snap, err := f.p.Snapshot(ctx, h, "ck")
			if err != nil {
				t.Fatal(err)
			}
			if err := f.p.Stop(ctx, h); err != nil {
				t.Fatal(err)
			}
			return func() {
				if err := f.p.DeleteSnapshot(ctx, snap); err != nil {
					t.Fatal(err)
				}
			}
		}},
		{"a start in flight", func(t *testing.T, f *gcFixture) func() {
			spec, unpin := f.spec(t)
			return func() {
				// It starts on what was kept for it, then ends.
				h, err := f.p.Start(ctx, spec)
				if err != nil {
					t.Fatalf("a start on the generations pinned before the squash: %v", err)
				}
				if err := f.p.Stop(ctx, h); err != nil {
					t.Fatal(err)
				}
				unpin()
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newGCFixture(t)
			old := f.generations(t)
			if len(old) != maxCacheChain {
				t.Fatalf("%d generations, want %d", len(old), maxCacheChain)
			}
			gone := c.stand(t, f)
			squash := f.publish(t)
			if got := cacheChain(f.base); !cmp.Equal(got, []string{squash}) {
				t.Fatalf("the chain after the squash: %v", got)
			}
			all := append(slices.Clone(old), squash)
			slices.Sort(all)
			f.s.collectCacheGens(f.env, f.log)
			if d := cmp.Diff(all, f.generations(t)); d != "" {
				t.Fatalf("generations after a collection, %s standing on the old chain (-want +got):\n%s", c.name, d)
			}
			gone()
			f.s.collectCacheGens(f.env, f.log)
			if d := cmp.Diff([]string{squash}, f.generations(t)); d != "" {
				t.Fatalf("generations after a collection, nothing standing on the old chain (-want +got):\n%s", d)
			}
			if !emptyDir(f.base) {
				t.Error("the first generation was not emptied")
			}
			if n := len(regularFiles(t, squash)); n != maxCacheChain+1 {
				t.Errorf("the squash holds %d files, want the first generation's and the %d added", n, maxCacheChain)
			}
			spec, unpin := f.spec(t)
			defer unpin()
			h, err := f.p.Start(ctx, spec)
			if err != nil {
				t.Fatalf("a start after the collection: %v", err)
			}
			if err := f.p.Stop(ctx, h); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// What a process that died left is no obstacle and is cleaned: its pins
// (their lock gone with it), a generation it was deleting; a provider
// whose directories are gone is forgotten. A user that does not say what
// stands on its mounts stops every deletion.
func TestACollectionAfterACrash(t *testing.T) {
	f := newGCFixture(t)
	old := f.generations(t)
	squash := f.publish(t)
	// A pin whose holder died: its file is there, unlocked.
	pins := filepath.Join(f.base+cacheGensSuffix, cachePinsDir)
	writeFiles(t, pins, map[string]string{"dead": strings.Join(old, "\n")})
	// A generation a collection was deleting when it died.
	half := filepath.Join(f.base+cacheGensSuffix, cacheDeletedPrefix+"00000003.delta-abc")
	writeFiles(t, half, map[string]string{"x": "y"})
	// A provider that is gone.
	if err := registerCacheUser(f.env, `{"sandboxes":"/nonexistent/sandboxes","snapshots":"/nonexistent/snapshots"}`); err != nil {
		t.Fatal(err)
	}
	// A provider that does not say: nothing is deleted while it is
	// recorded.
	if err := registerCacheUser(f.env, ""); err != nil {
		t.Fatal(err)
	}
	f.s.collectCacheGens(f.env, f.log)
	if got := f.generations(t); len(got) != maxCacheChain+2 {
		t.Fatalf("with a provider that does not say what stands on its mounts: %d generations left, want all %d", len(got), maxCacheChain+2)
	}
	if err := os.Remove(filepath.Join(f.env.Dir, envCaches, cacheUsersDir, unknownCacheUser)); err != nil {
		t.Fatal(err)
	}
	f.s.collectCacheGens(f.env, f.log)
	if d := cmp.Diff([]string{squash}, f.generations(t)); d != "" {
		t.Errorf("generations after a collection (-want +got):\n%s", d)
	}
	if entries, _ := os.ReadDir(pins); len(entries) != 0 {
		t.Errorf("pins left: %v", entries)
	}
	users, _ := os.ReadDir(filepath.Join(f.env.Dir, envCaches, cacheUsersDir))
	if len(users) != 0 {
		t.Errorf("users left: %v", users)
	}
}

// A sandbox's spec pins the generations it mounts until its caller says
// the start is done, which then deletes what nothing stands on any more.
func TestASpecPinsItsGenerationsUntilItsStartIsDone(t *testing.T) {
	f := newGCFixture(t)
	spec, done, err := f.s.spec(f.p, f.img, Row{InstanceID: "x"}, roleGrading, f.env)
	if err != nil {
		t.Fatal(err)
	}
	old := cacheChain(f.base)
	mounts, _ := spec.ProviderOptions[local.MountsOption].([]local.Mount)
	if len(mounts) != 1 || !cmp.Equal(append([]string{mounts[0].Host}, mounts[0].Lower...), old) {
		t.Fatalf("the spec's mounts %+v, want the chain %v", mounts, old)
	}
	squash := f.publish(t)
	f.s.collectCacheGens(f.env, f.log)
	if got := f.generations(t); len(got) != maxCacheChain+1 {
		t.Fatalf("%d generations while a spec's start is in flight, want all %d", len(got), maxCacheChain+1)
	}
	done()
	if d := cmp.Diff([]string{squash}, f.generations(t)); d != "" {
		t.Errorf("generations once the start is done (-want +got):\n%s", d)
	}
}

// TestConcurrentStartsRecordACacheUserOnce: the sandboxes of one server
// start concurrently and each records its provider as a user of the
// template's caches. With one temporary name per process, one start's
// rename took the file another had just written (ENOENT, and the start
// failed: TestValidationMakesABrokenInstanceUnavailable under load). A file
// at that name, as another writer's would be, now stops no one, and many
// writers at once leave one record and no temporary file.
func TestConcurrentStartsRecordACacheUserOnce(t *testing.T) {
	env := &Environment{Dir: t.TempDir()}
	const user = `{"sandboxes":"/srv/sandboxes","snapshots":"/srv/snapshots"}`
	dir := filepath.Join(env.Dir, envCaches, cacheUsersDir)
	sum := sha256.Sum256([]byte(user))
	record := filepath.Join(dir, hex.EncodeToString(sum[:8])+".json")
	writeFiles(t, fmt.Sprintf("%s.tmp-%d", record, os.Getpid()), map[string]string{"another-writer": "x"})
	errs := make(chan error, 16)
	for range cap(errs) {
		go func() { errs <- registerCacheUser(env, user) }()
	}
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if b, err := os.ReadFile(record); err != nil || string(b) != user {
		t.Fatalf("the record: %q, %v", b, err)
	}
	// Readable by another server's collection, as os.WriteFile made it.
	if fi, err := os.Stat(record); err != nil {
		t.Fatal(err)
	} else if fi.Mode().Perm() != 0o644 {
		t.Errorf("the record's mode is %v, want -rw-r--r--", fi.Mode())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	want := []string{filepath.Base(record), filepath.Base(record) + fmt.Sprintf(".tmp-%d", os.Getpid())}
	if d := cmp.Diff(want, names); d != "" {
		t.Errorf("the users' directory (-want +got):\n%s", d)
	}
}
