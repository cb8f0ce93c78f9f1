package sandboxapi

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// TestABodyOfExactlyMaxBodyIsServed: the cap is on more than MaxBody bytes;
// a handler left at zero takes DefaultMaxBody.
func TestABodyOfExactlyMaxBodyIsServed(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	uri := "/sandboxes/" + id + "/files?path="
	at := strings.Repeat("x", w.h.MaxBody)
	if got := codeOf(t, w.do("PUT", uri+"at", token, []byte(at))); got.Status != 200 {
		t.Errorf("a body of MaxBody bytes: %+v, want 200", got)
	}
	if got := codeOf(t, w.do("PUT", uri+"over", token, []byte(at+"x"))); got != errReply(413, "body_too_large") {
		t.Errorf("a body of MaxBody+1 bytes: %+v, want 413 body_too_large", got)
	}
	w.h.MaxBody = 0
	if got := codeOf(t, w.do("PUT", uri+"default", token, []byte(at+"x"))); got.Status != 200 {
		t.Errorf("MaxBody 0 (DefaultMaxBody): %+v, want 200", got)
	}
	if got := codeOf(t, w.do("PUT", uri+"over-default", token, make([]byte, DefaultMaxBody+1))); got != errReply(413, "body_too_large") {
		t.Errorf("DefaultMaxBody+1 bytes: %+v, want 413 body_too_large", got)
	}
}

// deadlineProvider records whether each Exec call was bounded.
type deadlineProvider struct {
	*local.Provider
	bounded []bool
}

func (p *deadlineProvider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	_, ok := ctx.Deadline()
	p.bounded = append(p.bounded, ok)
	return p.Provider.Exec(ctx, h, req)
}

// TestOnlyATimedCommandIsBoundedByTheHandler: a command with timeout_ms
// has the whole call bounded (its timeout and a grace); one without is left
// to the provider's own bound, never cut by the handler.
func TestOnlyATimedCommandIsBoundedByTheHandler(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	p := &deadlineProvider{Provider: w.p}
	w.h.Provider = p
	for _, body := range []string{`{"command":"true","timeout_ms":1000}`, `{"command":"true"}`, `{"command":"true","timeout_ms":0}`} {
		if r := w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(body)); r.Status != 200 {
			t.Fatalf("%s: %d %s", body, r.Status, r.Body)
		}
	}
	if diff := cmp.Diff([]bool{true, false, false}, p.bounded); diff != "" {
		t.Errorf("calls bounded (-want +got):\n%s", diff)
	}
}

// TestRefusalsAreLoggedWithTheirSandbox: a refused request and a failed
// provider call each leave one line naming the sandbox, status and code;
// a handler without a logger answers the same and logs nothing.
func TestRefusalsAreLoggedWithTheirSandbox(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	w.h.Logger = log
	requests := []struct{ method, uri, body string }{
		{"POST", "/sandboxes/" + id + "/exec", `{"cwd":"."}`},
		{"GET", "/sandboxes/" + id + "/files?path=nope", ""},
	}
	type line struct {
		Msg       string
		SandboxID any
		Status    any
		Code      any
	}
	var got []line
	for _, r := range requests {
		w.do(r.method, r.uri, token, []byte(r.body))
	}
	for _, e := range hook.AllEntries() {
		got = append(got, line{e.Message, e.Data["sandbox_id"], e.Data["status"], e.Data["code"]})
	}
	want := []line{
		{"sandboxapi: refused", id, 422, "invalid_request"},
		{"sandboxapi: provider call failed", id, 404, "file_not_found"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("log lines (-want +got):\n%s", diff)
	}
	w.h.Logger = nil
	var answers []reply
	for _, r := range requests {
		answers = append(answers, codeOf(t, w.do(r.method, r.uri, token, []byte(r.body))))
	}
	if diff := cmp.Diff([]reply{errReply(422, "invalid_request"), errReply(404, "file_not_found")}, answers); diff != "" {
		t.Errorf("answers without a logger (-want +got):\n%s", diff)
	}
}

// timeoutProvider answers every exec at once, recording its timeout, so that
// a request's timeout_ms can sit on its bounds with nothing run that long.
type timeoutProvider struct {
	*local.Provider
	timeouts []time.Duration
}

func (p *timeoutProvider) Exec(_ context.Context, _ provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	p.timeouts = append(p.timeouts, req.Timeout)
	return provider.ExecResult{}, nil
}

// TestTimeoutMSOnItsBounds: timeout_ms is taken up to MaxTimeout and refused
// a millisecond over it; without a MaxTimeout, up to the largest that still
// fits a time.Duration with the call's grace; 0 is no timeout either way.
func TestTimeoutMSOnItsBounds(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	p := &timeoutProvider{Provider: w.p}
	w.h.Provider = p
	fits := int64((math.MaxInt64 - execGrace) / time.Millisecond)
	for _, c := range []struct {
		max  time.Duration
		ms   int64
		want int
	}{
		{2 * time.Second, 2000, 200},
		{2 * time.Second, 2001, 422},
		{2 * time.Second, 0, 200},
		{0, 1000, 200},
		{0, fits, 200},
		{0, fits + 1, 422},
	} {
		w.h.MaxTimeout = c.max
		r := w.do("POST", "/sandboxes/"+id+"/exec", token, []byte(fmt.Sprintf(`{"command":"true","timeout_ms":%d}`, c.ms)))
		if r.Status != c.want {
			t.Errorf("timeout_ms %d under a maximum of %v: %d %s, want %d", c.ms, c.max, r.Status, r.Body, c.want)
		}
	}
	want := []time.Duration{2 * time.Second, 0, time.Second, time.Duration(fits) * time.Millisecond}
	if diff := cmp.Diff(want, p.timeouts); diff != "" {
		t.Errorf("the timeouts the provider was given (-want +got):\n%s", diff)
	}
}

// unavailableProvider's backend gives no answer: every call fails with
// provider.ErrUnavailable, as an OpenSandbox call does whose look at the
// sandbox before connecting to its execd got none.
type unavailableProvider struct{ *local.Provider }

func (unavailableProvider) Exec(context.Context, provider.Handle, provider.ExecRequest) (provider.ExecResult, error) {
	return provider.ExecResult{}, fmt.Errorf("exec: %w", provider.ErrUnavailable)
}

func (unavailableProvider) WriteFile(context.Context, provider.Handle, string, []byte) error {
	return fmt.Errorf("write: %w", provider.ErrUnavailable)
}

// TestAnUnavailableProviderIsARetryable503: a call the provider could not
// make for want of its backend's answer is 503 provider_unavailable with
// Retry-After, as the resources server answers it, not a 500.
func TestAnUnavailableProviderIsARetryable503(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	w.h.Provider = unavailableProvider{w.p}
	for _, c := range []struct{ method, uri, body string }{
		{"POST", "/sandboxes/" + id + "/exec", `{"command":"true"}`},
		{"PUT", "/sandboxes/" + id + "/files?path=x", "x"},
	} {
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod(c.method)
		ctx.Request.SetRequestURI(c.uri)
		ctx.Request.Header.Set("Authorization", "Bearer "+token)
		ctx.Request.SetBody([]byte(c.body))
		w.h.Serve(&ctx)
		got := codeOf(t, reply{ctx.Response.StatusCode(), string(ctx.Response.Body())})
		if ra := string(ctx.Response.Header.Peek("Retry-After")); got != errReply(503, "provider_unavailable") || ra != "5" {
			t.Errorf("%s %s: %+v with Retry-After %q, want 503 provider_unavailable with 5", c.method, c.uri, got, ra)
		}
	}
}

// outcomeLostProvider's Exec sent its command and lost its outcome (an
// execd stream cut before its final event).
type outcomeLostProvider struct{ provider.Provider }

func (outcomeLostProvider) Exec(context.Context, provider.Handle, provider.ExecRequest) (provider.ExecResult, error) {
	return provider.ExecResult{}, fmt.Errorf("exec: %w (%w)", provider.ErrUnavailable, provider.ErrOutcomeLost)
}

// TestAnExecWhoseOutcomeWasLostSaysARetryRunsItAgain: still a retryable
// 503 provider_unavailable, but its detail does not claim that nothing
// ran: a retry runs the command a second time.
func TestAnExecWhoseOutcomeWasLostSaysARetryRunsItAgain(t *testing.T) {
	w := newWorld(t)
	id, token := w.sandbox(t)
	w.h.Provider = outcomeLostProvider{w.p}
	var ctx fasthttp.RequestCtx
	ctx.Request.Header.SetMethod("POST")
	ctx.Request.SetRequestURI("/sandboxes/" + id + "/exec")
	ctx.Request.Header.Set("Authorization", "Bearer "+token)
	ctx.Request.SetBody([]byte(`{"command":"true"}`))
	w.h.Serve(&ctx)
	var body struct {
		Error struct{ Code, Detail string } `json:"error"`
	}
	if err := json.Unmarshal(ctx.Response.Body(), &body); err != nil {
		t.Fatal(err)
	}
	got := []string{strconv.Itoa(ctx.Response.StatusCode()), body.Error.Code, body.Error.Detail, string(ctx.Response.Header.Peek("Retry-After"))}
	want := []string{"503", "provider_unavailable", "the command was sent and may have run, but its outcome was lost; a retry runs it again", "5"}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("the reply (-want +got):\n%s", d)
	}
}
