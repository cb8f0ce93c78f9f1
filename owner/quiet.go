package owner

import (
	"context"
	"fmt"
)

// Holdings are what the owner's sessions hold that the index may not name
// (yet): a sweep of a running server keeps them.
type Holdings struct {
	// Sessions are the sessions tracked, starting ones included: a seed's
	// sandbox exists, labelled with its session, before the session holds
	// it.
	Sessions map[string]bool
	// Sandboxes are the sandboxes live sessions hold.
	Sandboxes map[string]bool
	// Snapshots are those live sandboxes were forked from, and those of
	// commits whose snapshots were taken but not stored (a retry stores
	// the same records).
	Snapshots map[string]bool
}

// Quiet runs fn while no commit, restore, retire, release or retention
// check runs: it waits for the one in flight (bounded by ctx) and holds the
// next off until fn returns, so that what fn reads of the index stays true
// while it acts on it. holdings reads what the sessions hold when it is
// called: a sweep calls it after listing the provider, so that any sandbox
// listed belongs to a session it finds, unless that session has ended.
func (o *Owner) Quiet(ctx context.Context, fn func(holdings func() (Holdings, error)) error) error {
	if err := o.ctl.Lock(ctx, o.rt); err != nil {
		return fmt.Errorf("waiting for another control operation: %w", err)
	}
	defer o.ctl.Unlock()
	return fn(o.holdings)
}

func (o *Owner) holdings() (Holdings, error) {
	h := Holdings{Sessions: map[string]bool{}, Sandboxes: map[string]bool{}, Snapshots: o.liveSnapshots()}
	ids, err := o.Sessions()
	if err != nil {
		return h, err
	}
	for _, id := range ids {
		h.Sessions[id] = true
	}
	for _, held := range o.dir.Holdings() {
		h.Sandboxes[held.Handle.SandboxID] = true
	}
	o.holdTemplates(&h)
	o.holdPools(&h)
	if err := o.writer.Lock(context.Background(), o.rt); err != nil {
		return h, err
	}
	defer o.writer.Unlock()
	// An unstored commit's records name every snapshot its round took.
	for _, u := range o.unstored {
		for _, r := range u.records {
			h.Snapshots[r.SnapshotID] = true
		}
	}
	return h, nil
}
