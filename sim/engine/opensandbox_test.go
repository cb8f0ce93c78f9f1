package engine

import (
	"fmt"
	"testing"
)

// TestOpenSandboxSeeds: the invariants hold when the owner drives the
// OpenSandbox client against the fake OpenSandbox server (whose runtime is
// the run's fake), and the calls really went over its API.
func TestOpenSandboxSeeds(t *testing.T) {
	cfg := Config{Sessions: 3, Steps: 16, Faults: DefaultFaults(), Provider: ProviderOpenSandbox}
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
			if st.Requests["POST /sandboxes"] == 0 {
				t.Errorf("no sandbox was created through the OpenSandbox API: %v", st.Requests)
			}
			if v := r.osb.Violations(); len(v) > 0 {
				t.Errorf("requests that break the spec: %v", v)
			}
		})
	}
}
