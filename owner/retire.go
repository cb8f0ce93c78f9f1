package owner

import (
	"context"
)

// RetireResult is what a retire stopped.
type RetireResult struct {
	Stopped []string
	Failed  map[string]string
}

// Retire stops the sandboxes of discarded attempts and keeps their
// snapshots. It is idempotent; a failed stop keeps the session so that a
// retry stops it. ctx bounds the wait for the control turn as well as the
// stops.
func (o *Owner) Retire(ctx context.Context, sessionIDs []string) (RetireResult, error) {
	m := newRetiring(sessionIDs)
	err := o.run(ctx, m)
	return m.res, err
}
