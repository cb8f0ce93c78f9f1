package local

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// testCgroups probes the host's cgroups for a parent of the test's own (as
// a provider on a fresh root would), removed at the test's end.
func testCgroups(tb testing.TB) *cgroups {
	tb.Helper()
	cg, _ := probeCgroups(cgroupParent(tb.TempDir()))
	tb.Cleanup(func() {
		if cg != nil {
			for _, dir := range cg.dirs {
				_ = os.Remove(dir)
			}
		}
	})
	return cg
}

// Servers in one cgroup (several started from one shell, a test suite's
// packages) each set their sandboxes' CPU weight; in one shared parent the
// last to start or stop a sandbox set it for all. Each root's sandboxes
// now sit in a parent of their own, named the same again for a server
// restarted on that root, each weighing its own, on real cgroups.
func TestEachRootsSandboxesWeighInAParentOfTheirOwn(t *testing.T) {
	rootA, rootB := t.TempDir(), t.TempDir()
	if again := filepath.Join(rootA); cgroupParent(again) != cgroupParent(rootA) || cgroupParent(rootA) == cgroupParent(rootB) {
		t.Fatalf("parents %q and %q of two roots", cgroupParent(rootA), cgroupParent(rootB))
	}
	a, _ := probeCgroups(cgroupParent(rootA))
	b, _ := probeCgroups(cgroupParent(rootB))
	dirA, okA := a.dirOf("cpu")
	dirB, okB := b.dirOf("cpu")
	if !okA || !okB {
		t.Skip("SKIP: the host lets the server make no cpu cgroup here")
	}
	t.Cleanup(func() { _ = os.Remove(dirA); _ = os.Remove(dirB) })
	if filepath.Base(dirA) != cgroupParent(rootA) || filepath.Dir(dirA) != filepath.Dir(dirB) {
		t.Fatalf("parents %s and %s: want %s and a sibling", dirA, dirB, cgroupParent(rootA))
	}
	for _, cg := range []*cgroups{a, b} {
		cg.weight = cpuWeight{perSandbox: 1, max: 8}
	}
	start := func(cg *cgroups, id string) {
		g, err := cg.create(id, Limits{CPUs: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = g.remove(); _ = cg.tidy(id) })
	}
	start(a, "sb-weigh-a1")
	start(b, "sb-weigh-b1")
	start(a, "sb-weigh-a2")
	file, unit := "cpu.shares", 1024
	if a.v2 {
		file, unit = "cpu.weight", 100
	}
	weight := func(dir string) string {
		v, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(v))
	}
	got := []string{weight(dirA), weight(dirB)}
	want := []string{strconv.Itoa(2 * unit), strconv.Itoa(unit)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("weights of the two roots' parents, two sandboxes and one (-want +got):\n%s", diff)
	}
}

// A starting provider sweeps the parents other roots left beside its own
// (a killed server's, or the one parent every server shared before): their
// stale sandbox cgroups go, and so does a parent left empty and old; one
// holding a busy sandbox, a fresh one and a directory not named as the
// provider names parents stay. On real cgroups under one of the test's own
// standing for the server's cgroup.
func TestTheSweepRemovesWhatOtherRootsParentsLeft(t *testing.T) {
	host := testCgroups(t)
	hostDir, ok := host.dirOf("cpu")
	if !ok {
		t.Skip("SKIP: the host lets the server make no cpu cgroup here")
	}
	own := filepath.Join(filepath.Dir(hostDir), "parents-test-"+strconv.Itoa(os.Getpid()))
	// Made first, stamped after, children before their parents: a
	// cgroup directory once stamped is stamped again as children come.
	type stamp struct {
		dir string
		at  time.Time
	}
	var stamps []stamp
	mk := func(dir string, at time.Time) {
		t.Helper()
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(dir) })
		stamps = append(stamps, stamp{dir, at})
	}
	now := time.Now()
	old := now.Add(-staleCgroupAge)
	mk(own, now)
	mine := filepath.Join(own, cgroupParent(t.TempDir()))
	mk(mine, old)
	killed, busy, fresh := filepath.Join(own, cgroupParentPrefix+"-0123456789ab"), filepath.Join(own, cgroupParentPrefix), filepath.Join(own, cgroupParentPrefix+"-fresh")
	mk(killed, old)
	mk(filepath.Join(killed, sandboxPrefix+"stale"), old)
	mk(busy, old)
	mk(filepath.Join(busy, sandboxPrefix+"busy"), old)
	mk(fresh, now.Add(time.Second-staleCgroupAge))
	mk(filepath.Join(own, "other-"+strconv.Itoa(os.Getpid())), old)
	for i := len(stamps) - 1; i >= 0; i-- {
		if err := os.Chtimes(stamps[i].dir, stamps[i].at, stamps[i].at); err != nil {
			t.Fatal(err)
		}
	}
	sleeper := exec.Command("sleep", "3600")
	if err := sleeper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sleeper.Process.Kill(); _ = sleeper.Wait() })
	procs := "cgroup.procs"
	if !host.v2 {
		procs = "tasks"
	}
	if err := os.WriteFile(filepath.Join(busy, sandboxPrefix+"busy", procs), []byte(strconv.Itoa(sleeper.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	cg := &cgroups{v2: host.v2, dirs: map[string]string{"cpu": mine}}
	if n := cg.sweepStale(now, staleCgroupAge); n != 2 {
		t.Errorf("removed %d cgroups, want 2 (the killed root's sandbox and parent)", n)
	}
	var left []string
	err := filepath.WalkDir(own, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(own, path)
		if strings.Count(rel, "/") > 1 {
			return filepath.SkipDir
		}
		left = append(left, rel)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{".", "other-" + strconv.Itoa(os.Getpid()), cgroupParentPrefix, cgroupParentPrefix + "/" + sandboxPrefix + "busy", cgroupParentPrefix + "-fresh", filepath.Base(mine)}
	slices.Sort(want)
	slices.Sort(left)
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("left under the server's cgroup (-want +got):\n%s", diff)
	}
}

// A provider closed with no sandbox leaves no parent in the server's
// cgroup (hundreds piled up under the test suite's); one whose sandbox is
// still running keeps it, for a provider on the same root to find again.
func TestAClosedProviderLeavesNoEmptyParent(t *testing.T) {
	m := allModes()[0]
	idle, busy := newProvider(t, m, Options{}), newProvider(t, m, Options{})
	if idle.cg == nil || len(idle.cg.dirs) == 0 {
		t.Skip("SKIP: the host lets the server make no cgroup here")
	}
	// A sandbox's cgroups are made with its init, at its first command.
	mustRun(t, busy, start(t, busy, provider.Spec{}), "true")
	exists := func(p *Provider) []bool {
		var got []bool
		for _, c := range cgroupControllers {
			if dir, ok := p.cg.dirOf(c); ok {
				_, err := os.Stat(dir)
				got = append(got, err == nil)
			}
		}
		return got
	}
	want := exists(idle)
	if !slices.Contains(want, true) {
		t.Fatalf("no parent made at the start: %v", want)
	}
	for _, p := range []*Provider{idle, busy} {
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if got := exists(idle); slices.Contains(got, true) {
		t.Errorf("the idle provider's parents after its close: %v, want none", got)
	}
	if got := exists(busy); !slices.Contains(got, true) || slices.Contains(got, false) {
		t.Errorf("the busy provider's parents after its close: %v, want every one", got)
	}
}
