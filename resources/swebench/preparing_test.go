package swebench

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/provider"
)

// heldValidation is a provider whose validation sandboxes wait, once
// asked for, until the test lets them start.
type heldValidation struct {
	provider.Provider
	asked   chan struct{}
	release chan struct{}
}

func holdValidations(p *provider.Provider) *heldValidation {
	h := &heldValidation{Provider: *p, asked: make(chan struct{}, 16), release: make(chan struct{})}
	*p = h
	return h
}

func (h *heldValidation) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	if spec.Metadata["swebench_role"] == roleValidation {
		h.asked <- struct{}{}
		select {
		case <-h.release:
		case <-ctx.Done():
			return provider.Handle{}, ctx.Err()
		}
	}
	return h.Provider.Start(ctx, spec)
}

func health(t *testing.T, c *client) map[string]json.RawMessage {
	t.Helper()
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("GET")
	ctx.Request.SetRequestURI(httpapi.RouteHealth)
	c.srv.Handler()(&ctx)
	var got map[string]json.RawMessage
	if err := json.Unmarshal(ctx.Response.Body(), &got); err != nil || ctx.Response.StatusCode() != 200 {
		t.Fatalf("/health: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	return got
}

func preparingOf(t *testing.T, c *client) []Preparing {
	t.Helper()
	var got []Preparing
	if err := json.Unmarshal(health(t, c)["preparing"], &got); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		got[i].ElapsedSeconds, got[i].PhaseSeconds = 0, 0 // the wall clock's
	}
	return got
}

func TestAWaitingSeedShowsItsPhaseInHealth(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	var held *heldValidation
	_, own, srv := newGolden(t, tk, func(c *Config, p *provider.Provider) {
		held = holdValidations(p)
	})
	c := newHTTP(t, own, srv)
	id := "example__calc-health-" + runSuffix(t)
	row := mustJSON(t, tk.row(id))
	seeded := make(chan reply, 1)
	go func() { seeded <- c.post("/ng-rollout/r-1/seed_session", row) }()
	<-held.asked
	want := []Preparing{{InstanceID: id, Repo: taskRepo, Phase: PhaseValidation, Waiting: 1}}
	if d := cmp.Diff(want, preparingOf(t, c)); d != "" {
		t.Errorf("/health preparing while the validation waits (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]int{PhaseTemplate: 0, PhaseEnvironment: 0, PhaseValidation: 1}, srv.PreparingByPhase()); d != "" {
		t.Errorf("by phase (-want +got):\n%s", d)
	}
	close(held.release)
	if r := <-seeded; r.status != 200 {
		t.Fatalf("seed: %d %s", r.status, r.body)
	}
	if got := preparingOf(t, c); len(got) != 0 {
		t.Errorf("/health preparing after the seed: %+v", got)
	}
}

func TestARefusingServerAnswersAtOnceWhilePreparing(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	var held *heldValidation
	_, own, srv := newGolden(t, tk, func(c *Config, p *provider.Provider) {
		c.WhilePreparing = WhilePreparingRefuse
		held = holdValidations(p)
	})
	c := newHTTP(t, own, srv)
	row := mustJSON(t, tk.row("example__calc-refuse-"+runSuffix(t)))
	for i := range 2 {
		r := c.post("/ng-rollout/r-1/seed_session", row)
		if r.status != 503 || r.code(t) != CodeEnvironmentPreparing || r.header["Retry-After"] != PreparingRetryAfter {
			t.Fatalf("seed %d: %d %s (Retry-After %q), want 503 %s with Retry-After %s", i, r.status, r.body, r.header["Retry-After"], CodeEnvironmentPreparing, PreparingRetryAfter)
		}
	}
	<-held.asked
	if got := preparingOf(t, c); len(got) != 1 || got[0].Phase != PhaseValidation {
		t.Errorf("/health preparing: %+v", got)
	}
	close(held.release)
	srv.awaitBackground()
	if n := len(held.asked); n != 0 {
		t.Errorf("%d more validations started: two refused seeds prepared the instance twice", n)
	}
	if r := c.post("/ng-rollout/r-1/seed_session", row); r.status != 200 {
		t.Fatalf("seed once prepared: %d %s", r.status, r.body)
	}
	r := c.post("/ng-rollout/r-1/verify", row)
	var res VerifyResult
	if err := json.Unmarshal(r.body, &res); err != nil || r.status != 200 {
		t.Fatalf("verify: %d %s", r.status, r.body)
	}
	wantResolved(t, res)

	// After a restart the instance is prepared on disk: the first seed is
	// served, and nothing is prepared again.
	var again *heldValidation
	_, own2, srv2 := newGolden(t, tk, func(c *Config, p *provider.Provider) {
		c.WhilePreparing = WhilePreparingRefuse
		again = holdValidations(p)
	})
	t.Cleanup(func() { close(again.release); srv2.awaitBackground() })
	if r := newHTTP(t, own2, srv2).post("/ng-rollout/r-2/seed_session", row); r.status != 200 {
		t.Fatalf("the first seed after a restart: %d %s", r.status, r.body)
	}
	if n := len(again.asked); n != 0 {
		t.Errorf("%d validations started after the restart", n)
	}
}
