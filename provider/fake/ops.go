package fake

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/internal/jsonw"
	"github.com/sandboxowner/owner/provider"
)

// descriptor is what a fresh process needs to reach a fake sandbox again: its
// id, as for OpenSandbox.
type descriptor struct {
	SandboxID string `json:"sandbox_id"`
}

func (p *Provider) handle(id string) provider.Handle {
	// What json.Marshal writes for descriptor{SandboxID: id}, without its
	// reflection and second allocation.
	d := append(make([]byte, 0, len(`{"sandbox_id":""}`)+len(id)+8), `{"sandbox_id":`...)
	d = append(jsonw.AppendString(d, id), '}')
	return provider.Handle{SandboxID: id, Provider: p.name, Descriptor: d}
}

// handleID is the sandbox a handle names: its SandboxID, or else the id in
// its descriptor, so that a handle rebuilt from a descriptor alone works.
func handleID(h provider.Handle) string {
	if h.SandboxID != "" || len(h.Descriptor) == 0 {
		return h.SandboxID
	}
	var d descriptor
	if json.Unmarshal(h.Descriptor, &d) != nil {
		return ""
	}
	return d.SandboxID
}

// foreign refuses a handle made by another provider, so that a test
// that hands one fake's sandbox to another fails loudly instead of reaching
// a sandbox that happens to share the id.
func (p *Provider) foreign(h provider.Handle, op Op) error {
	if h.Provider == "" || h.Provider == p.name {
		return nil
	}
	return fmt.Errorf("fake %q: %s: handle %s is from provider %q: %w", p.name, op, handleID(h), h.Provider, provider.ErrSandboxNotFound)
}

// liveLocked returns the sandbox h names, or an error wrapping
// provider.ErrSandboxNotFound. The caller holds sh, the shard of h's id.
func (p *Provider) liveLocked(sh *shard, h provider.Handle, op Op) (*sandbox, error) {
	if err := p.foreign(h, op); err != nil {
		return nil, err
	}
	id := handleID(h)
	sb, ok := p.lookupLocked(sh, id)
	if !ok {
		return nil, fmt.Errorf("fake: %s sandbox %q: %w", op, id, provider.ErrSandboxNotFound)
	}
	return sb, nil
}

// withLive runs fn on the sandbox h names, under its shard's lock.
func (p *Provider) withLive(h provider.Handle, op Op, fn func(*sandbox) error) error {
	sh := p.shardOf(handleID(h))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sb, err := p.liveLocked(sh, h, op)
	if err != nil {
		return err
	}
	return fn(sb)
}

// Start makes a sandbox holding spec.Files (relative paths under the
// workdir). Image is accepted and ignored.
func (p *Provider) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	return p.launch(ctx, OpStart, spec, "")
}

// launch is Start, and Fork (from snapshotID) when op is OpFork.
func (p *Provider) launch(ctx context.Context, op Op, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	c := &Call{Op: op, SnapshotID: snapshotID}
	err := p.run(ctx, c, func() error {
		var from *snapshot
		if op == OpFork {
			// Held until the fork stands, so that a DeleteSnapshot sees it.
			p.snapMu.RLock()
			defer p.snapMu.RUnlock()
			var ok bool
			if from, ok = p.snapshots[snapshotID]; !ok {
				return fmt.Errorf("fake: fork from snapshot %q: %w", snapshotID, provider.ErrSnapshotNotFound)
			}
		}
		sb, err := p.create(spec, from, snapshotID)
		if err != nil {
			return err
		}
		if from == nil {
			p.started.Add(1)
		} else {
			p.forked.Add(1)
		}
		c.SandboxID = sb.id
		return nil
	})
	if err != nil {
		return provider.Handle{}, err
	}
	return p.handle(c.SandboxID), nil
}

// Stop deletes the sandbox. One already gone (stopped, expired, never made)
// is success; a handle from another provider is not.
func (p *Provider) Stop(ctx context.Context, h provider.Handle) error {
	c := &Call{Op: OpStop, SandboxID: handleID(h)}
	return p.run(ctx, c, func() error {
		if err := p.foreign(h, OpStop); err != nil {
			return err
		}
		sh := p.shardOf(c.SandboxID)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if _, ok := p.lookupLocked(sh, c.SandboxID); ok {
			delete(sh.sandboxes, c.SandboxID)
			p.stopped.Add(1)
		}
		return nil
	})
}

// Exec interprets a small subset of sh; see the package doc. Env and Timeout
// are ignored: nothing the fake runs reads the environment or takes time.
func (p *Provider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	c := &Call{Op: OpExec, SandboxID: handleID(h)}
	var res provider.ExecResult
	err := p.run(ctx, c, func() error {
		return p.withLive(h, OpExec, func(sb *sandbox) error {
			cwd := sb.spec.Workdir
			if req.Cwd != "" {
				var err error
				if cwd, err = resolve(sb.spec.Workdir, req.Cwd); err != nil {
					return fmt.Errorf("fake: exec in sandbox %s: cwd: %w", sb.id, err)
				}
			}
			res = execute(sb, cwd, req.Command)
			return nil
		})
	})
	if err != nil {
		return provider.ExecResult{}, err
	}
	return res, nil
}

// WriteFile writes data at name (relative to the workdir, or absolute).
func (p *Provider) WriteFile(ctx context.Context, h provider.Handle, name string, data []byte) error {
	c := &Call{Op: OpWriteFile, SandboxID: handleID(h)}
	return p.run(ctx, c, func() error {
		return p.withLive(h, OpWriteFile, func(sb *sandbox) error {
			full, err := resolve(sb.spec.Workdir, name)
			if err != nil {
				return fmt.Errorf("fake: write_file in sandbox %s: %w", sb.id, err)
			}
			if isDir(sb.files, sb.spec.Workdir, full) {
				return fmt.Errorf("fake: write_file in sandbox %s: %s is a directory", sb.id, full)
			}
			sb.files[full] = string(data)
			return nil
		})
	})
}

// ReadFile reads name (relative to the workdir, or absolute). A missing file
// is an error wrapping fs.ErrNotExist.
func (p *Provider) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	c := &Call{Op: OpReadFile, SandboxID: handleID(h)}
	var data []byte
	err := p.run(ctx, c, func() error {
		return p.withLive(h, OpReadFile, func(sb *sandbox) error {
			full, err := resolve(sb.spec.Workdir, name)
			if err != nil {
				return fmt.Errorf("fake: read_file in sandbox %s: %w", sb.id, err)
			}
			s, ok := sb.files[full]
			if !ok {
				return fmt.Errorf("fake: read_file in sandbox %s: %w", sb.id, &fs.PathError{Op: "read", Path: full, Err: fs.ErrNotExist})
			}
			data = []byte(s)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return data, nil
}

// Status is StatusRunning for a live sandbox. Otherwise the error wraps
// provider.ErrSandboxNotFound and the status is StatusStopped for a sandbox
// this fake made (stopped or expired) and StatusUnknown for any other.
func (p *Provider) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	c := &Call{Op: OpStatus, SandboxID: handleID(h)}
	st := provider.StatusUnknown
	err := p.run(ctx, c, func() error {
		sh := p.shardOf(c.SandboxID)
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if _, err := p.liveLocked(sh, h, OpStatus); err != nil {
			if p.foreign(h, OpStatus) == nil && p.issued(c.SandboxID) {
				st = provider.StatusStopped
			}
			return err
		}
		st = provider.StatusRunning
		return nil
	})
	return st, err
}

// Snapshot copies the sandbox's files, workdir and spec into a new snapshot;
// the sandbox keeps running and later changes to it do not reach the
// snapshot.
func (p *Provider) Snapshot(ctx context.Context, h provider.Handle, name string) (string, error) {
	c := &Call{Op: OpSnapshot, SandboxID: handleID(h)}
	err := p.run(ctx, c, func() error {
		p.snapMu.Lock()
		defer p.snapMu.Unlock()
		return p.withLive(h, OpSnapshot, func(sb *sandbox) error {
			id := p.prefix + "snap-" + strconv.FormatInt(p.nextSnap.Add(1), 10)
			p.snapshots[id] = &snapshot{
				info: provider.SnapshotInfo{
					ID:        id,
					Name:      name,
					SandboxID: sb.id,
					Metadata:  maps.Clone(sb.spec.Metadata),
					CreatedAt: p.clock.Now(),
				},
				spec:  cloneSpec(sb.spec),
				files: maps.Clone(sb.files),
			}
			c.SnapshotID = id
			return nil
		})
	})
	if err != nil {
		return "", err
	}
	return c.SnapshotID, nil
}

// Fork starts a sandbox from a copy of the snapshot's files; spec.Files are
// ignored. The metadata, lease and the rest come from spec; an empty
// spec.Workdir means the snapshot's.
func (p *Provider) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	return p.launch(ctx, OpFork, spec, snapshotID)
}

// DeleteSnapshot deletes the snapshot; a missing one is success. While a
// live sandbox forked from it stands, it refuses with
// provider.ErrSnapshotInUse and keeps the snapshot, as a runtime whose
// forks share the snapshot's layers does.
func (p *Provider) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	c := &Call{Op: OpDeleteSnapshot, SnapshotID: snapshotID}
	return p.run(ctx, c, func() error {
		p.snapMu.Lock()
		defer p.snapMu.Unlock()
		if _, ok := p.snapshots[snapshotID]; !ok {
			return nil
		}
		unlock := p.lockAll()
		defer unlock()
		p.reapAllLocked()
		for i := range p.shards {
			for _, sb := range p.shards[i].sandboxes {
				if sb.fromSnapshot == snapshotID {
					return fmt.Errorf("fake: delete snapshot %s: sandbox %s stands on it: %w", snapshotID, sb.id, provider.ErrSnapshotInUse)
				}
			}
		}
		delete(p.snapshots, snapshotID)
		return nil
	})
}

// Renew sets the sandbox's expiry to expiresAt (which may give a sandbox
// without a TTL a lease). A sandbox already expired is not found: a lease
// cannot be revived.
func (p *Provider) Renew(ctx context.Context, h provider.Handle, expiresAt time.Time) error {
	c := &Call{Op: OpRenew, SandboxID: handleID(h)}
	return p.run(ctx, c, func() error {
		return p.withLive(h, OpRenew, func(sb *sandbox) error {
			sb.expiresAt = expiresAt
			return nil
		})
	})
}

// ListSandboxes returns the live sandboxes sorted by id, reaping expired ones
// first.
func (p *Provider) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	var out []provider.SandboxInfo
	err := p.run(ctx, &Call{Op: OpList}, func() error {
		unlock := p.lockAll()
		defer unlock()
		p.reapAllLocked()
		out = make([]provider.SandboxInfo, 0, p.liveCountLocked())
		for i := range p.shards {
			for _, sb := range p.shards[i].sandboxes {
				out = append(out, p.info(sb))
			}
		}
		slices.SortFunc(out, func(a, b provider.SandboxInfo) int { return strings.Compare(a.Handle.SandboxID, b.Handle.SandboxID) })
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ListSnapshots returns the snapshots sorted by id.
func (p *Provider) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	var out []provider.SnapshotInfo
	err := p.run(ctx, &Call{Op: OpList}, func() error {
		p.snapMu.RLock()
		defer p.snapMu.RUnlock()
		out = make([]provider.SnapshotInfo, 0, len(p.snapshots))
		for _, id := range slices.Sorted(maps.Keys(p.snapshots)) {
			out = append(out, cloneSnapshotInfo(p.snapshots[id].info))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
