package local

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits bound what one sandbox's commands may use together. Zero fields
// take the defaults; a negative one means no limit.
type Limits struct {
	// Pids caps the sandbox's processes and threads.
	Pids int
	// MemoryMB caps its memory (and swap), in MiB: past it the kernel
	// kills one of its processes.
	MemoryMB int
	// CPUs caps its CPU time, in CPUs (1.5 is one and a half).
	CPUs float64
	// DiskMB caps what its tree and its mounts' copies hold, in MiB: its
	// writable layer is a filesystem of this size of its own (see disks),
	// and a write past it fails with ENOSPC.
	DiskMB int
	// DiskInodes caps the files, directories and links it holds (about:
	// the filesystem rounds up to fill its block groups, and a few are its
	// own); zero is one per 16 KiB of DiskMB.
	DiskInodes int
}

// Default limits of a sandbox.
const (
	DefaultPids     = 1024
	DefaultMemoryMB = 4096
	DefaultCPUs     = 2
)

// withDefaults fills zero fields.
func (l Limits) withDefaults() Limits {
	if l.Pids == 0 {
		l.Pids = DefaultPids
	}
	if l.MemoryMB == 0 {
		l.MemoryMB = DefaultMemoryMB
	}
	if l.CPUs == 0 {
		l.CPUs = DefaultCPUs
	}
	if l.DiskMB == 0 {
		l.DiskMB = DefaultDiskMB
	}
	return l
}

// cgroupParentPrefix begins the name of the directory, under the server's
// own cgroup in each hierarchy, that holds one cgroup per sandbox of a
// provider's root (see cgroupParent).
const cgroupParentPrefix = "sandboxowner"

// cgroupParent names the cgroup parent of the sandboxes of the provider
// whose root is root: one per root, so that servers in one cgroup (several
// started from one shell or unit, a test suite's packages) each weigh
// their own sandboxes (see weigh) instead of the last to start or stop one
// setting the weight of all; and the same again for a server restarted on
// its root, which finds the cgroups of the sandboxes it left.
func cgroupParent(root string) string {
	sum := sha256.Sum256([]byte(root))
	return cgroupParentPrefix + "-" + hex.EncodeToString(sum[:6])
}

// cgroups are where this server may make sandbox cgroups: for each
// controller it uses (pids, memory, cpu, freezer), the directory nested
// under the cgroup the server itself runs in. A controller the host does
// not offer, or does not let the server write, is absent.
type cgroups struct {
	v2 bool
	// dirs maps a controller to its parent directory; on v2 every
	// controller shares one.
	dirs map[string]string
	// weight sizes the cpu parent's weight by its sandboxes (see weigh).
	weight cpuWeight
	// leaf is the v2 cgroup the probe moved the processes of the server's
	// cgroup into (see delegateV2), empty when it moved none.
	leaf string
}

// cpuWeight is how much CPU weight the sandboxes' cpu parent carries
// against its siblings (the server's own processes and whatever else runs
// beside it), in busy processes' worth: a nice-0 process weighs one
// (cgroup v1 cpu.shares 1024, v2 cpu.weight 100). A cgroup weighs what its
// weight file says however many processes it holds, so at the default of
// one, every sandbox together got one process's share of a loaded host.
// Each live sandbox now adds perSandbox (its CPU limit: a sandbox using
// all it may weighs what as many busy processes outside would), up to max.
// A zero cpuWeight leaves the parent's weight alone.
type cpuWeight struct {
	perSandbox, max float64
}

// DefaultCPUWeightMax bounds the sandboxes' weight together, in busy
// processes' worth (Options.CPUWeightMax). Every live sandbox counts, busy
// or idle (the weight cannot follow which ones run), so past the bound a
// few busy sandboxes among many idle ones do not outweigh the rest of the
// host without end; each is held to its own CPU limit anyway.
const DefaultCPUWeightMax = 64

// The kernels' bounds of a cgroup's weight.
const (
	maxSharesV1 = 262144
	minSharesV1 = 2
	maxWeightV2 = 10000
	minWeightV2 = 1
)

// weightValue is the weight file's name and the value of n processes'
// worth, within the kernel's bounds.
func weightValue(v2 bool, n float64) (file, value string) {
	unit, lo, hi, file := 1024.0, minSharesV1, maxSharesV1, "cpu.shares"
	if v2 {
		unit, lo, hi, file = 100.0, minWeightV2, maxWeightV2, "cpu.weight"
	}
	return file, strconv.Itoa(max(lo, min(hi, int(math.Round(n*unit)))))
}

// liveCPU holds, per cpu parent directory, the sandboxes whose cgroups
// this process made and has not removed: what weigh counts. Not the
// parent's subdirectories: cgroups a killed process left (empty, weighing
// nothing, hundreds on a host that runs this package's tests) would count
// as live sandboxes, and telling them apart reads a file per sandbox.
var liveCPU = struct {
	sync.Mutex
	byDir map[string]map[string]bool
}{byDir: map[string]map[string]bool{}}

// weigh marks sandbox id live or not (none when id is empty) and sets the
// cpu parent's weight to perSandbox times the live sandboxes, up to max
// (see cpuWeight), at least one process's worth. The count is this
// process's (every provider's in it on the parent's root); another
// server's sandboxes sit in a parent of their own (see cgroupParent). A
// parent tidy removed is no one's: nothing is written.
func (cg *cgroups) weigh(id string, live bool) error {
	dir, ok := cg.dirOf("cpu")
	if !ok || cg.weight.perSandbox <= 0 {
		return nil
	}
	liveCPU.Lock()
	defer liveCPU.Unlock()
	set := liveCPU.byDir[dir]
	switch {
	case id == "":
	case live && set == nil:
		set = map[string]bool{id: true}
		liveCPU.byDir[dir] = set
	case live:
		set[id] = true
	default:
		delete(set, id)
		if len(set) == 0 {
			delete(liveCPU.byDir, dir)
		}
	}
	file, value := weightValue(cg.v2, max(1, min(cg.weight.max, float64(len(set))*cg.weight.perSandbox)))
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup cpu %s=%s: %w", file, value, err)
	}
	return nil
}

// cgroupControllers are the controllers sandboxes use.
var cgroupControllers = []string{"pids", "memory", "cpu", "freezer"}

// probeCgroups finds, for each controller sandboxes use, the server's
// own cgroup and checks that a child can be made in parent, the directory
// there that holds the sandboxes' cgroups (see cgroupParent), and removed.
// It never touches a cgroup outside the server's own (on v2, see v2Base).
func probeCgroups(parent string) (*cgroups, []string) {
	return probeControllers(parent, cgroupControllers)
}

// probeControllers is probeCgroups for the controllers named (any the
// kernel has; "freezer" is v1's, built into every v2 cgroup).
func probeControllers(parent string, controllers []string) (*cgroups, []string) {
	own, err := ownCgroups()
	if err != nil {
		return nil, []string{err.Error()}
	}
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, []string{err.Error()}
	}
	var why []string
	cg := &cgroups{dirs: map[string]string{}}
	// A hybrid host binds some of the controllers to v1 hierarchies; a v1
	// hierarchy holding none of them (systemd's name=systemd, which some
	// v2 hosts keep) leaves the host a v2 one.
	v1 := false
	for _, c := range controllers {
		_, bound := mounts[c]
		v1 = v1 || bound
	}
	// A pure v2 host offers every controller in one tree, to the server's
	// children once its cgroup enables them for its children (see
	// delegateV2).
	v2Mnt, okMnt := mounts[""]
	v2Own, okOwn := own[""]
	v2Own = v2Base(v2Own)
	var v2Refused map[string]error
	if !v1 && okMnt && okOwn {
		v2Refused, cg.leaf = delegateV2(filepath.Join(v2Mnt, v2Own), controllers)
	}
	for _, c := range controllers {
		mnt, ok := mounts[c]
		ownPath, ok2 := own[c]
		if !ok || !ok2 {
			if v1 {
				// A hybrid host: v1 and v2 cgroups of one sandbox are not
				// joined the same way, so v1 only.
				why = append(why, c+": no v1 hierarchy")
				continue
			}
			mnt, ownPath = v2Mnt, v2Own
			if !okMnt || !okOwn {
				why = append(why, c+": "+errNotOffered.Error())
				continue
			}
			if err := v2Refused[c]; err != nil {
				why = append(why, fmt.Sprintf("%s: %v", c, err))
				continue
			}
			cg.v2 = true
		}
		dir := filepath.Join(mnt, ownPath, parent)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		probe := filepath.Join(dir, "probe-"+strconv.Itoa(os.Getpid()))
		if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			why = append(why, fmt.Sprintf("%s: %v", c, err))
			continue
		}
		_ = syscall.Rmdir(probe)
		if cg.v2 {
			// A v2 child gets a controller only when its parent delegates it.
			if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil && c != "freezer" {
				why = append(why, fmt.Sprintf("%s: %v", c, err))
				continue
			}
		}
		cg.dirs[c] = dir
	}
	if len(cg.dirs) == 0 {
		return nil, why
	}
	return cg, why
}

// memoryDir is the parent directory of sandboxes' memory cgroups, when
// there is one.
func (cg *cgroups) memoryDir() (string, bool) { return cg.dirOf("memory") }

// dirOf is the parent directory of sandboxes' cgroups of controller c,
// when there is one.
func (cg *cgroups) dirOf(c string) (string, bool) {
	if cg == nil {
		return "", false
	}
	dir, ok := cg.dirs[c]
	return dir, ok
}

// errNotOffered is why a v2 controller the server's cgroup does not have
// (its parent does not enable it there) is not taken.
var errNotOffered = errors.New("not offered to the server's cgroup")

// serverLeaf names the cgroup, under the server's own v2 cgroup, that the
// processes there move into when the kernel refuses to enable a controller
// for the children of a cgroup holding processes (see delegateV2).
const serverLeaf = "sandboxowner.server"

// v2Base is the v2 cgroup (own, as /proc/self/cgroup names it) under which
// the server makes its sandboxes' parents: its own, or, when it runs in
// the leaf a server moved its cgroup's processes into (see delegateV2),
// that leaf's parent, so that the parents are the leaf's siblings and a
// process there (this server after its move, another started from it)
// does not nest a leaf in the leaf.
func v2Base(own string) string {
	if path.Base(own) == serverLeaf {
		return path.Dir(own)
	}
	return own
}

// delegateV2 enables, for the children of the v2 cgroup dir, each of
// controllers that dir has but does not yet enable for them, and returns
// why each one it cannot give them is not given ("freezer" is built in),
// and the leaf it moved dir's processes into, if it did.
// The kernel enables a controller for a cgroup's children only while the
// cgroup holds no process (the root aside), so a server in a cgroup of its
// own (a systemd unit with Delegate=yes, a container's cgroup namespace)
// would get no limit: when the kernel refuses with EBUSY, every process of
// dir moves into its leaf child serverLeaf first, as runc and systemd
// expect of a delegated cgroup, and the enabling is tried again. Nothing
// is undone after: the processes stay in the leaf and the controllers
// enabled (other servers there may rely on them).
func delegateV2(dir string, controllers []string) (refused map[string]error, leaf string) {
	refused = map[string]error{}
	has, err1 := cgroupList(filepath.Join(dir, "cgroup.controllers"))
	enabled, err2 := cgroupList(filepath.Join(dir, "cgroup.subtree_control"))
	if err := errors.Join(err1, err2); err != nil {
		// Not a v2 cgroup: not even freezing.
		for _, c := range controllers {
			refused[c] = err
		}
		return refused, ""
	}
	moved := false
	for _, c := range controllers {
		switch {
		case c == "freezer" || enabled[c]:
			continue
		case !has[c]:
			refused[c] = errNotOffered
			continue
		}
		err := enableV2(dir, c)
		if errors.Is(err, syscall.EBUSY) && !moved {
			moved = true
			if err = moveToLeaf(dir); err == nil {
				leaf = filepath.Join(dir, serverLeaf)
				err = enableV2(dir, c)
			}
		}
		if err != nil {
			refused[c] = err
		}
	}
	return refused, leaf
}

// enableV2 enables controller c for the children of v2 cgroup dir.
func enableV2(dir, c string) error {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0); err != nil {
		return fmt.Errorf("enable %s for %s's children: %w", c, dir, err)
	}
	return nil
}

// moveLeafRounds bounds moveToLeaf's rounds: a process of the cgroup that
// forks as it is moved leaves its child behind, moved in the next round.
const moveLeafRounds = 16

// moveToLeaf moves every process of v2 cgroup dir into its child
// serverLeaf (made if need be).
func moveToLeaf(dir string) error {
	leaf := filepath.Join(dir, serverLeaf)
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("move the server into a leaf cgroup: %w", err)
	}
	for range moveLeafRounds {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			return fmt.Errorf("move the server into a leaf cgroup: %w", err)
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return nil
		}
		for _, pid := range pids {
			// One at a time: a write of several stops at the first gone.
			err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0)
			if err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("move process %s into leaf cgroup %s: %w", pid, leaf, err)
			}
		}
	}
	return fmt.Errorf("move the server into a leaf cgroup: %s still holds processes after %d rounds", dir, moveLeafRounds)
}

// cgroupList reads a v2 file listing controllers.
func cgroupList(file string) (map[string]bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, f := range strings.Fields(string(b)) {
		out[f] = true
	}
	return out, nil
}

// ownCgroups reads /proc/self/cgroup: controller -> path ("" for v2).
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[1] == "" {
			out[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			out[c] = parts[2]
		}
	}
	return out, nil
}

// cgroupMounts reads /proc/self/mountinfo: controller -> mount point of its
// v1 hierarchy, "" -> the v2 mount.
func cgroupMounts() (map[string]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts ... - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		fields, tail := strings.Fields(pre), strings.Fields(post)
		if len(fields) < 5 || len(tail) < 3 || fields[3] != "/" {
			continue
		}
		switch tail[0] {
		case "cgroup2":
			if _, dup := out[""]; !dup {
				out[""] = fields[4]
			}
		case "cgroup":
			for _, o := range strings.Split(tail[2], ",") {
				if _, dup := out[o]; !dup {
					out[o] = fields[4]
				}
			}
		}
	}
	return out, sc.Err()
}

// sandboxCgroup is one sandbox's cgroup in each hierarchy.
type sandboxCgroup struct {
	v2   bool
	dirs map[string]string // controller -> directory
	// beforeKill, when a test in this package sets it, runs as a kill
	// round is about to send its signals.
	beforeKill func()
	// roundEvery, when a test in this package sets it, is the wait
	// before another kill round instead of killRoundEvery.
	roundEvery time.Duration
}

// create makes (or finds again, after a restart) the sandbox's cgroups and
// writes its limits.
func (cg *cgroups) create(id string, l Limits) (*sandboxCgroup, error) {
	g := &sandboxCgroup{v2: cg.v2, dirs: map[string]string{}}
	for c, parent := range cg.dirs {
		dir := filepath.Join(parent, id)
		// The parent may be removed by tidy at the same moment: again.
		var err error
		for range 3 {
			if err = os.MkdirAll(dir, 0o755); err == nil {
				break
			}
		}
		if err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", c, err)
		}
		if cg.v2 {
			_ = os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+"+c), 0)
		}
		g.dirs[c] = dir
	}
	write := func(c, file, v string) error {
		dir, ok := g.dirs[c]
		if !ok {
			return nil
		}
		if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
			return fmt.Errorf("cgroup %s %s=%s: %w", c, file, v, err)
		}
		return nil
	}
	var errs []error
	if l.Pids > 0 {
		errs = append(errs, write("pids", "pids.max", strconv.Itoa(l.Pids)))
	}
	if l.MemoryMB > 0 {
		bytes := strconv.FormatInt(int64(l.MemoryMB)<<20, 10)
		if g.v2 {
			errs = append(errs, write("memory", "memory.max", bytes))
			if _, err := os.Stat(filepath.Join(g.dirs["memory"], "memory.swap.max")); err == nil {
				errs = append(errs, write("memory", "memory.swap.max", "0"))
			}
		} else {
			errs = append(errs, write("memory", "memory.limit_in_bytes", bytes))
			if _, err := os.Stat(filepath.Join(g.dirs["memory"], "memory.memsw.limit_in_bytes")); err == nil {
				errs = append(errs, write("memory", "memory.memsw.limit_in_bytes", bytes))
			}
		}
	}
	if l.CPUs > 0 {
		const period = 100000
		quota := strconv.Itoa(int(l.CPUs * period))
		if g.v2 {
			errs = append(errs, write("cpu", "cpu.max", quota+" "+strconv.Itoa(period)))
		} else {
			errs = append(errs, write("cpu", "cpu.cfs_period_us", strconv.Itoa(period)), write("cpu", "cpu.cfs_quota_us", quota))
		}
	}
	if err := errors.Join(errs...); err != nil {
		g.remove()
		return nil, err
	}
	if err := cg.weigh(id, true); err != nil {
		g.remove()
		_ = cg.weigh(id, false)
		return nil, err
	}
	return g, nil
}

// tidy follows the removal of sandbox id's cgroups: it removes the parent
// directories when no sandbox cgroup is left in them, so that nothing of
// this server stays in its own cgroup once its sandboxes are idle (a
// directory with children cannot be removed), and weighs the cpu parent
// again without id.
func (cg *cgroups) tidy(id string) error {
	cg.removeEmptyParents()
	return cg.weigh(id, false)
}

// removeEmptyParents removes the sandboxes' parent directories; the kernel
// refuses each that still holds a sandbox's cgroup, which stays.
func (cg *cgroups) removeEmptyParents() {
	if cg == nil {
		return
	}
	for _, parent := range cg.dirs {
		_ = syscall.Rmdir(parent)
	}
}

// staleCgroupAge is how old an empty sandbox or probe cgroup must be before
// a starting provider removes it as left by a killed server. A live one is
// empty only between its creation and its init's start (milliseconds), and
// one that holds a process cannot be removed at all.
const staleCgroupAge = 10 * time.Minute

// sweepStale removes the empty sandbox and probe cgroups that killed
// servers left in the parents (a server's own are removed as its sandboxes
// go; a killed one's stay, and a restart on another root never names them
// again), older than age by the kernel's timestamps at now. It returns how
// many it removed. The kernel refuses to remove a cgroup that holds a
// process or a child, so a live sandbox's is never touched; a stopped
// sandbox's, removed here, is made again when it starts.
//
// The parents of other roots beside this one (a killed server's, or the
// single parent of servers before each root had its own) are swept the
// same way, and removed once empty and as old: a live server's parent,
// removed while it had no sandbox, is made again at its next start.
func (cg *cgroups) sweepStale(now time.Time, age time.Duration) int {
	removed := 0
	old := func(e os.DirEntry) bool {
		info, err := e.Info()
		return err == nil && now.Sub(info.ModTime()) >= age
	}
	sweepParent := func(parent string) {
		entries, err := os.ReadDir(parent)
		if err != nil {
			return
		}
		for _, e := range entries {
			name := e.Name()
			if !e.IsDir() || !(strings.HasPrefix(name, sandboxPrefix) || strings.HasPrefix(name, "probe-")) || !old(e) {
				continue
			}
			if syscall.Rmdir(filepath.Join(parent, name)) == nil {
				removed++
			}
		}
	}
	swept := map[string]bool{}
	for _, parent := range cg.dirs {
		if swept[parent] {
			continue // v2: every controller shares one parent
		}
		swept[parent] = true
		sweepParent(parent)
		own := filepath.Dir(parent)
		siblings, err := os.ReadDir(own)
		if err != nil {
			continue
		}
		for _, e := range siblings {
			name := e.Name()
			other := filepath.Join(own, name)
			// The leaf a server moved into (see delegateV2) holds it.
			if !e.IsDir() || other == parent || !strings.HasPrefix(name, cgroupParentPrefix) || name == serverLeaf || swept[other] {
				continue
			}
			swept[other] = true
			// Its age as found: removing its children may stamp it now.
			stale := old(e)
			sweepParent(other)
			if stale && syscall.Rmdir(other) == nil {
				removed++
			}
		}
	}
	return removed
}

// tidyCgroups tidies the sandboxes' cgroup parents once sandbox id's
// cgroups are removed (see tidy).
func (p *Provider) tidyCgroups(id string) {
	if err := p.cg.tidy(id); err != nil {
		p.log.WithError(err).Warn("local: weigh the sandboxes' cpu cgroup again")
	}
}

// of names the sandbox's cgroups without making them.
func (cg *cgroups) of(id string) *sandboxCgroup {
	g := &sandboxCgroup{v2: cg.v2, dirs: map[string]string{}}
	for c, parent := range cg.dirs {
		g.dirs[c] = filepath.Join(parent, id)
	}
	return g
}

// procsFiles opens the membership file of each distinct directory: the
// server writes a command's pid to each (see startJoined) before the
// command runs.
func (g *sandboxCgroup) procsFiles() ([]*os.File, error) {
	seen := map[string]bool{}
	var files []*os.File
	for _, c := range cgroupControllers {
		dir, ok := g.dirs[c]
		if !ok || seen[dir] {
			continue
		}
		seen[dir] = true
		// On v1 moving a stopped single-threaded process through "tasks"
		// skips the lock that moving a whole thread group takes (and the
		// RCU grace period with it): several milliseconds per hierarchy
		// on a busy host.
		name := "cgroup.procs"
		if !g.v2 {
			name = "tasks"
		}
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY, 0)
		if err != nil {
			for _, o := range files {
				o.Close()
			}
			return nil, err
		}
		files = append(files, f)
	}
	return files, nil
}

// canFreeze reports whether the sandbox's processes can be frozen.
func (g *sandboxCgroup) canFreeze() bool {
	if g == nil {
		return false
	}
	_, ok := g.dirs["freezer"]
	return ok
}

// freeze stops every process of the sandbox (freeze(false) thaws them)
// and waits, up to limit and while ctx lasts, for the kernel to say they
// are. A thaw does not wait.
func (g *sandboxCgroup) freeze(ctx context.Context, on bool, limit time.Duration) error {
	dir := g.dirs["freezer"]
	file, value, done := "freezer.state", "THAWED", "THAWED"
	if g.v2 {
		file, value, done = "cgroup.freeze", "0", "frozen 0"
	}
	if on {
		value, done = "FROZEN", "FROZEN"
		if g.v2 {
			value, done = "1", "frozen 1"
		}
	}
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return err
	}
	if !on {
		return nil
	}
	state := filepath.Join(dir, file)
	if g.v2 {
		state = filepath.Join(dir, "cgroup.events")
	}
	deadline := time.Now().Add(limit)
	for {
		b, err := os.ReadFile(state)
		if err != nil {
			return err
		}
		if strings.Contains(string(b), done) {
			return nil
		}
		if time.Now().After(deadline) {
			return errNotStopped
		}
		if err := pollPause(ctx); err != nil {
			return err
		}
	}
}

// pids lists the processes in the sandbox's cgroups.
func (g *sandboxCgroup) pids() []int {
	var out []int
	for _, dir := range g.dirs {
		b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				out = append(out, pid)
			}
		}
	}
	return out
}

// killRoundEvery is how long kill waits for the processes a round killed
// to leave their cgroups before it kills again: a round leaves none alive
// (see killRound), so another is only a safety net, for a freeze that did
// not complete within its bound.
const killRoundEvery = time.Second

// kill kills every process in the sandbox's cgroups, once none is left or
// for at most killLimit, and leaves them thawed. It returns how many
// processes it found there and how many rounds it killed in.
func (g *sandboxCgroup) kill() (found, rounds int) {
	seen := map[int]bool{}
	deadline := time.Now().Add(killLimit)
	every := killRoundEvery
	if g.roundEvery > 0 {
		every = g.roundEvery
	}
	var next time.Time
	for {
		pids := g.pids()
		for _, pid := range pids {
			seen[pid] = true
		}
		now := time.Now()
		if len(pids) == 0 || now.After(deadline) {
			break
		}
		if !now.Before(next) {
			for _, pid := range g.killRound(pids, deadline) {
				seen[pid] = true
			}
			rounds++
			next = now.Add(every)
		}
		time.Sleep(pollEvery)
	}
	if g.canFreeze() {
		_ = g.freeze(context.Background(), false, 0) // for what starts in it next
	}
	return len(seen), rounds
}

// killRound kills the sandbox's processes (pids, as listed) so that none
// escapes by forking as it is killed: on v2 the kernel's cgroup.kill kills
// the whole cgroup, forks on their way included; without it the freezer
// stops every process first (a frozen process cannot fork, and one forking
// as it is frozen has its child frozen too), the list taken again is
// complete, each gets SIGKILL while frozen and dies at the thaw (v1) or at
// once (v2); with no freezer, what is listed gets SIGKILL. It returns
// the processes it killed, as far as it knows them.
func (g *sandboxCgroup) killRound(pids []int, deadline time.Time) []int {
	if g.v2 {
		done := map[string]bool{}
		for _, dir := range g.dirs {
			if !done[dir] && os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0) == nil {
				done[dir] = true
			}
		}
		if len(done) > 0 {
			return pids
		}
	}
	frozen := g.canFreeze() && g.freeze(context.Background(), true, time.Until(deadline)) == nil
	if frozen {
		pids = g.pids()
	}
	if g.beforeKill != nil {
		g.beforeKill()
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	if g.canFreeze() {
		_ = g.freeze(context.Background(), false, 0) // a frozen v1 process cannot die
	}
	return pids
}

// remove kills what is left in the sandbox's cgroups and removes them.
func (g *sandboxCgroup) remove() error {
	if g == nil {
		return nil
	}
	g.kill()
	deadline := time.Now().Add(killLimit)
	var errs []error
	for c, dir := range g.dirs {
		for {
			err := syscall.Rmdir(dir)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			if !errors.Is(err, syscall.EBUSY) || time.Now().After(deadline) {
				errs = append(errs, fmt.Errorf("cgroup %s: %w", c, err))
				break
			}
			for _, pid := range g.pids() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			time.Sleep(pollEvery)
		}
	}
	return errors.Join(errs...)
}
