// Package problem is the one error type the server's HTTP surfaces answer
// with: a status, the code and detail of the {"error":{"code","detail"}}
// envelope, and a cause. The checkpoint protocol's errors (package
// control), a resources server's refusals (package resources) and the
// participant's failures are all *Error, so a transport answers any of
// them the same way.
package problem

import "fmt"

// StatusInternal is the status of a failure that is the server's, not the
// caller's (HTTP 500).
const StatusInternal = 500

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

func (e *Error) Error() string {
	if e.Detail == "" {
		return e.Code
	}
	return e.Code + ": " + e.Detail
}

// Is matches errors of the same code, so errors.Is(err, target) holds for
// every error of target's code whatever its detail.
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

// Wrap makes an *Error caused by err, with err's text as the detail.
func Wrap(status int, code string, err error) *Error {
	return &Error{Status: status, Code: code, Detail: err.Error(), Err: err}
}

// Errorf makes an *Error.
func Errorf(status int, code, format string, args ...any) *Error {
	return &Error{Status: status, Code: code, Detail: fmt.Sprintf(format, args...)}
}
