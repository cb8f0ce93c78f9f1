package owner_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/snapshotindex"
)

// TestQuietHoldsControlOperationsOff: while Quiet's fn runs a commit waits
// (here until its context ends), and once it returns the commit runs.
func TestQuietHoldsControlOperationsOff(t *testing.T) {
	e := newEnv(t)
	o := e.open()
	seed(t, o, "s1")
	err := o.Quiet(context.Background(), func(func() (owner.Holdings, error)) error {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "c1"}); !errors.Is(err, context.Canceled) {
			t.Errorf("commit during Quiet: %v, want it to wait", err)
		}
		return errors.New("fn's error")
	})
	if err == nil || err.Error() != "fn's error" {
		t.Fatalf("Quiet returned %v, want fn's error", err)
	}
	commit(t, o, "c1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := o.Quiet(ctx, func(func() (owner.Holdings, error)) error { return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Quiet with an ended context: %v", err)
	}
}

// TestHoldingsNameWhatSessionsHold: the sessions, their sandboxes, the
// snapshot a restored session was forked from and the snapshots of a
// commit whose store failed.
func TestHoldingsNameWhatSessionsHold(t *testing.T) {
	e := newEnv(t)
	st := &failingStore{Store: snapshotindex.NewMemory().Open()}
	o := e.open(withStore(st))
	s1 := seed(t, o, "s1")
	commit(t, o, "c1")
	forkedFrom := snapshotIDs(t, o, "c1")
	if err := o.EndSessionSandbox(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Restore(context.Background(), owner.RestoreRequest{CheckpointID: "c1"}); err != nil {
		t.Fatal(err)
	}
	st.n.Store(1)
	if _, err := o.Commit(context.Background(), owner.CommitRequest{CheckpointID: "c2"}); !errors.Is(err, errStore) {
		t.Fatalf("commit c2: %v, want the store's failure", err)
	}
	h := holdings(t, o)
	if diff := cmp.Diff(map[string]bool{"s1": true}, h.Sessions); diff != "" {
		t.Errorf("sessions (-want +got):\n%s", diff)
	}
	if len(h.Sandboxes) != 1 || h.Sandboxes[s1.Handle.SandboxID] {
		t.Errorf("sandboxes %v: want the restored fork only, not %s", h.Sandboxes, s1.Handle.SandboxID)
	}
	var unstored []string
	for _, s := range e.fk.SnapshotIDs() {
		if !slices.Contains(forkedFrom, s) {
			unstored = append(unstored, s)
		}
	}
	want := map[string]bool{}
	for _, s := range append(forkedFrom, unstored...) {
		want[s] = true
	}
	if diff := cmp.Diff(want, h.Snapshots); diff != "" || len(unstored) != 1 {
		t.Errorf("snapshots (-want +got):\n%s\n(unstored %v)", diff, unstored)
	}
}

// holdings reads what o's sessions hold, in a Quiet.
func holdings(t *testing.T, o *owner.Owner) owner.Holdings {
	t.Helper()
	var h owner.Holdings
	if err := o.Quiet(context.Background(), func(holdings func() (owner.Holdings, error)) (err error) {
		h, err = holdings()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return h
}
