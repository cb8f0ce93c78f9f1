// Package logs is the logger policy: one logrus logger is injected
// everywhere; a component given none logs nowhere (Discard), and log lines
// name what they concern with the keys below.
package logs

import (
	"context"
	"io"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/internal/lazyctx"
)

// Field keys every component uses for the things it logs about.
const (
	SessionID    = "session_id"
	SandboxID    = "sandbox_id"
	CheckpointID = "checkpoint_id"
	// RequestID names the HTTP request a line was caused by: the id its
	// client sent in X-Request-Id, or the one the server made.
	RequestID = "request_id"
)

// requestKey is the context key of the id of the request a call serves.
type requestKey struct{}

// WithRequestID returns ctx carrying id, the id of the request the calls
// made with it serve, so that what they log can be tied to that request
// ("" leaves ctx as it is).
func WithRequestID(ctx context.Context, id string) context.Context {
	if id == "" {
		return ctx
	}
	return context.WithValue(ctx, requestKey{}, id)
}

// RequestContext is a context carrying the request id held in an
// interface value already (a string; anything else, or "", carries none),
// ended by its Cancel or its parent's end: the HTTP server boxes each
// request's id once, for its user value and its context alike. It is made
// in one allocation and registered with its parent only if someone waits
// on it (lazyctx).
func RequestContext(parent context.Context, id any) *lazyctx.Ctx {
	if s, _ := id.(string); s == "" {
		return lazyctx.WithCancel(parent)
	}
	return lazyctx.WithValue(parent, requestKey{}, id)
}

// RequestIDOf is the request id ctx carries, or "".
func RequestIDOf(ctx context.Context) string {
	id, _ := ctx.Value(requestKey{}).(string)
	return id
}

// ForRequest returns l with the request_id of the request ctx serves, or
// l itself when ctx serves none.
func ForRequest(ctx context.Context, l logrus.FieldLogger) logrus.FieldLogger {
	if id := RequestIDOf(ctx); id != "" {
		return l.WithField(RequestID, id)
	}
	return l
}

// Discard is the default of a component given no logger.
func Discard() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// Or returns l, or Discard when l is nil.
func Or(l logrus.FieldLogger) logrus.FieldLogger {
	if l == nil {
		return Discard()
	}
	return l
}
