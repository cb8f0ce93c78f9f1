// Package freeport hands out loopback ports for programs a test starts
// that take a port number rather than 0 (OpenSandbox's execd and lifecycle
// server), and tells a start that failed because its port was taken.
//
// A port found free is free only until another process's bind: under load
// the program's own bind comes long after, so a start that failed with its
// port held by another socket is made again on another port.
package freeport

import (
	"errors"
	"net"
	"strconv"
	"syscall"
)

// Loopback is a loopback TCP port nothing listens on now.
func Loopback() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Held reports whether a socket holds loopback port port now.
func Held(port int) bool {
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return errors.Is(err, syscall.EADDRINUSE)
	}
	l.Close()
	return false
}
