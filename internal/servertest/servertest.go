// Package servertest lets a test binary be the server binary: a test
// starts Command, which runs the test binary itself with a marker in its
// environment, and the test binary's TestMain calls ServeIfChild first,
// which then runs app.Main (cmd/server's program) instead of the tests.
//
// A package whose tests run the server as a process so needs no `go build`
// of cmd/server: that build compiled every package again without the race
// detector (minutes on a cold cache, on two cores), and the server it made
// ran without it. The server a test starts is the test binary's build, with
// -race when the tests have it.
package servertest

import (
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/internal/diewith"
	"github.com/sandboxowner/owner/internal/racebuild"
)

// StartGuard bounds a test's wait for a server it started to answer: a
// hang guard, not a speed bound. A minute was missed at load 30 by a local
// provider whose start (its probes, its helpers) took 44 s, and by a server
// on the OpenSandbox provider checking the real stack at load 36.
const StartGuard = 5 * time.Minute

// marker is set in the environment of the test binary Command starts.
const marker = "SANDBOXOWNER_SERVERTEST_CHILD=1"

// ServeIfChild runs the server and exits when the test binary was started by
// Command; otherwise it returns at once. Call it first in TestMain, before
// flag.Parse: the arguments are the server's, not go test's.
func ServeIfChild() {
	if slices.Contains(os.Environ(), marker) {
		// The test that started it may die (see Command) with the pipe
		// its log goes to: the drain that follows must not die of
		// SIGPIPE at its first log line, leaving its sandboxes.
		signal.Ignore(syscall.SIGPIPE)
		os.Exit(app.Main())
	}
}

// Command is the server run with args: the test binary itself, with env as
// its environment (nil: the test's own). The package's TestMain must call
// ServeIfChild.
func Command(env []string, args ...string) *exec.Cmd {
	if env == nil {
		env = os.Environ()
	}
	self, err := os.Executable()
	if err != nil {
		self = os.Args[0]
	}
	cmd := exec.Command(self, args...)
	env = slices.DeleteFunc(slices.Clone(env), func(kv string) bool {
		return strings.HasPrefix(kv, "SANDBOXOWNER_SERVERTEST_CHILD=")
	})
	// Without the race runtime's second of sleep on every server a test
	// stops.
	cmd.Env = append(racebuild.NoExitSleep(env), marker)
	// A test binary killed mid-run (its -timeout, a cancelled CI job)
	// runs no cleanup: the server then drains and stops its sandboxes as
	// at any SIGTERM, rather than run on. Start it from a goroutine
	// that does not lock its thread (see diewith.Parent).
	diewith.Parent(cmd, syscall.SIGTERM)
	return cmd
}

// servingOn is the address in the server's startup line, in the text
// format (addr=..., quoted or not) or JSON ("addr":"..."), whole: a quote
// or a space ends it, so that a line read half written gives nothing.
var servingOn = regexp.MustCompile(`\baddr"?[=:]"?(127\.0\.0\.1:[0-9]+)["\s]`)

// Addr is the loopback address a server started with -port 0 logged it
// serves on, found in its log so far ("" until the line is there). A port
// a test found free and handed to the server can be taken by any process's
// bind before the server's own, which comes after its provider's start:
// tens of seconds on a loaded machine.
func Addr(log []byte) string {
	if m := servingOn.FindSubmatch(log); m != nil {
		return string(m[1])
	}
	return ""
}
