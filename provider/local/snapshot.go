package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
)

// stopLimit bounds how long Snapshot waits for paused commands to stop.
const stopLimit = 2 * time.Second

// snapshotMeta is a snapshot's metadata file, meta.json in its directory;
// its tree is layer/ beside it.
type snapshotMeta struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	SandboxID string            `json:"sandbox_id"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// Overlay: layer/ is a diff (an overlayfs upper layer, whiteouts and
	// all) to stack on Lowers; otherwise it is the whole tree.
	Overlay bool     `json:"overlay,omitempty"`
	Lowers  []string `json:"lowers,omitempty"`
	// Depends are the snapshots whose layers Lowers include.
	Depends []string `json:"depends,omitempty"`
	// Deleted: DeleteSnapshot was called; the layer stays while a sandbox
	// or another snapshot stands on it.
	Deleted bool `json:"deleted,omitempty"`
	// Hosts are the host directories the sandbox's mounts stood on (see
	// HostsInUse): a fork of the snapshot from a checkpoint names them
	// again. HostsRecorded tells an empty list from a snapshot taken
	// before they were recorded.
	Hosts         []string `json:"hosts,omitempty"`
	HostsRecorded bool     `json:"hosts_recorded,omitempty"`
}

func (p *Provider) snapshotMetaPath(id string) string {
	return filepath.Join(p.snapshotDir(id), "meta.json")
}
func (p *Provider) snapshotLayer(id string) string { return filepath.Join(p.snapshotDir(id), "layer") }

// Snapshot takes a consistent copy of the sandbox's tree: new commands and
// file calls wait, the running commands are paused with SIGSTOP for the copy
// and resumed with SIGCONT after. In overlay mode only the sandbox's own
// layer (its diff from what it stands on) is copied; a sandbox already
// standing on many layers is copied whole. The sandbox keeps running, and
// the snapshot survives a server restart.
func (p *Provider) Snapshot(ctx context.Context, h provider.Handle, name string) (string, error) {
	if err := ctxErr(ctx, "snapshot"); err != nil {
		return "", err
	}
	s, err := p.live(ctx, h, true)
	if err != nil {
		return "", err
	}
	if err := delay(ctx, p.snapshotDelay, "snapshot"); err != nil {
		return "", err
	}
	began := time.Now()
	id := newID(snapshotPrefix)
	defer p.markPending(id)()
	dir := p.snapshotDir(id)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return "", fmt.Errorf("local: snapshot: %w", err)
	}
	meta, err := p.copySandbox(ctx, s, id)
	if err == nil {
		meta.Name = name
		s.mu.Lock()
		meta.Hosts, err = mountHosts(s.meta.Spec)
		s.mu.Unlock()
		meta.HostsRecorded = true
	}
	if err == nil {
		if p.durable {
			syscall.Sync() // the layer's blocks, before the record that names it
		}
		err = writeJSON(p.snapshotMetaPath(id), meta, p.durable)
	}
	if err != nil {
		if rmErr := os.RemoveAll(dir); rmErr != nil {
			logs.ForRequest(ctx, p.log).WithError(rmErr).WithField("snapshot_id", id).Warn("local: remove a failed snapshot (Reap retries)")
			p.snapMu.Lock()
			p.garbage = true
			p.snapMu.Unlock()
		}
		return "", err
	}
	logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{
		"sandbox_id": s.id, "snapshot_id": id, "overlay": meta.Overlay,
		"duration_ms": time.Since(began).Milliseconds(),
	}).Info("local: snapshot taken")
	return id, nil
}

// copySandbox copies s's tree into snapshot id's layer with s paused, once
// a capture turn is its.
func (p *Provider) copySandbox(ctx context.Context, s *sandbox, id string) (snapshotMeta, error) {
	if p.hook != nil {
		p.hook("turn", s.id)
	}
	select {
	case p.captures <- struct{}{}:
	case <-ctx.Done():
		return snapshotMeta{}, fmt.Errorf("local: snapshot %s: waiting for a capture turn: %w", s.id, ctx.Err())
	}
	defer func() { <-p.captures }()
	paused := time.Now()
	s.gate.Lock()
	defer func() {
		s.gate.Unlock()
		if p.onPause != nil {
			p.onPause(s.id, time.Since(paused))
		}
	}()
	s.mu.Lock()
	if err := p.checkLiveLocked(s); err != nil {
		s.mu.Unlock()
		return snapshotMeta{}, err
	}
	sm := s.meta
	cg := s.cgroup
	s.mu.Unlock()

	// Every process of the sandbox is frozen where its cgroup can be
	// (setsid children and all); otherwise its commands' process groups
	// are stopped.
	var resume func()
	if cg.canFreeze() {
		if err := cg.freeze(ctx, true, stopLimit); err != nil {
			logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", s.id).Warn("local: snapshot copies a sandbox whose processes did not all freeze")
		}
		resume = func() {
			if err := cg.freeze(context.Background(), false, 0); err != nil {
				logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", s.id).Error("local: thaw a sandbox after its snapshot")
			}
		}
	} else {
		// Without a freezer: every process carrying the sandbox's mark
		// (its init's commands each have a process group of their own).
		pids := markedProcesses(s.id)
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
		}
		resume = func() {
			for _, pid := range pids {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
		}
		if err := waitPidsStopped(ctx, pids, stopLimit); err != nil {
			logs.ForRequest(ctx, p.log).WithError(err).WithField("sandbox_id", s.id).Warn("local: snapshot copies a sandbox whose commands did not all stop")
		}
	}
	resumeOnce := sync.OnceFunc(resume)
	defer resumeOnce()
	if p.hook != nil {
		p.hook("paused", s.id)
	}
	meta := snapshotMeta{ID: id, SandboxID: s.id, Metadata: sm.Metadata, CreatedAt: p.clk.Now()}
	src := s.fsDir()
	// A snapshot in a shared directory is a whole tree: the layers below
	// an overlay sandbox are this machine's.
	if sm.Overlay && len(sm.Lowers) < p.maxLayers && p.snapDir == "" {
		meta.Overlay, meta.Lowers, meta.Depends = true, sm.Lowers, sm.Layers
		src = s.upperDir()
	}
	if err := copyTree(ctx, src, p.snapshotLayer(id), p.copyWorkers, nil); err != nil {
		return snapshotMeta{}, fmt.Errorf("local: snapshot %s: %w", s.id, err)
	}
	resumeOnce()
	if p.hook != nil {
		p.hook("resumed", s.id)
	}
	return meta, nil
}

// Fork starts a new sandbox from a snapshot: spec gives everything but the
// tree (its Image and Files are ignored). In overlay mode the fork stands on
// the snapshot's layer and copies nothing; otherwise the snapshot is copied.
func (p *Provider) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	ctx, cancel := readyContext(ctx, spec)
	defer cancel()
	if err := ctxErr(ctx, "fork"); err != nil {
		return provider.Handle{}, err
	}
	if err := delay(ctx, p.forkDelay, "fork"); err != nil {
		return provider.Handle{}, err
	}
	if !validID(snapshotID, snapshotPrefix) {
		return provider.Handle{}, fmt.Errorf("local: snapshot %q: %w", snapshotID, provider.ErrSnapshotNotFound)
	}
	// The snapshot is marked read before its record is: a collection
	// that did not see the mark read the record afterwards, and so a
	// delete written before it, which this read sees too. No lock is
	// shared with the other forks, so a group of them forking one
	// snapshot at once does not pass through one by one.
	release := sync.OnceFunc(p.markPending(snapshotID)) // kept until the fork stands on it
	defer release()
	var sm snapshotMeta
	err := readJSON(p.snapshotMetaPath(snapshotID), &sm)
	if err == nil && sm.Deleted {
		err = fs.ErrNotExist
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return provider.Handle{}, fmt.Errorf("local: snapshot %s: %w", snapshotID, provider.ErrSnapshotNotFound)
		}
		return provider.Handle{}, fmt.Errorf("local: snapshot %s: %w", snapshotID, err)
	}
	if p.hook != nil {
		p.hook("fork-read", snapshotID)
	}

	layer := p.snapshotLayer(snapshotID)
	o := origin{fromSnapshot: snapshotID, copyFrom: layer, lowers: []string{layer}, layers: []string{snapshotID}}
	if sm.Overlay {
		if !p.overlay {
			return provider.Handle{}, fmt.Errorf("local: snapshot %s is an overlay layer and this provider has overlay off: %w", snapshotID, provider.ErrUnsupported)
		}
		o.lowers = append(o.lowers, sm.Lowers...)
		o.layers = append(o.layers, sm.Depends...)
		for _, l := range o.lowers {
			if _, err := os.Stat(l); err != nil {
				return provider.Handle{}, fmt.Errorf("local: snapshot %s stands on %s: %v: %w", snapshotID, l, err, provider.ErrSnapshotNotFound)
			}
		}
	}
	spec.Files = nil
	h, err := p.create(ctx, spec, o)
	if err != nil {
		return provider.Handle{}, err
	}
	release()
	// A snapshot deleted while the fork read it was kept for the fork; a
	// collection now removes it unless the fork stands on it. Only then:
	// a collection takes the snapshots' lock, which every fork of a group
	// would otherwise queue on.
	if err := readJSON(p.snapshotMetaPath(snapshotID), &sm); err != nil || sm.Deleted {
		p.collectSnapshots(ctx)
	}
	return h, nil
}

// DeleteSnapshot deletes a snapshot; a missing one is success. A snapshot
// that a live fork (or another snapshot) still stands on is no longer listed
// or forkable, and its layer is removed once nothing stands on it.
func (p *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	if err := ctxErr(ctx, "delete snapshot"); err != nil {
		return err
	}
	if !validID(snapshotID, snapshotPrefix) {
		return nil
	}
	p.snapMu.Lock()
	var sm snapshotMeta
	err := readJSON(p.snapshotMetaPath(snapshotID), &sm)
	if err == nil && !sm.Deleted {
		sm.Deleted = true
		err = writeJSON(p.snapshotMetaPath(snapshotID), sm, p.durable)
	}
	p.garbage = true
	p.snapMu.Unlock()
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("local: delete snapshot %s: %w", snapshotID, err)
	}
	p.collectSnapshots(ctx)
	return nil
}

// collectSnapshots removes deleted snapshots nothing stands on, and
// snapshot directories without a metadata file that no call is making
// (a crashed Snapshot's). Failures are logged; the next call retries.
func (p *Provider) collectSnapshots(ctx context.Context) {
	if err := p.collect(ctx); err != nil {
		logs.ForRequest(ctx, p.log).WithError(err).Warn("local: collect deleted snapshots")
	}
}

func (p *Provider) collect(ctx context.Context) (err error) {
	p.snapMu.Lock()
	defer p.snapMu.Unlock()
	if !p.garbage {
		return nil
	}
	kept := 0
	defer func() { p.garbage = err != nil || kept > 0 }()
	entries, err := os.ReadDir(p.snapshotsDir())
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	metas := map[string]snapshotMeta{}
	var deleted, orphans []string
	for _, e := range entries {
		id := e.Name()
		if !validID(id, snapshotPrefix) {
			continue
		}
		// A pending snapshot is listed all the same (it is needed below):
		// one a fork reads may be deleted, and what it stands on is needed.
		// Pending is read before the record: one made meanwhile wrote its
		// record before its mark went.
		pending := p.isPending(id)
		var sm snapshotMeta
		if err := readJSON(p.snapshotMetaPath(id), &sm); err != nil {
			// In a shared directory a snapshot without its record may be
			// another server's, being written; here, one being made.
			if errors.Is(err, fs.ErrNotExist) && p.snapDir == "" && !pending {
				orphans = append(orphans, id)
			}
			continue
		}
		metas[id] = sm
		if sm.Deleted {
			deleted = append(deleted, id)
		}
	}
	var errs []error
	for _, id := range orphans {
		errs = append(errs, os.RemoveAll(p.snapshotDir(id)))
	}
	if len(deleted) == 0 {
		return errors.Join(errs...)
	}
	// What is still stood on: every live snapshot, every sandbox's layers,
	// every snapshot a fork is reading now, and what those stand on.
	needed := map[string]bool{}
	for id, sm := range metas {
		if !sm.Deleted {
			needed[id] = true
		}
	}
	p.mu.Lock()
	for id := range p.pending {
		needed[id] = true
	}
	p.mu.Unlock()
	ids, err := p.sandboxIDs()
	if err != nil {
		return err
	}
	for _, id := range ids {
		var m sandboxMeta
		if err := readJSON(filepath.Join(p.sandboxDir(id), "meta.json"), &m); err != nil {
			continue
		}
		for _, l := range m.Layers {
			needed[l] = true
		}
	}
	for id := range needed {
		for _, d := range metas[id].Depends {
			needed[d] = true
		}
	}
	sort.Strings(deleted)
	for _, id := range deleted {
		if needed[id] {
			kept++
			continue
		}
		trash := filepath.Join(p.snapshotTrashDir(), id)
		if err := os.Rename(p.snapshotDir(id), trash); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, os.RemoveAll(trash))
		logs.ForRequest(ctx, p.log).WithField("snapshot_id", id).Info("local: snapshot removed")
	}
	return errors.Join(errs...)
}

// ListSnapshots lists the snapshots not deleted, oldest first.
func (p *Provider) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	if err := ctxErr(ctx, "list snapshots"); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(p.snapshotsDir())
	if err != nil {
		return nil, fmt.Errorf("local: list snapshots: %w", err)
	}
	var out []provider.SnapshotInfo
	for _, e := range entries {
		if !validID(e.Name(), snapshotPrefix) {
			continue
		}
		var sm snapshotMeta
		if err := readJSON(p.snapshotMetaPath(e.Name()), &sm); err != nil || sm.Deleted {
			continue
		}
		out = append(out, provider.SnapshotInfo{
			ID: sm.ID, Name: sm.Name, SandboxID: sm.SandboxID, Metadata: sm.Metadata, CreatedAt: sm.CreatedAt,
		})
	}
	slices.SortFunc(out, func(a, b provider.SnapshotInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	return out, nil
}

// delay waits d (Options.SnapshotDelay, ForkDelay) unless ctx ends first.
func delay(ctx context.Context, d time.Duration, op string) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctxErr(ctx, op)
	}
}
