package control

import (
	"net/http"

	"github.com/sandboxowner/owner/problem"
)

// The checkpoint protocol's errors, by the codes its controllers branch
// on, for errors.Is. Use With to
// add a detail; never modify them.
var (
	ErrStaleCheckpoint        = &problem.Error{Code: "stale_checkpoint", Status: http.StatusConflict}
	ErrCheckpointConflict     = &problem.Error{Code: "checkpoint_conflict", Status: http.StatusConflict}
	ErrInvalidPhase           = &problem.Error{Code: "invalid_phase", Status: http.StatusConflict}
	ErrDeadlineExceeded       = &problem.Error{Code: "deadline_exceeded", Status: http.StatusConflict}
	ErrStaleAttempt           = &problem.Error{Code: "stale_attempt", Status: http.StatusConflict}
	ErrAdmissionClosed        = &problem.Error{Code: "admission_closed", Status: http.StatusConflict}
	ErrRestartInScope         = &problem.Error{Code: "restart_in_scope", Status: http.StatusConflict}
	ErrCheckpoint             = &problem.Error{Code: "checkpoint_error", Status: http.StatusConflict}
	ErrRolloutIDRequired      = &problem.Error{Code: "rollout_id_required", Status: http.StatusBadRequest}
	ErrUnauthorized           = &problem.Error{Code: "unauthorized", Status: http.StatusUnauthorized}
	ErrInvalidCheckpointState = &problem.Error{Code: "invalid_checkpoint_state", Status: http.StatusUnprocessableEntity}
	// ErrInvalidRequest: a body that does not validate (422, as FastAPI
	// answers upstream).
	ErrInvalidRequest = &problem.Error{Code: "invalid_request", Status: http.StatusUnprocessableEntity}
	// ErrShuttingDown: the server is stopping; a waiting request is let go.
	ErrShuttingDown = &problem.Error{Code: "shutting_down", Status: http.StatusServiceUnavailable}
)
