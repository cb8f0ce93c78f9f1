package opensandbox

import (
	"math/rand/v2"
	"time"
)

// MaxFrame is the bound of one line of a command stream.
const MaxFrame = maxFrame

// SetFrameCap bounds the lines of p's command streams at n bytes instead
// of MaxFrame, before p runs a command: a test cuts a line longer than a
// frame without sending 16 MiB of it.
func SetFrameCap(p *Provider, n int) { p.frameCap = n }

// testJitter is Backoff's jitter, shared by the tests of one binary.
var testJitter = &jitter{rng: rand.New(rand.NewPCG(1, 2))}

// Backoff is the provider's wait before its retry n (0-based) of a call
// whose answer asked no Retry-After: a test that retries the real server's
// passing failures by hand waits as the provider would.
func Backoff(n int) time.Duration { return (&Provider{rng: testJitter}).backoff(n, 0) }

// PointEndpoint makes p's cached endpoint of sandbox id the base URL base
// (keeping its token), as a runtime that gave id's host port to another
// sandbox leaves it: a test points one sandbox's cache at another's execd.
func PointEndpoint(p *Provider, id, base string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep := p.endpoints[id]
	ep.sandbox, ep.base = id, base
	p.endpoints[id] = ep
}

// CloseIdle closes p's idle connections to sandbox id's execd, as a
// runtime's restart closes them all.
func CloseIdle(p *Provider, id string) {
	p.mu.Lock()
	t := p.transports[id]
	p.mu.Unlock()
	if t != nil {
		t.CloseIdleConnections()
	}
}
