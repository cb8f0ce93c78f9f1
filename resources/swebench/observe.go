package swebench

import "time"

// Outcomes an Observer is told of an environment and of a validation.
const (
	// OutcomeOK: the environment was built (its step, if any, succeeded).
	OutcomeOK = "ok"
	// OutcomeFailed: the environment step ran and failed; the template's
	// instances are unavailable.
	OutcomeFailed = "failed"
	// OutcomeError: the environment or validation could not be made or
	// run at all (nothing is kept; a later request tries again).
	OutcomeError = "error"
	// OutcomeAvailable: the validation found the instance's environment
	// able to run its tests.
	OutcomeAvailable = "available"
	// OutcomeUnavailable: the validation refused the instance.
	OutcomeUnavailable = "unavailable"
)

// Observer is told of every environment this server builds and every
// validation it runs, with its outcome and how long it took; those found on
// disk (built by another server sharing the template_dir, or an earlier
// run) are not built again and not told. It must be safe for concurrent
// use.
type Observer interface {
	Environment(outcome string, d time.Duration)
	Validation(outcome string, d time.Duration)
}

// noObserver is the Observer of a server given none.
type noObserver struct{}

func (noObserver) Environment(string, time.Duration) {}
func (noObserver) Validation(string, time.Duration)  {}
