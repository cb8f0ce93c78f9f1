package provider_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

func TestStopRetryingTriesThreeTimes(t *testing.T) {
	ctx := context.Background()
	for fails, wantErr := range map[int]bool{0: false, 2: false, 3: true} {
		fk := fake.New(fake.Options{Seed: 1})
		h, err := fk.Start(ctx, provider.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		fk.FailNext(fake.OpStop, fails)
		err = provider.StopRetrying(ctx, fk, h)
		if (err != nil) != wantErr || (wantErr && !errors.Is(err, provider.ErrInjected)) {
			t.Errorf("%d failures: err %v, want error %v", fails, err, wantErr)
		}
		if live := fk.Stats().LiveSandboxes; (live == 1) != wantErr {
			t.Errorf("%d failures: %d sandboxes live", fails, live)
		}
	}
	// A context that ended stops the retries at once.
	fk := fake.New(fake.Options{Seed: 1})
	h, _ := fk.Start(ctx, provider.Spec{})
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := provider.StopRetrying(gone, fk, h); err == nil {
		t.Fatal("a stop with an ended context succeeded")
	}
	if n := fk.Stats().Calls[fake.OpStop]; n != 1 {
		t.Fatalf("%d stop calls with an ended context, want 1", n)
	}
}
