package broadcast

import "testing"

// TestBroadcast: a channel taken before a Fire is closed by it, every
// waiter's alike; one taken after it stays open until the next; a Fire no
// one waits for changes nothing for the next waiter.
func TestBroadcast(t *testing.T) {
	b := New()
	b.Fire()
	w1, w2 := b.Wait(), b.Wait()
	if w1 != w2 {
		t.Fatal("two waits before a Fire got different channels")
	}
	if isClosed(w1) {
		t.Fatal("a channel was closed before any Fire after it was taken")
	}
	b.Fire()
	if !isClosed(w1) {
		t.Fatal("a Fire did not close the channel taken before it")
	}
	w3 := b.Wait()
	if isClosed(w3) {
		t.Fatal("a channel taken after the last Fire is closed")
	}
	b.Fire()
	b.Fire() // nobody waits: nothing to close twice
	if !isClosed(w3) {
		t.Fatal("the next Fire did not close the channel taken after the last")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
