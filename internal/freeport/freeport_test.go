package freeport

import (
	"net"
	"strconv"
	"testing"
)

// A port Loopback hands out is free (Held says no) until something
// listens on it (then Held says yes), and free again once it stops.
func TestLoopbackAndHeld(t *testing.T) {
	p, err := Loopback()
	if err != nil {
		t.Fatal(err)
	}
	if Held(p) {
		t.Fatalf("port %d handed out as free is held", p)
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Skipf("port %d was taken meanwhile: %v", p, err)
	}
	if !Held(p) {
		t.Errorf("port %d with a listener is not held", p)
	}
	l.Close()
	if Held(p) {
		t.Errorf("port %d is held after its listener closed", p)
	}
}

// A refusing port refuses a connection, and no listener can take it, until
// it is released; then it can be listened on.
func TestRefusing(t *testing.T) {
	p, release, err := Refusing()
	if err != nil {
		t.Fatal(err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Fatalf("a connection to refusing port %d was accepted", p)
	}
	if !Held(p) {
		t.Errorf("refusing port %d is not held", p)
	}
	release()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("port %d after its release: %v", p, err)
	}
	l.Close()
}
