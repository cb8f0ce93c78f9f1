// Package hangguard turns a test that hangs into a failure: a wait that a
// wrong line never satisfies (a reply never sent, a timer never armed, a
// poll loop going round on a manual clock that nothing advances) ends the
// test binary within Bound, naming the test, instead of holding it until
// go test's -timeout. A mutation run then counts such a mutant killed, not
// timed out.
package hangguard

import (
	"fmt"
	"testing"
	"time"
)

// Bound is how long one guarded test may run. It bounds a hang, never
// paces a test: the tests guarded take seconds, tens of them on a loaded
// machine.
const Bound = 2 * time.Minute

// Arm ends the test binary with a panic naming t if t has not ended within
// Bound; t's end disarms it, and so does disarm (true if it stopped the
// guard), for a test whose wall time grows with the machine's load and so is
// left to go test's -timeout.
func Arm(t testing.TB) (disarm func() bool) { return arm(t, Bound, func(msg string) { panic(msg) }) }

func arm(t testing.TB, bound time.Duration, fire func(msg string)) func() bool {
	tm := time.AfterFunc(bound, func() {
		fire(fmt.Sprintf("hang guard: %s did not end within %v", t.Name(), bound))
	})
	t.Cleanup(func() { tm.Stop() })
	return tm.Stop
}
