package fake

import (
	"context"

	"github.com/sandboxowner/owner/provider"
)

// NoSnapshots is a fake that cannot snapshot: its Capabilities are a
// Lister only, neither snapshots nor leases, as for a backend without them. Its methods are those
// of the wrapped Provider, which Fake exposes for faults and counters. A spec
// TTL still makes a lease; with no Renew here, only Fake().Renew moves it.
type NoSnapshots struct {
	p *Provider
}

var _ provider.Provider = (*NoSnapshots)(nil)

// Capabilities: a NoSnapshots lists only.
func (n *NoSnapshots) Capabilities() provider.Capabilities {
	return provider.Capabilities{Lister: n}
}

// NewWithoutSnapshots returns an empty fake that cannot snapshot.
func NewWithoutSnapshots(opts Options) *NoSnapshots { return &NoSnapshots{p: New(opts)} }

// Fake returns the underlying Provider, for fault injection, counters and
// inspection. Tests must not hand it to the code under test, which would then
// find the capabilities NoSnapshots hides.
func (n *NoSnapshots) Fake() *Provider { return n.p }

// Name returns the provider's name.
func (n *NoSnapshots) Name() string { return n.p.Name() }

// Start is Provider.Start.
func (n *NoSnapshots) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	return n.p.Start(ctx, spec)
}

// Stop is Provider.Stop.
func (n *NoSnapshots) Stop(ctx context.Context, h provider.Handle) error { return n.p.Stop(ctx, h) }

// Exec is Provider.Exec.
func (n *NoSnapshots) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	return n.p.Exec(ctx, h, req)
}

// WriteFile is Provider.WriteFile.
func (n *NoSnapshots) WriteFile(ctx context.Context, h provider.Handle, path string, data []byte) error {
	return n.p.WriteFile(ctx, h, path, data)
}

// ReadFile is Provider.ReadFile.
func (n *NoSnapshots) ReadFile(ctx context.Context, h provider.Handle, path string) ([]byte, error) {
	return n.p.ReadFile(ctx, h, path)
}

// Status is Provider.Status.
func (n *NoSnapshots) Status(ctx context.Context, h provider.Handle) (provider.Status, error) {
	return n.p.Status(ctx, h)
}

// ListSandboxes is Provider.ListSandboxes.
func (n *NoSnapshots) ListSandboxes(ctx context.Context) ([]provider.SandboxInfo, error) {
	return n.p.ListSandboxes(ctx)
}

// ListSnapshots is Provider.ListSnapshots; it lists nothing unless a test made
// snapshots through Fake.
func (n *NoSnapshots) ListSnapshots(ctx context.Context) ([]provider.SnapshotInfo, error) {
	return n.p.ListSnapshots(ctx)
}
