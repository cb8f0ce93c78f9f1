package local

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/localtest"
)

// cgroup2Env makes the test binary a pure cgroup v2 host (see
// enterPureCgroup2) and names the init binary its providers run.
const cgroup2Env = "LOCAL_PROVIDER_TEST_CGROUP2"

// cgroup2Mount is where the child mounts the v2 hierarchy, as a pure v2
// host does.
const cgroup2Mount = "/sys/fs/cgroup"

// enterPureCgroup2 turns this process's mount namespace (a new one, made
// for it by TestTheCgroupV2PathOnTheRealKernel) into a pure v2 host's:
// every mount is made private first, so that nothing done here reaches the
// host's mounts, then every cgroup mount (the v1 hierarchies and the tmpfs
// holding them, the v2 one) is detached and the v2 hierarchy mounted
// alone where a pure v2 host has it.
func enterPureCgroup2() error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("cgroup2 host: make the mounts private: %w", err)
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, _, ok := strings.Cut(sc.Text(), " - ")
		fields := strings.Fields(pre)
		if !ok || len(fields) < 6 {
			continue
		}
		// Optional fields from the seventh on: a shared mount would carry
		// an unmount to its peers (the host's).
		for _, o := range fields[6:] {
			if strings.HasPrefix(o, "shared:") {
				f.Close()
				return fmt.Errorf("cgroup2 host: %s is still shared", fields[4])
			}
		}
		if mp := fields[4]; mp == cgroup2Mount || strings.HasPrefix(mp, cgroup2Mount+"/") {
			points = append(points, mp)
		}
	}
	f.Close()
	if err := sc.Err(); err != nil {
		return err
	}
	// Children before their parents: later lines are mounted later.
	for i := len(points) - 1; i >= 0; i-- {
		if err := unix.Unmount(points[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("cgroup2 host: unmount %s: %w", points[i], err)
		}
	}
	if err := unix.Mount("cgroup2", cgroup2Mount, "cgroup2", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("cgroup2 host: mount: %w", err)
	}
	return nil
}

// The cgroup v2 path (one tree, freezing through cgroup.freeze) had never
// run on a kernel: this host is a hybrid, whose v1 hierarchies make the
// provider choose v1. A child of the test binary, in a mount namespace of
// its own where only the v2 hierarchy is mounted, and in a cgroup the test
// makes under its own (removed at the end), sees a pure v2 host and runs
// real sandboxes there (TestCgroupV2Host). The host's mounts are never
// touched: the child makes every mount of its namespace private first.
func TestTheCgroupV2PathOnTheRealKernel(t *testing.T) {
	if os.Getenv(cgroup2Env) != "" {
		t.Skip("SKIP: the child itself")
	}
	// Where the v2 hierarchy is, and the test's cgroup in it, found
	// without the code under test (which must agree).
	mnt, path := "", ""
	for _, d := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			mnt = d
			break
		}
	}
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if p, ok := strings.CutPrefix(l, "0::"); ok {
				path = p
			}
		}
	}
	if mnt == "" || path == "" {
		t.Skip("SKIP: no cgroup v2 hierarchy mounted here")
	}
	if os.Geteuid() != 0 {
		t.Skip("SKIP: mounting the v2 hierarchy needs root")
	}
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	own, err := ownCgroups()
	if err != nil {
		t.Fatal(err)
	}
	if mounts[""] != mnt || own[""] != path {
		t.Errorf("the provider reads the v2 hierarchy at %q and the server's cgroup %q, want %q and %q", mounts[""], own[""], mnt, path)
	}
	hybridProbe(t)
	ownDir := filepath.Join(mnt, path)
	if reaped := reapTestParents(ownDir); len(reaped) > 0 {
		t.Logf("removed the cgroups of gone test binaries: %v", reaped)
	}
	// The child's leaf move (testTheServerMovesIntoALeaf) needs a
	// controller its cgroup has: the v2 tree's hugetlb here, enabled for
	// the children of the test's own cgroup where the kernel does so
	// without a move (the root cgroup, this host's). Left enabled, as the
	// provider leaves what it enables: others' cgroups may use it by then.
	if b, err := os.ReadFile(filepath.Join(ownDir, "cgroup.controllers")); err == nil && slices.Contains(strings.Fields(string(b)), leafTestController) {
		if err := os.WriteFile(filepath.Join(ownDir, "cgroup.subtree_control"), []byte("+"+leafTestController), 0); err != nil {
			t.Logf("%s for the child's cgroup: %v (its leaf move is skipped)", leafTestController, err)
		}
	}
	dir := filepath.Join(ownDir, "cgroup2"+testParentInfix+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("SKIP: no v2 cgroup of the test's own can be made here: %v", err)
	}
	t.Cleanup(func() {
		// What the child left: its processes (it must leave none), then
		// its cgroups, children first (empty parents a provider leaves
		// are its sweep's, later: see sweepStale).
		// A process the child's sandboxes killed as they stopped may still
		// be on its way out when the child ends (SIGKILL is delivered, not
		// waited for, on a loaded machine); one that lives past the bound
		// was never killed.
		waitUnpopulated(dir)
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err == nil && !strings.Contains(string(b), "populated 0") {
			t.Errorf("the child left processes in its cgroups: %v", cgroupProcesses(dir))
		}
		_ = os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
		waitUnpopulated(dir)
		left, err := removeCgroupTree(dir)
		if err != nil {
			t.Errorf("the test's v2 cgroup: %v", err)
		}
		if len(left) > 0 {
			t.Logf("removed the cgroups the child left: %v", left)
		}
	})
	cgDir, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer cgDir.Close()
	// Hang guards, the child's first (it then prints where it hung), both
	// well within go test's default timeout, so that the cleanup above
	// kills what a hung child left.
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^("+strings.Join(onPureCgroup2, "|")+")$", "-test.count=1", "-test.v=true", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), cgroup2Env+"="+localtest.InitBinary(t))
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWNS,
		UseCgroupFD: true,
		CgroupFD:    int(cgDir.Fd()),
		Pdeathsig:   syscall.SIGKILL,
	}
	out, err := cmd.CombinedOutput()
	t.Logf("the pure v2 host's run:\n%s", out)
	if err != nil {
		t.Fatalf("the pure v2 host's run: %v", err)
	}
	for _, name := range onPureCgroup2 {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("the pure v2 host's run did not pass %s", name)
		}
	}
}

// onPureCgroup2 are the tests the pure v2 host runs: TestCgroupV2Host's
// own, and the package's tests of freezing and killing a sandbox's
// processes through its cgroup (every mode of each).
var onPureCgroup2 = []string{
	"TestCgroupV2Host",
	"TestSnapshotPausesRunningCommands",
	"TestACommandSentAsASnapshotBeginsRunsAfterTheCopy",
	"TestBackgroundProcessesLiveUntilTheSandboxStops",
	"TestACrashedServersCommandsDoNotSurviveIt",
	"TestAForkingSandboxIsKilledWhole",
}

// hybridProbe checks, where every controller the sandboxes use has a v1
// hierarchy of its own beside the v2 one (this host), that the provider
// takes the v1 ones, all four.
func hybridProbe(t *testing.T) {
	t.Helper()
	for _, c := range cgroupControllers {
		var st unix.Statfs_t
		if unix.Statfs(filepath.Join("/sys/fs/cgroup", c), &st) != nil || st.Type != unix.CGROUP_SUPER_MAGIC {
			t.Logf("no v1 %s hierarchy at /sys/fs/cgroup/%s: not a hybrid host", c, c)
			return
		}
	}
	cg, why := probeCgroups(cgroupParent(t.TempDir()))
	if cg != nil {
		t.Cleanup(func() {
			for _, d := range cg.dirs {
				_ = syscall.Rmdir(d)
			}
		})
	}
	var took []string
	for _, c := range cgroupControllers {
		if _, ok := cg.dirOf(c); ok {
			took = append(took, c)
		}
	}
	if cg == nil || cg.v2 || !slices.Equal(took, cgroupControllers) {
		t.Errorf("on a hybrid host the provider chose %+v (%v), want v1's four hierarchies", cg, why)
	}
}

// cgroupProcesses lists the processes in dir's cgroup tree with their
// command lines, for a failure's message.
func cgroupProcesses(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() != "cgroup.procs" {
			return nil
		}
		b, _ := os.ReadFile(p)
		for _, pid := range strings.Fields(string(b)) {
			cmd, _ := os.ReadFile(filepath.Join("/proc", pid, "cmdline"))
			out = append(out, fmt.Sprintf("%s %s %q", strings.TrimPrefix(filepath.Dir(p), dir), pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
		return nil
	})
	return out
}

// waitUnpopulated returns once v2 cgroup dir and its descendants hold no
// process (a killed process leaves its cgroup as it exits), or after a
// minute: a hang guard.
func waitUnpopulated(dir string) {
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(pollEvery) {
		if b, err := os.ReadFile(filepath.Join(dir, "cgroup.events")); err != nil || strings.Contains(string(b), "populated 0") {
			return
		}
	}
}

// TestCgroupV2Host runs in the child TestTheCgroupV2PathOnTheRealKernel
// starts, on a pure v2 host whose v2 hierarchy has no controller for the
// server's cgroup (this host binds pids, memory and cpu to v1): sandboxes
// get a v2 cgroup each, under one parent per provider root, frozen for
// snapshots and killed whole, and no limit is claimed.
func TestCgroupV2Host(t *testing.T) {
	initBin := os.Getenv(cgroup2Env)
	if initBin == "" {
		t.Skip("SKIP: run by TestTheCgroupV2PathOnTheRealKernel, on a pure v2 host of its own")
	}
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"": cgroup2Mount}, mounts); diff != "" {
		t.Fatalf("not a pure v2 host (-want +got):\n%s", diff)
	}
	own, err := ownCgroups()
	if err != nil {
		t.Fatal(err)
	}
	// Only under the cgroup the parent test made for this run.
	if !strings.HasPrefix(filepath.Base(own[""]), "cgroup2"+testParentInfix) {
		t.Fatalf("in v2 cgroup %q, not one TestTheCgroupV2PathOnTheRealKernel made", own[""])
	}
	ownDir := filepath.Join(cgroup2Mount, own[""])
	t.Run("named-v1-hierarchy", func(t *testing.T) { testANamedV1HierarchyLeavesV2(t, own) })
	for _, m := range []mode{{"container-copy", IsolationContainer, OverlayOff}, {"none-copy", IsolationNone, OverlayOff}} {
		t.Run(m.name, func(t *testing.T) { testCgroupV2Mode(t, m, ownDir, initBin) })
	}
	// Last: the tests after it run from the leaf.
	t.Run("leaf-move", func(t *testing.T) { testTheServerMovesIntoALeaf(t, own[""]) })
}

// leafTestController is the controller the leaf move is tested with: the
// one this host's v2 tree has. Any domain controller obeys the rule the
// move is for; pids, memory and cpu take the same path on a pure v2 host.
const leafTestController = "hugetlb"

// The kernel enables a controller for a v2 cgroup's children only while it
// holds no process (the root aside): a server in a cgroup of its own (a
// systemd unit with Delegate=yes) got no controller for its sandboxes at
// all. Its processes now move into a leaf, serverLeaf, first; the parents
// are the leaf's siblings, and a probe from the leaf finds the same ones.
func testTheServerMovesIntoALeaf(t *testing.T, own string) {
	const c = leafTestController
	ownDir := filepath.Join(cgroup2Mount, own)
	if has, _ := cgroupList(filepath.Join(ownDir, "cgroup.controllers")); !has[c] {
		t.Skipf("SKIP: the v2 tree gives this cgroup no %s", c)
	}
	// What the move is for: a cgroup holding this process cannot enable it.
	if err := os.WriteFile(filepath.Join(ownDir, "cgroup.subtree_control"), []byte("+"+c), 0); !errors.Is(err, syscall.EBUSY) {
		t.Fatalf("enabling %s for the children of a cgroup holding processes: %v, want EBUSY", c, err)
	}
	root := t.TempDir()
	parent := filepath.Join(ownDir, cgroupParent(root))
	for i := range 2 { // from the cgroup, then from the leaf
		cg, why := probeControllers(cgroupParent(root), []string{c, "freezer"})
		if cg == nil || !cg.v2 || len(why) > 0 {
			t.Fatalf("the probe of %s: %+v, %v; want v2, nothing refused", c, cg, why)
		}
		if wantLeaf := []string{filepath.Join(ownDir, serverLeaf), ""}[i]; cg.leaf != wantLeaf {
			t.Errorf("probe %d says it moved the processes into %q, want %q", i, cg.leaf, wantLeaf)
		}
		if diff := cmp.Diff(map[string]string{c: parent, "freezer": parent}, cg.dirs); diff != "" {
			t.Errorf("the parents (-want +got):\n%s", diff)
		}
		now, err := ownCgroups()
		if err != nil {
			t.Fatal(err)
		}
		if want := path.Join(own, serverLeaf); now[""] != want {
			t.Errorf("the test's process is in %q, want the leaf %q", now[""], want)
		}
		if left := cgroupMembers(t, ownDir); len(left) > 0 {
			t.Errorf("processes left in the server's cgroup: %v", left)
		}
		if enabled, _ := cgroupList(filepath.Join(ownDir, "cgroup.subtree_control")); !enabled[c] {
			t.Errorf("%s not enabled for the server's cgroup's children", c)
		}
		g, err := cg.create(sandboxPrefix+"leaf", Limits{})
		if err != nil {
			t.Fatal(err)
		}
		if has, _ := cgroupList(filepath.Join(g.dirs[c], "cgroup.controllers")); !has[c] {
			t.Errorf("a sandbox's cgroup %s has no %s", g.dirs[c], c)
		}
		if err := g.remove(); err != nil {
			t.Error(err)
		}
		if err := cg.tidy(sandboxPrefix + "leaf"); err != nil {
			t.Error(err)
		}
	}
	if _, err := os.Stat(filepath.Join(ownDir, serverLeaf, serverLeaf)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a leaf in the leaf: %v", err)
	}
}

// A v1 hierarchy holding no controller, only a name (systemd's
// name=systemd, which some v2 hosts keep mounted for old tools), leaves the
// host a v2 one: it made the provider treat it as a hybrid and take no
// cgroup at all, the v2 tree's freezer included.
func testANamedV1HierarchyLeavesV2(t *testing.T, own map[string]string) {
	if _, ok := own["name=systemd"]; !ok {
		t.Skip("SKIP: no name=systemd hierarchy here to mount")
	}
	dir := filepath.Join(t.TempDir(), "systemd")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("cgroup", dir, "cgroup", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "none,name=systemd"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	cg, why := probeCgroups(cgroupParent(dir))
	if cg != nil {
		t.Cleanup(func() {
			for _, d := range cg.dirs {
				_ = syscall.Rmdir(d)
			}
		})
	}
	if cg == nil || !cg.v2 {
		t.Fatalf("with a named v1 hierarchy mounted the provider chose %+v (%v), want v2", cg, why)
	}
	want := map[string]string{"freezer": filepath.Join(cgroup2Mount, own[""], cgroupParent(dir))}
	if diff := cmp.Diff(want, cg.dirs); diff != "" {
		t.Errorf("the provider's cgroup parents (-want +got):\n%s", diff)
	}
}

func testCgroupV2Mode(t *testing.T, m mode, ownDir, initBin string) {
	ctx := context.Background()
	root := t.TempDir()
	parent := filepath.Join(ownDir, cgroupParent(root))
	// What killed servers left: an empty sandbox cgroup of this root, and
	// another root's empty parent, both old.
	old := time.Now().Add(-staleCgroupAge - time.Minute)
	killed := filepath.Join(ownDir, cgroupParentPrefix+"-0123456789ab")
	for _, d := range []string{parent, filepath.Join(parent, sandboxPrefix+"stale"), killed} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{filepath.Join(parent, sandboxPrefix+"stale"), killed} {
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
	newP := func(log logrus.FieldLogger) *Provider {
		t.Helper()
		p, err := New(Options{Root: root, Isolation: m.isolation, Overlay: m.overlay, InitBinary: initBin, Logger: log, Limits: Limits{DiskMB: -1}, probed: newProbeResults()})
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		return p
	}
	log, entries := capturingLogger(t)
	p := newP(log)
	closed := false
	t.Cleanup(func() {
		if !closed {
			stopAll(t, p)
			_ = p.Close()
		}
	})

	// The provider chose v2, one parent for the root, and freezing only:
	// no controller is offered to the server's cgroup here, and no limit
	// is claimed.
	if !p.cg.v2 {
		t.Fatal("the provider chose cgroup v1 on a pure v2 host")
	}
	if diff := cmp.Diff(map[string]string{"freezer": parent}, p.cg.dirs); diff != "" {
		t.Errorf("the provider's cgroup parents (-want +got):\n%s", diff)
	}
	if got, want := p.LimitsInEffect(), "cgroup v2 freezer; rlimits core,nofile,fsize"; got != want {
		t.Errorf("limits in effect %q, want %q", got, want)
	}
	missing := missingLimits(entries())
	for _, c := range []string{"pids", "memory", "cpu"} {
		if !strings.Contains(missing, c+": not offered to the server's cgroup") {
			t.Errorf("the startup's limits not enforced %q do not name %s as not offered", missing, c)
		}
	}
	// The sweep removed what killed servers left, and counted it.
	removed := ""
	for _, e := range entries() {
		if v, ok := e.Data["removed"]; ok {
			removed = fmt.Sprint(v)
		}
	}
	if removed != "2" {
		t.Errorf("the sweep said it removed %q cgroups, want 2", removed)
	}
	for _, d := range []string{filepath.Join(parent, sandboxPrefix+"stale"), killed} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			_ = syscall.Rmdir(d)
			t.Errorf("%s after the sweep: %v, want it removed", d, err)
		}
	}

	// Background processes, one in a session of its own, one without the
	// sandbox's mark in its environment, all in the sandbox's cgroup.
	h := start(t, p, provider.Spec{Files: map[string]string{"notes": "one\n"}})
	if m.isolation == IsolationContainer {
		// Its cgroup namespace is rooted at its own cgroup: it names no
		// cgroup of the host's.
		if got := mustRun(t, p, h, "grep '^0::' /proc/self/cgroup"); got != "0::/\n" {
			t.Errorf("inside, the v2 cgroup is %q, want the namespace's root", got)
		}
	}
	sbDir := filepath.Join(parent, h.SandboxID)
	bg := backgroundProcs(t, p, h)
	members := cgroupMembers(t, sbDir)
	for _, pid := range bg {
		if !members[pid] {
			t.Errorf("background process %d is not in the sandbox's cgroup %s (%v)", pid, sbDir, members)
		}
	}

	// A snapshot freezes every process of the cgroup, and thaws them.
	var during string
	var duringMembers map[int]bool
	p.hook = func(stage, id string) {
		if stage == "paused" && id == h.SandboxID {
			during = cgroupEvent(t, sbDir, "frozen")
			duringMembers = cgroupMembers(t, sbDir)
		}
	}
	snapshot(t, p, h)
	p.hook = nil
	if during != "1" {
		t.Errorf("during the copy the sandbox's cgroup was frozen %q, want 1", during)
	}
	for _, pid := range bg {
		if !duringMembers[pid] {
			t.Errorf("background process %d was not in the frozen cgroup", pid)
		}
	}
	if got := cgroupEvent(t, sbDir, "frozen"); got != "0" {
		t.Errorf("after the copy the sandbox's cgroup is frozen %q, want 0", got)
	}
	if got := mustRun(t, p, h, "cat notes"); got != "one\n" {
		t.Errorf("after the snapshot the sandbox reads %q", got)
	}

	// A stop kills every process of the sandbox and removes its cgroup and
	// the parent, which holds no other sandbox.
	if err := p.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	assertGone(t, bg)
	for _, d := range []string{sbDir, parent} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the stop: %v, want it removed", d, err)
		}
	}

	// A server that dies mid-snapshot leaves a process in a sandbox's
	// cgroup (one the test starts and moves there: without the mark, in no
	// process group of the sandbox's) and the cgroup frozen; the restarted
	// provider kills it when it takes the sandbox over, and its commands
	// run (an init born in a frozen cgroup never would); nothing is left
	// once it stops.
	h2 := start(t, p, provider.Spec{})
	mustRun(t, p, h2, "true")
	bg2 := backgroundProcs(t, p, h2)
	crash(p)
	closed = true
	_ = p.Close()
	sbDir2 := filepath.Join(parent, h2.SandboxID)
	if err := os.MkdirAll(sbDir2, 0o755); err != nil {
		t.Fatal(err)
	}
	leftover := exec.Command("sleep", "3600")
	if err := leftover.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := make(chan struct{})
	go func() { _ = leftover.Wait(); close(reaped) }()
	t.Cleanup(func() { _ = leftover.Process.Kill(); <-reaped })
	if err := os.WriteFile(filepath.Join(sbDir2, "cgroup.procs"), []byte(strconv.Itoa(leftover.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sbDir2, "cgroup.freeze"), []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	p2 := newP(testLogger(t))
	t.Cleanup(func() {
		stopAll(t, p2)
		_ = p2.Close()
	})
	guard, cancel := context.WithTimeout(ctx, time.Minute) // a hang guard
	defer cancel()
	if res, err := p2.Exec(guard, h2, provider.ExecRequest{Command: "echo again"}); err != nil || res.Stdout != "again\n" {
		t.Errorf("the restarted provider's exec: %+v, %v", res, err)
	}
	select {
	case <-reaped:
	case <-time.After(time.Minute): // a hang guard
		t.Error("the process left in the sandbox's cgroup outlived its takeover")
	}
	assertGone(t, bg2)
	if err := p2.Stop(ctx, h2); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{sbDir2, parent} {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after the restarted provider's stop: %v, want it removed", d, err)
		}
	}
}

// backgroundProcs starts, in sandbox h, a background sleep, a spinning
// shell in a session of its own and a sleep whose environment is empty (no
// sandbox mark), and returns their host pids once all run.
func backgroundProcs(t *testing.T, p *Provider, h provider.Handle) []int {
	t.Helper()
	tok := strconv.Itoa(os.Getpid()) + strconv.FormatInt(time.Now().UnixNano()%1e6, 10)
	a, b := "86"+tok+"1", "86"+tok+"2"
	mustRun(t, p, h, fmt.Sprintf("sleep %s >/dev/null 2>&1 & setsid sh -c 'while :; do :; done' spin-%s >/dev/null 2>&1 & env -i /bin/sleep %s >/dev/null 2>&1 &", a, tok, b))
	want := []string{"sleep\x00" + a, "spin-" + tok, "sleep\x00" + b}
	var pids []int
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		pids = procsWith(want)
		if len(pids) == len(want) {
			return pids
		}
		if time.Now().After(deadline) { // a hang guard
			t.Fatalf("the sandbox's background processes: %v", pids)
		}
	}
}

// procsWith are the live processes whose command line holds one of subs.
func procsWith(subs []string) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || len(cmdline) == 0 {
			continue // gone, or a zombie
		}
		for _, s := range subs {
			if strings.Contains(string(cmdline), s) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// assertGone fails t unless every process of pids is gone (or a zombie).
func assertGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
		if err != nil {
			continue
		}
		if f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:])); len(f) > 0 && f[0] != "Z" && f[0] != "X" {
			t.Errorf("process %d of the sandbox still runs (%s)", pid, f[0])
		}
	}
}

// cgroupMembers are the processes in v2 cgroup dir.
func cgroupMembers(t *testing.T, dir string) map[int]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		out[pid] = true
	}
	return out
}

// cgroupEvent is key's value in v2 cgroup dir's cgroup.events.
func cgroupEvent(t *testing.T, dir, key string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, key+" "); ok {
			return v
		}
	}
	return ""
}

// capturingLogger logs to t (when verbose) and keeps every entry.
func capturingLogger(t *testing.T) (logrus.FieldLogger, func() []*logrus.Entry) {
	l := testLogger(t).(*logrus.Logger)
	h := &entryHook{}
	l.AddHook(h)
	return l, h.all
}

type entryHook struct {
	mu      sync.Mutex
	entries []*logrus.Entry
}

func (*entryHook) Levels() []logrus.Level { return logrus.AllLevels }
func (h *entryHook) Fire(e *logrus.Entry) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.entries = append(h.entries, e)
	return nil
}

func (h *entryHook) all() []*logrus.Entry {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*logrus.Entry(nil), h.entries...)
}

// missingLimits is the startup's "missing" field, printed.
func missingLimits(entries []*logrus.Entry) string {
	for _, e := range entries {
		if v, ok := e.Data["missing"]; ok {
			return fmt.Sprint(v)
		}
	}
	return ""
}

// A v2 cgroup gives its children the controllers its cgroup.controllers
// has once its cgroup.subtree_control enables them, and freezing wherever
// it is a cgroup at all. On files of the test's own (the kernel's refusal
// and the leaf move are testTheServerMovesIntoALeaf's): what is enabled
// is left alone, what is had is enabled, the rest refused as not offered.
func TestDelegateV2EnablesWhatTheCgroupHas(t *testing.T) {
	dir, bare := t.TempDir(), t.TempDir()
	for name, v := range map[string]string{"cgroup.controllers": "cpu memory\n", "cgroup.subtree_control": "memory\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]string{}
	for _, d := range []string{dir, bare} {
		refused, leaf := delegateV2(d, cgroupControllers)
		if leaf != "" {
			t.Errorf("%s: moved into %q, with nothing refusing", d, leaf)
		}
		for c, err := range refused {
			got[filepath.Base(d)+" "+c] = fmt.Sprint(errors.Is(err, errNotOffered))
		}
	}
	want := map[string]string{filepath.Base(dir) + " pids": "true"}
	for _, c := range cgroupControllers {
		want[filepath.Base(bare)+" "+c] = "false"
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("controllers refused, as not offered (-want +got):\n%s", diff)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "cgroup.subtree_control")); string(b) != "+cpu" {
		t.Errorf("written to cgroup.subtree_control: %q, want +cpu alone", b)
	}
}
