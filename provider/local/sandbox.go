package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/beneath"
	"github.com/sandboxowner/owner/provider/local/cmdenv"
)

// Descriptor is the JSON in a local Handle's Descriptor. The sandbox id is
// all a fresh provider on the same root needs; Root and Workdir make the
// handle self-describing, and a handle naming another root is refused.
type Descriptor struct {
	SandboxID string `json:"sandbox_id"`
	Root      string `json:"root"`
	Workdir   string `json:"workdir"`
}

// sandboxMeta is a sandbox's metadata file, meta.json in its directory.
type sandboxMeta struct {
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is the lease; zero means none.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Workdir is the path the tree has in the sandbox's view.
	Workdir      string            `json:"workdir"`
	Env          map[string]string `json:"env,omitempty"`
	Metadata     map[string]string `json:"metadata,omitempty"`
	Network      bool              `json:"network,omitempty"`
	Image        string            `json:"image,omitempty"`
	FromSnapshot string            `json:"from_snapshot,omitempty"`
	// Overlay: the tree is an overlayfs mount of Lowers (topmost first)
	// under the sandbox's own upper layer.
	Overlay bool     `json:"overlay,omitempty"`
	Lowers  []string `json:"lowers,omitempty"`
	// Layers are the snapshots whose layers Lowers include; they are kept
	// while this sandbox lives.
	Layers []string `json:"layers,omitempty"`
	// Spec is the spec it was started with, without Files.
	Spec provider.Spec `json:"spec"`
	// UID and GID are the host ids of its own its processes run as (see
	// uidrange.Range); zero: the provider's Options.UID and GID.
	UID int `json:"uid,omitempty"`
	GID int `json:"gid,omitempty"`
	// Disk: its writable layer is on a filesystem image of its own,
	// mounted at <dir>/disk (see disks).
	Disk bool `json:"disk,omitempty"`
}

// sandboxIDs are the host ids of its own of the sandbox meta describes,
// nil when it has none.
func sandboxIDs(meta sandboxMeta) *owner {
	if meta.UID == 0 {
		return nil
	}
	return &owner{meta.UID, meta.GID}
}

// sandbox is a loaded sandbox.
type sandbox struct {
	id  string
	dir string
	// gate is held shared while a command starts or a file is read or
	// written, and exclusively by Snapshot and Stop.
	gate sync.RWMutex

	// hasDisk and overlay are meta.Disk and meta.Overlay, fixed once the
	// sandbox is made or loaded.
	hasDisk, overlay bool

	mu      sync.Mutex
	meta    sandboxMeta
	stopped bool
	adopted bool             // its tree is mounted and a crashed server's leftovers are gone
	groups  map[int]struct{} // the host process group of its init
	cgroup  *sandboxCgroup   // its cgroups, while its init runs
	cgUsers int              // the init (and starts of one) using cgroup
	init    *sandboxInit     // the init commands start from (nil: none yet)
	// initMu serialises the start of an init.
	initMu sync.Mutex
}

// fsDir is the sandbox's tree: the overlay's mount, or in copy mode the
// tree itself (on its disk when it has one).
func (s *sandbox) fsDir() string {
	if s.hasDisk && !s.overlay {
		return filepath.Join(s.diskDir(), "fs")
	}
	return filepath.Join(s.dir, "fs")
}

// writableDir is where what the sandbox writes lands: its disk, or its
// directory.
func (s *sandbox) writableDir() string {
	if s.hasDisk {
		return s.diskDir()
	}
	return s.dir
}

func (s *sandbox) diskDir() string  { return filepath.Join(s.dir, diskDirName) }
func (s *sandbox) upperDir() string { return filepath.Join(s.writableDir(), "upper") }
func (s *sandbox) workDir() string  { return filepath.Join(s.writableDir(), "work") }
func (s *sandbox) metaPath() string { return filepath.Join(s.dir, "meta.json") }

// origin is what a new sandbox's tree starts from.
type origin struct {
	image        string
	copyFrom     string   // copy mode: the tree to copy; "" is an empty tree
	lowers       []string // overlay mode: the layers, topmost first
	layers       []string // overlay mode: snapshots among lowers
	fromSnapshot string
	files        map[string]string
}

// Start makes a sandbox from spec.Image (a template name from Options, an
// absolute directory, or "" for an empty tree), writes spec.Files into it and
// returns once commands can run in it. ReadyTimeoutSeconds bounds the call.
func (p *Provider) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	ctx, cancel := readyContext(ctx, spec)
	defer cancel()
	src, err := p.resolveImage(spec.Image)
	if err != nil {
		return provider.Handle{}, err
	}
	o := origin{image: spec.Image, copyFrom: src, lowers: []string{src}, files: spec.Files}
	if src == "" {
		o.lowers = []string{p.emptyDir()}
	}
	return p.create(ctx, spec, o)
}

func readyContext(ctx context.Context, spec provider.Spec) (context.Context, context.CancelFunc) {
	if spec.ReadyTimeoutSeconds > 0 {
		return context.WithTimeout(ctx, time.Duration(spec.ReadyTimeoutSeconds*float64(time.Second)))
	}
	return context.WithCancel(ctx)
}

// resolveImage returns the directory an image starts from ("" for empty).
func (p *Provider) resolveImage(image string) (string, error) {
	if image == "" {
		return "", nil
	}
	dir, ok := p.templates[image]
	if !ok {
		if !filepath.IsAbs(image) {
			return "", fmt.Errorf("local: image %q is neither a template nor an absolute directory: %w", image, provider.ErrInvalidSpec)
		}
		dir = filepath.Clean(image)
	}
	if dir == "" {
		return "", nil
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() {
		return "", fmt.Errorf("local: image %q: %s is not a directory: %w", image, dir, provider.ErrInvalidSpec)
	}
	return dir, nil
}

// checkSpec validates what create uses of spec and returns the workdir.
func (p *Provider) checkSpec(spec provider.Spec, files map[string]string) (string, error) {
	workdir := spec.Workdir
	if workdir == "" {
		workdir = p.workdir
	}
	workdir, err := cleanWorkdir(workdir)
	if err != nil {
		return "", fmt.Errorf("local: %v: %w", err, provider.ErrInvalidSpec)
	}
	if p.ctr != nil {
		if err := p.ctr.checkWorkdir(workdir); err != nil {
			return "", fmt.Errorf("local: %v: %w", err, provider.ErrInvalidSpec)
		}
	}
	if spec.TTLSeconds < 0 {
		return "", fmt.Errorf("local: negative ttl_s %v: %w", spec.TTLSeconds, provider.ErrInvalidSpec)
	}
	if err := cmdenv.Check(spec.Env); err != nil {
		return "", err
	}
	if _, err := p.sandboxMounts(spec, workdir, "", false); err != nil {
		return "", err
	}
	if err := checkMountHosts(spec); err != nil {
		return "", err
	}
	for name := range files {
		if _, err := beneath.Rel(workdir, name); err != nil {
			return "", fmt.Errorf("local: spec file: %w", err)
		}
	}
	return workdir, nil
}

// create makes a sandbox directory from o; the metadata file is written last,
// so a directory without one is a start that did not finish.
func (p *Provider) create(ctx context.Context, spec provider.Spec, o origin) (h provider.Handle, err error) {
	if err := p.isolationUp(); err != nil {
		return provider.Handle{}, err
	}
	began := time.Now()
	workdir, err := p.checkSpec(spec, o.files)
	if err != nil {
		return provider.Handle{}, err
	}
	if err := ctxErr(ctx, "start"); err != nil {
		return provider.Handle{}, err
	}
	got, err := p.newSandboxID()
	if err != nil {
		return provider.Handle{}, err
	}
	id, ids, userns := got.id, got.ids, got.nsfd
	if userns >= 0 {
		defer unix.Close(userns)
	}
	defer p.markPending(id)()
	if got.done != nil {
		defer got.done()
	}
	s := &sandbox{id: id, dir: p.sandboxDir(id), adopted: true, groups: map[int]struct{}{}}
	if got.dir {
		// Its directory, its disk mounted, was made ahead; one removed
		// meanwhile (by another provider's Reap on this root) is made
		// again.
		ahead := filepath.Join(p.readyDir(), id)
		if err := os.Rename(ahead, s.dir); err == nil {
			s.hasDisk = true
		} else if rmErr := removeSandboxDir(ahead); rmErr != nil {
			logs.ForRequest(ctx, p.log).WithError(rmErr).WithField("sandbox_id", id).Warn("local: remove a sandbox directory made ahead (Reap retries)")
		}
	}
	if !s.hasDisk {
		err = os.Mkdir(s.dir, 0o755)
	}
	if err != nil {
		if ids != nil {
			p.uids.Release(ids.uid, id)
		}
		return provider.Handle{}, fmt.Errorf("local: start: %w", err)
	}
	defer func() {
		if err != nil {
			_ = unmount(s.fsDir())
			if ids != nil {
				p.uids.Release(ids.uid, id)
			}
			if rmErr := removeSandboxDir(s.dir); rmErr != nil {
				logs.ForRequest(ctx, p.log).WithError(rmErr).WithField("sandbox_id", id).Warn("local: remove a sandbox that failed to start")
			}
		}
	}()
	s.overlay = p.overlay
	if !s.hasDisk {
		if err := p.startDisk(ctx, s); err != nil {
			return provider.Handle{}, err
		}
	}
	now := p.clk.Now()
	meta := sandboxMeta{
		ID: id, CreatedAt: now, Workdir: workdir, Env: spec.Env, Metadata: spec.Metadata,
		Network: spec.Network, Image: o.image, FromSnapshot: o.fromSnapshot, Disk: s.hasDisk,
	}
	if ttl := spec.TTL(); ttl > 0 {
		meta.ExpiresAt = now.Add(ttl)
	}
	meta.Spec = spec
	meta.Spec.Files = nil
	treeOwner := p.owner()
	if ids != nil {
		meta.UID, meta.GID = ids.uid, ids.gid
		if p.overlay {
			// The server writes the tree through its views.
			treeOwner = ids
		}
	}
	// Isolated, the tree is the sandbox uid's: a fresh tree's top,
	// and an image's every entry (a fork's are already).
	own := p.owner()
	image := o.fromSnapshot == "" && o.copyFrom != ""
	if p.overlay {
		lowers := o.lowers
		if own != nil && image {
			layer, err := p.ownedLayer(ctx, o.copyFrom)
			if err != nil {
				return provider.Handle{}, fmt.Errorf("local: start: %w", err)
			}
			lowers = append([]string{layer}, lowers...)
		}
		meta.Overlay, meta.Lowers, meta.Layers = true, lowers, o.layers
		for _, d := range []string{s.upperDir(), s.workDir(), s.fsDir()} {
			if err := os.Mkdir(d, 0o755); err != nil {
				return provider.Handle{}, fmt.Errorf("local: start: %w", err)
			}
		}
		if err := own.chown(s.upperDir()); err != nil {
			return provider.Handle{}, fmt.Errorf("local: start: %w", err)
		}
		upper, work := s.upperDir(), s.workDir()
		if ids != nil {
			if lowers, upper, work, _, err = p.makeViews(ctx, s, *ids, userns, lowers, nil); err != nil {
				return provider.Handle{}, fmt.Errorf("local: start: %w", err)
			}
		}
		if err := mountOverlay(s.fsDir(), lowers, upper, work); err != nil {
			return provider.Handle{}, fmt.Errorf("local: start: %w", err)
		}
	} else if o.copyFrom != "" {
		var as *owner
		if image {
			as = own
		}
		if err := copyTree(ctx, o.copyFrom, s.fsDir(), p.copyWorkers, as); err != nil {
			return provider.Handle{}, fmt.Errorf("local: start: %w", err)
		}
	} else if err := os.Mkdir(s.fsDir(), 0o755); err != nil {
		return provider.Handle{}, fmt.Errorf("local: start: %w", err)
	} else if err := own.chown(s.fsDir()); err != nil {
		return provider.Handle{}, fmt.Errorf("local: start: %w", err)
	}
	if err := writeFiles(s.fsDir(), workdir, o.files, treeOwner); err != nil {
		return provider.Handle{}, err
	}
	if err := p.copyMounts(ctx, spec, s.writableDir()); err != nil {
		return provider.Handle{}, err
	}
	if err := ctxErr(ctx, "start"); err != nil {
		return provider.Handle{}, err
	}
	s.meta = meta
	if p.durable {
		syscall.Sync() // the tree, before the record that makes it a sandbox
	}
	if err := writeJSON(s.metaPath(), meta, p.durable); err != nil {
		return provider.Handle{}, fmt.Errorf("local: start: %w", err)
	}
	p.mu.Lock()
	p.sandboxes[id] = s
	p.mu.Unlock()
	logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{
		"sandbox_id": id, "image": o.image, "from_snapshot": o.fromSnapshot, "overlay": p.overlay,
		"duration_ms": time.Since(began).Milliseconds(),
	}).Info("local: sandbox started")
	return p.handle(id, workdir), nil
}

func (p *Provider) handle(id, workdir string) provider.Handle {
	d, err := json.Marshal(Descriptor{SandboxID: id, Root: p.root, Workdir: workdir})
	if err != nil {
		panic(fmt.Sprintf("local: marshal descriptor: %v", err)) // plain strings never fail
	}
	return provider.Handle{SandboxID: id, Provider: Name, Descriptor: d}
}

// loaded returns the sandbox h names, loading its metadata from disk if this
// process has not yet: stopped or never existing is ErrSandboxNotFound. It
// does not check the lease.
func (p *Provider) loaded(h provider.Handle) (*sandbox, error) {
	if h.Provider != "" && h.Provider != Name {
		return nil, fmt.Errorf("local: handle %s is from provider %q: %w", h, h.Provider, provider.ErrInvalidSpec)
	}
	if len(h.Descriptor) > 0 {
		var d Descriptor
		if err := json.Unmarshal(h.Descriptor, &d); err != nil {
			return nil, fmt.Errorf("local: handle %s: descriptor: %v: %w", h, err, provider.ErrInvalidSpec)
		}
		if d.Root != "" && filepath.Clean(d.Root) != p.root {
			return nil, fmt.Errorf("local: handle %s is for root %s, this provider's is %s: %w", h, d.Root, p.root, provider.ErrInvalidSpec)
		}
		if d.SandboxID != "" && d.SandboxID != h.SandboxID {
			return nil, fmt.Errorf("local: handle %s: descriptor names sandbox %q: %w", h, d.SandboxID, provider.ErrInvalidSpec)
		}
	}
	id := h.SandboxID
	if !validID(id, sandboxPrefix) {
		return nil, fmt.Errorf("local: sandbox %q: %w", id, provider.ErrSandboxNotFound)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s, ok := p.sandboxes[id]; ok {
		return s, nil
	}
	s := &sandbox{id: id, dir: p.sandboxDir(id), groups: map[int]struct{}{}}
	if err := readJSON(s.metaPath(), &s.meta); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("local: sandbox %s: %w", id, provider.ErrSandboxNotFound)
		}
		return nil, fmt.Errorf("local: sandbox %s: %w", id, err)
	}
	s.hasDisk, s.overlay = s.meta.Disk, s.meta.Overlay
	p.sandboxes[id] = s
	return s, nil
}

// live returns the sandbox h names if it is running and its lease has not
// run out, adopted (tree mounted, a crashed server's leftover processes
// killed) when adopt is set.
func (p *Provider) live(ctx context.Context, h provider.Handle, adopt bool) (*sandbox, error) {
	s, err := p.loaded(h)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := p.checkLiveLocked(s); err != nil {
		return nil, err
	}
	if adopt && !s.adopted {
		if err := p.adoptLocked(ctx, s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func (p *Provider) checkLiveLocked(s *sandbox) error {
	if s.stopped {
		return fmt.Errorf("local: sandbox %s: %w", s.id, provider.ErrSandboxNotFound)
	}
	if exp := s.meta.ExpiresAt; !exp.IsZero() && !p.clk.Now().Before(exp) {
		return fmt.Errorf("local: sandbox %s: lease ran out at %s: %w", s.id, exp.Format(time.RFC3339Nano), provider.ErrSandboxNotFound)
	}
	// Removed by another process (an operator's sweep): gone, not a host
	// path error on whatever the call touches first.
	if _, err := os.Lstat(s.metaPath()); errors.Is(err, fs.ErrNotExist) {
		s.stopped = true
		return fmt.Errorf("local: sandbox %s was removed: %w", s.id, provider.ErrSandboxNotFound)
	}
	return nil
}

// adoptLocked takes over a sandbox a previous server left: commands do not
// outlive their Exec call, so any process still marked with the sandbox's id
// belongs to a server that died mid-call and is killed; an overlay tree that
// is no longer mounted (after a reboot) is mounted again.
func (p *Provider) adoptLocked(ctx context.Context, s *sandbox) error {
	n := killMarked(s.id)
	if p.cg != nil {
		// Its cgroup holds them all, one that cleared its environment too.
		found, _ := p.cg.of(s.id).kill()
		n += found
	}
	if n > 0 {
		p.log.WithFields(logrus.Fields{"sandbox_id": s.id, "kills": n}).Info("local: killed processes a previous server left in the sandbox")
	}
	if err := p.ensureDisk(ctx, s); err != nil {
		return fmt.Errorf("local: sandbox %s: %w", s.id, err)
	}
	if s.meta.Overlay {
		mounted, err := isMountPoint(s.fsDir())
		if err != nil {
			return fmt.Errorf("local: sandbox %s: %w", s.id, err)
		}
		if !mounted {
			lowers, upper, work := s.meta.Lowers, s.upperDir(), s.workDir()
			if ids := sandboxIDs(s.meta); ids != nil {
				var err error
				if lowers, upper, work, _, err = p.makeViews(ctx, s, *ids, -1, lowers, nil); err != nil {
					return fmt.Errorf("local: sandbox %s: remount: %w", s.id, err)
				}
			}
			if err := mountOverlay(s.fsDir(), lowers, upper, work); err != nil {
				return fmt.Errorf("local: sandbox %s: remount: %w", s.id, err)
			}
		}
	}
	s.adopted = true
	return nil
}

// Status reports StatusRunning for a live sandbox; a stopped, expired or
// unknown one is ErrSandboxNotFound.
func (p *Provider) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	if err := ctxErr(ctx, "status"); err != nil {
		return provider.StatusUnknown, err
	}
	if _, err := p.live(ctx, h, false); err != nil {
		return provider.StatusUnknown, err
	}
	return provider.StatusRunning, nil
}

// Stop kills the sandbox's commands, unmounts and deletes its tree. A sandbox
// already gone (or never made) is success. A fresh process on the same root
// can stop a sandbox from its handle alone.
func (p *Provider) Stop(ctx context.Context, h provider.Handle) error {
	if err := ctxErr(ctx, "stop"); err != nil {
		return err
	}
	s, err := p.loaded(h)
	if errors.Is(err, provider.ErrSandboxNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	return p.stop(ctx, s, "stop")
}

func (p *Provider) stop(ctx context.Context, s *sandbox, reason string) error {
	s.gate.Lock()
	defer s.gate.Unlock()
	s.mu.Lock()
	if s.stopped {
		s.mu.Unlock()
		return nil
	}
	s.stopped = true
	groups := make([]int, 0, len(s.groups))
	for g := range s.groups {
		groups = append(groups, g)
	}
	overlay := s.meta.Overlay
	s.mu.Unlock()

	for _, g := range groups {
		killGroup(g)
	}
	killMarked(s.id)
	if p.cg != nil {
		// Found by id: a previous server may have made them.
		if err := p.cg.of(s.id).remove(); err != nil {
			logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", s.id).Warn("local: remove a stopped sandbox's cgroups")
		}
		p.tidyCgroups(s.id)
	}
	if overlay {
		if err := unmount(s.fsDir()); err != nil {
			return p.stopFailed(s, err)
		}
	}
	detachSandboxMounts(s.dir)
	trash := filepath.Join(p.trashDir(), s.id+"-"+newID("")[:8])
	if err := os.Rename(s.dir, trash); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return p.stopFailed(s, err)
	}
	if ids := sandboxIDs(s.meta); ids != nil && p.uids != nil {
		p.uids.Release(ids.uid, s.id)
	}
	if err := removeSandboxDir(trash); err != nil {
		logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", s.id).Warn("local: remove a stopped sandbox's tree (Reap retries)")
	}
	p.mu.Lock()
	delete(p.sandboxes, s.id)
	p.mu.Unlock()
	logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"sandbox_id": s.id, "reason": reason}).Info("local: sandbox stopped")
	p.collectSnapshots(ctx)
	return nil
}

// stopFailed undoes the stopped mark so that a retried Stop tries again.
func (p *Provider) stopFailed(s *sandbox, err error) error {
	s.mu.Lock()
	s.stopped = false
	s.adopted = false
	s.mu.Unlock()
	return fmt.Errorf("local: stop %s: %w", s.id, err)
}

// sandboxIDs lists the ids of sandbox directories on disk, sorted.
func (p *Provider) sandboxIDs() ([]string, error) {
	entries, err := os.ReadDir(p.sandboxesDir())
	if err != nil {
		return nil, fmt.Errorf("local: list sandboxes: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() && validID(e.Name(), sandboxPrefix) {
			ids = append(ids, e.Name())
		}
	}
	sort.Strings(ids)
	return ids, nil
}

// writeJSON writes v to path atomically: a temporary file, renamed over
// path, so a crashed server leaves the old file or the new one. It does not
// fsync: a server crash keeps the page cache, and on ext4 an fsync would
// flush every block written since the last commit (a whole snapshot's tree).
// With sync (Options.Durable) the file is fsynced before the rename.
func writeJSON(path string, v any, sync bool) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("marshal %s: %w", filepath.Base(path), err)
	}
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
