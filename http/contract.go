package http

import (
	"github.com/sandboxowner/owner/participant"
	"github.com/sandboxowner/owner/resources"
)

// ReleaseReply answers the release route.
type ReleaseReply = participant.ReleaseReply

// The resources contract, as this package serves it. The types live in
// package resources, which resources servers import; these names keep the
// server's own code and its callers short.
type (
	Resources = resources.Resources
	ToolFunc  = resources.ToolFunc
	Session   = resources.Session
	Error     = resources.Error
	// HealthReporter is a Resources that adds fields to /health.
	HealthReporter = resources.HealthReporter
)

// Wrap is resources.Wrap.
func Wrap(status int, code string, err error) *Error { return resources.Wrap(status, code, err) }

// Errorf is resources.Errorf.
func Errorf(status int, code, format string, args ...any) *Error {
	return resources.Errorf(status, code, format, args...)
}

// Invalid is resources.Invalid.
func Invalid(format string, args ...any) *Error { return resources.Invalid(format, args...) }

// DecodeData is resources.DecodeData.
func DecodeData(body []byte, v any) error { return resources.DecodeData(body, v) }

// CheckObject is resources.CheckObject.
func CheckObject(body []byte) error { return resources.CheckObject(body) }

// Codes this package answers with besides the protocol's.
const (
	// CodeNoSessionSandbox: the session holds no sandbox (409,
	// sandbox.ErrNone).
	CodeNoSessionSandbox = "no_session_sandbox"
	CodeNoSandboxAccess  = "no_sandbox_access"
	CodeSessionClosed    = "session_closed"
	CodeBodyTooLarge     = "body_too_large"
	CodeBadRequest       = "bad_request"
	CodeNotFound         = "not_found"
	CodeMethod           = "method_not_allowed"
	CodeInternal         = "internal_error"
	CodeSetupFailed      = "setup_failed"
	CodeInvalidCapture   = "invalid_capture_key"
	CodeCommitFailed     = participant.CodeCommitFailed
	CodeRestoreFailed    = participant.CodeRestoreFailed
	CodeRetireFailed     = participant.CodeRetireFailed
	CodeReleaseFailed    = participant.CodeReleaseFailed
	CodeAtCapacity       = "at_capacity"
	CodeSandboxLost      = "sandbox_lost"
	// CodeProviderUnavailable: the sandbox provider's backend cannot be
	// reached (503, with Retry-After).
	CodeProviderUnavailable = "provider_unavailable"
)

// ProviderUnavailableRetryAfter is the Retry-After (seconds) of a 503
// provider_unavailable.
const ProviderUnavailableRetryAfter = "5"

// AtCapacityRetryAfter is the Retry-After (seconds) of a 503 at_capacity.
const AtCapacityRetryAfter = "30"

// decodeControl decodes a control body strictly.
func decodeControl(body []byte, v any) error { return resources.DecodeStrict(body, v) }

func jsonProblem(err error) string { return resources.JSONProblem(err) }
