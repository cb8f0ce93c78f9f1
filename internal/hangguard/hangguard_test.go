package hangguard

import (
	"testing"
	"time"
)

// TestAHungTestIsNamed: a test that outlives its bound fires the guard,
// which names it.
func TestAHungTestIsNamed(t *testing.T) {
	fired := make(chan string, 1)
	t.Run("hung", func(t *testing.T) {
		arm(t, time.Nanosecond, func(msg string) { fired <- msg })
		// Hangs until the guard fires, as a hung test would.
		if msg, want := <-fired, "hang guard: TestAHungTestIsNamed/hung did not end within 1ns"; msg != want {
			t.Errorf("guard said %q, want %q", msg, want)
		}
	})
}

// A disarmed guard is stopped; disarming again finds nothing to stop.
func TestDisarmStopsTheGuard(t *testing.T) {
	disarm := arm(t, time.Hour, func(msg string) { t.Errorf("fired: %s", msg) })
	if !disarm() {
		t.Error("disarm found no guard to stop")
	}
	if disarm() {
		t.Error("a second disarm stopped a guard again")
	}
}
