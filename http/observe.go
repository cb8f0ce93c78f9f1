package http

import (
	"strconv"
	"strings"
	"time"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/metrics"
)

const (
	// RouteMetrics is Prometheus' scrape route (with Config.Metrics).
	RouteMetrics = "/metrics"

	// sessionValue is the request's user value holding its session id,
	// for the access log.
	sessionValue = "session_id"
	// otherRoute labels a path no route serves: labels stay bounded
	// whatever paths clients send.
	otherRoute = "other"
)

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
		sid, _ := ctx.UserValue(sessionValue).(string)
		s.log.WithFields(logrus.Fields{
			"method":     string(ctx.Method()),
			"route":      route,
			"status":     status,
			"duration":   d.Seconds(),
			"session_id": sid,
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
			control.OpForget, control.OpRenew, RouteRelease, "status":
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
