// Package resources is the contract resources servers are written against:
// the Resources interface, the request's Session, tool registration,
// request decoding and typed errors. It knows nothing of the transport:
// package http serves a Resources over fasthttp, and the notes and
// SWE-bench servers import only this package.
package resources

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
)

// Resources is a resources server written on the owner: the notes server,
// SWE-bench. The transport does everything else — cookies, the rollout
// prefix, admission, the checkpoint control plane, /close_session,
// /sandbox_access, the error envelope — and calls these methods with the
// request's Session.
//
// Methods get the request body as a copy they may keep. They return a value
// to send as JSON, or an error: an *Error is sent as it is,
// sandbox.ErrNone as 409 no_session_sandbox, anything else as 500.
type Resources interface {
	// Name is the server's config name ("notes"), the instance in status
	// and the second half of the cookie name.
	Name() string
	// Kind is the server type ("notes", "swebench"), the first half of the
	// cookie name <kind>___<name>.
	Kind() string
	// LendsSandboxes reports whether sessions hold sandboxes. A server that
	// lends none answers /sandbox_access with 404 and its checkpoint mode in
	// effect is restart_only.
	LendsSandboxes() bool
	// VerifyReplayable declares /verify safe to run again and not state
	// changing: it is then neither counted in flight nor held at admission,
	// and seed replies say x-ng-checkpoint-verify: replay.
	VerifyReplayable() bool
	// Seed starts the session from a dataset row (typically with
	// sess.Owner.StartSessionSandbox). A re-seed of a session a restore
	// rebuilt must hand back the fork, which StartSessionSandbox does.
	Seed(ctx context.Context, sess *Session, row []byte) (any, error)
	// Verify grades the episode and ends the session's sandbox; without a
	// sandbox it must fail with sandbox.ErrNone (409), never
	// reward.
	Verify(ctx context.Context, sess *Session, body []byte) (any, error)
	// Tools are the server's own POST routes, keyed by path ("/append_note").
	Tools() map[string]ToolFunc
}

// HealthReporter is a Resources that adds its own fields to /health (the
// SWE-bench server's grading queue, say). Fields named like the base ones
// (status, name, mode, isolation) are dropped.
type HealthReporter interface {
	Health() map[string]any
}

// ToolFunc serves one tool route.
type ToolFunc func(ctx context.Context, sess *Session, body []byte) (any, error)

// Session is what a resources server knows of the request's session.
type Session struct {
	// ID is the cookie's session id: the owner's session key.
	ID string
	// Episode is the episode the request (its rollout prefix) or the
	// session (its seed) is bound to; HasEpisode is false for neither.
	Episode    control.EpisodeID
	HasEpisode bool
	// Owner holds the session's sandbox.
	Owner *owner.Owner
	Log   logrus.FieldLogger
}

// Error is an error with its HTTP status and envelope code.
type Error struct {
	Status int
	Code   string
	Detail string
	// Err is the cause, if any (errors.Is and errors.As see it).
	Err error
	// RetryAfter, when set, is the reply's Retry-After header (seconds).
	RetryAfter string
}

func (e *Error) Error() string { return e.Code + ": " + e.Detail }

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Err }

// Wrap makes an *Error caused by err, with err's text as the detail.
func Wrap(status int, code string, err error) *Error {
	return &Error{Status: status, Code: code, Detail: err.Error(), Err: err}
}

// Is matches errors of the same code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Errorf makes an *Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}

// Invalid is a 422 invalid_request: a body that is not JSON, or of the
// wrong types.
func Invalid(format string, args ...any) *Error {
	return Errorf(nethttp.StatusUnprocessableEntity, control.ErrInvalidRequest.Code, format, args...)
}

// DecodeData decodes a data route's body into v as upstream's models do:
// unknown fields are ignored (dataset rows carry many), an empty body is {},
// and malformed JSON or a field of the wrong type is a 422.
func DecodeData(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		body = []byte("{}")
	}
	if err := json.Unmarshal(body, v); err != nil {
		return Invalid("%s", JSONProblem(err))
	}
	return nil
}

// DecodeStrict decodes a body that must be exactly one JSON value of v's
// shape: a body is required, and unknown fields and trailing data are
// refused (422).
func DecodeStrict(body []byte, v any) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return Invalid("a JSON body is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Invalid("%s", JSONProblem(err))
	}
	// More is false before a stray ']' or '}': only io.EOF proves the body
	// ended.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return Invalid("trailing data after the JSON body")
	}
	return nil
}

// CheckObject refuses a data body that is neither empty nor one JSON object
// (malformed JSON, an array, trailing data): 422, before any resources
// server sees it.
func CheckObject(body []byte) error {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	if !json.Valid(body) {
		var v any
		return Invalid("%s", JSONProblem(json.Unmarshal(body, &v)))
	}
	if body[0] != '{' {
		return Invalid("the body must be a JSON object")
	}
	return nil
}

// JSONProblem words a decoding error for an error detail.
func JSONProblem(err error) string {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, err)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return fmt.Sprintf("field %s must be %s, not %s", field, typ.Type, typ.Value)
	default:
		return "invalid JSON body: " + err.Error()
	}
}
