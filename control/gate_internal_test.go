package control

import (
	"context"
	"testing"
	"time"
)

// TestOpenGateAdmitsWithoutItsLock: every data request enters the gate, so
// an open gate admits and lets go without the lock that guards its phase
// (one lock all requests shared was where they queued under load).
func TestOpenGateAdmitsWithoutItsLock(t *testing.T) {
	g := NewGate(nil)
	g.mu.Lock()
	defer g.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		leave, err := g.Enter(context.Background(), Entry{Session: "s1", Label: "k1", Wait: true})
		if err == nil {
			leave()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a guard against a hang, not a wait
		t.Fatal("a request waited for the gate's lock to enter an open gate")
	}
}
