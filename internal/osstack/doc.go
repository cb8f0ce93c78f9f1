// Package osstack is the real OpenSandbox stack on this machine (its
// lifecycle server from source, the Docker runtime, execd in every sandbox),
// as ../shared/opensandbox/stack.sh brings it up, for the tests and
// benchmarks that run against it: Up starts it or finds it up, Require holds
// it shared for a test (or skips the test where there is no stack),
// RequireFault and Stack.Exclusive let a test stop or restart one of its
// parts while no other test uses it, across test binaries (flocks in its
// directory), and Stack.OwnServer gives a test a lifecycle server of its
// own to kill while the others go on.
//
// It is apart from opensandboxtest, the fake server, whose own tests cannot
// reach it: nothing here runs without the real stack but its locks.
package osstack
