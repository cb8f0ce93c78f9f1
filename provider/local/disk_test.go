package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/localtest"
)

// newDiskProvider is newProvider with a small disk limit, skipping where
// the limit is not enforced here (no loop devices, no mke2fs, not root).
func newDiskProvider(t *testing.T, m mode, limit Limits) *Provider {
	t.Helper()
	p := newProvider(t, m, Options{Limits: limit})
	if p.disks == nil {
		t.Skipf("SKIP: the disk limit is not enforced here: %v", p.diskErr)
	}
	return p
}

// fillDisk is a command that writes 16 MiB, past an 8 MiB disk.
const fillDisk = "head -c 16777216 /dev/zero > big"

// fillInodesCmd makes empty files until one fails, and says how many it made.
const fillInodesCmd = `mkdir many && cd many && i=0; while [ $i -lt 4000 ] && : > f$i; do i=$((i+1)); done; echo $i`

// A sandbox filled the disk (or its inodes) that every session, seed and
// checkpoint shares, and the root-reserved blocks with it. Now its writes
// fail with ENOSPC on a filesystem of its own, and another sandbox, the
// server's own writes and a checkpoint of the full sandbox still work.
func TestAFullSandboxDiskStopsNoOneElse(t *testing.T) {
	for _, m := range []mode{{"container-overlay", IsolationContainer, OverlayOn}, {"container-copy", IsolationContainer, OverlayOff}} {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			p := newDiskProvider(t, m, Limits{DiskMB: 8, DiskInodes: 512})
			if got := p.LimitsInEffect(); !strings.Contains(got, "disk 8 MiB, 512 inodes") {
				t.Errorf("limits in effect: %q, want the disk named", got)
			}
			a := start(t, p, provider.Spec{Files: map[string]string{"kept": "a"}})
			b := start(t, p, provider.Spec{})

			res := run(t, p, a, fillDisk)
			if res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
				t.Errorf("16 MiB written to an 8 MiB disk: %+v", res)
			}
			mustRun(t, p, a, "rm big")
			res = run(t, p, a, fillInodesCmd)
			if !strings.Contains(res.Stderr, "No space left on device") || strings.TrimSpace(res.Stdout) == "4000" {
				t.Errorf("4000 files made on a disk of 512 inodes: %+v", res)
			}
			res = run(t, p, a, fillDisk)
			if res.ExitCode == 0 {
				t.Errorf("16 MiB written to an 8 MiB disk full of files: %+v", res)
			}

			// The other sandbox, and the server, still write.
			if got := mustRun(t, p, b, "head -c 4194304 /dev/zero > four && : > one && ls"); got != "four\none\n" {
				t.Errorf("the other sandbox: %q", got)
			}
			if err := os.WriteFile(filepath.Join(p.root, "server-write"), []byte("ok"), 0o600); err != nil {
				t.Errorf("the server's own write beside the full sandbox: %v", err)
			}
			// A checkpoint of the full sandbox commits, and its restore has
			// the limit too.
			snap := snapshot(t, p, a)
			f := fork(t, p, snap)
			if got := readFile(t, p, f, "kept"); got != "a" {
				t.Errorf("the fork's kept: %q", got)
			}
			mustRun(t, p, f, "rm -rf many big")
			if res := run(t, p, f, fillDisk); res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
				t.Errorf("16 MiB written to the fork's 8 MiB disk: %+v", res)
			}
			c := start(t, p, provider.Spec{})
			mustRun(t, p, c, ": > seeded-after")
		})
	}
}

// A sandbox's disk is unmounted, and its image removed, on every way out:
// a stop, a start that fails, and a sandbox left behind by a crash.
func TestASandboxDiskGoesWithIt(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	ctx := context.Background()
	h := start(t, p, provider.Spec{})
	mustRun(t, p, h, "echo x > f")
	dir := p.sandboxDir(h.SandboxID)
	if !isMountRoot(filepath.Join(dir, diskDirName)) {
		t.Fatalf("the sandbox's disk is not mounted at %s", dir)
	}
	if err := p.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if got := mountsLeft(t, p); len(got) != 0 {
		t.Errorf("mounts left under the root after a stop: %v", got)
	}

	// A start whose files cannot be written removes its disk.
	_, err := p.Start(ctx, provider.Spec{Files: map[string]string{"big": strings.Repeat("x", 9<<20)}})
	if !errors.Is(err, syscall.ENOSPC) {
		t.Errorf("a seed of 9 MiB on an 8 MiB disk: %v, want ENOSPC", err)
	}
	if got := mountsLeft(t, p); len(got) != 0 {
		t.Errorf("mounts left under the root after a failed start: %v", got)
	}

	// A crashed server's sandbox whose disk is gone (a reboot) is mounted
	// again, with its files, by the next server to use it.
	h = start(t, p, provider.Spec{Files: map[string]string{"kept": "k"}})
	mustRun(t, p, h, "echo more >> kept")
	crash(p)
	detachSandboxMounts(p.sandboxDir(h.SandboxID))
	// The reboot ends once the kernel has let the image go; only then does
	// the next server come. It lets it go after the lazily detached disk's
	// last holders, at its own pace: at load 35 that took longer than a
	// remount waits (diskReleaseBound), and the remount refused with
	// ErrDiskBusy. What is tested here is the remount after a reboot, not
	// the kernel's speed (the bound is TestARemountOfAnImageStillBusyRefuses's).
	rebooted := imageRelease{clk: clock.Real{}, backing: loopOf, bound: 10 * time.Minute, poll: diskReleasePoll}
	if err := rebooted.wait(ctx, filepath.Join(p.sandboxDir(h.SandboxID), diskImageName)); err != nil {
		t.Fatalf("the image after the reboot: %v", err)
	}
	p2 := newProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Options{Root: p.root, Limits: Limits{DiskMB: 8}})
	if got := mustRun(t, p2, h, "cat kept"); got != "kmore\n" {
		t.Errorf("kept after a reboot: %q", got)
	}
	if err := p2.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	if got := mountsLeft(t, p); len(got) != 0 {
		t.Errorf("mounts left under the root: %v", got)
	}
}

// mountsLeft lists the mount points under p's root but for the disks of
// the sandbox directories made ahead.
func mountsLeft(t *testing.T, p *Provider) []string {
	t.Helper()
	var out []string
	for _, m := range localtest.MountsUnder(t, p.root) {
		if !within(m, p.readyDir()) {
			out = append(out, m)
		}
	}
	return out
}

func TestTheDiskLimitsDefaults(t *testing.T) {
	got := []diskLimit{}
	for _, l := range []Limits{{}, {DiskMB: 10240}, {DiskMB: 64, DiskInodes: 100}, {DiskMB: -1}} {
		d, ok := l.withDefaults().disk()
		if ok {
			got = append(got, d)
		}
	}
	want := []diskLimit{{DefaultDiskMB, DefaultDiskMB * 64}, {10240, 655360}, {64, 100}}
	if diff := cmp.Diff(want, got, cmp.AllowUnexported(diskLimit{})); diff != "" {
		t.Errorf("disk limits (-want +got):\n%s", diff)
	}
}

// The disk limit is claimed only where a full image refuses writes: a
// mke2fs that fails leaves it out of the limits in effect.
func TestTheDiskLimitIsClaimedOnlyWhereItHolds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: only root mounts sandbox disks")
	}
	if _, err := newDisks(t.TempDir(), diskLimit{mb: 8, inodes: 64}, "/bin/false", nil); err == nil {
		t.Errorf("disks with a mke2fs that fails: no error")
	}
	mkfs, err := findMkfs()
	if err != nil {
		t.Skipf("SKIP: %v", err)
	}
	if _, err := newDisks(t.TempDir(), diskLimit{mb: 8, inodes: 64}, mkfs, nil); err != nil {
		t.Skipf("SKIP: the disk limit is not enforced here: %v", err)
	}
	p := newProvider(t, mode{"container-copy", IsolationContainer, OverlayOff}, Options{Limits: Limits{DiskMB: -1}})
	if got := p.LimitsInEffect(); strings.Contains(got, "disk") {
		t.Errorf("limits in effect with no disk limit: %q", got)
	}
	// Unisolated commands write wherever the server can: no disk is
	// claimed for them.
	p = newProvider(t, mode{"none-copy", IsolationNone, OverlayOff}, Options{Limits: Limits{DiskMB: 8}})
	if got := p.LimitsInEffect(); strings.Contains(got, "disk") || p.diskErr == nil {
		t.Errorf("limits in effect unisolated: %q (%v)", got, p.diskErr)
	}
}

// loopOf names the loop device an image is attached to, and no device for
// an image nothing attached or once its device let it go.
func TestLoopOfNamesTheDeviceBackingAnImage(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	dir := t.TempDir()
	img, other := filepath.Join(dir, "held.img"), filepath.Join(dir, "other.img")
	for _, f := range []string{img, other} {
		if err := p.disks.format(f, diskLimit{mb: 1, inodes: 64}); err != nil {
			t.Fatal(err)
		}
	}
	dev, err := attachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := loopOf(img); err != nil || got != filepath.Base(dev.Name()) {
		t.Errorf("an attached image: %q, %v; want %q", got, err, filepath.Base(dev.Name()))
	}
	if got, err := loopOf(other); err != nil || got != "" {
		t.Errorf("an image nothing attached: %q, %v", got, err)
	}
	dev.Close() // autoclear: the device lets the image go
	if err := newImageRelease().wait(context.Background(), img); err != nil {
		t.Errorf("an image whose device was closed: %v", err)
	}
}

// An attach passes over the loop device another attach of the process
// holds between choosing it and configuring it, though the kernel still
// calls that one free: attaches at once each get a device of their own
// instead of all trying the same one.
func TestAnAttachPassesOverTheDeviceAnotherAttachHolds(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := p.disks.format(img, diskLimit{mb: 1, inodes: 64}); err != nil {
		t.Fatal(err)
	}
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.Close()
	held, err := loopClaims.claim(int(ctl.Fd()), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer loopClaims.release(held)
	dev, err := attachLoop(img)
	if err != nil {
		t.Fatal(err)
	}
	defer dev.Close()
	heldDev := "/dev/loop" + strconv.Itoa(held)
	if dev.Name() == heldDev {
		t.Errorf("the attach took %s, which another attach held", heldDev)
	}
	if _, err := os.Stat("/sys/block/loop" + strconv.Itoa(held) + "/loop"); err == nil {
		t.Errorf("%s, held by another attach, was configured", heldDev)
	}
}

// An attach passes over a loop device it found busy (another process
// configuring it, or holding it open exclusively) though the kernel still
// calls that one free: it tries another device, where it had asked the
// kernel again and got the same one, attempt after attempt, until it gave
// up (a loaded machine's parallel tests failed so).
func TestAnAttachPassesOverADeviceItFoundBusy(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	img := filepath.Join(t.TempDir(), "disk.img")
	if err := p.disks.format(img, diskLimit{mb: 1, inodes: 64}); err != nil {
		t.Fatal(err)
	}
	var tried []int
	dev, err := attachLoopWith(img, func(n int, backing *os.File) (*os.File, error) {
		tried = append(tried, n)
		if len(tried) == 1 {
			return nil, fmt.Errorf("loop device %d: %w", n, unix.EBUSY)
		}
		return configureLoop("/dev/loop"+strconv.Itoa(n), backing)
	})
	if err != nil {
		t.Fatalf("attach after one busy device (tried %v): %v", tried, err)
	}
	defer dev.Close()
	if len(tried) != 2 || tried[1] == tried[0] || dev.Name() != "/dev/loop"+strconv.Itoa(tried[1]) {
		t.Errorf("tried devices %v and attached %s: want the busy one passed over for another", tried, dev.Name())
	}
}

// busyImage is a stand-in for loopOf that answers each question with what
// the test sends, after telling it which image was asked about.
type busyImage struct {
	asked  chan string
	answer chan string
}

func newBusyImage() busyImage {
	return busyImage{asked: make(chan string), answer: make(chan string)}
}

func (b busyImage) backing(img string) (string, error) {
	b.asked <- img
	return <-b.answer, nil
}

// expect waits for the next question, failing if done answers first (the
// code mounted without asking).
func (b busyImage) expect(t *testing.T, done <-chan error, img string) {
	t.Helper()
	select {
	case got := <-b.asked:
		if got != img {
			t.Fatalf("asked about %s, want %s", got, img)
		}
	case err := <-done:
		t.Fatalf("returned (%v) without asking whether a loop device still backs %s", err, img)
	}
}

// diskSandbox is a sandbox record whose formatted image is not mounted, as
// after a reboot; its mount is undone at the end of the test.
func diskSandbox(t *testing.T, p *Provider) (*sandbox, string) {
	t.Helper()
	s := &sandbox{id: "sb-remount", dir: t.TempDir(), hasDisk: true}
	img := filepath.Join(s.dir, diskImageName)
	if err := p.disks.format(img, diskLimit{mb: 1, inodes: 64}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { detachSandboxMounts(s.dir) })
	return s, img
}

// A remount of an image a loop device still backs (a lazily detached
// mount its last holders have not let go) waits, looking again every poll
// on the clock, and mounts once the device has gone.
func TestARemountWaitsForTheImagesLastMount(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	s, img := diskSandbox(t, p)
	clk := clock.NewManual(time.Unix(0, 0))
	b := newBusyImage()
	p.release = imageRelease{clk: clk, backing: b.backing, bound: time.Minute, poll: time.Second}

	done := make(chan error, 1)
	go func() { done <- p.ensureDisk(context.Background(), s) }()
	b.expect(t, done, img)
	b.answer <- "loop9"
	if !clk.WaitPending(1, nil) {
		t.Fatal("no poll armed")
	}
	if isMountRoot(s.diskDir()) {
		t.Fatal("mounted while a loop device still backs the image")
	}
	clk.Advance(time.Second)
	b.expect(t, done, img)
	b.answer <- ""
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if !isMountRoot(s.diskDir()) {
		t.Error("not mounted once the image was free")
	}
}

// Past its bound (looking at its start and every poll, the last time at
// the bound itself) a remount refuses with ErrDiskBusy and mounts nothing.
func TestARemountOfAnImageStillBusyRefuses(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{DiskMB: 8})
	s, img := diskSandbox(t, p)
	clk := clock.NewManual(time.Unix(0, 0))
	b := newBusyImage()
	p.release = imageRelease{clk: clk, backing: b.backing, bound: 3 * time.Second, poll: time.Second}

	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		done <- p.ensureDisk(context.Background(), s)
		close(finished)
	}()
	asked := 0
	for {
		b.expect(t, done, img)
		if asked++; asked > 8 {
			t.Fatalf("still waiting after %d looks in a bound of three polls", asked)
		}
		b.answer <- "loop9"
		if !clk.WaitPending(1, finished) {
			break
		}
		clk.Advance(time.Second)
	}
	if err := <-done; !errors.Is(err, ErrDiskBusy) {
		t.Errorf("busy past the bound: %v, want ErrDiskBusy", err)
	}
	if asked != 4 {
		t.Errorf("asked %d times in a bound of three polls, want 4 (at 0, 1, 2 and 3 s)", asked)
	}
	if isMountRoot(s.diskDir()) {
		t.Error("mounted an image a loop device still backs")
	}
}

// The wait is the call's: a server that takes over a crashed server's
// sandbox whose image is still held gives up when the exec's context ends,
// mounting nothing, and mounts it on a later call once the image is free.
func TestAnAdoptionsRemountEndsWithTheCallsContext(t *testing.T) {
	m := mode{"container-overlay", IsolationContainer, OverlayOn}
	p := newDiskProvider(t, m, Limits{DiskMB: 8})
	h := start(t, p, provider.Spec{Files: map[string]string{"kept": "k"}})
	crash(p)
	dir := p.sandboxDir(h.SandboxID)
	detachSandboxMounts(dir)
	p2 := newProvider(t, m, Options{Root: p.root, Limits: Limits{DiskMB: 8}})
	b := newBusyImage()
	p2.release.backing = b.backing
	p2.release.clk = clock.NewManual(time.Unix(0, 0)) // its polls never come: only the context ends the wait

	exec := func(ctx context.Context) <-chan error {
		done := make(chan error, 1)
		go func() {
			res, err := p2.Exec(ctx, h, provider.ExecRequest{Command: "cat kept"})
			if err == nil && res.Stdout != "k" {
				err = fmt.Errorf("kept: %+v", res)
			}
			done <- err
		}()
		return done
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := exec(ctx)
	img := filepath.Join(dir, diskImageName)
	b.expect(t, done, img)
	cancel()
	b.answer <- "loop9"
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("an exec whose context ended while the image was held: %v, want context.Canceled", err)
	}
	if isMountRoot(filepath.Join(dir, diskDirName)) {
		t.Error("mounted an image a loop device still backs")
	}

	done = exec(context.Background())
	b.expect(t, done, img)
	realRelease(t, img)
	b.answer <- ""
	if err := <-done; err != nil {
		t.Errorf("an exec once the image was free: %v", err)
	}
}

// realRelease returns once no loop device really backs img, so that a fake
// answers "free" only when the real wait would: the crashed provider's
// lazily detached disk lives on until the kernel lets it go (later on a
// loaded machine), and a second ext4 mount of the image beside it reads
// what the first has not written back yet (a saturated run's remount found
// the overlay's directories missing). The kernel says nothing when a
// device lets its file go: it is looked for, with a hang guard.
func realRelease(t *testing.T, img string) {
	t.Helper()
	for bound, looks := time.Now().Add(5*time.Minute), 1; ; looks++ {
		dev, err := loopOf(img)
		if err != nil {
			t.Fatal(err)
		}
		if dev == "" {
			if looks > 1 {
				t.Logf("%s was backed by a loop device for %d looks", img, looks-1)
			}
			return
		}
		if time.Now().After(bound) {
			t.Fatalf("a loop device (%s) still backs %s after five minutes", dev, img)
		}
		time.Sleep(diskReleasePoll)
	}
}

// Every sandbox's image is a copy of the template, so what the template
// holds is copied (and cached) per sandbox: a default-sized disk's holds
// its filesystem's bare metadata, not the 4 MiB a resize inode reserves.
func TestASandboxImageCopiesLittle(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{})
	if p.disks.limit.mb != DefaultDiskMB {
		t.Fatalf("disk limit %d MiB, want the default %d", p.disks.limit.mb, DefaultDiskMB)
	}
	h := start(t, p, provider.Spec{})
	s, err := p.loaded(h)
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(s.dir, diskImageName), &st); err != nil {
		t.Fatal(err)
	}
	if held := st.Blocks * 512; held > 1<<20 {
		t.Errorf("a new sandbox's %d MiB image holds %d KiB, want at most 1 MiB", DefaultDiskMB, held>>10)
	}
}

// A sandbox's loop device reads and writes its image with direct I/O: the
// sandbox's ext4 caches what it uses already, and the image's own page
// cache would hold each block a second time for the sandbox's life.
func TestASandboxDiskIsNotCachedTwice(t *testing.T) {
	p := newDiskProvider(t, mode{"container-overlay", IsolationContainer, OverlayOn}, Limits{})
	h := start(t, p, provider.Spec{})
	s, err := p.loaded(h)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := loopOf(filepath.Join(s.dir, diskImageName))
	if err != nil || dev == "" {
		t.Fatalf("the sandbox's loop device: %q, %v", dev, err)
	}
	dio, err := os.ReadFile(filepath.Join("/sys/block", dev, "loop", "dio"))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(dio)); got != "1" {
		t.Errorf("%s: direct I/O %s, want 1", dev, got)
	}
}

// A loop device whose node exists before its disk is live (another
// process's LOOP_CTL_ADD of the number under way: ours answered EEXIST)
// answers ENXIO to the open; the attach tries another device instead of
// failing the sandbox's start, as for one configured first (EBUSY) or
// whose node is not made yet (ENOENT, here a real open of a missing node).
// The errors that are the attach's own stay failures. (The live-disk race
// itself cannot be staged: opening a loop node with no device here makes
// the device.)
func TestAnAttachTriesAnotherDeviceWhenItsChoiceIsNotToBeHad(t *testing.T) {
	backing, err := os.CreateTemp(t.TempDir(), "img")
	if err != nil {
		t.Fatal(err)
	}
	defer backing.Close()
	_, err = configureLoop(filepath.Join(t.TempDir(), "absent"), backing)
	if !loopTakenMeanwhile(err) {
		t.Errorf("a node not made yet: %v is not taken meanwhile", err)
	}
	for _, e := range []struct {
		err  error
		want bool
	}{
		{&os.PathError{Op: "open", Path: "/dev/loop48", Err: unix.ENXIO}, true},
		{unix.EBUSY, true},
		{unix.EACCES, false},
		{unix.EINVAL, false},
		{unix.EIO, false},
		{errors.New("other"), false},
	} {
		if got := loopTakenMeanwhile(fmt.Errorf("loop devices: %w", e.err)); got != e.want {
			t.Errorf("%v: taken meanwhile %v, want %v", e.err, got, e.want)
		}
	}
}
