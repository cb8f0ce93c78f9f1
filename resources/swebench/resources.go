package swebench

import (
	"context"
	"errors"
	nethttp "net/http"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sandbox"
)

// Error codes of this server's refusals, besides package http's.
const (
	CodeInvalidRow      = "invalid_row"
	CodeSessionMismatch = "session_mismatch"
	// CodeEnvironmentUnavailable: the instance's environment cannot grade
	// it (503); the reason is in the detail.
	CodeEnvironmentUnavailable = "environment_unavailable"
	// CodeEnvironmentPreparing: while_preparing is refuse and the
	// instance is still being prepared (503, Retry-After).
	CodeEnvironmentPreparing = "environment_preparing"
)

// PreparingRetryAfter is the Retry-After (seconds) of a 503
// environment_preparing.
const PreparingRetryAfter = "10"

var _ resources.Resources = (*Server)(nil)

// Name is the server's config name.
func (s *Server) Name() string { return s.name }

// Kind is "swebench".
func (s *Server) Kind() string { return Kind }

// VerifyReplayable is false: a verify ends the session.
func (s *Server) VerifyReplayable() bool { return false }

// Tools: the agent works in its sandbox through the sandbox API; the server
// has no tool routes of its own.
func (s *Server) Tools() map[string]resources.ToolFunc { return map[string]resources.ToolFunc{} }

// Seed serves /seed_session: SeedSession on the request's session.
func (s *Server) Seed(ctx context.Context, sess *resources.Session, row []byte) (any, error) {
	res, err := s.seed(ctx, sess.Owner, sess.ID, row, s.requestLog(sess))
	if err != nil {
		return nil, httpError(err)
	}
	return res, nil
}

// Verify serves /verify: VerifySession on the request's session.
func (s *Server) Verify(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
	res, err := s.verify(ctx, sess.Owner, sess.ID, body, s.requestLog(sess))
	if err != nil {
		return nil, httpError(err)
	}
	return res, nil
}

// requestLog is the logger of a request through package http: the server's
// when one was injected, else the session's.
func (s *Server) requestLog(sess *resources.Session) logrus.FieldLogger {
	if s.injected || sess.Log == nil {
		return s.log
	}
	return sess.Log.WithField("resources", Kind)
}

// statusError is an *problem.Error (what package http answers with) that
// still matches this package's sentinels.
type statusError struct {
	he  *problem.Error
	err error
}

func (e *statusError) Error() string   { return e.err.Error() }
func (e *statusError) Unwrap() []error { return []error{e.he, e.err} }

// httpError gives err its status: a row that cannot be graded is 422
// invalid_row, a verify or re-seed naming another instance 409
// session_mismatch; sandbox.ErrNone (409) and setup failures (500
// setup_failed) are package http's.
func httpError(err error) error {
	var status int
	var code string
	switch {
	case errors.Is(err, sandbox.ErrNone), errors.Is(err, sandbox.ErrSetup):
		return err
	case errors.Is(err, ErrInvalidRow), errors.Is(err, ErrUnknownLogParser), errors.Is(err, ErrNoTestCommand), errors.Is(err, ErrUnknownRepo):
		status, code = nethttp.StatusUnprocessableEntity, CodeInvalidRow
	case errors.Is(err, ErrSessionMismatch):
		status, code = nethttp.StatusConflict, CodeSessionMismatch
	case errors.Is(err, ErrEnvironmentUnavailable):
		status, code = nethttp.StatusServiceUnavailable, CodeEnvironmentUnavailable
	case errors.Is(err, ErrEnvironmentPreparing):
		he := problem.Errorf(nethttp.StatusServiceUnavailable, CodeEnvironmentPreparing, "%s", err.Error())
		he.RetryAfter = PreparingRetryAfter
		return &statusError{he: he, err: err}
	default:
		return err
	}
	return &statusError{he: problem.Errorf(status, code, "%s", err.Error()), err: err}
}
