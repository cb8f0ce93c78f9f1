package messages_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

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

// TestSessionViewPermit: the permit is lent to one caller at a time and
// only while open; a recall takes a free permit back at once and marks a
// lent one, whose caller then learns it must tell the actor; a withdrawn
// permit is neither free nor lent, and a closed one lends nothing.
func TestSessionViewPermit(t *testing.T) {
	var v messages.SessionView
	var got []bool
	got = append(got, v.Borrow()) // never opened
	v.Open()
	got = append(got, v.Lent(), v.Borrow(), v.Lent(), v.Borrow(), v.GiveBack()) // lent once; given back unrecalled
	got = append(got, v.Recall(), v.Borrow())                                   // a free permit recalled: closed
	v.Open()
	got = append(got, v.Borrow(), v.Recall(), v.Lent(), v.Recall(), v.GiveBack(), v.Lent(), v.Borrow()) // recalled while lent
	v.Open()
	v.Borrow()
	v.Withdraw()
	got = append(got, v.Lent(), v.Recall(), v.Borrow()) // withdrawn: the caller's return is on the way
	v.Open()
	v.Borrow()
	v.Close()
	got = append(got, v.Lent(), v.GiveBack(), v.Borrow()) // closed under a caller: its return goes nowhere
	want := []bool{
		false,
		false, true, true, false, false,
		true, false,
		true, false, true, false, true, false, false,
		false, false, false,
		false, true, false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("permit (-want +got):\n%s", diff)
	}
}
