package app_test

import (
	"context"
	"testing"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestPoolMetrics: the warm pools' families are there at zero from
// startup, and a seed that finds its pool empty counts a miss; with
// sandbox.pool.size 0 a seed counts neither.
func TestPoolMetrics(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 2} {
		fk := fake.New(fake.Options{})
		a, _, _ := startFake(t, t.TempDir(), fk, app.Deps{}, func(c *app.Config) { c.Sandbox.Pool.Size = size })
		fams := scrape(t, a.Addr().String())
		for _, name := range []string{"sandboxowner_pool_hits_total", "sandboxowner_pool_misses_total", "sandboxowner_pool_expired_total", "sandboxowner_pool_start_failures_total"} {
			check{name + " at startup", counter(t, fams, name, nil), 0}.verify(t)
		}
		for _, state := range []string{"ready", "starting"} {
			check{"pool sandboxes " + state + " at startup", gauge(t, fams, "sandboxowner_pool_sandboxes", map[string]string{"state": state}), 0}.verify(t)
		}
		if _, err := a.Owner().StartSessionSandbox(context.Background(), "s1", provider.Spec{Image: "notes"}, noSetup, ""); err != nil {
			t.Fatal(err)
		}
		fams = scrape(t, a.Addr().String())
		want := 0.0
		if size > 0 {
			want = 1
		}
		check{"misses after a seed", counter(t, fams, "sandboxowner_pool_misses_total", nil), want}.verify(t)
		check{"hits after a seed", counter(t, fams, "sandboxowner_pool_hits_total", nil), 0}.verify(t)
	}
}
