package http

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/metrics"
)

const (
	// RouteMetrics is Prometheus' scrape route (with Config.Metrics).
	RouteMetrics = "/metrics"

	// sessionValue is the request's user value holding its session id,
	// for the access log.
	sessionValue = "session_id"
	// captureKeyValue holds a rollout route's capture key, for the
	// access log.
	captureKeyValue = "capture_key"
	// otherRoute labels a path no route serves: labels stay bounded
	// whatever paths clients send.
	otherRoute = "other"
)

// HeaderRequestID carries a request's id: taken from the request when the
// client sent a usable one, made otherwise, and sent back on every reply,
// so that a client's call can be found in the server's log.
const HeaderRequestID = "X-Request-Id"

// Request user values a mount's handler may set for the access log.
const (
	// SandboxIDValue names the sandbox a request is about.
	SandboxIDValue = "sandbox_id"
	// SessionIDValue names the session a request is about when no cookie
	// says (the sandbox API's).
	SessionIDValue = sessionValue
	// CaptureKeyValue names the episode a request is about when no rollout
	// prefix says (the sandbox API's: its session's bound episode).
	CaptureKeyValue = captureKeyValue
)

// requestIDValue holds the request's id.
const requestIDValue = logs.RequestID

// maxRequestID bounds a client's request id; a longer one, or one with
// anything but letters, digits and "-_.:", is replaced by a made one.
const maxRequestID = 128

// requestID gives the request its id (the client's X-Request-Id when
// usable, else 16 random hex digits) and puts it on the reply.
func requestID(ctx *fasthttp.RequestCtx) {
	id := string(ctx.Request.Header.Peek(HeaderRequestID))
	if !usableRequestID(id) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		var h [16]byte
		hex.Encode(h[:], b[:])
		id = string(h[:]) // one allocation, where EncodeToString makes two
	}
	ctx.SetUserValue(requestIDValue, id)
	ctx.Response.Header.Set(HeaderRequestID, id)
}

func usableRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.ContainsRune("-_.:", c)) {
			return false
		}
	}
	return true
}

// RequestID is the id of the request ctx serves ("" outside the server's
// handler), for the log lines it causes.
func RequestID(ctx *fasthttp.RequestCtx) string {
	id, _ := ctx.UserValue(requestIDValue).(string)
	return id
}

// RequestFields are the fields every log line a request causes carries:
// its request_id, and the session_id, sandbox_id and capture_key the
// request has (set by the server, or by a mount's handler through the user
// values SessionIDValue, SandboxIDValue and CaptureKeyValue).
func RequestFields(ctx *fasthttp.RequestCtx) logrus.Fields {
	f := logrus.Fields{"request_id": RequestID(ctx)}
	for _, key := range []string{sessionValue, SandboxIDValue, captureKeyValue} {
		if v, _ := ctx.UserValue(key).(string); v != "" {
			f[key] = v
		}
	}
	return f
}

// requestLog is the server's logger with the request's fields.
func (s *Server) requestLog(ctx *fasthttp.RequestCtx) *logrus.Entry {
	return s.log.WithFields(RequestFields(ctx))
}

// RouteValue is the user value in which a mount's handler may name the
// request's route label (one of a bounded set, such as the sandbox API's
// /sandboxes/{id}/exec); without it a mount is labelled by its prefix.
const RouteValue = "route"

// isCheckpointOp reports the control operations the checkpoint families
// count.
func isCheckpointOp(op string) bool {
	switch op {
	case control.OpPrepare, control.OpCommit, control.OpRestore, RouteRelease, control.OpRetire:
		return true
	}
	return false
}

// observe records an answered request in the metrics and the access log.
func (s *Server) observe(ctx *fasthttp.RequestCtx, began time.Time) {
	d := time.Since(began)
	route := s.routeOf(string(ctx.Path()))
	if r, ok := ctx.UserValue(RouteValue).(string); ok && r != "" {
		route = r
	}
	status := ctx.Response.StatusCode()
	code := strconv.Itoa(status)
	s.cfg.Metrics.HTTPRequest(route, code, d)
	if route == RouteSeed && ctx.IsPost() {
		s.cfg.Metrics.Seed(metrics.OutcomeOfStatus(status))
	}
	if s.cfg.AccessLog {
		str := func(key string) string { v, _ := ctx.UserValue(key).(string); return v }
		s.log.WithFields(logrus.Fields{
			"method":      string(ctx.Method()),
			"route":       route,
			"status":      status,
			"duration":    d.Seconds(),
			"session_id":  str(sessionValue),
			"sandbox_id":  str(SandboxIDValue),
			"capture_key": str(captureKeyValue),
			"remote_addr": ctx.RemoteAddr().String(),
			"request_id":  RequestID(ctx),
		}).Info("request")
	}
}

// routeOf is a path's route label: the route served, without the rollout
// prefix; a control operation by name; a mount by its prefix.
func (s *Server) routeOf(path string) string {
	if rest, ok := strings.CutPrefix(path, RolloutPrefix); ok {
		i := strings.IndexByte(rest, '/')
		if i <= 0 {
			return otherRoute
		}
		path = rest[i:]
	}
	if op, ok := strings.CutPrefix(path, ControlPrefix); ok {
		switch op {
		case control.OpPrepare, control.OpCommit, control.OpRestore, control.OpResume, control.OpRetire,
			control.OpForget, control.OpRenew, RouteRelease, RouteCheckRetention, "status":
			return path
		}
		return otherRoute
	}
	switch path {
	case RouteSeed, RouteVerify, RouteClose, RouteSandboxAccess, RouteHealth, RouteLiveness,
		RouteAggregateMetrics, RouteReverifyMode, RouteMetrics:
		return path
	}
	if _, ok := s.tools[path]; ok {
		return path
	}
	for _, m := range s.mounts {
		if strings.HasPrefix(path, m.prefix) {
			return m.prefix
		}
	}
	return otherRoute
}
