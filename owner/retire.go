package owner

import (
	"context"
	"fmt"

	"github.com/sandboxowner/owner/messages"
)

// RetireResult is what a retire stopped.
type RetireResult struct {
	Stopped []string
	Failed  map[string]string
}

// Retire stops the sandboxes of discarded attempts and keeps their
// snapshots. It is idempotent; a failed stop keeps the session so that a
// retry stops it.
func (o *Owner) Retire(ctx context.Context, sessionIDs []string) (RetireResult, error) {
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return RetireResult{}, fmt.Errorf("retire: waiting for another control operation: %w", err)
	}
	defer o.ctl.Unlock()
	stopped, failed := o.stopMany(ctx, sessionIDs, messages.StopRetire)
	res := RetireResult{Stopped: stopped, Failed: failed}
	if len(failed) > 0 {
		return res, fmt.Errorf("retire: %d of %d sessions could not be stopped", len(failed), len(sessionIDs))
	}
	return res, nil
}
