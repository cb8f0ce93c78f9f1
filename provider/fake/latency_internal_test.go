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

// TestFixedLatencyDrawsNothing: a fixed latency is itself and a range
// cleared by a top of 0 is none, neither drawing from the seeded RNG
// (another op's range draws the same with or without their calls); a range
// one nanosecond wide gives both its ends.
func TestFixedLatencyDrawsNothing(t *testing.T) {
	draws := func(other time.Duration, set func(p *Provider)) []time.Duration {
		p := New(Options{Seed: 3})
		p.SetLatencyRange(OpExec, time.Millisecond, time.Millisecond+time.Nanosecond)
		if set != nil {
			set(p)
		}
		var out []time.Duration
		for range 64 {
			p.ctl.Lock()
			if set != nil {
				if d := p.delayLocked(OpStatus); d != other {
					t.Errorf("a status call's latency %v, want %v", d, other)
				}
			}
			out = append(out, p.delayLocked(OpExec))
			p.ctl.Unlock()
		}
		return out
	}
	alone := draws(0, nil)
	fixed := draws(time.Millisecond, func(p *Provider) { p.SetLatency(OpStatus, time.Millisecond) })
	cleared := draws(0, func(p *Provider) {
		p.SetLatencyRange(OpStatus, time.Second, 2*time.Second)
		p.SetLatencyRange(OpStatus, -time.Second, 0)
	})
	if d := cmp.Diff(alone, fixed); d != "" {
		t.Errorf("a fixed latency's calls changed another op's draws (-alone +interleaved):\n%s", d)
	}
	if d := cmp.Diff(alone, cleared); d != "" {
		t.Errorf("a cleared latency's calls changed another op's draws (-alone +interleaved):\n%s", d)
	}
	ends := map[time.Duration]bool{}
	for _, d := range alone {
		ends[d] = true
	}
	if diff := cmp.Diff(map[time.Duration]bool{time.Millisecond: true, time.Millisecond + time.Nanosecond: true}, ends); diff != "" {
		t.Errorf("delays drawn from [1ms, 1ms+1ns] (-want +got):\n%s", diff)
	}
}
