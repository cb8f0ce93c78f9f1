package http

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
