package http_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/problem"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
	"github.com/sandboxowner/owner/sandbox"
)

// picky is the notes server refusing a row that asks it to, and seeding
// without a sandbox a row that says "bare".
type picky struct{ *notes.Server }

func (p picky) Seed(ctx context.Context, sess *resources.Session, row []byte) (any, error) {
	switch {
	case bytes.Contains(row, []byte("refuse")):
		return nil, problem.Errorf(422, "bad_row", "refused")
	case bytes.Contains(row, []byte("bare")):
		return map[string]any{}, nil
	}
	return p.Server.Seed(ctx, sess, row)
}

func pickySeed(id, rollout, task, data string) map[string]any {
	s := typedSeed(id, ep(rollout, 0), "notes", task)
	s["task_data"] = map[string]any{"expected_notes": []string{data}}
	return s
}

// TestATypedSeedTheResourcesRefuse: the refusal is the seed's reply, and
// the session is not left bound to the refused task: a seed of another
// task then succeeds. A seed that starts no sandbox answers no
// sandbox_access.
func TestATypedSeedTheResourcesRefuse(t *testing.T) {
	h := newHarness(t, withResources(picky{notes.New(notes.Options{})}))
	h.want(h.post(&agent{}, "/seed_session", pickySeed("s-1", "r1", "t1", "refuse")), 422, "bad_row", "a refused row")
	h.ok(h.post(&agent{}, "/seed_session", pickySeed("s-1", "r1", "t2", "one")), "a seed of another task after the refusal")
	// A refused retry of a seed that succeeded keeps its binding.
	h.want(h.post(&agent{}, "/seed_session", pickySeed("s-1", "r1", "t2", "refuse")), 422, "bad_row", "a refused retry")
	h.want(h.post(&agent{}, "/seed_session", pickySeed("s-1", "r1", "t3", "one")), 409, httpapi.CodeSessionConflict, "another task after a refused retry")

	got := h.ok(h.post(&agent{}, "/seed_session", pickySeed("s-2", "r2", "t1", "bare")), "a seed without a sandbox")
	if got["sandbox_access"] != nil || got["resources_session_id"] != "s-2" {
		t.Errorf("seed without a sandbox: %v", got)
	}
}

// TestAccessAddsToTheDescriptor: the Access hook's fields are in
// /sandbox_access's descriptor and in a typed seed's sandbox_access; its
// refusal is both calls' error; a field that cannot be encoded is a 500.
func TestAccessAddsToTheDescriptor(t *testing.T) {
	mode := "add"
	h := newHarness(t, withConfig(func(c *httpapi.Config) {
		c.Access = func(_ *resources.Session, sb sandbox.Sandbox, d map[string]any) error {
			switch mode {
			case "refuse":
				return problem.Errorf(503, "no_exec_api", "no exec API")
			case "unencodable":
				d["c"] = make(chan int)
			default:
				d["endpoint"] = "http://exec/" + sb.Handle.SandboxID
			}
			return nil
		}
	}))
	a := &agent{}
	seed := h.ok(h.post(a, "/seed_session", typedSeed("s-1", ep("r1", 0), "notes", "t1")), "typed seed")
	sb := h.sandboxID(a)
	want := map[string]any{"sandbox_id": sb, "workdir": nil, "endpoint": "http://exec/" + sb}
	access := h.ok(h.post(a, "/sandbox_access", nil), "access")
	for what, got := range map[string]any{"seed": seed["sandbox_access"], "/sandbox_access": access} {
		d, _ := got.(map[string]any)["connection"].(map[string]any)["descriptor"].(map[string]any)
		delete(d, "workdir") // the fake's
		delete(want, "workdir")
		if diff := cmp.Diff(want, d); diff != "" {
			t.Errorf("%s's descriptor (-want +got):\n%s", what, diff)
		}
	}
	mode = "refuse"
	h.want(h.post(a, "/sandbox_access", nil), 503, "no_exec_api", "access refused")
	h.want(h.post(&agent{}, "/seed_session", typedSeed("s-2", ep("r2", 0), "notes", "t1")), 503, "no_exec_api", "typed seed with the access refused")
	mode = "unencodable"
	h.want(h.post(a, "/sandbox_access", nil), 500, httpapi.CodeInternal, "an unencodable descriptor")
}

// TestAFailedCloseIsRetried: a close whose stop fails is refused and
// leaves the session's sandbox and cookie (none is deleted); the retry stops it. The same
// for a close naming its session.
func TestAFailedCloseIsRetried(t *testing.T) {
	h := newHarness(t)
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	h.ok(h.post(&agent{}, "/seed_session", typedSeed("s-2", ep("r2", 0), "notes", "t1")), "typed seed")
	for _, tc := range []struct {
		name string
		a    *agent
		body any
	}{{"the cookie's", a, nil}, {"a named", nil, map[string]any{"resources_session_id": "s-2"}}} {
		sid := "s-2"
		if tc.a != nil {
			sid = sessionID(tc.a)
		}
		held, ok := h.own.SessionSandbox(context.Background(), sid)
		if !ok {
			t.Fatalf("%s: session %s holds no sandbox", tc.name, sid)
		}
		sb := held.Handle.SandboxID
		h.fake().FailNext(fake.OpStop, 1)
		r := h.post(tc.a, "/close_session", tc.body)
		if r.status != 500 || r.code() != httpapi.CodeInternal || r.cookie == "-" || !h.live(sb) {
			t.Errorf("%s close with its stop failing: %d %s, cookie %q, sandbox live %v", tc.name, r.status, r.body, r.cookie, h.live(sb))
		}
		h.ok(h.post(tc.a, "/close_session", tc.body), tc.name+" close again")
		if h.live(sb) {
			t.Errorf("%s close again left %s live", tc.name, sb)
		}
	}
}

// oddGrader is the notes server grading some requests with a reply that is
// no JSON object, or that cannot be encoded.
type oddGrader struct{ *notes.Server }

func (g oddGrader) Verify(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
	switch {
	case bytes.Contains(body, []byte("list")):
		return []int{1}, nil
	case bytes.Contains(body, []byte("chan")):
		return map[string]any{"c": make(chan int)}, nil
	}
	return g.Server.Verify(ctx, sess, body)
}

// TestAVerifyReplyThatCannotExtendItsRequest: a grader's reply that is no
// JSON object, or cannot be encoded, is the server's 500, never a reply
// that drops the request's fields.
func TestAVerifyReplyThatCannotExtendItsRequest(t *testing.T) {
	h := newHarness(t, withResources(oddGrader{notes.New(notes.Options{})}))
	for _, odd := range []string{"list", "chan"} {
		a := &agent{}
		h.ok(h.post(a, "/seed_session", nil), "seed")
		h.want(h.post(a, "/verify", map[string]any{"expected_notes": []string{odd}}), 500, httpapi.CodeInternal, "a reply of "+odd)
	}
}

// failing is the notes server with a tool failing with the errors of the
// layers below the server, by name.
type failing struct{ *notes.Server }

var belowErrors = map[string]error{
	"setup":       fmt.Errorf("seed: %w", sandbox.ErrSetup),
	"unavailable": fmt.Errorf("start: %w", provider.ErrUnavailable),
	"closed":      fmt.Errorf("start: %w", owner.ErrClosed),
	"none":        fmt.Errorf("exec: %w", sandbox.ErrNone),
}

func (f failing) Tools() map[string]resources.ToolFunc {
	tools := f.Server.Tools()
	tools["/below"] = func(_ context.Context, _ *resources.Session, body []byte) (any, error) {
		var req struct{ Err string }
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return nil, belowErrors[req.Err]
	}
	return tools
}

// TestErrorsFromBelow: each error of the owner, the provider or a sandbox's
// setup is answered with its status, envelope code and Retry-After; only
// the server's own 500 is logged as a failure.
func TestErrorsFromBelow(t *testing.T) {
	h := newHarness(t, withResources(failing{notes.New(notes.Options{})}))
	a := &agent{}
	h.ok(h.post(a, "/seed_session", nil), "seed")
	type answer struct {
		Status     int
		Code       string
		RetryAfter string
	}
	want := map[string]answer{
		"setup":       {500, httpapi.CodeSetupFailed, ""},
		"unavailable": {503, httpapi.CodeProviderUnavailable, httpapi.ProviderUnavailableRetryAfter},
		"closed":      {503, "shutting_down", ""},
		"none":        {409, httpapi.CodeNoSessionSandbox, ""},
	}
	got := map[string]answer{}
	for name := range want {
		r := h.post(a, "/below", map[string]any{"Err": name})
		got[name] = answer{r.status, r.code(), r.header["Retry-After"]}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
	var logged []string
	for _, e := range h.log.AllEntries() {
		if e.Message == "request failed" {
			logged = append(logged, e.Data["error"].(error).Error())
		}
	}
	if diff := cmp.Diff([]string{belowErrors["setup"].Error()}, logged); diff != "" {
		t.Errorf("failures logged (-want +got):\n%s", diff)
	}
}
