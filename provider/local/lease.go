package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// Renew moves the sandbox's lease to expiresAt (a zero time removes the
// lease). A sandbox whose lease already ran out is ErrSandboxNotFound, even
// before the reaper deleted it.
func (p *Provider) Renew(ctx context.Context, h provider.Handle, expiresAt time.Time) error {
	if err := ctxErr(ctx, "renew"); err != nil {
		return err
	}
	s, err := p.loaded(h)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := p.checkLiveLocked(s); err != nil {
		return err
	}
	m := s.meta
	m.ExpiresAt = expiresAt
	if err := writeJSON(s.metaPath(), m, p.durable); err != nil {
		return fmt.Errorf("local: renew %s: %w", s.id, err)
	}
	s.meta = m
	return nil
}

// Reap deletes every sandbox whose lease ran out (Clock.Now() at or past its
// expiry) and returns their ids, sorted. It also finishes what a crashed
// server left half done: sandbox directories without a metadata file (a
// start that did not finish), stopped sandboxes not yet removed, deleted
// snapshots nothing stands on any more, sandbox directories made ahead
// that no start of this provider holds.
func (p *Provider) Reap(ctx context.Context) ([]string, error) {
	ids, err := p.sandboxIDs()
	if err != nil {
		return nil, err
	}
	var reaped []string
	var errs []error
	for _, id := range ids {
		if err := ctx.Err(); err != nil {
			return reaped, fmt.Errorf("local: reap: %w", err)
		}
		s, err := p.loaded(provider.Handle{SandboxID: id})
		if errors.Is(err, provider.ErrSandboxNotFound) {
			if !p.isPending(id) {
				errs = append(errs, p.removeUnfinished(id))
			}
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.mu.Lock()
		exp, stopped := s.meta.ExpiresAt, s.stopped
		s.mu.Unlock()
		if stopped || exp.IsZero() || p.clk.Now().Before(exp) {
			continue
		}
		if err := p.stop(ctx, s, "lease expired"); err != nil {
			errs = append(errs, err)
			continue
		}
		reaped = append(reaped, id)
	}
	if trash, err := os.ReadDir(p.trashDir()); err == nil {
		for _, e := range trash {
			errs = append(errs, removeSandboxDir(filepath.Join(p.trashDir(), e.Name())))
		}
	}
	// What no id of this provider holds, only while it holds the root or
	// no server does: another server's on the same root are its own.
	_, rerr := p.SweepMadeAhead()
	errs = append(errs, rerr)
	if err := p.collect(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return reaped, fmt.Errorf("local: reap: %w", err)
	}
	return reaped, nil
}

// removeUnfinished removes a sandbox directory that has no metadata file.
func (p *Provider) removeUnfinished(id string) error {
	dir := p.sandboxDir(id)
	if _, err := os.Stat(filepath.Join(dir, "meta.json")); err == nil {
		return nil // finished meanwhile
	}
	killMarked(id)
	if err := unmount(filepath.Join(dir, "fs")); err != nil {
		return err
	}
	p.log.WithField("sandbox_id", id).Info("local: removed a sandbox whose start did not finish")
	return removeSandboxDir(dir)
}

// RunReaper calls Reap every interval of the provider's clock until ctx
// ends, logging what it deletes and any error.
func (p *Provider) RunReaper(ctx context.Context, interval time.Duration) {
	t := p.clk.NewTimer(interval)
	defer t.Stop()
	for first := true; ; first = false {
		if !first {
			t.Reset(interval)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		reaped, err := p.Reap(ctx)
		if len(reaped) > 0 {
			p.log.WithField("sandbox_ids", reaped).Info("local: reaped sandboxes whose lease ran out")
		}
		if err != nil && ctx.Err() == nil {
			p.log.WithError(err).Warn("local: reap")
		}
	}
}

// ListSandboxes lists the live sandboxes (not stopped, lease not run out),
// oldest first, with their metadata.
func (p *Provider) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	if err := ctxErr(ctx, "list sandboxes"); err != nil {
		return nil, err
	}
	ids, err := p.sandboxIDs()
	if err != nil {
		return nil, err
	}
	var out []provider.SandboxInfo
	for _, id := range ids {
		s, err := p.loaded(provider.Handle{SandboxID: id})
		if err != nil {
			continue
		}
		s.mu.Lock()
		if p.checkLiveLocked(s) == nil {
			out = append(out, provider.SandboxInfo{
				Handle:       p.handle(id, s.meta.Workdir),
				Status:       provider.StatusRunning,
				Metadata:     s.meta.Metadata,
				CreatedAt:    s.meta.CreatedAt,
				ExpiresAt:    s.meta.ExpiresAt,
				FromSnapshot: s.meta.FromSnapshot,
			})
		}
		s.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b provider.SandboxInfo) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return cmp.Compare(a.Handle.SandboxID, b.Handle.SandboxID)
	})
	return out, nil
}
