package actors_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/sandboxowner/owner/actors"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// flakyExec answers its first fails Execs unavailable, as a remote
// provider whose command stream was cut short does.
type flakyExec struct {
	*fake.Provider
	fails, calls int
}

func (f *flakyExec) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	f.calls++
	if f.calls <= f.fails {
		return provider.ExecResult{}, fmt.Errorf("stream cut: %w", provider.ErrUnavailable)
	}
	return f.Provider.Exec(ctx, h, req)
}

// pwd is run once more after an unavailable answer, and only once.
func TestWorkdirOfRunsPwdOnceMoreWhenUnavailable(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		fails, calls int
		ok           bool
	}{{0, 1, true}, {1, 2, true}, {2, 2, false}} {
		f := &flakyExec{Provider: fake.New(fake.Options{}), fails: tc.fails}
		h, err := f.Start(ctx, provider.Spec{Image: "img", Workdir: "/work"})
		if err != nil {
			t.Fatal(err)
		}
		dir, err := actors.WorkdirOf(ctx, f, h)
		if tc.ok && (err != nil || dir != "/work") || !tc.ok && !errors.Is(err, provider.ErrUnavailable) || f.calls != tc.calls {
			t.Errorf("%d unavailable answers: WorkdirOf = %q, %v after %d calls, want ok %v after %d", tc.fails, dir, err, f.calls, tc.ok, tc.calls)
		}
	}
}
