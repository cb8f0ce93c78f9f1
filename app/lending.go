package app

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"net"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/clock"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

// TokenLifetime is how long a sandbox access token works. A token stops
// earlier when its sandbox is superseded or ended (410).
const TokenLifetime = 12 * time.Hour

// ReapEvery is how often the local provider's reaper looks for sandboxes
// whose lease ran out.
const ReapEvery = 30 * time.Second

// lending lends a server's sandboxes to agents over the sandbox exec API:
// /sandbox_access carries an endpoint and a token, and /sandboxes/ serves
// exec and file calls authorised by it.
type lending struct {
	tokens  *sandboxapi.Tokens
	handler *sandboxapi.Handler
	clk     clock.Clock
	// base is the server's base URL, known once the listener is open.
	base string
	// srv is the HTTP server, whose admission gate exec calls and file
	// writes pass; set once it is built.
	srv *httpapi.Server
	own *owner.Owner
	// direct, when set, hands agents the provider's own endpoint instead
	// of this server's sandbox API.
	direct endpointer
}

// endpointer is a provider whose sandboxes agents can reach themselves
// (OpenSandbox's execd).
type endpointer interface {
	Endpoint(ctx context.Context, h provider.Handle) (string, map[string]string, error)
}

// lendDirect returns the provider when sandbox.opensandbox.lend is direct.
func lendDirect(cfg *Config, prov provider.Provider) endpointer {
	if cfg.Sandbox.Provider != "opensandbox" || cfg.Sandbox.OpenSandbox.Lend != LendDirect {
		return nil
	}
	e, _ := prov.(endpointer)
	return e
}

// newLending builds the sandbox exec API over prov. The token secret is
// derived from the session secret, so tokens survive a restart exactly as
// cookies do.
func newLending(secret []byte, prov provider.Provider, own *owner.Owner, clk clock.Clock, log logrus.FieldLogger, direct endpointer) (*lending, error) {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte("sandbox access tokens"))
	tokens, err := sandboxapi.NewTokens(mac.Sum(nil), clk)
	if err != nil {
		return nil, err
	}
	l := &lending{tokens: tokens, clk: clk, own: own, direct: direct}
	l.handler = &sandboxapi.Handler{
		Provider: prov,
		Tokens:   tokens,
		Resolve:  sandboxapi.ResolverOf(own),
		Logger:   log.WithField("api", "sandboxes"),
		// The mount below puts the session and its capture key on the
		// request; every line names them and the request id.
		LogFields: httpapi.RequestFields,
		Admit:     l.admit,
	}
	return l, nil
}

// admit passes a sandbox call through the server's admission gate on
// behalf of the session that holds the sandbox.
func (l *lending) admit(ctx context.Context, sandboxID string) (func(), error) {
	if l.srv == nil {
		return func() {}, nil
	}
	session, _, _ := l.own.SandboxFate(sandboxID)
	return l.srv.AdmitSandboxCall(ctx, session)
}

// listening records the address agents reach the server at.
func (l *lending) listening(addr net.Addr) { l.base = "http://" + addr.String() }

// access adds the endpoint and a token for the session's sandbox to the
// /sandbox_access descriptor. Lent directly, it is execd's endpoint and
// headers instead: no fencing (a superseded sandbox answers until it is
// deleted) and no admission.
func (l *lending) access(_ *resources.Session, sb sandbox.Sandbox, descriptor map[string]any) error {
	if l.direct != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeouts.ProviderCall)
		defer cancel()
		ep, headers, err := l.direct.Endpoint(ctx, sb.Handle)
		if err != nil {
			return err
		}
		descriptor["endpoint"], descriptor["headers"] = ep, headers
		return nil
	}
	a := l.tokens.Access(l.base, sb.Handle.SandboxID, l.clk.Now().Add(TokenLifetime))
	descriptor["endpoint"] = a.Endpoint
	descriptor["token"] = a.Token
	descriptor["token_expires_at"] = a.TokenExpiresAt
	return nil
}

func (l *lending) mounts() map[string]fasthttp.RequestHandler {
	return map[string]fasthttp.RequestHandler{sandboxapi.Prefix: func(ctx *fasthttp.RequestCtx) {
		// exec and files apart in the metrics; the access log names the
		// sandbox and the session holding it.
		path := string(ctx.Path())
		ctx.SetUserValue(httpapi.RouteValue, sandboxapi.RouteOf(path))
		if id, _, ok := sandboxapi.SplitPath(path); ok {
			ctx.SetUserValue(httpapi.SandboxIDValue, id)
			if l.own != nil {
				if sid, _, _ := l.own.SandboxFate(id); sid != "" {
					ctx.SetUserValue(httpapi.SessionIDValue, sid)
					if key := l.srv.CaptureKeyOf(sid); key != "" {
						ctx.SetUserValue(httpapi.CaptureKeyValue, key)
					}
				}
			}
		}
		l.handler.Serve(ctx)
	}}
}

// reaperOf starts prov's lease reaper until ctx ends: the local provider
// reaps its own sandboxes' leases; other providers' servers enforce theirs.
func reaperOf(prov provider.Provider) func(ctx context.Context) {
	if lp, ok := prov.(*local.Provider); ok {
		return func(ctx context.Context) { go lp.RunReaper(ctx, ReapEvery) }
	}
	return func(context.Context) {}
}
