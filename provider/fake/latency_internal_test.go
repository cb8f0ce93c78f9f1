package fake

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// The drawn delays are not observable from outside without timing, so this
// checks the draw itself: in range, and the same for the same seed.
func TestLatencyRangeIsSeeded(t *testing.T) {
	draws := func(seed int64) []time.Duration {
		p := New(Options{Seed: seed})
		p.SetLatencyRange(OpExec, time.Millisecond, 5*time.Millisecond)
		var out []time.Duration
		for range 50 {
			p.ctl.Lock()
			out = append(out, p.delayLocked(OpExec))
			p.ctl.Unlock()
		}
		return out
	}
	a := draws(3)
	if d := cmp.Diff(a, draws(3)); d != "" {
		t.Fatalf("same seed, different delays:\n%s", d)
	}
	distinct := map[time.Duration]bool{}
	for _, d := range a {
		if d < time.Millisecond || d > 5*time.Millisecond {
			t.Fatalf("delay %v outside [1ms, 5ms]", d)
		}
		distinct[d] = true
	}
	if len(distinct) < 2 {
		t.Fatalf("50 draws gave %d distinct delays", len(distinct))
	}
}
