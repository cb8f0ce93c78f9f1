package sandboxapi

import (
	"errors"
	"net"
	"reflect"
	"syscall"
	"time"
)

// watchClient calls gone when the client at the other end of conn closes
// its side while a call runs (an agent gave up on an exec), and returns a
// func that stops watching. It peeks, never reads, so a request the client
// pipelines behind this one stays for the server; seeing data it stops
// watching. A conn that is not a socket is not watched.
func watchClient(conn net.Conn, gone func()) (stop func()) {
	sc, ok := socketOf(conn)
	if !ok {
		return func() {}
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1]byte
		closed := false
		_ = raw.Read(func(fd uintptr) bool {
			n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if errors.Is(err, syscall.EAGAIN) {
				return false // nothing yet: wait for the socket to be readable
			}
			closed = n == 0 && err == nil || errors.Is(err, syscall.ECONNRESET)
			return true
		})
		if closed {
			gone()
		}
	}()
	return func() {
		// Wake the watcher (its Read fails with a timeout), then give the
		// connection back with no deadline of ours.
		_ = conn.SetReadDeadline(time.Now())
		<-done
		_ = conn.SetReadDeadline(time.Time{})
	}
}

// socketOf finds the socket under conn, looking through wrappers that
// embed the connection they wrap (fasthttp's per-IP counting does).
func socketOf(conn net.Conn) (syscall.Conn, bool) {
	for range 4 {
		if sc, ok := conn.(syscall.Conn); ok {
			return sc, true
		}
		v := reflect.ValueOf(conn)
		if v.Kind() == reflect.Pointer {
			v = v.Elem()
		}
		if v.Kind() != reflect.Struct {
			return nil, false
		}
		f := v.FieldByName("Conn")
		if !f.IsValid() || !f.CanInterface() {
			return nil, false
		}
		inner, ok := f.Interface().(net.Conn)
		if !ok || inner == nil {
			return nil, false
		}
		conn = inner
	}
	return nil, false
}
