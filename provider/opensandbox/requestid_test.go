package opensandbox_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/sirupsen/logrus/hooks/test"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// TestLinesOfARequestNameIt: what the provider logs about a call made for
// a request carries that request's id; a call made for none carries no id.
func TestLinesOfARequestNameIt(t *testing.T) {
	lg, hook := test.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{Logger: lg})
	h := e.start(t, provider.Spec{})
	retried := func(ctx context.Context) logrus.Fields {
		t.Helper()
		hook.Reset()
		e.srv.Inject(opensandboxtest.Fault{Method: http.MethodGet, Path: "/v1/sandboxes/" + h.SandboxID, Status: 503})
		if _, err := e.p.Status(ctx, h); err != nil {
			t.Fatal(err)
		}
		for _, en := range hook.AllEntries() {
			if en.Message == "opensandbox: retrying" {
				return en.Data
			}
		}
		t.Fatal("no retry logged")
		return nil
	}
	if got := retried(logs.WithRequestID(context.Background(), "req-5"))[logs.RequestID]; got != "req-5" {
		t.Errorf("the retry of a request's call: request_id %v, want req-5", got)
	}
	if got, ok := retried(context.Background())[logs.RequestID]; ok {
		t.Errorf("the retry of a call for no request: request_id %v, want none", got)
	}
}
