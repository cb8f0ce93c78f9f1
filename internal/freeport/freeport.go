// Package freeport hands out loopback ports for programs a test starts
// that take a port number rather than 0 (OpenSandbox's execd and lifecycle
// server), tells a start that failed because its port was taken, and holds
// a port that refuses every connection.
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

// Refusing is a loopback TCP port that refuses every connection until
// release: a socket bound to it that does not listen holds it, so no other
// socket can take it and listen there meanwhile, as one closed at once
// could be.
func Refusing() (port int, release func(), err error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return 0, nil, err
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return 0, nil, err
	}
	return sa.(*syscall.SockaddrInet4).Port, func() { syscall.Close(fd) }, nil
}
