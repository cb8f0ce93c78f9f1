package metrics

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// Provider ops, the op label of the provider families.
const (
	OpStart          = "start"
	OpStop           = "stop"
	OpExec           = "exec"
	OpWriteFile      = "write_file"
	OpReadFile       = "read_file"
	OpStatus         = "status"
	OpSnapshot       = "snapshot"
	OpFork           = "fork"
	OpDeleteSnapshot = "delete_snapshot"
	OpRenew          = "renew"
	OpListSandboxes  = "list_sandboxes"
	OpListSnapshots  = "list_snapshots"
)

// providerOps are the op label's values.
func providerOps() []string {
	return []string{OpStart, OpStop, OpExec, OpWriteFile, OpReadFile, OpStatus, OpSnapshot, OpFork,
		OpDeleteSnapshot, OpRenew, OpListSandboxes, OpListSnapshots}
}

// Provider wraps p so that every call is counted and timed. The wrapper's
// Capabilities are p's, each wrapped alike. A nil m returns p itself.
func (m *Metrics) Provider(p provider.Provider) provider.Provider {
	if m == nil || p == nil {
		return p
	}
	b := &base{p: p, m: m, name: p.Name()}
	for _, op := range providerOps() {
		for _, o := range outcomes() {
			m.providerCalls.WithLabelValues(b.name, op, o) // at zero from the start
		}
	}
	c := p.Capabilities()
	if c.Snapshotter != nil {
		c.Snapshotter = snapOps{b, c.Snapshotter}
	}
	if c.Leaser != nil {
		c.Leaser = leaseOps{b, c.Leaser}
	}
	if c.Lister != nil {
		c.Lister = listOps{b, c.Lister}
	}
	if c.FileOpener != nil {
		c.FileOpener = openOps{b, c.FileOpener}
	}
	b.caps = c
	return b
}

// base instruments the calls every provider has.
type base struct {
	p    provider.Provider
	m    *Metrics
	name string
	caps provider.Capabilities
}

// record times one call from began.
func (b *base) record(op string, began time.Time, err error) {
	b.m.ProviderCall(b.name, op, providerOutcome(err), time.Since(began))
}

// providerOutcome is ok, refused (the caller's request was wrong: a path
// out of the sandbox, a bad spec, a file that is missing, too large or not
// regular, a caller that gave up) or failed (the provider's own failure),
// so that a client's mistakes never read as provider failures.
func providerOutcome(err error) string {
	switch {
	case err == nil:
		return OutcomeOK
	case errors.Is(err, provider.ErrPathEscape), errors.Is(err, provider.ErrInvalidSpec),
		errors.Is(err, provider.ErrFileTooLarge), errors.Is(err, provider.ErrNotRegular),
		errors.Is(err, fs.ErrNotExist), errors.Is(err, context.Canceled):
		return OutcomeRefused
	}
	return OutcomeFailed
}

// Unwrap is the provider wrapped.
func (b *base) Unwrap() provider.Provider { return b.p }

func (b *base) Name() string { return b.name }

func (b *base) Capabilities() provider.Capabilities { return b.caps }

func (b *base) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	began := time.Now()
	h, err := b.p.Start(ctx, spec)
	b.record(OpStart, began, err)
	return h, err
}

func (b *base) Stop(ctx context.Context, h provider.Handle) error {
	began := time.Now()
	err := b.p.Stop(ctx, h)
	b.record(OpStop, began, err)
	return err
}

func (b *base) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	began := time.Now()
	res, err := b.p.Exec(ctx, h, req)
	b.record(OpExec, began, err)
	return res, err
}

func (b *base) WriteFile(ctx context.Context, h provider.Handle, path string, data []byte) error {
	began := time.Now()
	err := b.p.WriteFile(ctx, h, path, data)
	b.record(OpWriteFile, began, err)
	return err
}

func (b *base) ReadFile(ctx context.Context, h provider.Handle, path string) ([]byte, error) {
	began := time.Now()
	data, err := b.p.ReadFile(ctx, h, path)
	b.record(OpReadFile, began, err)
	return data, err
}

func (b *base) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	began := time.Now()
	st, err := b.p.Status(ctx, h)
	b.record(OpStatus, began, err)
	return st, err
}

type snapOps struct {
	b *base
	s provider.Snapshotter
}

func (o snapOps) Snapshot(ctx context.Context, h provider.Handle, name string) (string, error) {
	began := time.Now()
	id, err := o.s.Snapshot(ctx, h, name)
	o.b.record(OpSnapshot, began, err)
	return id, err
}

func (o snapOps) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	began := time.Now()
	h, err := o.s.Fork(ctx, spec, snapshotID)
	o.b.record(OpFork, began, err)
	return h, err
}

func (o snapOps) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	began := time.Now()
	err := o.s.DeleteSnapshot(ctx, snapshotID)
	o.b.record(OpDeleteSnapshot, began, err)
	return err
}

type leaseOps struct {
	b *base
	l provider.Leaser
}

func (o leaseOps) Renew(ctx context.Context, h provider.Handle, expiresAt time.Time) error {
	began := time.Now()
	err := o.l.Renew(ctx, h, expiresAt)
	o.b.record(OpRenew, began, err)
	return err
}

type listOps struct {
	b *base
	l provider.Lister
}

func (o listOps) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	began := time.Now()
	out, err := o.l.ListSandboxes(ctx)
	o.b.record(OpListSandboxes, began, err)
	return out, err
}

func (o listOps) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	began := time.Now()
	out, err := o.l.ListSnapshots(ctx)
	o.b.record(OpListSnapshots, began, err)
	return out, err
}

type openOps struct {
	b *base
	o provider.FileOpener
}

// OpenFile is counted as a read_file: the op is the same read, streamed.
func (o openOps) OpenFile(ctx context.Context, h provider.Handle, path string) (io.ReadCloser, int64, error) {
	began := time.Now()
	rc, size, err := o.o.OpenFile(ctx, h, path)
	o.b.record(OpReadFile, began, err)
	return rc, size, err
}
