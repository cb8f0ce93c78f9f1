package local

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// Every sandbox's cpu cgroup sits in one parent, which on cgroup v1 weighed
// what one busy process does (cpu.shares 1024) however many sandboxes ran
// in it: under a load of 20–70 on two cores, in-sandbox work got a tenth of
// a core. The parent now weighs its live sandboxes' CPU limits, up to a
// bound, on a real cgroup (one of the test's own under the server's
// parent), and each sandbox keeps its own limit.
func TestTheSandboxesCPUWeightFollowsTheirNumber(t *testing.T) {
	host, dir := cpuTestParent(t, "weight-test")
	cg := &cgroups{v2: host.v2, dirs: map[string]string{"cpu": dir}, weight: cpuWeight{perSandbox: 1.5, max: 4}}
	if cg.v2 {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
			t.Fatal(err)
		}
	}
	// A cgroup a killed server left (empty, weighing nothing) is no live
	// sandbox.
	left := filepath.Join(dir, "sb-left-by-a-killed-server")
	if err := os.Mkdir(left, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(left)
	file, unit := "cpu.shares", 1024.0
	if cg.v2 {
		file, unit = "cpu.weight", 100
	}
	weight := func() string {
		b, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	var got, want []string
	var groups []*sandboxCgroup
	for i, w := range []float64{1.5, 3, 4} {
		id := "sb" + strconv.Itoa(i)
		g, err := cg.create(id, Limits{CPUs: 1.5})
		if err != nil {
			t.Fatal(err)
		}
		// Tidied too: the live count is the process's, by directory, and a
		// second run of the test (go test -count) has the same one.
		t.Cleanup(func() { _ = g.remove(); _ = cg.tidy(id) })
		groups = append(groups, g)
		got, want = append(got, weight()), append(want, strconv.Itoa(int(w*unit)))
	}
	for i, w := range []float64{3, 1.5} {
		if err := groups[i].remove(); err != nil {
			t.Fatal(err)
		}
		if err := cg.tidy("sb" + strconv.Itoa(i)); err != nil {
			t.Fatal(err)
		}
		got, want = append(got, weight()), append(want, strconv.Itoa(int(w*unit)))
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the parent's %s as sandboxes start and stop (-want +got):\n%s", file, diff)
	}
	// The weight is the parent's: each sandbox keeps its CPU limit.
	quota := "cpu.cfs_quota_us"
	if cg.v2 {
		quota = "cpu.max"
	}
	b, err := os.ReadFile(filepath.Join(groups[2].dirs["cpu"], quota))
	if err != nil {
		t.Fatal(err)
	}
	if q := strings.Fields(string(b)); len(q) == 0 || q[0] != "150000" {
		t.Errorf("a sandbox's %s under a weighed parent: %q, want 150000", quota, b)
	}
}

// The weight's bounds: a parent weighs at least one process, at most the
// kernel's bound.
func TestAWeightStaysWithinTheKernelsBounds(t *testing.T) {
	for _, c := range []struct {
		v2         bool
		n          float64
		file, want string
	}{
		{false, 0.001, "cpu.shares", "2"},
		{false, 2.5, "cpu.shares", "2560"},
		{false, 1000, "cpu.shares", "262144"},
		{true, 0.001, "cpu.weight", "1"},
		{true, 2.5, "cpu.weight", "250"},
		{true, 1000, "cpu.weight", "10000"},
	} {
		file, value := weightValue(c.v2, c.n)
		if file != c.file || value != c.want {
			t.Errorf("v2 %v, %g processes: %s=%s, want %s=%s", c.v2, c.n, file, value, c.file, c.want)
		}
	}
}

// A provider weighs each sandbox by its CPU limit (the host's CPUs without
// one), up to Options.CPUWeightMax.
func TestAProvidersSandboxesWeighTheirCPULimit(t *testing.T) {
	for _, c := range []struct {
		opts Options
		want cpuWeight
	}{
		{Options{Limits: Limits{CPUs: 1.5}, CPUWeightMax: 3}, cpuWeight{1.5, 3}},
		{Options{}, cpuWeight{DefaultCPUs, DefaultCPUWeightMax}},
		{Options{Limits: Limits{CPUs: -1}}, cpuWeight{float64(runtime.NumCPU()), DefaultCPUWeightMax}},
	} {
		p := newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, c.opts)
		if p.cg == nil {
			t.Skip("SKIP: the host lets the server make no cgroup here")
		}
		if p.cg.weight != c.want {
			t.Errorf("Limits.CPUs %g, CPUWeightMax %g: %+v, want %+v", c.opts.Limits.CPUs, c.opts.CPUWeightMax, p.cg.weight, c.want)
		}
	}
	if _, err := New(Options{Root: t.TempDir(), Isolation: IsolationNone, CPUWeightMax: -1}); !errors.Is(err, ErrBadOptions) {
		t.Errorf("a negative CPUWeightMax: %v, want ErrBadOptions", err)
	}
}

// An isolated sandbox cannot raise its own weight, its parent's, or its
// CPU limit: it does not see its cgroups' files, and they are the
// server's, never delegated to the sandbox's uid. (Unisolated commands run
// as the server and can change what it can.)
func TestASandboxCannotRaiseItsCPUWeightOrLimit(t *testing.T) {
	containerModes(t, func(t *testing.T, m mode) {
		p := newProvider(t, m, Options{})
		if _, ok := p.cg.dirOf("cpu"); !ok {
			t.Skipf("SKIP: the host lets the server make no cpu cgroup here (limits in effect: %s)", p.LimitsInEffect())
		}
		h := start(t, p, provider.Spec{})
		mustRun(t, p, h, "true") // its init, and so its cgroups, run
		own, parent := p.cg.of(h.SandboxID).dirs["cpu"], filepath.Dir(p.cg.of(h.SandboxID).dirs["cpu"])
		files := []string{"cpu.shares", "cpu.cfs_quota_us"}
		if p.cg.v2 {
			files = []string{"cpu.weight", "cpu.max"}
		}
		targets := []string{filepath.Join(own, files[0]), filepath.Join(own, files[1]), filepath.Join(parent, files[0])}
		before := make([]string, len(targets))
		for i, f := range targets {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			before[i] = string(b)
		}
		for _, f := range append([]string{own}, targets...) {
			fi, err := os.Stat(f)
			if err != nil {
				t.Fatal(err)
			}
			if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != os.Geteuid() || fi.Mode().Perm()&0o022 != 0 {
				t.Errorf("%s: uid %d, mode %v; want the server's (uid %d), writable by it alone", f, st.Uid, fi.Mode(), os.Geteuid())
			}
		}
		var script strings.Builder
		for _, f := range targets {
			script.WriteString("if echo 10000 > " + f + "; then echo wrote " + f + "; fi; ")
		}
		res := run(t, p, h, script.String())
		if strings.Contains(res.Stdout, "wrote") {
			t.Errorf("a sandbox wrote its cgroups' CPU files: %+v", res)
		}
		for i, f := range targets[:2] {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != before[i] {
				t.Errorf("%s: %q after the sandbox's writes, %q before", f, b, before[i])
			}
		}
	})
}

// A starting provider removes the empty sandbox and probe cgroups that
// killed servers left (hundreds piled up under the test suite's parent),
// once they are old enough that no server can be about to start a process
// in one; a fresh one, one holding a process and a directory not named as
// the provider names its cgroups stay, on a real cgroup of the test's own.
func TestStaleSandboxCgroupsAreSwept(t *testing.T) {
	host, own := cpuTestParent(t, "sweep-test")
	// The sweep also looks beside the parent for other roots' parents: the
	// parent is one level down, so that it finds only this test's.
	dir := filepath.Join(own, cgroupParentPrefix+"-sweep-test")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	// Whole seconds: exactly the age is what the kernel keeps whatever its
	// timestamps' granularity.
	now := time.Now().Truncate(time.Second)
	old := now.Add(-staleCgroupAge - time.Minute)
	for name, at := range map[string]time.Time{
		sandboxPrefix + "stale": old, "probe-memory-1": old, sandboxPrefix + "fresh": now,
		"weight-test-1": old, sandboxPrefix + "busy": old,
		// The age is reached at exactly staleCgroupAge; a second younger
		// is not.
		sandboxPrefix + "at-the-age": now.Add(-staleCgroupAge), sandboxPrefix + "a-second-younger": now.Add(-staleCgroupAge + time.Second),
	} {
		sub := filepath.Join(dir, name)
		if err := os.Mkdir(sub, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(sub) })
		if err := os.Chtimes(sub, at, at); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Stat(sub); err != nil {
			t.Fatal(err)
		} else if !fi.ModTime().Equal(at) {
			t.Fatalf("%s: modified %v, want %v as set", name, fi.ModTime(), at)
		}
	}
	busy := exec.Command("sleep", "3600")
	if err := busy.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = busy.Process.Kill(); _ = busy.Wait() })
	if err := os.WriteFile(filepath.Join(dir, sandboxPrefix+"busy", "cgroup.procs"), []byte(strconv.Itoa(busy.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	cg := &cgroups{v2: host.v2, dirs: map[string]string{"cpu": dir}}
	if n := cg.sweepStale(now, staleCgroupAge); n != 3 {
		t.Errorf("removed %d cgroups, want 3", n)
	}
	var left []string
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() {
			left = append(left, e.Name())
		}
	}
	want := []string{sandboxPrefix + "a-second-younger", sandboxPrefix + "busy", sandboxPrefix + "fresh", "weight-test-1"}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("cgroups left by the sweep (-want +got):\n%s", diff)
	}
}

// cpuTestParent makes a cpu cgroup of the test's own (name and the pid)
// under the server's own cgroup, beside the providers' parents, removed at
// the end, and returns the host's cgroups with it; it skips the test where
// the host lets the server make none. It first removes those that test
// binaries killed before their cleanup left (reapTestParents): the
// providers' sweep removes only the names they give (a test's staged stale
// cgroups must not be theirs to sweep).
func cpuTestParent(t *testing.T, name string) (*cgroups, string) {
	t.Helper()
	host := testCgroups(t)
	parent, ok := host.dirOf("cpu")
	if !ok {
		t.Skip("SKIP: the host lets the server make no cpu cgroup here")
	}
	own := filepath.Dir(parent)
	if reaped := reapTestParents(own); len(reaped) > 0 {
		t.Logf("removed the cgroups of gone test binaries: %v", reaped)
	}
	dir := filepath.Join(own, name+testParentInfix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(dir) })
	return host, dir
}

// testParentInfix is between a cgroup cpuTestParent makes's name and its
// test binary's pid.
const testParentInfix = "-test-"

// reapTestParents removes the cgroups cpuTestParent made under parent for
// test binaries that are gone: each <name>-test-<pid> whose pid no process
// has, with the cgroups its test made in it (one level), and returns their
// names. One holding a process stays (the kernel refuses to remove it), as
// does one whose pid a live process has taken since.
func reapTestParents(parent string) []string {
	entries, err := os.ReadDir(parent)
	if err != nil {
		return nil
	}
	var reaped []string
	for _, e := range entries {
		name := e.Name()
		i := strings.LastIndex(name, testParentInfix)
		if !e.IsDir() || i <= 0 {
			continue
		}
		pid, err := strconv.Atoi(name[i+len(testParentInfix):])
		if err != nil || pid <= 0 || !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			continue
		}
		if _, err := removeCgroupTree(filepath.Join(parent, name)); err == nil {
			reaped = append(reaped, name)
		}
	}
	return reaped
}

// removeCgroupTree removes the cgroup dir with the cgroups under it,
// children before their parents, to any depth, and returns those it found
// under dir with dir's own removal error (the kernel refuses a cgroup that
// holds a process or a child).
func removeCgroupTree(dir string) ([]string, error) {
	var subs []string
	_ = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != dir {
			subs = append(subs, path)
		}
		return nil
	})
	for i := len(subs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(subs[i])
	}
	return subs, syscall.Rmdir(dir)
}

// The cgroups cpuTestParent made for a test binary that was killed before
// its cleanup (with the cgroups its test made in them) are removed by the
// next one; a live binary's, and directories of other names, stay.
func TestGoneTestBinariesCgroupsAreReaped(t *testing.T) {
	_, dir := cpuTestParent(t, "reap-test")
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Fatal(err)
	}
	dead, live := strconv.Itoa(gone.Process.Pid), strconv.Itoa(os.Getpid())
	for _, sub := range []string{
		"weight-test-" + dead, "weight-test-" + dead + "/sb0", "weight-test-" + dead + "/sb-left-by-a-killed-server",
		"parents-test-" + dead, "parents-test-" + dead + "/" + cgroupParentPrefix, "parents-test-" + dead + "/" + cgroupParentPrefix + "/" + sandboxPrefix + "busy",
		"sweep-test-" + dead, "sweep-test-" + live, "sweep-test-" + live + "/sb0", sandboxPrefix + "other", "test-" + dead,
	} {
		path := filepath.Join(dir, sub)
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		// Cleanups run last first: children before their parents.
		t.Cleanup(func() { _ = syscall.Rmdir(path) })
	}
	if diff := cmp.Diff([]string{"parents-test-" + dead, "sweep-test-" + dead, "weight-test-" + dead}, reapTestParents(dir)); diff != "" {
		t.Errorf("reaped (-want +got):\n%s", diff)
	}
	var left []string
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && path != dir {
			rel, _ := filepath.Rel(dir, path)
			left = append(left, rel)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{sandboxPrefix + "other", "sweep-test-" + live, "sweep-test-" + live + "/sb0", "test-" + dead}
	if diff := cmp.Diff(want, left); diff != "" {
		t.Errorf("left (-want +got):\n%s", diff)
	}
}
