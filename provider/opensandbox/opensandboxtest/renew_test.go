package opensandboxtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// A renewal moves the lease of the runtime under the sandbox too, not only
// the expiresAt the server answers: else the runtime (here the backend)
// ends the sandbox at its first expiry while the server says it lives on.
func TestARenewMovesTheBackendsLease(t *testing.T) {
	backend := fake.New(fake.Options{Clock: clock.NewManual(t0), IDPrefix: "backend-"})
	c := newClient(t, opensandboxtest.Options{Backend: backend})
	_, m, _ := c.call("POST", "/v1/sandboxes", create, nil)
	id, _ := m["id"].(string)
	until := t0.Add(300 * time.Second)
	if st, m, _ := c.call("POST", "/v1/sandboxes/"+id+"/renew-expiration", `{"expiresAt":"`+until.Format(time.RFC3339)+`"}`, nil); st != 200 {
		t.Fatalf("renew: %d %v", st, m)
	}
	infos, err := backend.ListSandboxes(context.Background())
	if err != nil || len(infos) != 1 {
		t.Fatalf("the backend's sandboxes: %v, %v; want one", infos, err)
	}
	if got := infos[0].ExpiresAt; !got.Equal(until) {
		t.Errorf("the backend's lease ends at %v, want %v (the renewal's)", got, until)
	}
}
