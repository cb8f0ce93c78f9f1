package engine

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/sandboxowner/owner/provider/fake"
)

// TestOpenSandboxSeeds: the invariants hold when the owner drives the
// OpenSandbox client against the fake OpenSandbox server (whose runtime is
// the run's fake), and the calls really went over its API.
func TestOpenSandboxSeeds(t *testing.T) {
	cfg := Config{Sessions: 3, Steps: 16, Faults: DefaultFaults(), Provider: ProviderOpenSandbox}
	// A seed may draw no seed step; the set as a whole must create
	// sandboxes through the API.
	var created atomic.Int64
	t.Cleanup(func() {
		if created.Load() == 0 {
			t.Error("no run created a sandbox through the OpenSandbox API")
		}
	})
	for s := int64(2001); s <= 2012; s++ {
		t.Run(fmt.Sprintf("seed-%d", s), func(t *testing.T) {
			t.Parallel()
			c := cfg
			c.TempDir = t.TempDir()
			r := newRun(s, c)
			res := r.exec()
			for _, v := range res.Violations {
				t.Errorf("%s\n  replay: go run ./sim -provider opensandbox -seed %d -runs 1 -sessions %d -steps %d -v", v, s, c.Sessions, c.Steps)
			}
			if r.osb == nil {
				t.Fatal("the run did not use the OpenSandbox server")
			}
			st := r.osb.Stats()
			created.Add(int64(st.Requests["POST /sandboxes"]))
			if started := r.fk.Stats().Calls[fake.OpStart]; started > 0 && st.Requests["POST /sandboxes"] == 0 {
				t.Errorf("%d sandboxes started, none through the OpenSandbox API: %v", started, st.Requests)
			}
			if v := r.osb.Violations(); len(v) > 0 {
				t.Errorf("requests that break the spec: %v", v)
			}
		})
	}
}
