package local

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// Kept results are what the first probe of each name found; with none
// kept every probe runs.
func TestProbeResultsAreKeptByName(t *testing.T) {
	t.Parallel()
	calls := map[string]int{}
	probe := func(name string, err error) func() error {
		return func() error { calls[name]++; return err }
	}
	errA := errors.New("a fails")
	r := newProbeResults()
	var got []error
	for range 2 {
		got = append(got, r.run("a", probe("a", errA)), r.run("b", probe("b", nil)))
	}
	var none *probeResults
	for range 2 {
		got = append(got, none.run("c", probe("c", nil)))
	}
	if diff := cmp.Diff([]error{errA, nil, errA, nil, nil, nil}, got, cmp.Comparer(func(x, y error) bool { return x == y })); diff != "" {
		t.Errorf("results (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"a": 1, "b": 1, "c": 2}, calls); diff != "" {
		t.Errorf("probes run (-want +got):\n%s", diff)
	}
}
