package http

import "testing"

// TestBudgetTakesAndGivesWithoutAllocating: every request with a body takes
// from the budget and gives back, so neither allocates (the change signal
// made a fresh channel on each, under a lock all requests shared); a waiter
// still hears the next change, and a take past what is left reserves
// nothing.
func TestBudgetTakesAndGivesWithoutAllocating(t *testing.T) {
	b := newBudget(100)
	if n := testing.AllocsPerRun(100, func() {
		if !b.take(60) {
			t.Fatal("a take within the budget was refused")
		}
		b.give(60)
	}); n != 0 {
		t.Fatalf("a take and a give allocate %.1f times, want 0", n)
	}
	used, changed := b.inUse()
	if used != 0 {
		t.Fatalf("in use %d after every take was given back", used)
	}
	if !b.take(60) {
		t.Fatal("a take within the budget was refused")
	}
	select {
	case <-changed:
	default:
		t.Fatal("a take did not signal the waiter who asked before it")
	}
	if b.take(41) {
		t.Fatal("a take past what is left was granted")
	}
	if used, _ := b.inUse(); used != 60 {
		t.Fatalf("in use %d after a refused take, want the 60 held", used)
	}
}
