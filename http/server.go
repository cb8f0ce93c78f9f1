package http

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	nethttp "net/http"
	"os"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/envelope"
	"github.com/sandboxowner/owner/internal/fifo"
	"github.com/sandboxowner/owner/internal/lazyctx"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sandbox"
)

// Routes and headers of the wire protocol.
const (
	RouteSeed          = "/seed_session"
	RouteVerify        = "/verify"
	RouteClose         = "/close_session"
	RouteSandboxAccess = "/sandbox_access"
	RouteHealth        = "/health"

	// ControlPrefix is where the checkpoint control plane lives.
	ControlPrefix = "/ng-control/v1/checkpoint/"
	// RolloutPrefix binds a request to an episode:
	// /ng-rollout/<capture_key>/<route>.
	RolloutPrefix = "/ng-rollout/"
	// RouteRelease is our addition to the control plane.
	RouteRelease = "release"
	// RouteCheckRetention is another: check the checkpoint directories
	// now, as the period does.
	RouteCheckRetention = "check_retention"

	HeaderVerify  = "x-ng-checkpoint-verify"
	HeaderRestart = "x-ng-checkpoint-restart"

	// DefaultProviderConfigRef is the top-level config key of the sandbox
	// provider, named in /sandbox_access.
	DefaultProviderConfigRef = "sandbox"
	// DefaultMaxBody bounds a request body (413 above it).
	DefaultMaxBody = 4 << 20
	// MaxControlBody bounds a control request body.
	MaxControlBody = 1 << 20
)

// reserved reports the routes a resources server may not take for a tool.
func reserved(route string) bool {
	switch route {
	case RouteSeed, RouteVerify, RouteClose, RouteSandboxAccess, RouteHealth,
		RouteAggregateMetrics, RouteMCP, RouteReverifyMode, RouteLiveness:
		return true
	}
	return false
}

// Config configures a Server.
type Config struct {
	Owner     *owner.Owner
	Resources resources.Resources
	Logger    *logrus.Logger
	// Clock is the control plane's clock (default the wall clock; the
	// simulation passes its logical one).
	Clock clock.Clock
	// SessionSecret signs session cookies (LoadSessionSecret).
	SessionSecret []byte
	// ControlAuthToken guards the control plane; required when the owner
	// checkpoints (its mode is not off).
	ControlAuthToken string
	// LeaseGrace is checkpoint.lease_grace_seconds (default 600 s).
	LeaseGrace time.Duration
	// MaxDeadline is checkpoint.max_deadline_seconds (default 1 h).
	MaxDeadline time.Duration
	// MaxBodyBytes bounds request bodies (default DefaultMaxBody).
	MaxBodyBytes int
	// ReadTimeout bounds reading a request, body included (http.read_timeout,
	// default DefaultReadTimeout); WriteTimeout writing its response
	// (default DefaultWriteTimeout); IdleTimeout a keep-alive connection's
	// wait for its next request (http.idle_timeout, default
	// DefaultIdleTimeout).
	ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConns bounds the connections served at once (http.max_conns,
	// default DefaultMaxConns; one more is answered 503 and closed), and
	// MaxConnsPerIP those of one client address (http.max_conns_per_ip,
	// default DefaultMaxConnsPerIP; one more is 429).
	MaxConns, MaxConnsPerIP int
	// BodyMemory bounds the bytes of request bodies held at once (default
	// DefaultBodyMemory); a body beyond it is 503 overloaded.
	BodyMemory int64
	// ProviderConfigRef is named in /sandbox_access (default "sandbox").
	ProviderConfigRef string
	// LeaseTick is how often a wall-clock ticker checks the lease (default
	// 1 s); negative starts none, for callers that Tick the machine
	// themselves.
	LeaseTick time.Duration
	// ReadinessPoll bounds a prepare's wait between readiness checks.
	ReadinessPoll time.Duration
	// ClosedRetention is how long a closed session's id is refused a new
	// seed (default 1 h, as upstream).
	ClosedRetention time.Duration
	// Access, when set, adds fields to the descriptor /sandbox_access
	// returns (an exec API's endpoint and token).
	Access func(sess *resources.Session, sb sandbox.Sandbox, descriptor map[string]any) error
	// Mounts serve other path prefixes (the sandbox exec API) with their
	// own handlers; they get the panic guard and nothing else.
	Mounts map[string]fasthttp.RequestHandler
	// Isolation is how sandboxed commands are held ("container", "none",
	// "unavailable"),
	// reported by /health when set.
	Isolation string
	// ProviderDown, when set, says why the provider cannot be reached (nil
	// while it can); /health then answers 503 provider_unreachable.
	ProviderDown func() error
	// PendingDeletes, when set, counts the snapshots whose deletes are
	// pending (in use by a live fork, or failed), for /health.
	PendingDeletes func() (int, error)
	// CheckpointsHeld, when set, counts the committed checkpoints, for
	// /health.
	CheckpointsHeld func() (int, error)
	// Retention, when set, reports the checks of the checkpoint
	// directories, for /health (shown while they follow the directories).
	Retention func() owner.RetentionStatus
	// Sweep, when set, is /health's sweep: what the server's own sweep
	// is configured to do and what its passes found and removed.
	Sweep func() map[string]any
	// Seccomp is the syscall filter of sandboxed commands ("default",
	// "off", a file), reported by /health when set.
	Seccomp string
	// Limits are the sandbox limits the provider enforces, reported by
	// /health when set.
	Limits string
	// Metrics, when set, records the requests and serves GET /metrics.
	Metrics *metrics.Metrics
	// AccessLog logs one line per request: method, route, status,
	// duration, session_id.
	AccessLog bool
}

// Server serves a resources server, its sessions and its participant
// control plane over fasthttp.
type Server struct {
	cfg        Config
	own        *owner.Owner
	res        resources.Resources
	log        *logrus.Entry
	clk        clock.Clock
	mode       owner.Mode
	cookieName string
	signer     *Signer
	mcpSigner  *Signer
	tools      map[string]resources.ToolFunc
	tokenSum   [32]byte
	verifyMode string
	mounts     []mount

	part    *participant.Participant // nil with checkpointing off
	machine *control.Machine
	closed  *closedSessions
	typed   *typedSessions
	bodies  *budget

	srv    *fasthttp.Server
	base   context.Context
	cancel context.CancelFunc
	// shards are base's children the data requests' contexts hang from:
	// a context is registered with its parent, under the parent's lock,
	// for as long as it lives, and one parent for every request made that
	// lock the one all concurrent requests queued on.
	shards       [contextShards]context.Context
	shardCancels [contextShards]context.CancelFunc
	// ctlBase bounds control requests: ended when shutdown begins, so a
	// prepare waiting for its deadline does not hold up the drain (commit
	// and restore runs are shielded and go on).
	ctlBase   context.Context
	ctlCancel context.CancelFunc

	// metricsHandler serves GET /metrics (nil without Metrics).
	metricsHandler fasthttp.RequestHandler

	stopOnce sync.Once
	stopTick chan struct{}
	ticker   sync.WaitGroup
	// tickMu guards ticking and stopped: the ticker starts with Serve,
	// never after Shutdown.
	tickMu  sync.Mutex
	ticking bool
	stopped bool
}

type mount struct {
	prefix string
	h      fasthttp.RequestHandler
}

// ErrConfig: the server cannot be built from its Config.
var ErrConfig = errors.New("http config")

// New builds a server; it starts nothing, so a caller that fails after it
// need not shut it down. Serve starts the lease ticker (unless LeaseTick <
// 0); Shutdown stops it.
func New(cfg Config) (*Server, error) {
	if cfg.Owner == nil || cfg.Resources == nil {
		return nil, fmt.Errorf("%w: Owner and Resources are required", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = logs.Discard()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBody
	}
	setDefault(&cfg.ReadTimeout, DefaultReadTimeout)
	setDefault(&cfg.WriteTimeout, DefaultWriteTimeout)
	setDefault(&cfg.IdleTimeout, DefaultIdleTimeout)
	setDefault(&cfg.MaxConns, DefaultMaxConns)
	setDefault(&cfg.MaxConnsPerIP, DefaultMaxConnsPerIP)
	setDefault(&cfg.BodyMemory, DefaultBodyMemory)
	if cfg.ProviderConfigRef == "" {
		cfg.ProviderConfigRef = DefaultProviderConfigRef
	}
	if cfg.LeaseTick == 0 {
		cfg.LeaseTick = time.Second
	}
	if cfg.ClosedRetention <= 0 {
		cfg.ClosedRetention = time.Hour
	}
	res := cfg.Resources
	name := res.Name()
	cookieName := res.Kind() + "___" + name
	signer, err := NewSigner(cookieName, cfg.SessionSecret)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	// Its own name, so that a cookie is no MCP token and a token no cookie.
	mcpSigner, err := NewSigner(mcpTokenSalt, cfg.SessionSecret)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	tools := map[string]resources.ToolFunc{}
	for route, fn := range res.Tools() {
		if !strings.HasPrefix(route, "/") || strings.Count(route, "/") != 1 || reserved(route) {
			return nil, fmt.Errorf("%w: tool route %q must be /<name> and not one of the reserved routes", ErrConfig, route)
		}
		tools[route] = fn
	}
	s := &Server{
		cfg:        cfg,
		own:        cfg.Owner,
		res:        res,
		log:        cfg.Logger.WithField("server", name),
		clk:        cfg.Clock,
		cookieName: cookieName,
		signer:     signer,
		mcpSigner:  mcpSigner,
		tools:      tools,
		verifyMode: "wait",
		closed:     newClosedSessions(cfg.Clock, cfg.ClosedRetention),
		typed:      newTypedSessions(),
		bodies:     newBudget(cfg.BodyMemory),
		stopTick:   make(chan struct{}),
	}
	if res.VerifyReplayable() {
		s.verifyMode = "replay"
	}
	if reg := cfg.Metrics.Registry(); reg != nil {
		s.metricsHandler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	for p, h := range cfg.Mounts {
		s.mounts = append(s.mounts, mount{p, h})
	}
	sort.Slice(s.mounts, func(i, j int) bool { return len(s.mounts[i].prefix) > len(s.mounts[j].prefix) })
	s.mode = cfg.Owner.Mode()
	if s.mode == owner.ModeExported && !res.LendsSandboxes() {
		// Nothing a session holds is in the owner: nothing to export.
		s.mode = owner.ModeRestartOnly
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	s.ctlBase, s.ctlCancel = context.WithCancel(s.base)
	for i := range s.shards {
		// Each ends with base, its parent; its own cancel is never called.
		s.shards[i], s.shardCancels[i] = context.WithCancel(s.base)
	}
	if s.mode != owner.ModeOff {
		if cfg.ControlAuthToken == "" {
			return nil, fmt.Errorf("%w: checkpoint.control_auth_token is required with checkpointing on", ErrConfig)
		}
		s.tokenSum = sha256.Sum256([]byte(cfg.ControlAuthToken))
		s.part = participant.New(participant.Config{
			Owner:            cfg.Owner,
			Mode:             s.mode,
			VerifyReplayable: res.VerifyReplayable(),
			Instance:         name,
			Clock:            cfg.Clock,
			LeaseGrace:       cfg.LeaseGrace,
			PollEvery:        cfg.ReadinessPoll,
			MaxDeadline:      cfg.MaxDeadline,
			Logger:           s.log,
		})
		s.machine = s.part.Machine()
	}
	s.srv = &fasthttp.Server{
		Handler:      s.Handler(),
		ErrorHandler: s.parseError,
		Name:         "sandbox-owner",
		// Bodies are streamed so that readBody commits memory as bytes
		// arrive, within the budget and MaxBodyBytes, instead of fasthttp
		// allocating each announced Content-Length up front. A limit of one
		// byte makes fasthttp hand every body over as a stream after
		// reading at most one byte of it (with a larger limit it first
		// waits for up to 8 KB, so a client announcing a huge body and
		// sending little would be held to the read timeout before its 413).
		MaxRequestBodySize:           1,
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		ReadTimeout:                  cfg.ReadTimeout,
		WriteTimeout:                 cfg.WriteTimeout,
		IdleTimeout:                  cfg.IdleTimeout,
		Concurrency:                  cfg.MaxConns,
		MaxConnsPerIP:                cfg.MaxConnsPerIP,
		CloseOnShutdown:              true,
		Logger:                       fasthttpLogger{cfg.Logger.WithField("server", name)},
	}
	return s, nil
}

// startTicking starts the lease ticker once, unless the server has none or
// has been shut down.
func (s *Server) startTicking() {
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	if s.machine == nil || s.cfg.LeaseTick < 0 || s.ticking || s.stopped {
		return
	}
	s.ticking = true
	s.ticker.Add(1)
	go s.tickLease(s.cfg.LeaseTick)
}

func (s *Server) tickLease(every time.Duration) {
	defer s.ticker.Done()
	t := s.clk.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-s.stopTick:
			return
		case <-t.C():
			s.machine.Tick()
			t.Reset(every)
		}
	}
}

// Mode is the checkpoint mode in effect.
func (s *Server) Mode() owner.Mode { return s.mode }

// CookieName is the session cookie's name, <kind>___<name>.
func (s *Server) CookieName() string { return s.cookieName }

// Signer signs and checks this server's cookies.
func (s *Server) Signer() *Signer { return s.signer }

// Machine is the control plane's phase machine (nil with checkpointing
// off), for the simulation and tests.
func (s *Server) Machine() *control.Machine { return s.machine }

// Gate is the admission gate (nil with checkpointing off).
func (s *Server) Gate() *control.Gate {
	if s.part == nil {
		return nil
	}
	return s.part.Gate()
}

// CaptureKeyOf is the capture key of the episode a session is bound to
// ("" for none, or without checkpointing), for the sandbox API's log lines.
func (s *Server) CaptureKeyOf(sessionID string) string {
	if s == nil || s.part == nil || sessionID == "" {
		return ""
	}
	if ep, ok := s.part.BoundEpisode(sessionID); ok {
		return ep.CaptureKey()
	}
	return ""
}

// AdmitSandboxCall passes a call an agent makes on its session's sandbox
// (an exec, a file write) through the admission gate, as a tool call is:
// it waits while a checkpoint is open and is counted in flight, named by
// its session's capture key, until leave is called. With checkpointing off
// it does nothing.
func (s *Server) AdmitSandboxCall(ctx context.Context, sessionID string) (leave func(), err error) {
	if s.part == nil {
		return func() {}, nil
	}
	return s.part.AdmitSandboxCall(ctx, sessionID)
}

// FastHTTP is the configured fasthttp server, to Serve a listener with.
func (s *Server) FastHTTP() *fasthttp.Server { return s.srv }

// Serve ticks the lease and serves ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	s.startTicking()
	return s.srv.Serve(ln)
}

// Shutdown stops accepting connections, lets requests waiting at a closed
// gate go (503), ends waiting control calls (a prepare, a retire), waits for
// the data requests in flight, and stops the lease ticker. The owner is the
// caller's to close afterwards.
func (s *Server) Shutdown(ctx context.Context) error {
	var err error
	s.stopOnce.Do(func() {
		s.tickMu.Lock()
		s.stopped = true
		s.tickMu.Unlock()
		close(s.stopTick)
		s.ctlCancel()
		if s.part != nil {
			s.part.Gate().Shutdown()
		}
		err = s.srv.ShutdownWithContext(ctx)
		s.ticker.Wait()
		s.cancel()
	})
	return err
}

// contextShards is how many parents the data requests' contexts are spread
// over.
const contextShards = 64

// requestContext is a data request's context: ended when the request is
// answered (its Cancel) or when the server stops, carrying its request id.
// One allocation, and no registration with its parent unless a wait asks
// for its Done: most requests are answered without one.
func (s *Server) requestContext(ctx *fasthttp.RequestCtx) *lazyctx.Ctx {
	id := ctx.ID()
	parent := s.shards[(id^id>>32)%contextShards]
	// The id's user value is boxed already: the context keeps that box.
	return logs.RequestContext(parent, ctx.UserValue(requestIDValue))
}

// Handler is the request handler, panics included: a panic is logged with
// its stack and answered 500 with the envelope.
func (s *Server) Handler() fasthttp.RequestHandler { return s.handle }

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	requestID(ctx)
	if s.cfg.Metrics != nil || s.cfg.AccessLog {
		defer s.observe(ctx, time.Now())
	}
	defer func() {
		if r := recover(); r != nil {
			s.requestLog(ctx).WithFields(logrus.Fields{"panic": fmt.Sprint(r), "path": string(ctx.Path()), "stack": string(debug.Stack())}).Error("request handler panicked")
			ctx.Response.ResetBody()
			writeError(ctx, nethttp.StatusInternalServerError, CodeInternal, "internal error")
		}
	}()
	release, ok := s.readBody(ctx)
	if !ok {
		return
	}
	defer release()
	path := string(ctx.Path())
	switch {
	case path == RouteHealth:
		s.health(ctx)
	case path == RouteLiveness:
		s.liveness(ctx)
	case path == RouteReverifyMode:
		s.reverifyMode(ctx)
	case path == RouteAggregateMetrics:
		s.aggregateMetrics(ctx)
	case path == RouteMCP:
		s.serveMCP(ctx)
	case path == RouteMetrics && s.metricsHandler != nil:
		if !ctx.IsGet() && !ctx.IsHead() {
			methodNotAllowed(ctx, "GET")
			return
		}
		s.metricsHandler(ctx)
	case strings.HasPrefix(path, ControlPrefix):
		s.serveControl(ctx, path[len(ControlPrefix):])
	case strings.HasPrefix(path, RolloutPrefix):
		rest := path[len(RolloutPrefix):]
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			writeError(ctx, nethttp.StatusNotFound, CodeNotFound, "expected /ng-rollout/<capture_key>/<route>")
			return
		}
		ctx.SetUserValue(captureKeyValue, rest[:i])
		ep, err := control.ParseCaptureKey(rest[:i])
		if err != nil {
			writeError(ctx, nethttp.StatusBadRequest, CodeInvalidCapture, err.Error())
			return
		}
		s.serveData(ctx, rest[i:], &ep)
	default:
		for _, m := range s.mounts {
			if strings.HasPrefix(path, m.prefix) {
				m.h(ctx)
				return
			}
		}
		s.serveData(ctx, path, nil)
	}
}

func (s *Server) health(ctx *fasthttp.RequestCtx) {
	if !ctx.IsGet() && !ctx.IsHead() {
		methodNotAllowed(ctx, "GET")
		return
	}
	reply := map[string]any{"status": "ok", "name": s.res.Name(), "mode": s.mode}
	if s.cfg.Isolation != "" {
		reply["isolation"] = s.cfg.Isolation
	}
	if s.cfg.Seccomp != "" {
		reply["seccomp"] = s.cfg.Seccomp
	}
	if s.cfg.Limits != "" {
		reply["limits"] = s.cfg.Limits
	}
	status := nethttp.StatusOK
	if s.cfg.ProviderDown != nil {
		if err := s.cfg.ProviderDown(); err != nil {
			reply["status"], reply["provider_error"] = "provider_unreachable", err.Error()
			status = nethttp.StatusServiceUnavailable
		}
	}
	if s.cfg.PendingDeletes != nil {
		if n, err := s.cfg.PendingDeletes(); err == nil {
			reply["pending_snapshot_deletes"] = n
		}
	}
	if s.cfg.CheckpointsHeld != nil {
		if n, err := s.cfg.CheckpointsHeld(); err == nil {
			reply["checkpoints_held"] = n
		}
	}
	if s.cfg.Retention != nil {
		if st := s.cfg.Retention(); st.FollowDirs {
			reply["retention"] = retentionHealth(st)
		}
	}
	if s.cfg.Sweep != nil {
		reply["sweep"] = s.cfg.Sweep()
	}
	if hr, ok := s.res.(resources.HealthReporter); ok {
		for k, v := range hr.Health() {
			if _, taken := reply[k]; !taken {
				reply[k] = v
			}
		}
	}
	writeJSON(ctx, status, reply)
}

// retentionHealth is /health's retention: what the directory checks follow
// and what the last one saw.
func retentionHealth(st owner.RetentionStatus) map[string]any {
	gone, unreadable := []string{}, []string{}
	for _, p := range st.Pending {
		gone = append(gone, p.ID)
	}
	for _, p := range st.Unreadable {
		unreadable = append(unreadable, p.ID)
	}
	return map[string]any{
		"follow_dirs":     st.FollowDirs,
		"grace_s":         st.Grace.Seconds(),
		"dirs_gone":       gone,
		"dirs_unreadable": unreadable,
	}
}

// parseError answers what fasthttp could not parse: 413 for a body over
// the limit (its default is a bare 400), 400 for the rest.
func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, nethttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("request body over %d bytes", s.cfg.MaxBodyBytes))
		return
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		writeError(ctx, nethttp.StatusRequestTimeout, CodeRequestTimeout, fmt.Sprintf("the request did not arrive within %v", s.cfg.ReadTimeout))
		return
	}
	writeError(ctx, nethttp.StatusBadRequest, CodeBadRequest, "malformed HTTP request")
}

// --- responses ---

func writeJSON(ctx *fasthttp.RequestCtx, status int, v any) { envelope.WriteJSON(ctx, status, v) }

func writeError(ctx *fasthttp.RequestCtx, status int, code, detail string) {
	envelope.WriteError(ctx, status, code, detail)
}

func methodNotAllowed(ctx *fasthttp.RequestCtx, allow string) {
	ctx.Response.Header.Set("Allow", allow)
	writeError(ctx, nethttp.StatusMethodNotAllowed, CodeMethod, "use "+allow)
}

// fail answers an error with its status and code; unexpected ones are 500s
// and logged.
func (s *Server) fail(ctx *fasthttp.RequestCtx, err error) {
	status, code, detail := classify(err)
	switch code {
	case CodeAtCapacity:
		ctx.Response.Header.Set("Retry-After", AtCapacityRetryAfter)
	case CodeProviderUnavailable:
		ctx.Response.Header.Set("Retry-After", ProviderUnavailableRetryAfter)
	}
	if he := (*problem.Error)(nil); errors.As(err, &he) && he.RetryAfter != "" {
		ctx.Response.Header.Set("Retry-After", he.RetryAfter)
	}
	if status >= 500 && status != nethttp.StatusServiceUnavailable {
		s.requestLog(ctx).WithError(err).WithFields(logrus.Fields{"path": string(ctx.Path()), "status": status}).Error("request failed")
	}
	writeError(ctx, status, code, detail)
}

func classify(err error) (status int, code, detail string) {
	var pe *problem.Error
	switch {
	case errors.As(err, &pe):
		return pe.Status, pe.Code, pe.Detail
	case errors.Is(err, sandbox.ErrNone):
		return nethttp.StatusConflict, CodeNoSessionSandbox, err.Error()
	case errors.Is(err, sandbox.ErrSetup):
		return nethttp.StatusInternalServerError, CodeSetupFailed, err.Error()
	case errors.Is(err, sandbox.ErrLost):
		// A fixed detail: the provider's error can carry host paths.
		return nethttp.StatusConflict, CodeSandboxLost, "the session's sandbox is gone (stopped outside this server, or its lease ran out); the episode cannot go on or be graded: start a new one"
	case errors.Is(err, sandbox.ErrAtCapacity):
		return nethttp.StatusServiceUnavailable, CodeAtCapacity, "the server holds max_sessions sessions; retry later"
	case errors.Is(err, provider.ErrUnavailable):
		return nethttp.StatusServiceUnavailable, CodeProviderUnavailable, err.Error()
	case errors.Is(err, owner.ErrClosed):
		return nethttp.StatusServiceUnavailable, control.ErrShuttingDown.Code, err.Error()
	default:
		return nethttp.StatusInternalServerError, CodeInternal, err.Error()
	}
}

// --- control plane ---

func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	tok, ok := BearerToken(ctx.Request.Header.Peek("Authorization"))
	if !ok {
		return false
	}
	// Comparing digests keeps the comparison constant-time in the length
	// too.
	sum := sha256.Sum256(bytes.TrimSpace(tok))
	return subtle.ConstantTimeCompare(sum[:], s.tokenSum[:]) == 1
}

// BearerToken returns the token of an Authorization header of the Bearer
// scheme, whose name is case-insensitive (RFC 7235).
func BearerToken(h []byte) ([]byte, bool) {
	const scheme = "bearer "
	if len(h) < len(scheme) || !bytes.EqualFold(h[:len(scheme)], []byte(scheme)) {
		return nil, false
	}
	return h[len(scheme):], true
}

func (s *Server) serveControl(ctx *fasthttp.RequestCtx, op string) {
	if s.machine == nil {
		writeError(ctx, nethttp.StatusNotFound, CodeNotFound, "checkpointing is off: this server is not a participant")
		return
	}
	if !s.authorized(ctx) {
		writeError(ctx, nethttp.StatusUnauthorized, control.ErrUnauthorized.Code, "missing or wrong bearer token")
		return
	}
	if op == "status" {
		if !ctx.IsGet() {
			methodNotAllowed(ctx, "GET")
			return
		}
		writeJSON(ctx, nethttp.StatusOK, s.machine.Status())
		return
	}
	if !ctx.IsPost() {
		methodNotAllowed(ctx, "POST")
		return
	}
	body := ctx.PostBody()
	if len(body) > MaxControlBody {
		writeError(ctx, nethttp.StatusRequestEntityTooLarge, CodeBodyTooLarge, fmt.Sprintf("control body over %d bytes", MaxControlBody))
		return
	}
	rctx, cancel := context.WithCancel(logs.WithRequestID(s.ctlBase, RequestID(ctx)))
	defer cancel()
	var reply any
	var err error
	if isCheckpointOp(op) {
		defer func(began time.Time) {
			status := nethttp.StatusOK
			if err != nil {
				status, _, _ = classify(err)
			}
			s.cfg.Metrics.CheckpointOp(op, metrics.OutcomeOfStatus(status), time.Since(began))
		}(time.Now())
	}
	switch op {
	case control.OpPrepare:
		reply, err = controlCall(body, func(r control.PrepareRequest) (any, error) { return s.machine.Prepare(rctx, r) })
	case control.OpCommit:
		reply, err = controlCall(body, func(r control.CommitRequest) (any, error) { return s.machine.Commit(rctx, r) })
	case control.OpRestore:
		reply, err = controlCall(body, func(r control.RestoreRequest) (any, error) { return s.machine.Restore(rctx, r) })
	case control.OpResume:
		reply, err = controlCall(body, func(r control.ResumeRequest) (any, error) { return s.machine.Resume(rctx, r) })
	case control.OpRetire:
		reply, err = controlCall(body, func(r control.RetireRequest) (any, error) { return s.machine.Retire(rctx, r) })
	case control.OpForget:
		reply, err = controlCall(body, func(r control.ForgetRequest) (any, error) { return s.machine.Forget(rctx, r) })
	case control.OpRenew:
		reply, err = controlCall(body, func(r control.RenewRequest) (any, error) { return s.machine.Renew(rctx, r) })
	case RouteRelease:
		reply, err = controlCall(body, func(r participant.ReleaseRequest) (any, error) { return s.part.Release(rctx, r) })
	case RouteCheckRetention:
		reply, err = controlCall(body, func(r participant.CheckRetentionRequest) (any, error) { return s.part.CheckRetention(rctx, r) })
	default:
		writeError(ctx, nethttp.StatusNotFound, CodeNotFound, "no control route "+op)
		return
	}
	if err != nil {
		s.fail(ctx, err)
		return
	}
	writeJSON(ctx, nethttp.StatusOK, reply)
}

// controlCall decodes a control body strictly and calls fn with it.
func controlCall[T any](body []byte, fn func(T) (any, error)) (any, error) {
	var req T
	if err := resources.DecodeStrict(body, &req); err != nil {
		return nil, err
	}
	return fn(req)
}

// --- closed sessions ---

// closedSessions remembers closed session ids for a while, so a late seed
// with a closed session's cookie does not start a sandbox nobody will end.
type closedSessions struct {
	// An RWMutex: every seed asks, only closes write.
	mu   sync.RWMutex
	clk  clock.Clock
	keep time.Duration
	at   *fifo.Map[string, time.Time]
}

func newClosedSessions(clk clock.Clock, keep time.Duration) *closedSessions {
	return &closedSessions{clk: clk, keep: keep, at: fifo.New[string, time.Time](1 << 16)}
}

func (c *closedSessions) add(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clk.Now()
	c.at.Put(id, now)
	for _, at, ok := c.at.Oldest(); ok && now.Sub(at) >= c.keep; _, at, ok = c.at.Oldest() {
		c.at.DropOldest()
	}
}

func (c *closedSessions) has(id string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	at, ok := c.at.Get(id)
	return ok && c.clk.Now().Sub(at) < c.keep
}
