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

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/control"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/problem"
)

// Resources is a resources server written on the owner: the notes server,
// SWE-bench. The transport does everything else — cookies, the rollout
// prefix, admission, the checkpoint control plane, /close_session,
// /sandbox_access, the error envelope — and calls these methods with the
// request's Session.
//
// Methods get the request body as a copy they may keep. They return a value
// to send as JSON, or an error: a *problem.Error is sent as it is,
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

// Closer is a Resources with work of its own to end at shutdown (the
// SWE-bench server's preparations and gradings, each in a sandbox of its
// own): Close ends it and returns once its sandboxes are stopped, or with
// ctx's error. The server calls it once the requests in flight are
// drained or cut, before the owner and the provider close.
type Closer interface {
	Close(ctx context.Context) error
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

// Invalid is a 422 invalid_request: a body that is not JSON, or of the
// wrong types.
func Invalid(format string, args ...any) *problem.Error {
	return control.ErrInvalidRequest.With(format, args...)
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
