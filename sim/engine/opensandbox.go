package engine

import (
	"context"
	"time"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// Providers the simulation can drive.
const (
	ProviderFake        = "fake"
	ProviderOpenSandbox = "opensandbox"
)

// openSandbox puts the OpenSandbox client and a fake OpenSandbox server
// between the owner and the run's fake: the server's runtime is the fake
// (ids, files, leases, faults), so every check reads the same state. The
// client does not retry, so that each injected fault fails exactly the call
// it was meant for; its waits return at once (the run's clock moves only
// when the run says).
func (r *run) openSandbox() (stop func(), err error) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{Clock: r.clk, Backend: r.fk, SyncWithBackend: true})
	p, err := opensandbox.New(opensandbox.Options{
		Domain:     srv.Domain,
		Clock:      r.clk,
		Sleep:      func(ctx context.Context, _ time.Duration) error { return ctx.Err() },
		MaxRetries: -1,
		TTL:        r.ttl,
		ListLabels: map[string]string{owner.LabelOwner: "notes"},
		Logger:     r.log,
		// Many runs share the machine: a call waits on the fake, never
		// on the network, but generously.
		RequestTimeout: time.Minute,
	})
	if err != nil {
		srv.Close()
		return nil, err
	}
	r.inner, r.osb = p, srv
	return srv.Close, nil
}
