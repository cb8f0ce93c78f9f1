package http_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/gymcheck"
)

// gymVerify is a verify request as a Gym agent sends it: the task's
// responses_create_params, the model's response, and the dataset row's
// fields.
func gymVerify(row map[string]any) map[string]any {
	req := map[string]any{
		"responses_create_params": map[string]any{
			"input": []any{map[string]any{"role": "user", "content": "append one"}},
			"tools": []any{map[string]any{"type": "function", "name": "append_note"}},
		},
		"response": map[string]any{
			"id": "resp_1", "object": "response", "created_at": 1.0, "model": "policy",
			"output":              []any{map[string]any{"type": "message", "role": "assistant", "content": []any{}}},
			"parallel_tool_calls": false, "tool_choice": "auto", "tools": []any{},
		},
		"_ng_task_index": 3.0,
	}
	for k, v := range row {
		req[k] = v
	}
	return req
}

func TestVerifyReplyExtendsItsRequest(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/ng-rollout/r1/seed_session", nil), "seed")
	h.ok(h.post(a, "/ng-rollout/r1/append_note", map[string]any{"line": "one"}), "append")
	// The request's own reward and notes are the grader's to say.
	req := gymVerify(map[string]any{"expected_notes": []any{"one"}, "row_extra": map[string]any{"k": []any{1.0, "x"}}, "reward": 7.0, "notes": []any{"forged"}})
	raw, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	r := h.post(a, "/ng-rollout/r1/verify", raw)
	got := h.ok(r, "verify")
	want := map[string]any{}
	for k, v := range req {
		want[k] = v
	}
	want["reward"], want["notes"], want["token_matches"] = 1.0, []any{"one"}, true
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verify reply (-want +got):\n%s", diff)
	}
	delete(req, "reward")
	delete(req, "notes")
	raw, _ = json.Marshal(req)
	gymcheck.Verify(t, "notes", raw, r.body)
}

func TestVerifyOfALegacyBodyStillAnswersItsGrade(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	got := h.ok(h.post(a, "/verify", map[string]any{"expected_notes": []string{}}), "verify of a body without Gym's fields")
	want := map[string]any{"reward": 1.0, "notes": []any{}, "expected_notes": []any{}, "token_matches": true}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("verify reply (-want +got):\n%s", diff)
	}
}
