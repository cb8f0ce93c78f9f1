package aggregate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/sandboxowner/owner/aggregate"
)

// TestHandComputedExample: three tasks (one given by a response without a
// task index, one of a single rollout), a bool, a usage count, a field some
// responses lack, a string and a null; the figures were computed by hand.
func TestHandComputedExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "example.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ex struct {
		Request aggregate.Request `json:"request"`
		Want    json.RawMessage   `json:"want"`
	}
	if err := json.Unmarshal(b, &ex); err != nil {
		t.Fatal(err)
	}
	got, err := aggregate.Compute(ex.Request.VerifyResponses)
	if err != nil {
		t.Fatal(err)
	}
	// Compared as JSON, as a client sees them.
	var want, have any
	gb, _ := json.Marshal(got)
	if err := json.Unmarshal(gb, &have); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(ex.Want, &want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, have, cmpopts.EquateApprox(0, 1e-12)); diff != "" {
		t.Errorf("metrics (-want +got):\n%s", diff)
	}
}

func TestEmptyAndBadInput(t *testing.T) {
	got, err := aggregate.Compute(nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(got)
	if string(b) != `{"group_level_metrics":[],"agent_metrics":{},"key_metrics":{}}` {
		t.Errorf("no responses: %s", b)
	}
	for _, bad := range []any{"0", 1.5, true, map[string]any{}} {
		if _, err := aggregate.Compute([]map[string]any{{"reward": 1.0, "_ng_task_index": bad}}); err == nil {
			t.Errorf("task index %v accepted", bad)
		}
	}
}

// TestSingleResponseStdIsZero: one response varies by nothing; Gym reports
// a standard deviation of 0, not none.
func TestSingleResponseStdIsZero(t *testing.T) {
	got, err := aggregate.Compute([]map[string]any{{"reward": 1.0}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"mean/reward": 1.0, "max/reward": 1.0, "min/reward": 1.0, "median/reward": 1.0, "std/reward": 0.0}
	if diff := cmp.Diff(want, got.AgentMetrics); diff != "" {
		t.Errorf("agent metrics (-want +got):\n%s", diff)
	}
}
