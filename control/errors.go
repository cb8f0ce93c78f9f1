package control

import (
	"fmt"
	"net/http"
)

// Error is a protocol error: the code and HTTP status of the
// {"error":{"code","detail"}} envelope, and a detail for people.
type Error struct {
	Code   string
	Status int
	Detail string
	// Err is the cause, if any (errors.Is and errors.As see it).
	Err error
}

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Code
	}
	return e.Code + ": " + e.Detail
}

// Is matches errors of the same code, so errors.Is(err, ErrStaleCheckpoint)
// holds for every stale_checkpoint error whatever its detail.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Err }

// With returns a copy of e with a detail.
func (e *Error) With(format string, args ...any) *Error {
	return &Error{Code: e.Code, Status: e.Status, Detail: fmt.Sprintf(format, args...)}
}

// Wrap returns a copy of e caused by err, with err's text as the detail.
func (e *Error) Wrap(err error) *Error {
	return &Error{Code: e.Code, Status: e.Status, Detail: err.Error(), Err: err}
}

// The checkpoint protocol's errors, by the codes its controllers branch
// on, for errors.Is. Use With to
// add a detail; never modify them.
var (
	ErrStaleCheckpoint        = &Error{Code: "stale_checkpoint", Status: http.StatusConflict}
	ErrCheckpointConflict     = &Error{Code: "checkpoint_conflict", Status: http.StatusConflict}
	ErrInvalidPhase           = &Error{Code: "invalid_phase", Status: http.StatusConflict}
	ErrDeadlineExceeded       = &Error{Code: "deadline_exceeded", Status: http.StatusConflict}
	ErrStaleAttempt           = &Error{Code: "stale_attempt", Status: http.StatusConflict}
	ErrAdmissionClosed        = &Error{Code: "admission_closed", Status: http.StatusConflict}
	ErrRestartInScope         = &Error{Code: "restart_in_scope", Status: http.StatusConflict}
	ErrCheckpoint             = &Error{Code: "checkpoint_error", Status: http.StatusConflict}
	ErrRolloutIDRequired      = &Error{Code: "rollout_id_required", Status: http.StatusBadRequest}
	ErrUnauthorized           = &Error{Code: "unauthorized", Status: http.StatusUnauthorized}
	ErrInvalidCheckpointState = &Error{Code: "invalid_checkpoint_state", Status: http.StatusUnprocessableEntity}
	// ErrInvalidRequest: a body that does not validate (422, as FastAPI
	// answers upstream).
	ErrInvalidRequest = &Error{Code: "invalid_request", Status: http.StatusUnprocessableEntity}
	// ErrShuttingDown: the server is stopping; a waiting request is let go.
	ErrShuttingDown = &Error{Code: "shutting_down", Status: http.StatusServiceUnavailable}
)
