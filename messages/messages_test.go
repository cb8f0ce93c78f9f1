package messages_test

import (
	"testing"
	"time"

	"github.com/sandboxowner/owner/messages"
)

// TestSessionViewKeepsTheLatestUse: uses are reported out of order (each
// request touches as it arrives); the view keeps the latest, and none
// touched reads as the zero time.
func TestSessionViewKeepsTheLatestUse(t *testing.T) {
	var v messages.SessionView
	if got := v.Used(); !got.IsZero() {
		t.Fatalf("untouched view: used %v, want the zero time", got)
	}
	t0 := time.Date(2026, 12, 5, 8, 0, 0, 0, time.UTC)
	v.Touch(t0.Add(2 * time.Second))
	v.Touch(t0.Add(time.Second))
	if got, want := v.Used(), t0.Add(2*time.Second); !got.Equal(want) {
		t.Fatalf("used %v, want the later touch %v", got, want)
	}
	v.Touch(t0.Add(3 * time.Second))
	if got, want := v.Used(), t0.Add(3*time.Second); !got.Equal(want) {
		t.Fatalf("used %v, want %v", got, want)
	}
}
