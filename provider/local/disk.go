package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider/local/cmdenv"
)

// A sandbox's writable layer (overlay mode: its upper and work
// directories; copy mode: its tree) and its mounts' copies live on a
// filesystem of its own: an ext4 image file, sparse, in the sandbox's
// directory, loop-mounted at <sandbox>/disk. Its size and inode count are
// the sandbox's disk limit, so a sandbox that fills them gets ENOSPC while
// the host's filesystem, the provider's root and the other sandboxes keep
// working. The host's ext4 here has no project quotas; a filesystem per
// sandbox needs nothing of the host's but loop devices and mke2fs.
//
// Each image is a copy of a template formatted once per limit under
// <root>/disks, holes kept, which costs a few MiB of metadata whatever the
// limit; mkfs per sandbox would cost 50 to 100 ms. Images carry no journal
// (a sandbox does not outlive a machine crash, whose snapshots are on the
// host) and no reserved blocks.

// diskDirName is where a sandbox's image is mounted, and diskImageName
// the image file, both in its directory.
const (
	diskDirName   = "disk"
	diskImageName = "disk.img"
)

// DefaultDiskMB is a sandbox's disk when Limits.DiskMB is zero.
const DefaultDiskMB = 10240

// bytesPerInode gives the inode count of a disk whose Limits.DiskInodes
// is zero: one per 16 KiB, as mke2fs makes by default.
const bytesPerInode = 16 << 10

// diskLimit is one sandbox's filesystem: mb MiB and (about) inodes inodes.
type diskLimit struct{ mb, inodes int }

// disk returns the disk limit l asks for, ok false when none.
func (l Limits) disk() (d diskLimit, ok bool) {
	if l.DiskMB <= 0 {
		return diskLimit{}, false
	}
	d = diskLimit{mb: l.DiskMB, inodes: l.DiskInodes}
	if d.inodes <= 0 {
		d.inodes = int(int64(d.mb) << 20 / bytesPerInode)
	}
	return d, true
}

func (d diskLimit) String() string {
	return fmt.Sprintf("disk %d MiB, %d inodes", d.mb, d.inodes)
}

// disks makes the sandboxes' images.
type disks struct {
	dir   string // <root>/disks: the templates
	limit diskLimit
	mkfs  string
	// mu serialises the making of the template.
	mu sync.Mutex
}

// newDisks makes dir and checks, with a tiny limit, that a
// full image refuses both a block and an inode with ENOSPC (see
// probeDisk). An error says why disks cannot be limited here.
func newDisks(dir string, limit diskLimit, mkfs string, probed *probeResults) (*disks, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	d := &disks{dir: dir, limit: limit, mkfs: mkfs}
	if err := probed.run("disk", d.probe); err != nil {
		return nil, err
	}
	return d, nil
}

// findMkfs finds mke2fs on PATH or where distributions put it.
func findMkfs() (string, error) {
	for _, name := range []string{"mkfs.ext4", "mke2fs"} {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		for _, dir := range []string{"/usr/sbin", "/sbin"} {
			if p := filepath.Join(dir, name); isExecutable(p) {
				return p, nil
			}
		}
	}
	return "", errors.New("no mkfs.ext4 (e2fsprogs) found")
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// format makes at img an ext4 filesystem of limit, its root directory
// root's (the sandbox's directories are made under it).
func (d *disks) format(img string, limit diskLimit) error {
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(int64(limit.mb) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	// nodiscard: discarding a sparse file's every block takes minutes.
	// No resize inode: a disk is never grown, and the blocks it reserves
	// for growing (4 MiB of a 10 GiB image's 4.3) would be copied into
	// every sandbox's image and cached for each.
	cmd := exec.Command(d.mkfs, "-q", "-F", "-t", "ext4", "-m", "0", "-N", strconv.Itoa(limit.inodes),
		"-O", "^has_journal,^resize_inode", "-E", "nodiscard,lazy_itable_init=1", img)
	cmd.Env = []string{"PATH=" + cmdenv.BasePath}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs %s: %w: %s", img, err, out)
	}
	return nil
}

// imageFormat names how format makes an image, in the template's name.
const imageFormat = "noresize"

// template returns the formatted image every sandbox's disk is a copy of,
// making it the first time.
func (d *disks) template() (string, error) {
	// The name says what made it: a server that formats otherwise makes
	// its own, never copies an earlier one's.
	name := filepath.Join(d.dir, fmt.Sprintf("template-%dm-%di-%s.img", d.limit.mb, d.limit.inodes, imageFormat))
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, err := os.Stat(name); err == nil {
		return name, nil
	}
	tmp := name + ".tmp"
	_ = os.Remove(tmp)
	if err := d.format(tmp, d.limit); err != nil {
		_ = os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, name); err != nil {
		return "", err
	}
	return name, nil
}

// make writes the sandbox's image at img: a copy of the template.
func (d *disks) make(img string) error {
	t, err := d.template()
	if err != nil {
		return err
	}
	return copyImage(t, img)
}

// copyImage copies the image src to a new file dst, its holes kept.
func copyImage(src, dst string) (err error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := out.Close(); err == nil {
			err = cerr
		}
	}()
	if err := copySparse(in, out, fi.Size()); err != nil {
		return fmt.Errorf("copy %s: %w", src, err)
	}
	return nil
}

// loopAttempts bounds the retries of a loop device another process took
// between our finding it free and configuring it.
const loopAttempts = 32

// attachLoop attaches img to a free loop device, which the kernel
// detaches again once nothing holds it open (autoclear): the last unmount
// of what is mounted from it, or the caller's close of the returned file
// when nothing is.
func attachLoop(img string) (*os.File, error) {
	return attachLoopWith(img, func(n int, backing *os.File) (*os.File, error) {
		return configureLoop("/dev/loop"+strconv.Itoa(n), backing)
	})
}

// attachLoopWith is attachLoop with configure attaching backing to loop
// device n (configureLoop but in tests).
func attachLoopWith(img string, configure func(n int, backing *os.File) (*os.File, error)) (*os.File, error) {
	backing, err := os.OpenFile(img, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	defer ctl.Close()
	var busy map[int]bool
	for range loopAttempts {
		n, err := loopClaims.claim(int(ctl.Fd()), busy)
		if err != nil {
			return nil, fmt.Errorf("loop devices: get a free one: %w", err)
		}
		dev, err := configure(n, backing)
		loopClaims.release(n)
		if loopTakenMeanwhile(err) {
			// The kernel calls a device free until another process's
			// configure of it ends, however long a loaded machine makes
			// that: asked again at once, it named the same device, and the
			// attach spent every attempt on it. This attach passes over
			// it from now on, as over a device another attach of the
			// process holds.
			if busy == nil {
				busy = map[int]bool{}
			}
			busy[n] = true
			continue
		}
		if err != nil {
			return nil, err
		}
		return dev, nil
	}
	return nil, errors.New("loop devices: every free one was taken before it could be used")
}

// loopTakenMeanwhile reports whether an attach's error means only that the
// device it chose is not to be had now, so that another is tried: another
// process configured it first (EBUSY), its node is not made yet
// (ENOENT), or another process's LOOP_CTL_ADD of the same number is still
// under way (ENXIO: the node exists before its disk is live; our own add
// of that number answered EEXIST). The other process takes that device.
func loopTakenMeanwhile(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.EBUSY) || errors.Is(err, unix.ENXIO)
}

// configureLoop opens the loop device at path and attaches backing to it.
func configureLoop(path string, backing *os.File) (*os.File, error) {
	dev, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("loop devices: %w", err)
	}
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	// Direct I/O: the device reads and writes the image past the host's
	// page cache. The sandbox's ext4 caches what it uses already; through
	// the image's own cache too, every block it touched would be held
	// twice for as long as it lives. A host filesystem that cannot gets
	// buffered I/O.
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR | unix.LO_FLAGS_DIRECT_IO
	err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if errors.Is(err, unix.EINVAL) {
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	}
	if err != nil {
		dev.Close()
		return nil, fmt.Errorf("loop device %s: %w", path, err)
	}
	return dev, nil
}

// loopClaims are the loop devices this process's attaches hold between
// choosing one and configuring it. The kernel names the lowest free
// device to every caller that asks (LOOP_CTL_GET_FREE) until one is
// configured, so a group of attaches at once all chose the same device,
// each waited on the others' open and configure of it, and all but one
// started over. Within the process, each attach now chooses a device no
// other holds; another process's attach that takes it first is retried
// as before.
var loopClaims = &loopClaimSet{held: map[int]bool{}}

type loopClaimSet struct {
	mu   sync.Mutex
	held map[int]bool
}

// claim returns a loop device that no other attach of the process holds
// and that is not in skip (devices the caller found busy): the one the
// kernel calls free, else the first one past it that is free (see
// nextFree). ctl is /dev/loop-control. No system call is made under the
// claims' lock: a goroutine that held it through one waited, on a loaded
// machine, for the scheduler to run it again, and every other attach
// waited behind it.
func (c *loopClaimSet) claim(ctl int, skip map[int]bool) (int, error) {
	n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
	if err != nil {
		return -1, err
	}
	for {
		c.mu.Lock()
		held := c.held[n] || skip[n]
		if !held {
			c.held[n] = true
		}
		c.mu.Unlock()
		if !held {
			return n, nil
		}
		if n, err = c.nextFree(ctl, n+1, skip); err != nil {
			return -1, err
		}
	}
}

// isHeld reports whether an attach of the process holds device n.
func (c *loopClaimSet) isHeld(n int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held[n]
}

// nextFree is the first loop device from n on that no attach of the
// process holds, that is not in skip and that has no backing file (its
// sysfs directory has no loop/ then), made (LOOP_CTL_ADD) where none
// exists.
func (c *loopClaimSet) nextFree(ctl, n int, skip map[int]bool) (int, error) {
	for ; ; n++ {
		if skip[n] || c.isHeld(n) {
			continue
		}
		sys := "/sys/block/loop" + strconv.Itoa(n)
		if _, err := os.Stat(sys); errors.Is(err, fs.ErrNotExist) {
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(ctl), unix.LOOP_CTL_ADD, uintptr(n)); errno != 0 && errno != unix.EEXIST {
				return -1, fmt.Errorf("make loop device %d: %w", n, errno)
			}
			return n, nil
		}
		if _, err := os.Stat(sys + "/loop"); errors.Is(err, fs.ErrNotExist) {
			return n, nil
		}
	}
}

func (c *loopClaimSet) release(n int) {
	c.mu.Lock()
	delete(c.held, n)
	c.mu.Unlock()
}

// mountDisk mounts the image img at target (made if missing). Nothing of
// it is setuid or a device to the host.
func mountDisk(img, target string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	dev, err := attachLoop(img)
	if err != nil {
		return fmt.Errorf("disk %s: %w", img, err)
	}
	defer dev.Close() // the mount holds the device now; failed, this detaches it
	// noinit_itable: the kernel would otherwise zero every inode table,
	// writing megabytes into each sparse image.
	if err := syscall.Mount(dev.Name(), target, "ext4", syscall.MS_NOSUID|syscall.MS_NODEV, "noinit_itable"); err != nil {
		return fmt.Errorf("mount disk %s at %s: %w", img, target, err)
	}
	return nil
}

// probe checks, on a throwaway image of a few hundred KiB and 64 inodes,
// that images mount here and that a full one answers ENOSPC to a write
// and to a new file: only then is the disk limit claimed.
func (d *disks) probe() (err error) {
	dir, err := os.MkdirTemp(d.dir, "probe-")
	if err != nil {
		return err
	}
	defer func() {
		if uerr := unmount(filepath.Join(dir, "m")); uerr != nil && err == nil {
			err = uerr
		}
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
	}()
	img, mnt := filepath.Join(dir, "probe.img"), filepath.Join(dir, "m")
	if err := d.format(img, diskLimit{mb: 1, inodes: 64}); err != nil {
		return err
	}
	if err := mountDisk(img, mnt); err != nil {
		return err
	}
	if err := fillBlocks(filepath.Join(mnt, "blocks"), 4<<20); !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("probe: 4 MiB written to a 1 MiB disk: want ENOSPC, got %v", err)
	}
	if err := os.Remove(filepath.Join(mnt, "blocks")); err != nil {
		return err
	}
	if err := fillInodes(filepath.Join(mnt, "inodes"), 1024); !errors.Is(err, syscall.ENOSPC) {
		return fmt.Errorf("probe: 1024 files made on a disk of 64 inodes: want ENOSPC, got %v", err)
	}
	return nil
}

// fillBlocks writes up to n bytes to a new file at name and returns the
// first error (nil when all were written).
func fillBlocks(name string, n int) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	buf := make([]byte, 64<<10)
	for n > 0 && err == nil {
		var w int
		w, err = f.Write(buf[:min(n, len(buf))])
		n -= w
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// fillInodes makes up to n empty files in a new directory dir and returns
// the first error.
func fillInodes(dir string, n int) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return err
	}
	for i := range n {
		f, err := os.OpenFile(filepath.Join(dir, strconv.Itoa(i)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		f.Close()
	}
	return nil
}

// ensureDisk mounts s's image again where it is not mounted (after a
// reboot, or a server that stopped); a sandbox without one is left alone.
func (p *Provider) ensureDisk(ctx context.Context, s *sandbox) error {
	if !s.hasDisk || isMountRoot(s.diskDir()) {
		return nil
	}
	img := filepath.Join(s.dir, diskImageName)
	if err := p.release.wait(ctx, img); err != nil {
		return err
	}
	return mountDisk(img, s.diskDir())
}

// ErrDiskBusy is a sandbox's disk image still attached to a loop device
// when it is to be mounted again.
var ErrDiskBusy = errors.New("local: the sandbox's disk image is still in use")

// How long a remount waits for the last mount of an image to go, and how
// often it looks. A mount detached lazily lives on until the processes and
// namespaces that held it are gone, which the kernel finishes after they
// exit (longer on a loaded machine).
const (
	diskReleaseBound = 30 * time.Second
	diskReleasePoll  = 10 * time.Millisecond
)

// imageRelease waits until no loop device backs an image. An image
// mounted beside a lazily detached mount of itself would be two ext4
// filesystems writing one file: it corrupts. The kernel says nothing when
// a device lets its file go, so the wait looks every poll, up to bound.
type imageRelease struct {
	clk         clock.Clock
	backing     func(img string) (dev string, err error) // loopOf; tests replace it
	bound, poll time.Duration
}

func newImageRelease() imageRelease {
	return imageRelease{clk: clock.Real{}, backing: loopOf, bound: diskReleaseBound, poll: diskReleasePoll}
}

// wait returns once no loop device backs img; ErrDiskBusy past the bound,
// the context's error if it ends first.
func (r imageRelease) wait(ctx context.Context, img string) error {
	deadline := r.clk.Now().Add(r.bound)
	for {
		dev, err := r.backing(img)
		if err != nil || dev == "" {
			return err
		}
		if !r.clk.Now().Before(deadline) {
			return fmt.Errorf("%w: %s still backs %s after %v", ErrDiskBusy, dev, img, r.bound)
		}
		t := r.clk.NewTimer(r.poll)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("local: waiting for %s to let %s go: %w", dev, img, ctx.Err())
		case <-t.C():
		}
	}
}

// loopOf names a loop device whose backing file is img, or "" if none is.
func loopOf(img string) (string, error) {
	want, err := filepath.Abs(img)
	if err != nil {
		return "", err
	}
	if resolved, err := filepath.EvalSymlinks(want); err == nil {
		want = resolved
	}
	files, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return "", err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // detached meanwhile
		}
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == want {
			return filepath.Base(filepath.Dir(filepath.Dir(f))), nil
		}
	}
	return "", nil
}

// detachSandboxMounts detaches what the server mounted in the sandbox
// directory dir: its overlay, its mounts' overlays, its views, and its
// disk, in that order (each holds the next). A removal must never go through one of them.
func detachSandboxMounts(dir string) {
	if fsDir := filepath.Join(dir, "fs"); isMountRoot(fsDir) {
		_ = unmount(fsDir)
	}
	detachLayers(dir)
	detachViews(dir)
	d := filepath.Join(dir, diskDirName)
	for i := 0; i < 8 && isMountRoot(d); i++ {
		_ = unmount(d)
	}
}

// startDisk makes and mounts a new sandbox's disk, when the provider
// limits disks.
func (p *Provider) startDisk(ctx context.Context, s *sandbox) error {
	if p.disks == nil {
		return nil
	}
	if err := ctxErr(ctx, "start"); err != nil {
		return err
	}
	img := filepath.Join(s.dir, diskImageName)
	if err := p.disks.make(img); err != nil {
		return fmt.Errorf("local: start: disk: %w", err)
	}
	if err := mountDisk(img, s.diskDir()); err != nil {
		return fmt.Errorf("local: start: %w", err)
	}
	s.hasDisk = true
	return nil
}
