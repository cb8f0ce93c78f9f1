package servertest_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/internal/servertest"
)

func TestMain(m *testing.M) {
	servertest.ServeIfChild()
	os.Exit(m.Run())
}

// TestCommandRunsTheServer: the child is the server's command line, not the
// tests: -h prints the server's flags on stdout and exits 0 (a test binary's
// -h prints go test's flags and exits 2), in the environment given.
func TestCommandRunsTheServer(t *testing.T) {
	for _, env := range [][]string{nil, append(os.Environ(), "SANDBOXOWNER_SERVERTEST_CHILD=0")} {
		cmd := servertest.Command(env, "-h")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Fatalf("the server's -h: %v\n%s", err, stderr.String())
		}
		if !strings.Contains(stdout.String(), "-checkpoint.state_dir") {
			t.Errorf("the child's -h printed no server flag:\n%s\n%s", stdout.String(), stderr.String())
		}
	}
}
