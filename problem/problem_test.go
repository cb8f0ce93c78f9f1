package problem_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/problem"
)

func TestErrorText(t *testing.T) {
	got := []string{
		(&problem.Error{Code: "stale_attempt"}).Error(),
		problem.Errorf(409, "stale_attempt", "attempt %d", 2).Error(),
	}
	if diff := cmp.Diff([]string{"stale_attempt", "stale_attempt: attempt 2"}, got); diff != "" {
		t.Fatal(diff)
	}
}

// TestMatchByCode: errors.Is holds for every error of the target's code,
// whatever its status, detail or cause, and through wrapping.
func TestMatchByCode(t *testing.T) {
	base := &problem.Error{Status: 409, Code: "stale_attempt"}
	cause := errors.New("disk full")
	for _, err := range []error{
		base.With("attempt %d", 2),
		base.Wrap(cause),
		fmt.Errorf("wrapped: %w", problem.Errorf(500, "stale_attempt", "x")),
	} {
		if !errors.Is(err, base) {
			t.Errorf("%v is not %v", err, base)
		}
		if errors.Is(err, &problem.Error{Code: "other"}) {
			t.Errorf("%v matched another code", err)
		}
	}
	if errors.Is(base, cause) {
		t.Error("an error without a cause matched one")
	}
}

func TestCopiesKeepStatusAndCause(t *testing.T) {
	base := &problem.Error{Status: 409, Code: "stale_attempt"}
	cause := errors.New("disk full")
	type view struct {
		Status       int
		Code, Detail string
		Cause        bool
	}
	see := func(e *problem.Error) view {
		return view{e.Status, e.Code, e.Detail, errors.Is(e, cause) && errors.Unwrap(e) == cause}
	}
	got := []view{see(base.With("attempt %d", 2)), see(base.Wrap(cause)), see(problem.Wrap(problem.StatusInternal, "commit_failed", cause))}
	want := []view{
		{409, "stale_attempt", "attempt 2", false},
		{409, "stale_attempt", "disk full", true},
		{500, "commit_failed", "disk full", true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatal(diff)
	}
	if base.Detail != "" || base.Err != nil {
		t.Fatalf("With or Wrap changed the original: %+v", base)
	}
}
