package swebench

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider/local"
)

// Every sandbox but the environment step's writes a layer of its own over
// the newest generation of a writable cache, a validation too (before, a
// validation wrote the template's build cache itself, under the gradings
// and validations standing on it); a validation alone also gets the
// directory it copies its additions into.
func TestEverySandboxWritesALayerOfItsOwnOverTheNewestGeneration(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: Config{Caches: map[string]string{"gobuild": "GOCACHE", "gomod": "GOMODCACHE"}, WritableCaches: []string{"gobuild"}}}
	env := &Environment{Dir: dir}
	gens := filepath.Join(dir, envCaches, "gobuild"+cacheGensSuffix)
	// The newest generation is a delta over the one before it, a delta
	// too, over a full one (a squash): the chain stops there.
	gen := filepath.Join(gens, "00000004.delta")
	chain := []string{filepath.Join(gens, "00000003.delta"), filepath.Join(gens, "00000002")}
	for _, d := range []string{gen, chain[0], chain[1], filepath.Join(gens, "00000001.delta"), filepath.Join(gens, ".tmp-x")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	gomod := filepath.Join(dir, envCaches, "gomod")
	ro := local.Mount{Host: gomod, Path: "/caches/gomod", Mode: local.MountReadOnly}
	layer := local.Mount{Host: gen, Path: "/caches/gobuild", Mode: local.MountOverlay, Lower: chain}
	for _, role := range []string{roleAgent, roleGrading, roleValidation} {
		mounts, vars := s.localMounts(env, role)
		if want := []local.Mount{layer, ro}; !cmp.Equal(mounts, want) {
			t.Errorf("%s mounts:\n%s", role, cmp.Diff(want, mounts))
		}
		if want := map[string]string{"GOCACHE": "/caches/gobuild", "GOMODCACHE": "/caches/gomod"}; !cmp.Equal(vars, want) {
			t.Errorf("%s vars: %v", role, vars)
		}
	}
	harvested := *env
	harvested.harvest = filepath.Join(dir, "h")
	mounts, _ := s.localMounts(&harvested, roleValidation)
	want := []local.Mount{{Host: filepath.Join(dir, "h", "gobuild"), Path: "/caches/.new-gobuild", Mode: local.MountReadWrite}, layer, ro}
	if !cmp.Equal(mounts, want) {
		t.Errorf("a validation's mounts:\n%s", cmp.Diff(want, mounts))
	}
	if mounts, _ := s.localMounts(&harvested, roleGrading); !cmp.Equal(mounts, []local.Mount{layer, ro}) {
		t.Errorf("a grading got a harvest directory: %v", mounts)
	}
	// Generations of a cache no longer writable: only an overlay stacks
	// them.
	gomodGen := filepath.Join(dir, envCaches, "gomod"+cacheGensSuffix, "00000001.delta")
	if err := os.MkdirAll(gomodGen, 0o755); err != nil {
		t.Fatal(err)
	}
	if mounts, _ := s.localMounts(env, roleGrading); !cmp.Equal(mounts, []local.Mount{layer, {Host: gomodGen, Path: "/caches/gomod", Mode: local.MountOverlay, Lower: []string{gomod}}}) {
		t.Errorf("the mounts over a read-only cache's chain: %v", mounts)
	}
	if err := os.RemoveAll(gomodGen); err != nil {
		t.Fatal(err)
	}
	// The environment step writes its staging caches themselves.
	mounts, _ = s.localMounts(env, roleEnv)
	want = []local.Mount{{Host: dir, Path: envOutPath, Mode: local.MountReadWrite}, {Host: gen, Path: "/caches/gobuild", Mode: local.MountReadWrite}, {Host: gomod, Path: "/caches/gomod", Mode: local.MountReadWrite}}
	if !cmp.Equal(mounts, want) {
		t.Errorf("the environment step's mounts:\n%s", cmp.Diff(want, mounts))
	}
}

// A generation is a copy of the one before it plus what the validation
// added that it lacked, stamped ahead; a validation that added nothing
// publishes nothing; no generation changes once published, not even a
// change time (hard links, tried first, changed those of the files they
// linked, which the purge of an eval standing on them takes for writes).
func TestAddCacheGenPublishesTheNextGenerationAndChangesNone(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "gobuild")
	writeFiles(t, base, map[string]string{"a1/x-a": "action", "a1/x-d": "output"})
	before := treeState(t, base)
	if got, n := currentCacheGen(base); got != base || n != 0 {
		t.Fatalf("current generation of a fresh cache: %s %d", got, n)
	}
	added := filepath.Join(dir, "h1")
	writeFiles(t, added, map[string]string{"a1/x-d": "refreshed", "b2/y-a": "new action", "b2/y-d": "new output"})
	gen, n, err := addCacheGen(context.Background(), base, added, true)
	if err != nil || n != 2 || gen != filepath.Join(base+cacheGensSuffix, "00000001.delta") {
		t.Fatalf("addCacheGen = %s, %d, %v", gen, n, err)
	}
	// The generation holds what was added, not a copy of the one under
	// it (before, every validation copied the whole cache).
	if got := regularFiles(t, gen); !cmp.Equal(got, []string{"b2/y-a", "b2/y-d"}) {
		t.Errorf("the generation holds %v, want only the two added files", got)
	}
	if got := cacheChain(base); !cmp.Equal(got, []string{gen, base}) {
		t.Errorf("the chain is %v, want the generation over the first", got)
	}
	if got, _ := currentCacheGen(base); got != gen {
		t.Errorf("current generation %s, want %s", got, gen)
	}
	if diff := treeChanged(before, treeState(t, base)); diff != "" {
		t.Errorf("the first generation changed (-before +after):\n%s", diff)
	}
	for rel, want := range map[string]string{"a1/x-a": "action", "a1/x-d": "output", "b2/y-a": "new action", "b2/y-d": "new output"} {
		if b := chainRead(t, cacheChain(base), rel); b != want {
			t.Errorf("%s through the chain: %q; want %q", rel, b, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(gen, "b2/y-d")); err != nil || !fi.ModTime().Equal(buildCacheStamp()) {
		t.Errorf("an added entry was not stamped ahead: %v %v", fi, err)
	}
	genBefore := treeState(t, gen)

	// Nothing new: nothing published.
	again := filepath.Join(dir, "h2")
	writeFiles(t, again, map[string]string{"b2/y-a": "new action"})
	if g, n, err := addCacheGen(context.Background(), base, again, true); g != "" || n != 0 || err != nil {
		t.Errorf("a harvest with nothing new published %s (%d files, %v)", g, n, err)
	}
	third := filepath.Join(dir, "h3")
	writeFiles(t, third, map[string]string{"c3/z-a": "third"})
	g, n, err := addCacheGen(context.Background(), base, third, false)
	if n != 1 || err != nil || g != filepath.Join(base+cacheGensSuffix, "00000002.delta") {
		t.Errorf("the third harvest: %s, %d, %v", g, n, err)
	}
	if got := regularFiles(t, g); !cmp.Equal(got, []string{"c3/z-a"}) {
		t.Errorf("the second generation holds %v, want only the added file", got)
	}
	if got := cacheChain(base); !cmp.Equal(got, []string{g, gen, base}) {
		t.Errorf("the chain is %v, want both generations over the first", got)
	}
	if diff := treeChanged(genBefore, treeState(t, gen)); diff != "" {
		t.Errorf("a published generation changed (-before +after):\n%s", diff)
	}
	if diff := treeChanged(before, treeState(t, base)); diff != "" {
		t.Errorf("the first generation changed (-before +after):\n%s", diff)
	}
	entries, _ := os.ReadDir(base + cacheGensSuffix)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if !cmp.Equal(names, []string{"00000001.delta", "00000002.delta"}) {
		t.Errorf("the generations directory holds %v", names)
	}
}

// A chain that would stack more than maxCacheChain layers is squashed: the
// next generation is a full copy of the chain with what was added, the
// next chain starts from it, and no layer of the old chain changes.
func TestAChainAtItsBoundIsSquashed(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "gobuild")
	writeFiles(t, base, map[string]string{"00/base-a": "base"})
	want := map[string]string{"00/base-a": "base"}
	add := func(i int) (string, int) {
		t.Helper()
		rel := fmt.Sprintf("%02x/e%d-a", i, i)
		added := filepath.Join(dir, fmt.Sprintf("h%d", i))
		files := map[string]string{rel: rel}
		if i > 1 {
			// What a farther layer of the chain holds (the first
			// generation's, the first's) is not added again.
			files["00/base-a"], files["01/e1-a"] = "refreshed", "again"
		}
		writeFiles(t, added, files)
		want[rel] = rel
		gen, n, err := addCacheGen(context.Background(), base, added, true)
		if err != nil || n != 1 {
			t.Fatalf("generation %d: %s, %d, %v", i, gen, n, err)
		}
		return gen, len(regularFiles(t, gen))
	}
	for i := 1; i < maxCacheChain; i++ {
		if gen, files := add(i); !strings.HasSuffix(gen, cacheDeltaSuffix) || files != 1 {
			t.Fatalf("generation %d (%s) holds %d files, want a delta of one", i, gen, files)
		}
	}
	old := cacheChain(base)
	if len(old) != maxCacheChain {
		t.Fatalf("the chain stacks %d layers, want %d", len(old), maxCacheChain)
	}
	states := map[string]map[string]fileState{}
	for _, l := range old {
		states[l] = treeState(t, l)
	}
	gen, files := add(maxCacheChain)
	if gen != filepath.Join(base+cacheGensSuffix, fmt.Sprintf("%08d", maxCacheChain)) || files != len(want) {
		t.Fatalf("at the bound the generation is %s with %d files, want a full one with %d", gen, files, len(want))
	}
	if got := cacheChain(base); !cmp.Equal(got, []string{gen}) {
		t.Errorf("the chain after the squash is %v, want the squash alone", got)
	}
	for rel, body := range want {
		if b := chainRead(t, []string{gen}, rel); b != body {
			t.Errorf("%s in the squash: %q, want %q", rel, b, body)
		}
	}
	if fi, err := os.Stat(filepath.Join(gen, "00/base-a")); err != nil || fi.ModTime().Equal(buildCacheStamp()) {
		t.Errorf("the squash changed the modification time of a copied entry: %v %v", fi, err)
	}
	for l, st := range states {
		if diff := treeChanged(st, treeState(t, l)); diff != "" {
			t.Errorf("the squash changed %s (-before +after):\n%s", l, diff)
		}
	}
	next, files := add(maxCacheChain + 1)
	if !strings.HasSuffix(next, cacheDeltaSuffix) || files != 1 || !cmp.Equal(cacheChain(base), []string{next, gen}) {
		t.Errorf("after the squash: %s with %d files, chain %v; want a delta over the squash", next, files, cacheChain(base))
	}
}

// The first generation is number 0 whatever its name, one of a
// generation's digits included.
func TestTheFirstGenerationIsNumberZero(t *testing.T) {
	base := filepath.Join(t.TempDir(), "00000007")
	writeFiles(t, base, map[string]string{"a1/x-a": "a"})
	if got, n := currentCacheGen(base); got != base || n != 0 {
		t.Errorf("currentCacheGen = %s, %d; want the first generation, 0", got, n)
	}
}

// regularFiles are the regular files under dir, relative to it, sorted.
func regularFiles(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		out = append(out, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// chainRead reads rel through chain as an overlay of it shows it: from the
// nearest layer holding it ("" when none does).
func chainRead(t *testing.T, chain []string, rel string) string {
	t.Helper()
	for _, l := range chain {
		if b, err := os.ReadFile(filepath.Join(l, rel)); err == nil {
			return string(b)
		}
	}
	return ""
}

// The purge takes what changed at or after the moment the eval began, to
// the file clock's tick: a cache write in the same second before it is
// kept (before, the threshold was that whole second, and such a write was
// purged), one after it is not.
func TestThePurgeKeepsWhatWasWrittenBeforeTheEvalBegan(t *testing.T) {
	needTools(t, "bash", "find")
	dir := t.TempDir()
	// The prelude runs without a go (its purge is what is tested), so
	// the script finds none: PATH holds only the tools it uses.
	bin := filepath.Join(dir, "bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tool := range []string{"find", "mktemp", "rm", "ls", "date"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Skipf("SKIP: no %s", tool)
		}
		if err := os.Symlink(p, filepath.Join(bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	// It waits for the file clock's next tick after the write (writes in
	// one tick have one change time, and the purge keeps none of the tick
	// the eval began in), in the same second as the eval's start: tried
	// again when the second turned meanwhile.
	const script = `
ct() { find "$1" -maxdepth 0 -printf '%C@'; }
c=$GOCACHE
for ((try = 0; try < 1000; try++)); do
	rm -f "$c"/*
	: > "$c/before"
	b=$(ct "$c/before")
	while :; do
		: > "$NG_DIR/probe"
		p=$(ct "$NG_DIR/probe")
		[ "$p" = "$b" ] || break
	done
	unset NG_T0
	eval "$PRELUDE"
	[ "${NG_T0%%.*}" != "${b%%.*}" ] || break
done
: > "$c/after"
ng_purge
ls "$c"
`
	cache := filepath.Join(dir, "cache")
	ng := filepath.Join(dir, "ng")
	for _, d := range []string{cache, ng} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = []string{"PATH=" + bin, "GOCACHE=" + cache, "NG_DIR=" + ng, "PRELUDE=" + evalPrelude}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if got := strings.TrimSpace(string(out)); got != "before" {
		t.Errorf("the cache after the purge holds %q, want only what was written before the eval began", got)
	}
}

// A validation writes a layer of its own: the template's build cache it
// stands on never changes (before, a validation wrote it in place, under
// the sandboxes standing on it, whose purge then deleted half of an entry
// another's go command had refreshed), and what it compiled is published
// as the cache's next generation, which later sandboxes stand on; a
// sandbox already standing on one sees nothing a later validation does.
func TestAValidationWritesALayerOfItsOwnAndWarmsTheNextGeneration(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	// The second instance compiles the package's test variant with other
	// flags: its validation adds entries the first's did not.
	second := "example__calc-gen-2"
	w := newWorld(t, tk, freshTemplates(), withConfig(func(c *Config) {
		c.TestCommands = map[string]string{taskRepo: goTestCmd, second: "go test -v -count=1 -gcflags=-N ./..."}
	}))
	first := tk.row("example__calc-gen-1")
	seed := w.seed("s-1", first)
	env := envOf(t, w.cfg.TemplateDir, taskRepo, tk.base)
	base := env.cacheBase("gobuild")
	gen1, n := currentCacheGen(base)
	if n != 1 {
		t.Fatalf("after the first validation the build cache's newest generation is %s, want the first one after the environment's", gen1)
	}
	baseState, gen1State := treeState(t, base), treeState(t, gen1)
	gen1Files := regularFiles(t, gen1)
	if len(gen1Files) == 0 {
		t.Error("the first validation's generation holds no file: it added nothing")
	}
	for _, rel := range gen1Files {
		if _, ok := baseState[rel]; ok {
			t.Errorf("the first generation holds %s, which the environment's has: a copy, not a delta", rel)
			break
		}
	}
	// The agent's sandbox stands on the first generation while the second
	// instance is validated.
	sb := *seed.SandboxHandle
	w.applyAsAgent(sb, tk.patch)
	w.seed("s-2", tk.row(second))
	gen2, n := currentCacheGen(base)
	if n != 2 {
		t.Fatalf("after the second validation the newest generation is %s, want the second", gen2)
	}
	if diff := treeChanged(baseState, treeState(t, base)); diff != "" {
		t.Errorf("a validation changed the environment's build cache (-before +after):\n%s", diff)
	}
	if diff := treeChanged(gen1State, treeState(t, gen1)); diff != "" {
		t.Errorf("a validation changed the generation a sandbox stands on (-before +after):\n%s", diff)
	}
	gen2State := treeState(t, gen2)
	if got := cacheChain(base); !cmp.Equal(got, []string{gen2, gen1, base}) {
		t.Errorf("the chain is %v, want the second generation over the first over the environment's", got)
	}
	gen2Files := regularFiles(t, gen2)
	if len(gen2Files) == 0 {
		t.Error("the second validation added nothing")
	}
	for _, rel := range gen2Files {
		if _, ok := gen1State[rel]; ok {
			t.Errorf("the second generation holds %s, which the first has", rel)
			break
		}
	}
	// A sandbox started now stands on the whole chain: it sees a file of
	// each layer.
	third := w.seed("s-3", first)
	var baseFile string
	for rel, st := range baseState {
		if st.Mode.IsRegular() && strings.HasSuffix(rel, "-a") {
			baseFile = rel
			break
		}
	}
	for _, rel := range []string{baseFile, gen1Files[0], gen2Files[0]} {
		if got := w.agentRun(*third.SandboxHandle, "test -f \"$GOCACHE/"+rel+"\" && echo yes || echo no"); got != "yes\n" {
			t.Errorf("a sandbox over the chain does not see %s: %q", rel, got)
		}
	}
	wantResolved(t, w.verify("s-1", first))
	if diff := treeChanged(gen2State, treeState(t, gen2)); diff != "" {
		t.Errorf("a grading changed the generation it stood on (-before +after):\n%s", diff)
	}
	if _, n := currentCacheGen(base); n != 2 {
		t.Errorf("a grading published a generation (now %d)", n)
	}
}

// What a server stopped mid-validation or mid-publish left is removed: a
// harvest directory older than any validation runs (a younger one may be
// another server's, at work), and under the cache's lock a generation's
// staging copy.
func TestLeftHarvestsAndStagingCopiesAreRemoved(t *testing.T) {
	dir := t.TempDir()
	s := &Server{cfg: Config{Caches: map[string]string{"gobuild": "GOCACHE"}, WritableCaches: []string{"gobuild"}}}
	env := &Environment{Dir: dir}
	caches := filepath.Join(dir, envCaches)
	limit := s.cfg.evaluationTimeout() + 2*s.cfg.setupTimeout() + time.Hour
	writeFiles(t, caches, map[string]string{".harvest-old/gobuild/a": "x", ".harvest-young/gobuild/a": "x", "gobuild/a1/x-a": "a"})
	now := time.Now()
	for name, age := range map[string]time.Duration{".harvest-old": limit + time.Minute, ".harvest-young": limit - time.Minute} {
		if err := os.Chtimes(filepath.Join(caches, name), now.Add(-age), now.Add(-age)); err != nil {
			t.Fatal(err)
		}
	}
	h, err := s.harvestDir(env)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(h, "gobuild")); err != nil {
		t.Errorf("the new harvest directory: %v", err)
	}
	if _, err := os.Stat(filepath.Join(caches, ".harvest-old")); !os.IsNotExist(err) {
		t.Errorf("a harvest directory older than any validation was kept (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(caches, ".harvest-young")); err != nil {
		t.Errorf("a harvest directory a validation may still use was removed: %v", err)
	}

	base := filepath.Join(caches, "gobuild")
	writeFiles(t, base+cacheGensSuffix, map[string]string{".tmp-dead/a1/x-a": "half a copy"})
	added := filepath.Join(dir, "added")
	writeFiles(t, added, map[string]string{"b2/y-a": "new"})
	if _, n, err := addCacheGen(context.Background(), base, added, false); n != 1 || err != nil {
		t.Fatalf("addCacheGen: %d, %v", n, err)
	}
	if _, err := os.Stat(filepath.Join(base+cacheGensSuffix, ".tmp-dead")); !os.IsNotExist(err) {
		t.Errorf("a dead publisher's staging copy was kept (%v)", err)
	}
}

// A validation's harvest takes what it wrote to the cache, not what its
// layer's copy of the generation holds (unisolated, the layer is a copy
// made at the start, whose every file changed then: it copied all of the
// cache, a hundred megabytes and more, for the server to skip): a file
// changed since the harvest directory was made counts only when modified
// since too, and not stamped ahead.
func TestTheHarvestTakesOnlyWhatTheValidationWrote(t *testing.T) {
	needTools(t, "bash", "find", "cp")
	dir := t.TempDir()
	cache, harvest := filepath.Join(dir, "cache"), filepath.Join(dir, "new")
	if err := os.MkdirAll(harvest, 0o755); err != nil {
		t.Fatal(err)
	}
	// The harvest directory is made as the validation starts; what its
	// layer holds is changed after it, in a later tick of the file clock.
	h := filepath.Join(harvest, "gobuild")
	if err := os.Mkdir(h, 0o755); err != nil {
		t.Fatal(err)
	}
	ctime := func(p string) time.Time {
		var st syscall.Stat_t
		if err := syscall.Stat(p, &st); err != nil {
			t.Fatal(err)
		}
		return time.Unix(st.Ctim.Unix())
	}
	probe := filepath.Join(dir, "probe")
	for start := ctime(h); ; {
		writeFiles(t, dir, map[string]string{"probe": "tick"})
		if ctime(probe).After(start) {
			break
		}
	}
	old := time.Now().Add(-time.Hour)
	writeFiles(t, cache, map[string]string{"a1/copied-a": "from the generation", "b2/stamped-d": "stamped", "c3/written-d": "the validation's"})
	for name, mtime := range map[string]time.Time{"a1/copied-a": old, "b2/stamped-d": buildCacheStamp()} {
		if err := os.Chtimes(filepath.Join(cache, name), mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "-c", harvestScript)
	cmd.Env = append(os.Environ(), "NG_CACHE_0="+cache, "NG_NEW_0="+h)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := treeState(t, h)
	var names []string
	for name, st := range got {
		if st.Mode.IsRegular() {
			names = append(names, name)
		}
	}
	if !cmp.Equal(names, []string{"c3/written-d"}) {
		t.Errorf("the harvest took %v, want only what the validation wrote", names)
	}
}
