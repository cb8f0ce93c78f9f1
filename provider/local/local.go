package local

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/cmdenv"
	"github.com/sandboxowner/owner/provider/local/searchable"
	"github.com/sandboxowner/owner/provider/local/seccomp"
	"github.com/sandboxowner/owner/provider/local/uidrange"
)

// Name is what (*Provider).Name returns and what Handle.Provider holds.
const Name = "local"

// Isolation modes (Options.Isolation, (*Provider).Isolation).
const (
	IsolationAuto = "auto"
	// IsolationContainer: each sandbox is a container the server makes
	// itself (namespaces, its own root, no capabilities, the filter).
	IsolationContainer = "container"
	// IsolationBwrap is what IsolationContainer was called when bubblewrap
	// made the namespaces; configurations naming it get IsolationContainer.
	IsolationBwrap = "bwrap"
	IsolationNone  = "none"
	// IsolationUnavailable is reported when "auto" found that the kernel
	// refuses the namespaces: no sandbox starts.
	IsolationUnavailable = "unavailable"
)

// Overlay modes (Options.Overlay).
const (
	OverlayAuto = "auto"
	OverlayOn   = "on"
	OverlayOff  = "off"
)

// Defaults for zero Options fields.
const (
	DefaultWorkdir     = "/sandbox"
	DefaultOutputCap   = 1 << 20
	DefaultExecTimeout = 10 * time.Minute
	// DefaultMaxExecTimeout caps a command's timeout.
	DefaultMaxExecTimeout = 30 * time.Minute
	DefaultCopyWorkers    = 4
	// DefaultMaxFileBytes caps one file read or written through the
	// provider (64 MiB).
	DefaultMaxFileBytes = 64 << 20
)

// SandboxIDEnv is set in every command's environment to the sandbox's id. The
// provider also uses it to find a sandbox's processes that outlived a crashed
// server, so a command that clears its environment escapes that sweep.
const SandboxIDEnv = cmdenv.IDVar

// Errors of this package (the provider's sentinels are in package provider).
var (
	// ErrIsolationUnavailable: the kernel refuses what a sandbox's container
	// is made of (unprivileged user namespaces, most often). New returns it
	// for Isolation "container" (or "bwrap"); with "auto", every Start and
	// Exec wraps it, with provider.ErrUnavailable.
	ErrIsolationUnavailable = errors.New("local: sandbox isolation unavailable")
	// ErrBwrapUnavailable is ErrIsolationUnavailable under its old name.
	ErrBwrapUnavailable = ErrIsolationUnavailable
	// ErrOverlayUnavailable: Overlay "on" was asked for and overlayfs cannot
	// be mounted here.
	ErrOverlayUnavailable = errors.New("local: overlayfs unavailable")
	// ErrBadOptions: New was given options it cannot use.
	ErrBadOptions = errors.New("local: bad options")
	// ErrNotRegular: ReadFile or WriteFile met a directory, FIFO, device or
	// socket at the path (provider.ErrNotRegular, under its old name).
	ErrNotRegular = provider.ErrNotRegular
)

// Options configure a Provider. Only Root is required.
type Options struct {
	// Root is the directory that holds every sandbox and snapshot. It is
	// created if missing. One server process owns a root at a time.
	Root string
	// Templates maps an image name (Spec.Image) to a directory the sandbox
	// starts from. An empty directory value means an empty tree, so
	// Templates{"notes": ""} makes image "notes" start empty. A Spec.Image
	// that is not a template name must be an absolute path to a directory.
	Templates map[string]string
	// Isolation: "auto" (the default) and "container" make each sandbox a
	// container of the server's own (no system package is needed); where
	// the kernel refuses, "container" fails New and "auto" starts a
	// provider that says why and starts no sandbox. "bwrap" is
	// "container". "none" runs commands unisolated, as the server.
	Isolation string
	// Seccomp is the syscall filter of sandboxed commands: "default" (or
	// empty) refuses what container runtimes' default profiles refuse
	// (see seccomp.Filter), "off" none, anything else is a file holding a
	// compiled classic BPF program. It applies to isolated sandboxes.
	Seccomp string
	// UID and GID are the unprivileged host ids sandboxed commands run as
	// (DefaultUID, DefaultGID when zero; root is never used). Root inside
	// a sandbox is this uid on the host, and a sandbox's tree is owned by it.
	UID, GID int
	// UIDRange is the block of host uids isolated sandboxes get one each
	// of, "FIRST-LAST" (the gid is the same number): DefaultUIDRange when
	// empty, checked at New against the host's users, groups and
	// subordinate ids. Per-user kernel state (keyrings, inotify and
	// fanotify counts, RLIMIT_NPROC) is then each sandbox's own. Trees stay
	// UID's on disk; a sandbox sees them as its own through idmapped
	// mounts. UIDRangeNone runs every sandbox as UID and GID; a server that
	// is not root runs them as its own uid whatever this says.
	UIDRange string
	// ROBinds are host paths shown read-only to sandboxed commands besides
	// /usr, /bin, /sbin, /lib* and /etc (a toolchain under /opt, say). None
	// may be or lie under /root, /home, /var, /srv, /run, /tmp or a Hide path.
	ROBinds []string
	// Limits bound each sandbox's processes, memory and CPU through cgroups
	// nested under the server's own, where the host lets the server make
	// them (see Limits). Rlimits (no core files, open files, file size)
	// apply always.
	Limits Limits
	// CPUWeightMax bounds the CPU weight all sandboxes together carry
	// against the other processes of the host (those of the cgroup the
	// server runs in: the server, and on a host like most, everything
	// else), in busy processes' worth: DefaultCPUWeightMax when zero; 1 is
	// one process's worth, what the sandboxes' one cgroup weighed before
	// its weight was scaled. Each live sandbox adds its CPU limit (the
	// host's CPUs when it has none): a sandbox using all its limit competes
	// as that many busy processes outside would, where before all of them
	// shared one process's share of a loaded host. Negative is
	// ErrBadOptions.
	CPUWeightMax float64
	// MaxExecTimeout caps ExecRequest.Timeout (DefaultMaxExecTimeout when
	// zero): a longer one is ErrInvalidSpec.
	MaxExecTimeout time.Duration
	// Hide are host paths a sandbox must never see even where a bound
	// directory holds them: the server's config file and state directory.
	// The provider's root is always hidden.
	Hide []string
	// Overlay: "auto" (the default) makes sandboxes overlayfs mounts when the
	// server can mount overlayfs and copies otherwise, "on" fails New when it
	// cannot, "off" always copies.
	Overlay string
	// DefaultWorkdir is the workdir of a spec that names none
	// (DefaultWorkdir when empty). Isolated, the tree is mounted there.
	DefaultWorkdir string
	// OutputCap caps each of stdout and stderr of a command, in bytes
	// (DefaultOutputCap when zero).
	OutputCap int
	// MaxFileBytes caps a file ReadFile, OpenFile or WriteFile handles
	// (DefaultMaxFileBytes when zero): a larger one is
	// provider.ErrFileTooLarge, refused before it is read, so a sandbox's
	// files cost the server at most this per call.
	MaxFileBytes int64
	// DefaultExecTimeout is the timeout of a command that names none
	// (DefaultExecTimeout when zero).
	DefaultExecTimeout time.Duration
	// Caches places named shared caches (see CachesOption): name → host
	// directory. A cache not listed is at <Root>/caches/<name>.
	Caches map[string]string
	// Durable makes Start, Snapshot and Renew survive a machine crash, not
	// only a server crash: metadata files are fsynced and a snapshot's tree
	// is flushed (sync(2)) before its record is written. Off, a snapshot
	// costs about what `cp -a` of the tree does.
	Durable bool
	// SnapshotDir, when set, is where snapshots are written instead of
	// <Root>/snapshots: a directory on a filesystem that every machine
	// which may restore them mounts (NFS, Lustre), so that a server on
	// another machine forks them. Such snapshots are whole trees (never an
	// overlay layer over this machine's images), and many servers may
	// share the directory. Unset, a snapshot lives and dies with the
	// machine.
	SnapshotDir string
	// SnapshotDelay and ForkDelay hold every Snapshot and Fork this long
	// before it starts (the call's context ends the wait). For crash tests:
	// they widen the window in which a server can be killed mid-commit or
	// mid-restore. Zero in production.
	SnapshotDelay, ForkDelay time.Duration
	// CopyWorkers is how many files a snapshot or a copy-mode start or fork
	// copies at once (DefaultCopyWorkers when zero).
	CopyWorkers int
	// OnPause, when set, is told after each snapshot how long the sandbox
	// was paused: from when the snapshot began to hold it (new commands
	// and file calls wait from then on; running commands are stopped) to
	// when it let it go. For benchmarks and metrics; it must be quick and
	// safe for concurrent use.
	OnPause func(sandboxID string, paused time.Duration)
	// Captures is how many snapshots copy a sandbox at once
	// (GOMAXPROCS when zero). A snapshot waits for a turn before it holds
	// its sandbox, in the order they came: a sandbox is paused only for
	// its own copy, never while other copies share the machine's CPUs and
	// disk with it.
	Captures int
	// ReadyIDs is how many sandbox ids a provider keeps made ahead, each
	// with what a start would otherwise wait for: its uid taken and the
	// user namespace its views map through made (sandboxes with uids of
	// their own, overlay mode), its directory made with its disk copied
	// and mounted (with a disk limit). DefaultReadyIDs when zero, none
	// when negative (nor the further ids kept with only their uids and
	// namespaces made, see readyNamespaces). They are made once a first sandbox started, and
	// given back by Close; the directories a crashed server left are
	// removed by the next exclusive provider's New, by Reap and by
	// SweepMadeAhead (server sweep -reap).
	ReadyIDs int
	// Exclusive locks Root for this provider until Close (or the process
	// ends): New fails with ErrRootLocked while another holds it, naming
	// the process. A server sets it, since a second one on the same root
	// would stop the first one's sandboxes as leftovers of a crash.
	Exclusive bool
	// Clock reads time for leases and records (clock.Real when nil).
	Clock clock.Clock
	// ExecClock times commands out (clock.Real when nil). It is apart from
	// Clock so that a test moving the lease clock never times out a command
	// in flight, and a test that sets a clock.Manual here times a command
	// out on cue, however slow the machine.
	ExecClock clock.Clock
	// Logger receives structured logs (a discarding logger when nil).
	Logger logrus.FieldLogger
	// InitBinary, when set, is the path of a separate init binary
	// (cmd/sandbox-init, built from the same sources as the server): each
	// sandbox's init runs it instead of the server's own binary, which
	// starts in about a third of the CPU time and page faults. New checks
	// that it speaks this server's init protocol (sinit.Identity) and
	// fails with ErrBadOptions naming both when it does not: a wrong or
	// mismatched binary is refused, never run as an init, and never
	// replaced by the server's own binary. Empty: the server's own binary.
	InitBinary string

	// probeIsolation, when a test in this package sets it, replaces New's
	// start of a throwaway container (see probeContainer).
	probeIsolation func() error
	// probed, when a test in this package sets it, keeps what New's probes
	// found for the next providers that share it (see probeResults).
	probed *probeResults
}

// Provider is the local provider. It implements provider.Provider,
// provider.Snapshotter, provider.Leaser and provider.Lister. It is safe for
// concurrent use.
type Provider struct {
	root string
	// maxLayers is how many lower layers a sandbox stands on before its
	// next snapshot is taken flat: the constant maxLayers. Tests lower it,
	// since reaching a flattening at 24 takes some 27 snapshot generations
	// (66–100 s of a loaded run); 3 reaches it in six.
	maxLayers int
	// snapDir is Options.SnapshotDir, absolute ("" for <root>/snapshots).
	snapDir   string
	templates map[string]string
	cacheDirs map[string]string
	workdir   string
	outputCap int
	// maxFileBytes: see Options.MaxFileBytes.
	maxFileBytes int64
	execTimeout  time.Duration
	copyWorkers  int
	clk          clock.Clock
	execClk      clock.Clock // see Options.ExecClock
	// answerGrace is how long an exec whose context ended waits for its
	// command's answer to the kill that asked (see commandStatus.wait).
	answerGrace time.Duration
	log         logrus.FieldLogger
	ctr         *containerConfig // nil: commands run unisolated
	// isoErr: isolation "auto" found the kernel refusing containers; no
	// sandbox starts.
	isoErr error
	// probeIsolation, when set by a test, replaces the start of a
	// throwaway container that New makes to see that containers work.
	probeIsolation func() error
	// probed: see Options.probed.
	probed *probeResults
	// seccompName is Options.Seccomp, "default" when empty.
	seccompName string
	// uids, when isolated sandboxes get a host uid each, hands them out.
	uids *uidrange.Range
	// uid and gid own sandbox trees (and run sandboxed commands, but where
	// uids gives each sandbox its own).
	uid, gid int
	// rootless: the server is not root, so sandboxed commands run as its
	// own uid and trees are its own.
	rootless bool
	// cg, when the host lets the server make cgroups, holds each sandbox's;
	// limits are written to them.
	cg     *cgroups
	limits Limits
	// cpuWeightMax: see Options.CPUWeightMax.
	cpuWeightMax float64
	// disks, when the disk limit holds here, makes each sandbox's
	// filesystem image (see disks); diskErr says why it does not.
	disks          *disks
	diskErr        error
	maxExecTimeout time.Duration
	overlay        bool
	durable        bool
	// snapshotDelay and forkDelay: see Options.
	snapshotDelay, forkDelay time.Duration
	onPause                  func(sandboxID string, paused time.Duration)
	// captures holds a token per snapshot copying a sandbox.
	captures chan struct{}

	// ready keeps sandbox ids made ahead (nil: none are); readyNS more
	// of them with only their uids and namespaces made (nil: none are).
	ready, readyNS *readyIDs
	// ns makes the user namespaces views map through (see nsMaker).
	ns *nsMaker
	// release: a remount's wait for the image's last loop device to go.
	release imageRelease

	// hook, when set by a test in this package, runs at a snapshot's
	// stages (its turn, the sandbox paused, resumed) and once an exec's
	// command is sent to the init and the sandbox's gate let go ("sent").
	hook func(stage string, sandboxID string)

	// initBin is the binary sandboxes' inits run (see initBinary), once
	// placed: Options.InitBinary's, or the server's own.
	initBinMu sync.Mutex
	initBin   string

	mu        sync.Mutex
	lock      *os.File            // Options.Exclusive: the locked file, until Close
	users     string              // Capabilities' HostMounts: Users as JSON
	sandboxes map[string]*sandbox // loaded sandboxes, by id
	pending   map[string]int      // ids of sandboxes and snapshots being made, and snapshots being read by a fork
	// imageMu serialises the making of images' owned layers.
	imageMu sync.Mutex
	// snapMu serialises changes to snapshot records and the collection of
	// deleted snapshots.
	snapMu sync.Mutex
	// garbage: deleted snapshots or a failed snapshot's leftovers may be
	// waiting for collection (true at start, for a previous server's).
	garbage bool
}

var (
	_ provider.Provider       = (*Provider)(nil)
	_ provider.Snapshotter    = (*Provider)(nil)
	_ provider.Leaser         = (*Provider)(nil)
	_ provider.Lister         = (*Provider)(nil)
	_ provider.FileOpener     = (*Provider)(nil)
	_ provider.StartsExpecter = (*Provider)(nil)
)

// Capabilities: the local provider does everything optional; its file
// calls refuse what is not a regular file, and its sandboxes see this
// machine's tools.
func (p *Provider) Capabilities() provider.Capabilities {
	return provider.Capabilities{Snapshotter: p, Leaser: p, Lister: p, FileOpener: p, StartsExpecter: p, RegularFiles: true, HostTools: true, HostMounts: p.users}
}

// New makes the root's directories, probes containers and overlayfs as the
// options ask, and logs once which isolation and filesystem mode are in
// effect. It does not touch sandboxes a previous server left: they are found
// again on first use, by Reap and by the Lister.
func New(opts Options) (_ *Provider, err error) {
	if opts.Root == "" {
		return nil, fmt.Errorf("%w: Root is required", ErrBadOptions)
	}
	root, err := filepath.Abs(opts.Root)
	if err != nil {
		return nil, fmt.Errorf("%w: root %q: %v", ErrBadOptions, opts.Root, err)
	}
	snapDir := opts.SnapshotDir
	if snapDir != "" {
		if snapDir, err = filepath.Abs(snapDir); err != nil {
			return nil, fmt.Errorf("%w: snapshot dir %q: %v", ErrBadOptions, opts.SnapshotDir, err)
		}
	}
	p := &Provider{
		maxLayers:      maxLayers,
		ns:             newNSMaker(),
		root:           root,
		snapDir:        snapDir,
		templates:      map[string]string{},
		cacheDirs:      map[string]string{},
		workdir:        opts.DefaultWorkdir,
		outputCap:      opts.OutputCap,
		execTimeout:    opts.DefaultExecTimeout,
		copyWorkers:    opts.CopyWorkers,
		durable:        opts.Durable,
		snapshotDelay:  opts.SnapshotDelay,
		onPause:        opts.OnPause,
		forkDelay:      opts.ForkDelay,
		clk:            opts.Clock,
		probeIsolation: opts.probeIsolation,
		probed:         opts.probed,
		log:            opts.Logger,
		sandboxes:      map[string]*sandbox{},
		pending:        map[string]int{},
		garbage:        true,
		release:        newImageRelease(),
	}
	// The helper is the inits' binary in its user namespace mode.
	p.ns.exe = p.initBinary
	if p.workdir == "" {
		p.workdir = DefaultWorkdir
	}
	p.uid, p.gid = opts.UID, opts.GID
	if p.uid == 0 {
		p.uid = DefaultUID
	}
	if p.gid == 0 {
		p.gid = DefaultGID
	}
	if p.uid < 0 || p.gid < 0 {
		return nil, fmt.Errorf("%w: uid %d, gid %d", ErrBadOptions, p.uid, p.gid)
	}
	if euid := os.Geteuid(); euid != 0 {
		// Only root may map a sandbox to another uid: a server that is not
		// root runs sandboxed commands as its own uid (itself unprivileged).
		p.rootless = true
		p.uid, p.gid = euid, os.Getegid()
	}
	if _, err := cleanWorkdir(p.workdir); err != nil {
		return nil, fmt.Errorf("%w: DefaultWorkdir: %v", ErrBadOptions, err)
	}
	if p.outputCap <= 0 {
		p.outputCap = DefaultOutputCap
	}
	p.maxFileBytes = opts.MaxFileBytes
	if p.maxFileBytes <= 0 {
		p.maxFileBytes = DefaultMaxFileBytes
	}
	if p.execTimeout <= 0 {
		p.execTimeout = DefaultExecTimeout
	}
	p.maxExecTimeout = opts.MaxExecTimeout
	if p.maxExecTimeout <= 0 {
		p.maxExecTimeout = DefaultMaxExecTimeout
	}
	if p.execTimeout > p.maxExecTimeout {
		return nil, fmt.Errorf("%w: DefaultExecTimeout %s is over MaxExecTimeout %s", ErrBadOptions, p.execTimeout, p.maxExecTimeout)
	}
	p.limits = opts.Limits.withDefaults()
	p.cpuWeightMax = cmp.Or(opts.CPUWeightMax, DefaultCPUWeightMax)
	if p.cpuWeightMax < 0 {
		return nil, fmt.Errorf("%w: CPUWeightMax %g is negative", ErrBadOptions, opts.CPUWeightMax)
	}
	if p.copyWorkers <= 0 {
		p.copyWorkers = DefaultCopyWorkers
	}
	p.captures = make(chan struct{}, cmp.Or(max(opts.Captures, 0), runtime.GOMAXPROCS(0)))
	if p.clk == nil {
		p.clk = clock.Real{}
	}
	if p.execClk = opts.ExecClock; p.execClk == nil {
		p.execClk = clock.Real{}
	}
	p.answerGrace = killLimit
	if p.log == nil {
		p.log = logs.Discard()
	}
	p.log = p.log.WithField("provider", Name)
	for name, dir := range opts.Templates {
		if dir != "" {
			abs, err := filepath.Abs(dir)
			if err != nil {
				return nil, fmt.Errorf("%w: template %q: %v", ErrBadOptions, name, err)
			}
			dir = abs
		}
		p.templates[name] = dir
	}
	for name, dir := range opts.Caches {
		if !cacheNameRE.MatchString(name) || dir == "" {
			return nil, fmt.Errorf("%w: cache %q at %q", ErrBadOptions, name, dir)
		}
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("%w: cache %q: %v", ErrBadOptions, name, err)
		}
		p.cacheDirs[name] = abs
	}
	users, _ := json.Marshal(p.Users())
	p.users = string(users)
	for _, d := range []string{p.sandboxesDir(), p.snapshotsDir(), p.snapshotTrashDir(), p.trashDir(), p.emptyDir(), p.imagesDir(), p.readyDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, fmt.Errorf("local: make root: %w", err)
		}
	}
	if opts.Exclusive {
		if p.lock, err = lockRoot(p.root); err != nil {
			return nil, err
		}
		defer func() {
			if err != nil {
				_ = p.Close()
			}
		}()
		// The inits' binaries previous servers placed (see initBinary):
		// their inits died with them, and this server owns the root.
		old, _ := filepath.Glob(filepath.Join(p.root, "init-*"))
		for _, dir := range old {
			_ = os.RemoveAll(dir)
		}
		// So are the sandbox directories they made ahead.
		if _, err := p.removeReadyDirs(); err != nil {
			p.log.WithError(err).Warn("local: remove the sandbox directories a previous server made ahead (Reap retries)")
		}
	}

	if opts.InitBinary != "" {
		// Before the isolation probe, which starts an init.
		if err := p.useInitBinary(opts.InitBinary); err != nil {
			return nil, err
		}
	}
	p.seccompName = opts.Seccomp
	if p.seccompName == "" {
		p.seccompName = SeccompDefault
	}
	if opts.Isolation != IsolationNone && !p.rootless && opts.UIDRange != UIDRangeNone {
		spec := opts.UIDRange
		if spec == "" {
			spec = DefaultUIDRange
		}
		if p.uids, err = uidrange.Parse(spec); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadOptions, err)
		}
		if err := p.uids.CheckHost(uidrange.System(), p.uid, p.gid); err != nil {
			return nil, fmt.Errorf("%w: %v", ErrBadOptions, err)
		}
	}
	if err := p.chooseIsolation(opts); err != nil {
		return nil, err
	}
	if p.ctr == nil {
		p.uids = nil
	}
	p.holdUIDs()
	if err := p.chooseOverlay(opts.Overlay); err != nil {
		return nil, err
	}
	mode := "copy"
	if p.overlay {
		mode = "overlay"
	}
	p.chooseCgroups()
	p.chooseDisks()
	if (p.uids != nil && p.overlay || p.disks != nil) && opts.ReadyIDs >= 0 {
		p.ready = newReadyIDs(p, cmp.Or(opts.ReadyIDs, DefaultReadyIDs), false)
		if n := p.readyNamespaces(); p.uids != nil && p.overlay && n > 0 {
			p.readyNS = newReadyIDs(p, n, true)
		}
	}
	fields := logrus.Fields{"root": p.root, "isolation": p.Isolation(), "fs_mode": mode, "limits": p.LimitsInEffect(), "seccomp": p.Seccomp()}
	if p.ctr != nil {
		fields["uid"], fields["gid"] = p.uid, p.gid
		if p.rootless {
			p.log.WithField("uid", p.uid).Warn("local provider: the server is not root, so sandboxed commands run as its own uid (sandbox.local.uid needs root); the sandbox still sees only the allow-listed host and its own tree")
		}
	}
	if p.isoErr != nil {
		fields["isolation_error"] = p.isoErr.Error()
	}
	if p.diskErr != nil {
		fields["disk_error"] = p.diskErr.Error()
	}
	if p.uids != nil {
		first, last := p.uids.Bounds()
		fields["uid_range"] = fmt.Sprintf("%d-%d", first, last)
	}
	p.log.WithFields(fields).Info("local provider ready")
	return p, nil
}

// unisolatedWarning is said at startup when commands run unisolated.
const unisolatedWarning = "agent commands run UNISOLATED, as the server's own user, and can read and change everything it can: do not lend sandboxes to untrusted code (isolation: auto or container isolates them)"

func (p *Provider) chooseIsolation(opts Options) error {
	mode := opts.Isolation
	switch mode {
	case "", IsolationAuto, IsolationContainer, IsolationBwrap:
	case IsolationNone:
		p.log.WithFields(logrus.Fields{"isolation": IsolationNone, "uid": os.Geteuid()}).Warn("local provider (isolation: none): " + unisolatedWarning)
		return nil
	default:
		return fmt.Errorf("%w: isolation %q (want auto, container, bwrap or none)", ErrBadOptions, mode)
	}
	hide := append([]string{p.root}, opts.Hide...)
	mask := filepath.Join(p.root, "masked")
	if err := os.WriteFile(mask, nil, 0o444); err != nil {
		return fmt.Errorf("local: make root: %w", err)
	}
	cfg, err := newContainerConfig(p.uid, p.gid, opts.ROBinds, hide, mask)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrBadOptions, err)
	}
	cfg.rootless = p.rootless
	if cfg.seccomp, err = seccomp.Load(opts.Seccomp); err != nil {
		return fmt.Errorf("%w: seccomp %q: %v", ErrBadOptions, opts.Seccomp, err)
	}
	if !p.rootless {
		err = p.reachable(opts.Caches)
	}
	p.ctr = cfg
	if err == nil {
		err = p.probeContainer()
	}
	if err != nil && cfg.seccomp != nil && p.seccompName != SeccompDefault {
		// A filter file the kernel refuses is the configuration's fault.
		prog := cfg.seccomp
		cfg.seccomp = nil
		if p.probeContainer() == nil {
			return fmt.Errorf("%w: seccomp %q: the kernel refuses the filter: %v", ErrBadOptions, opts.Seccomp, err)
		}
		cfg.seccomp = prog
	}
	if err == nil {
		return nil
	}
	p.ctr = nil
	if mode == IsolationContainer || mode == IsolationBwrap {
		return fmt.Errorf("%w: %v", ErrIsolationUnavailable, err)
	}
	p.isoErr = fmt.Errorf("%w: %v", ErrIsolationUnavailable, err)
	p.log.WithError(err).WithField("isolation", IsolationUnavailable).Error("local provider: the kernel refuses the namespaces a sandbox is made of (are unprivileged user namespaces disabled?), so no sandbox will start; isolation: none runs them unisolated, which " + unisolatedWarning[len("agent commands run UNISOLATED, "):])
	return nil
}

// probeContainer starts a throwaway container the way sandboxes start and
// runs `touch` in it, so that New knows containers work here: the kernel
// allows the namespaces and mounts, and the sandbox's uid reaches the
// provider's root.
func (p *Provider) probeContainer() error {
	if p.probeIsolation != nil {
		return p.probeIsolation()
	}
	return p.probed.run(fmt.Sprintf("container seccomp=%s/%t", p.seccompName, p.ctr.seccomp != nil), p.startProbeContainer)
}

// startProbeContainer is probeContainer's start of a container.
func (p *Provider) startProbeContainer() error {
	dir, err := os.MkdirTemp(p.trashDir(), "probe-")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer removeSandboxDir(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	s := &sandbox{id: "probe", dir: dir, groups: map[int]struct{}{}, meta: sandboxMeta{Workdir: p.workdir}}
	if p.uids != nil {
		first, _ := p.uids.Bounds()
		s.meta.UID, s.meta.GID = first, first
	}
	if err := os.Mkdir(s.fsDir(), 0o755); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if err := p.owner().chown(s.fsDir()); err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	// Its result is every caller's (see probed), so no one caller's
	// context bounds it: the init's setup bound does.
	ctx, cancel := context.WithTimeout(context.Background(), setupTimeout)
	defer cancel()
	in, err := p.startInit(ctx, s, nil)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer func() {
		_ = in.cmd.Process.Kill()
		<-in.dead
	}()
	stdout, err := outputFile("stdout")
	if err != nil {
		return err
	}
	defer stdout.Close()
	out := int(stdout.Fd())
	_, status, err := in.run("touch probe", []string{"PATH=" + cmdenv.BasePath}, p.workdir, out, out)
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	m, ok := status.wait(ctx, 0)
	if err := startErr(m); ok && err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	if !ok || m.Status != 0 {
		out, _ := readOutput(stdout, 4<<10)
		return fmt.Errorf("probe: a command in a container failed (status %d): %s", m.Status, strings.TrimSpace(out))
	}
	if _, err := os.Stat(filepath.Join(s.fsDir(), "probe")); err != nil {
		return errors.New("probe: a command in a container could not write its workdir")
	}
	return nil
}

// Seccomp reports the syscall filter in effect: "default", "off", or the
// filter file's path; "off" when commands run unisolated.
func (p *Provider) Seccomp() string {
	if p.ctr == nil || p.ctr.seccomp == nil {
		return SeccompOff
	}
	return p.seccompName
}

// reachable lets the sandbox's uid search its way to the provider's root
// and the placed caches, which a sandbox's init binds by path.
func (p *Provider) reachable(caches map[string]string) error {
	dirs := []string{p.root}
	for _, d := range caches {
		dirs = append(dirs, d)
	}
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if err := p.reach(d); err != nil {
			return err
		}
	}
	return nil
}

// reach makes dir searchable by the sandbox's uid (see searchable.Make), saying
// so when it changes a directory.
func (p *Provider) reach(dir string) error {
	changed, err := searchable.Make(dir, p.uid, p.gid)
	if err != nil {
		return fmt.Errorf("make %s searchable by uid %d: %w", dir, p.uid, err)
	}
	if len(changed) > 0 {
		p.log.WithField("dirs", changed).Info("local provider: made directories searchable (o+x, not readable) so that a sandbox's init, running as the sandbox's uid, reaches the trees it binds")
	}
	return nil
}

func (p *Provider) chooseOverlay(mode string) error {
	switch mode {
	case OverlayOff:
		return nil
	case "", OverlayAuto, OverlayOn:
	default:
		return fmt.Errorf("%w: overlay %q (want auto, on or off)", ErrBadOptions, mode)
	}
	if err := p.probed.run("overlay", func() error { return probeOverlay(p.trashDir()) }); err != nil {
		if mode == OverlayOn {
			return fmt.Errorf("%w: %v", ErrOverlayUnavailable, err)
		}
		p.log.WithError(err).Info("local provider: overlayfs cannot be mounted here; sandboxes and snapshots are copies")
		return nil
	}
	p.overlay = true
	return nil
}

// chooseCgroups finds whether sandboxes can have cgroups of their own and
// says what limits are in effect.
func (p *Provider) chooseCgroups() {
	cg, why := probeCgroups(cgroupParent(p.root))
	p.cg = cg
	if cg != nil && cg.leaf != "" {
		p.log.WithField("cgroup", cg.leaf).Info("local provider: moved the processes of the server's cgroup into a leaf of it, so that the kernel lets its sandboxes' cgroups have controllers")
	}
	// A limit the kernel does not enforce is not claimed: each is probed
	// over a tiny limit in a throwaway cgroup.
	for _, probe := range []struct {
		c    string
		on   bool
		test func(dir string) error
	}{
		{"memory", p.limits.MemoryMB > 0, func(dir string) error {
			bin, err := p.initBinary()
			if err != nil {
				return err
			}
			return probeMemory(bin, dir, cg.v2, memProbeLimitMiB)
		}},
		{"pids", p.limits.Pids > 0, func(dir string) error { return probePids(dir, cg.v2, probePidsLimit) }},
		{"cpu", p.limits.CPUs > 0, func(dir string) error { return probeCPU(dir, cg.v2, probeCPUQuotaUS) }},
	} {
		if dir, ok := cg.dirOf(probe.c); ok && probe.on {
			if err := p.probed.run(probe.c, func() error { return probe.test(dir) }); err != nil {
				delete(cg.dirs, probe.c)
				why = append(why, probe.c+": "+err.Error())
			}
		}
	}
	if len(why) > 0 {
		p.log.WithField("missing", why).Warn("local provider: some sandbox limits are not enforced here (no cgroup the server may make for them); rlimits still apply")
	}
	if cg == nil {
		return
	}
	// The kernel stamps a cgroup with the real time, so the real clock
	// reads its age.
	if n := cg.sweepStale(time.Now(), staleCgroupAge); n > 0 {
		p.log.WithField("removed", n).Info("local provider: removed empty sandbox cgroups that killed servers left")
	}
	cg.weight = cpuWeight{perSandbox: p.limits.CPUs, max: p.cpuWeightMax}
	if p.limits.CPUs < 0 {
		cg.weight.perSandbox = float64(runtime.NumCPU())
	}
	// What this process's live sandboxes weigh (one process's worth when
	// it has none): a previous server's weight does not stay.
	if err := cg.weigh("", false); err != nil {
		p.log.WithError(err).Warn("local provider: the sandboxes' CPU weight cannot be set; they share one process's worth of a loaded host")
	}
}

// LimitsInEffect says which limits hold sandboxes: the cgroup controllers
// in use, and the rlimits every command has.
func (p *Provider) LimitsInEffect() string {
	var parts []string
	if p.cg != nil {
		kind := "cgroup v1"
		if p.cg.v2 {
			kind = "cgroup v2"
		}
		var cs []string
		for _, c := range cgroupControllers {
			if _, ok := p.cg.dirs[c]; ok {
				cs = append(cs, c)
			}
		}
		parts = append(parts, kind+" "+strings.Join(cs, ","))
	}
	if p.disks != nil {
		parts = append(parts, p.disks.limit.String()+" (ext4 image)")
	}
	parts = append(parts, "rlimits core,nofile,fsize")
	return strings.Join(parts, "; ")
}

// chooseDisks claims the disk limit where images mount here and a full
// one refuses writes (see newDisks); it needs root, to mount them.
func (p *Provider) chooseDisks() {
	limit, ok := p.limits.disk()
	if !ok {
		return
	}
	if p.ctr == nil {
		// Unisolated commands write wherever the server can: a disk of
		// the tree's own would bound nothing.
		p.diskErr = errors.New("commands run unisolated and can write wherever the server can")
		return
	}
	if p.rootless {
		p.diskErr = errors.New("the server is not root, so it cannot mount a disk per sandbox")
	} else if mkfs, err := findMkfs(); err != nil {
		p.diskErr = err
	} else if p.disks, p.diskErr = newDisks(p.disksDir(), limit, mkfs, p.probed); p.diskErr != nil {
		p.disks = nil
	}
	if p.diskErr != nil {
		p.log.WithError(p.diskErr).Warn("local provider: the sandbox disk limit is not enforced here: a sandbox can fill the filesystem its root is on")
	}
}

// Name returns "local".
func (p *Provider) Name() string { return Name }

// Isolation reports the isolation in effect: "container", "none", or
// "unavailable" (see IsolationError).
func (p *Provider) Isolation() string {
	switch {
	case p.ctr != nil:
		return IsolationContainer
	case p.isoErr != nil:
		return IsolationUnavailable
	}
	return IsolationNone
}

// IsolationError says why no sandbox starts when Isolation is
// "unavailable"; nil otherwise.
func (p *Provider) IsolationError() error { return p.isoErr }

// Unreachable says why no sandbox can start here (isolation
// "unavailable"), nil otherwise: a server's /health reports it.
func (p *Provider) Unreachable() error { return p.isolationUp() }

// isolationUp refuses to run anything of a sandbox when isolation is
// "unavailable": it is never run unisolated instead.
func (p *Provider) isolationUp() error {
	if p.isoErr != nil {
		return fmt.Errorf("local: %w: %w", provider.ErrUnavailable, p.isoErr)
	}
	return nil
}

// Overlay reports whether new sandboxes are overlayfs mounts (true) or copies.
func (p *Provider) Overlay() bool { return p.overlay }

// owner is who a sandbox's files belong to on the host.
type owner struct{ uid, gid int }

// owner returns the owner of sandbox trees: isolated, the sandbox's uid; unisolated, nil (commands run as the server, and what the server
// makes is theirs already).
func (p *Provider) owner() *owner {
	if p.ctr == nil || p.rootless {
		return nil
	}
	return &owner{p.uid, p.gid}
}

// holdUIDs marks the uids of the sandboxes on disk (a previous server's)
// as held.
func (p *Provider) holdUIDs() {
	if p.uids == nil {
		return
	}
	ids, err := p.sandboxIDs()
	if err != nil {
		return
	}
	for _, id := range ids {
		var meta sandboxMeta
		if readJSON(filepath.Join(p.sandboxDir(id), "meta.json"), &meta) == nil && meta.UID != 0 {
			p.uids.Hold(meta.UID, id)
		}
	}
}

// treeOwner is who the server makes what it writes in s's tree belong to:
// s's own uid where the tree is an overlay over its views, else owner.
func (p *Provider) treeOwner(s *sandbox) *owner {
	s.mu.Lock()
	meta := s.meta
	s.mu.Unlock()
	if ids := sandboxIDs(meta); ids != nil && meta.Overlay && p.ctr != nil {
		return ids
	}
	return p.owner()
}

// chown gives path (not following a symlink) to o; a nil o does nothing.
func (o *owner) chown(path string) error {
	if o == nil {
		return nil
	}
	return os.Lchown(path, o.uid, o.gid)
}

// Root returns the absolute root directory.
func (p *Provider) Root() string { return p.root }

func (p *Provider) sandboxesDir() string { return filepath.Join(p.root, "sandboxes") }
func (p *Provider) snapshotsDir() string {
	if p.snapDir != "" {
		return p.snapDir
	}
	return filepath.Join(p.root, "snapshots")
}

// snapshotTrashDir is where a snapshot is moved to be removed: on the
// snapshots' own filesystem, since a rename cannot cross filesystems.
func (p *Provider) snapshotTrashDir() string {
	if p.snapDir != "" {
		return filepath.Join(p.snapDir, ".trash")
	}
	return p.trashDir()
}
func (p *Provider) trashDir() string  { return filepath.Join(p.root, "trash") }
func (p *Provider) emptyDir() string  { return filepath.Join(p.root, "empty") }
func (p *Provider) imagesDir() string { return filepath.Join(p.root, "images") }
func (p *Provider) disksDir() string  { return filepath.Join(p.root, "disks") }
func (p *Provider) readyDir() string  { return filepath.Join(p.root, "ready") }

func (p *Provider) sandboxDir(id string) string  { return filepath.Join(p.sandboxesDir(), id) }
func (p *Provider) snapshotDir(id string) string { return filepath.Join(p.snapshotsDir(), id) }

// newID returns prefix + 16 random hex digits.
func newID(prefix string) string {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("local: crypto/rand: %v", err)) // never fails on Linux
	}
	return prefix + hex.EncodeToString(b[:])
}

// validID accepts the ids this package makes (and nothing that could name a
// path outside the root).
func validID(id, prefix string) bool {
	if len(id) != len(prefix)+16 || id[:len(prefix)] != prefix {
		return false
	}
	_, err := hex.DecodeString(id[len(prefix):])
	return err == nil
}

const (
	sandboxPrefix  = "sb-"
	snapshotPrefix = "snap-"
)

// cleanWorkdir checks that w is an absolute path other than "/" and returns
// it cleaned.
func cleanWorkdir(w string) (string, error) {
	if !path.IsAbs(w) {
		return "", fmt.Errorf("workdir %q is not absolute", w)
	}
	w = path.Clean(w)
	if w == "/" {
		return "", fmt.Errorf("workdir %q is the root", w)
	}
	return w, nil
}

// markPending records that id (a sandbox or snapshot being made, or a
// snapshot a fork is reading) must not be collected; the returned func
// undoes it.
func (p *Provider) markPending(id string) func() {
	p.mu.Lock()
	p.pending[id]++
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		if p.pending[id]--; p.pending[id] <= 0 {
			delete(p.pending, id)
		}
		p.mu.Unlock()
	}
}

func (p *Provider) isPending(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pending[id] > 0
}

func ctxErr(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local: %s: %w", what, err)
	}
	return nil
}
