package http

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	nethttp "net/http"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/jsonw"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
)

// routeKind classifies a data route for admission and bookkeeping.
type routeKind int

const (
	kindUnknown routeKind = iota
	kindSeed
	kindVerify
	kindClose
	kindAccess
	kindTool
)

// admission is the participant's kind of a route.
func (k routeKind) admission() participant.Kind {
	switch k {
	case kindSeed:
		return participant.Seed
	case kindVerify:
		return participant.Verify
	case kindClose:
		return participant.Close
	default:
		return participant.Tool
	}
}

func (s *Server) kindOf(route string) (routeKind, resources.ToolFunc) {
	switch route {
	case RouteSeed:
		return kindSeed, nil
	case RouteVerify:
		return kindVerify, nil
	case RouteClose:
		return kindClose, nil
	case RouteSandboxAccess:
		return kindAccess, nil
	}
	if fn, ok := s.tools[route]; ok {
		return kindTool, fn
	}
	return kindUnknown, nil
}

// sessionOf returns the id of the request's genuine session cookie, or a
// new id: a forged or tampered cookie is a new session, never somebody
// else's. Every reply carries the session's cookie, as Gym's session
// middleware sends it.
func (s *Server) sessionOf(ctx *fasthttp.RequestCtx) string {
	if v := ctx.Request.Header.Cookie(s.cookieName); len(v) > 0 {
		value := string(v) // once: the id returned is part of it
		if id, ok := s.signer.Verify(value); ok {
			s.setCookie(ctx, value, false)
			return id
		}
	}
	id := NewID()
	s.setCookie(ctx, s.signer.Sign(id), false)
	return id
}

func (s *Server) setCookie(ctx *fasthttp.RequestCtx, value string, expire bool) {
	c := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(c)
	c.SetKey(s.cookieName)
	c.SetValue(value)
	c.SetPath("/")
	c.SetHTTPOnly(true)
	c.SetSameSite(fasthttp.CookieSameSiteLaxMode)
	if expire {
		c.SetExpire(fasthttp.CookieExpireDelete)
	}
	ctx.Response.Header.SetCookie(c)
}

// serveData serves a resources route; ep is the rollout prefix's episode.
func (s *Server) serveData(ctx *fasthttp.RequestCtx, route string, ep *control.EpisodeID) {
	kind, tool := s.kindOf(route)
	if kind == kindUnknown {
		writeError(ctx, nethttp.StatusNotFound, CodeNotFound, "no route "+route)
		return
	}
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	if kind == kindSeed {
		// On every seed reply, errors included: the episode owner picks
		// its verify mode and restart mark from them.
		ctx.Response.Header.Set(HeaderVerify, s.verifyMode)
		if s.mode == owner.ModeRestartOnly {
			ctx.Response.Header.Set(HeaderRestart, "1")
		}
	}
	// The body is copied: fasthttp reuses it after the handler returns,
	// and a resources server may hand it to the owner's goroutines.
	var body []byte
	if kind != kindAccess { // /sandbox_access reads no body
		body = bytes.Clone(ctx.PostBody())
		if err := resources.CheckObject(body); err != nil {
			s.fail(ctx, err)
			return
		}
	}
	var typed *typedSeed
	if kind == kindSeed {
		var err error
		if typed, err = parseTypedSeed(body); err != nil {
			s.fail(ctx, err)
			return
		}
	}
	id := s.sessionOf(ctx)
	if typed != nil {
		// The caller names the session; the cookie follows it, so that
		// cookie-bound routes (tools, verify) reach the same session.
		if ep != nil && *ep != typed.episode {
			s.fail(ctx, resources.Invalid("episode_id %s is not the rollout prefix's %s", typed.episode.CaptureKey(), ep.CaptureKey()))
			return
		}
		id = typed.ResourcesSessionID
		s.setCookie(ctx, s.signer.Sign(id), false)
		ep = &typed.episode
	}
	s.own.Touch(id)
	var episode control.EpisodeID
	hasEpisode := false
	if ep != nil {
		episode, hasEpisode = *ep, true
	} else if s.part != nil {
		episode, hasEpisode = s.part.BoundEpisode(id)
	}
	ctx.SetUserValue(sessionValue, id)
	sess := s.newDataRequest(id, RequestID(ctx), episode, hasEpisode)

	rctx := s.requestContext(ctx)
	defer rctx.Cancel()
	if s.part != nil {
		leave, err := s.part.Admit(rctx, kind.admission(), sess)
		if err != nil {
			s.fail(ctx, err)
			return
		}
		if leave != nil {
			defer leave()
		}
	}

	var reply any
	var err error
	switch kind {
	case kindSeed:
		if s.closed.has(sess.ID) {
			err = problem.Errorf(nethttp.StatusConflict, CodeSessionClosed, "this session was closed; start a new one")
			break
		}
		if typed != nil {
			reply, err = s.seedTyped(rctx, sess, typed)
			break
		}
		reply, err = s.res.Seed(rctx, sess, body)
	case kindVerify:
		if reply, err = s.res.Verify(rctx, sess, body); err == nil {
			reply, err = echoRequest(body, reply)
		}
	case kindClose:
		reply, err = s.closeSession(rctx, ctx, sess, body)
	case kindAccess:
		reply, err = s.sandboxAccess(rctx, sess)
	case kindTool:
		reply, err = tool(rctx, sess, body)
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	if s.part != nil {
		switch {
		case kind == kindSeed && ep != nil:
			s.part.Bind(sess.ID, *ep)
		case kind == kindVerify:
			s.part.Unbind(sess.ID)
		}
	}
	writeJSON(ctx, nethttp.StatusOK, reply)
}

// closeRequest is the typed form of /close_session.
type closeRequest struct {
	ResourcesSessionID *string         `json:"resources_session_id"`
	EpisodeID          json.RawMessage `json:"episode_id"`
}

// closeSession ends a session: the cookie's ({"closed": true}) for an empty
// body, the named one ({resources_session_id}) for a typed body. Closing a
// closed or never-seeded session succeeds; a failed stop fails the call, so
// a retry stops it again.
func (s *Server) closeSession(ctx context.Context, rc *fasthttp.RequestCtx, sess *resources.Session, body []byte) (any, error) {
	req, err := decodeClose(body, true)
	if err != nil {
		return nil, err
	}
	if req.ResourcesSessionID == nil {
		if err := s.endSession(ctx, sess.ID); err != nil {
			return nil, err
		}
		s.setCookie(rc, "", true)
		return closedReply(""), nil
	}
	id := *req.ResourcesSessionID
	if id == "" {
		return nil, resources.Invalid("resources_session_id must not be empty")
	}
	if _, _, err := parseEpisodeField(req.EpisodeID); err != nil {
		return nil, err
	}
	if err := s.endSession(ctx, id); err != nil {
		return nil, err
	}
	return closedReply(id), nil
}

// closedReply is /close_session's reply: {"closed":true} for the cookie's
// session, {"resources_session_id":id} for a named one (an id is never
// empty).
type closedReply string

// AppendJSON writes the reply without reflection.
func (r closedReply) AppendJSON(dst []byte) ([]byte, error) {
	if r == "" {
		return append(dst, `{"closed":true}`...), nil
	}
	dst = append(dst, `{"resources_session_id":`...)
	return append(jsonw.AppendString(dst, string(r)), '}'), nil
}

func (s *Server) endSession(ctx context.Context, id string) error {
	if err := s.own.EndSessionSandbox(ctx, id); err != nil {
		return err
	}
	s.closed.add(id)
	s.typed.forget(id)
	if s.part != nil {
		s.part.Unbind(id)
	}
	return nil
}

// Access is the JSON of /sandbox_access.
type Access struct {
	Connection Connection `json:"connection"`
	// Workdir is the agent's checkout inside the sandbox.
	Workdir string `json:"workdir"`
}

// Connection says how to reach a sandbox.
type Connection struct {
	Kind              string         `json:"kind"`
	ProviderConfigRef string         `json:"provider_config_ref"`
	Descriptor        map[string]any `json:"descriptor"`
}

// AppendJSON appends what json.Marshal writes for a, without reflection:
// /sandbox_access is an agent's most frequent call.
func (a *Access) AppendJSON(dst []byte) ([]byte, error) {
	dst = append(dst, `{"connection":{"kind":`...)
	dst = jsonw.AppendString(dst, a.Connection.Kind)
	dst = append(dst, `,"provider_config_ref":`...)
	dst = jsonw.AppendString(dst, a.Connection.ProviderConfigRef)
	dst = append(dst, `,"descriptor":`...)
	dst, err := jsonw.Append(dst, a.Connection.Descriptor)
	if err != nil {
		return dst, err
	}
	dst = append(dst, `},"workdir":`...)
	dst = jsonw.AppendString(dst, a.Workdir)
	return append(dst, '}'), nil
}

func noSandboxAccess() error {
	return problem.Errorf(nethttp.StatusNotFound, CodeNoSandboxAccess, "this session has no sandbox access")
}

func (s *Server) sandboxAccess(ctx context.Context, sess *resources.Session) (*Access, error) {
	if !s.res.LendsSandboxes() {
		return nil, noSandboxAccess()
	}
	sb, ok := s.own.SessionSandbox(ctx, sess.ID)
	if !ok {
		return nil, noSandboxAccess()
	}
	// The descriptor's workdir is the spec's, as Gym serialises a sandbox;
	// a spec that names none runs in the provider's default, which is the
	// sandbox's workdir.
	var workdir any
	if w := cmp.Or(sb.Spec.Workdir, sb.Workdir); w != "" {
		workdir = w
	}
	desc := map[string]any{"sandbox_id": sb.Handle.SandboxID, "workdir": workdir}
	if s.cfg.Access != nil {
		if err := s.cfg.Access(sess, sb, desc); err != nil {
			return nil, err
		}
	}
	return &Access{
		Connection: Connection{Kind: "direct", ProviderConfigRef: s.cfg.ProviderConfigRef, Descriptor: desc},
		Workdir:    sb.Workdir,
	}, nil
}
