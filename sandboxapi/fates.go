package sandboxapi

import (
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// Fates is what the owner tells of its sandboxes: which session holds one
// and whether it is live, superseded or ended; and that a session was used.
type Fates interface {
	SandboxFate(sandboxID string) (sessionID string, h provider.Handle, fate sandbox.Fate)
	Touch(sessionID string)
}

// ResolverOf answers what became of a sandbox from f: a live one's handle
// (its session counts as used: an agent works in it), or only the fate.
func ResolverOf(f Fates) Resolver {
	return func(sandboxID string) (provider.Handle, sandbox.Fate) {
		session, h, fate := f.SandboxFate(sandboxID)
		if fate != sandbox.FateLive {
			return provider.Handle{}, fate
		}
		f.Touch(session)
		return h, fate
	}
}
