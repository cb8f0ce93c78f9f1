package owner

import "context"

// recover cleans up after a predecessor that did not shut down: snapshots
// tombstoned but not deleted, commit rounds that never committed, and
// sandboxes still running under an earlier incarnation of this server.
func (o *Owner) recover(ctx context.Context) error {
	return o.run(ctx, newRecovering(o.index != nil, o.caps.Lister != nil, o.name, o.incarnation))
}
