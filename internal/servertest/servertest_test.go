package servertest_test

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/internal/diewith/diewithtest"
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

// TestChildStartsAServer is the child's part of
// TestAServerEndsWithItsTestBinary: it starts a server through Command,
// its log read through a pipe as the tests read it, until it serves.
func TestChildStartsAServer(t *testing.T) {
	if !diewithtest.Child() {
		t.Skip("the child of TestAServerEndsWithItsTestBinary")
	}
	cmd := servertest.Command(nil, "-port", "0", "-sandbox.provider", "fake", "-log-format", "json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stderr)
	for sc.Scan() && !strings.Contains(sc.Text(), `"addr"`) {
	}
	diewithtest.Write(t, cmd.Process.Pid)
}

// A test binary SIGKILLed mid-run (its -timeout, a cancelled CI job: no
// cleanup runs) leaves no server it started through Command running.
func TestAServerEndsWithItsTestBinary(t *testing.T) {
	if diewithtest.Child() {
		t.Skip("in the child")
	}
	words := diewithtest.Kill(t, "TestChildStartsAServer", servertest.StartGuard)
	pid, err := strconv.Atoi(words[0])
	if err != nil {
		t.Fatalf("%q: %v", words, err)
	}
	diewithtest.Gone(t, map[int]string{pid: "the killed test binary's server"})
}

// TestAddrIsTheStartupLinesWhole: the address is read from the startup
// line in either log format, and only once it is there whole; another
// field that ends in addr is not it.
func TestAddrIsTheStartupLinesWhole(t *testing.T) {
	for log, want := range map[string]string{
		`level=info msg="serving notes on 127.0.0.1:41235" addr="127.0.0.1:41235" name=notes` + "\n": "127.0.0.1:41235",
		`level=info msg=serving addr=127.0.0.1:41235 name=notes` + "\n":                              "127.0.0.1:41235",
		`level=info msg=serving addr=127.0.0.1:41235` + "\n":                                         "127.0.0.1:41235",
		`{"addr":"127.0.0.1:41235","level":"info","msg":"serving notes"}` + "\n":                     "127.0.0.1:41235",
		`level=info msg=serving addr="127.0.0.1:412`:                                                 "",
		`level=info msg=serving addr=127.0.0.1:412`:                                                  "",
		`level=info msg=request remote_addr="127.0.0.1:5000"` + "\n":                                 "",
		"": "",
	} {
		if got := servertest.Addr([]byte(log)); got != want {
			t.Errorf("Addr(%q) = %q, want %q", log, got, want)
		}
	}
}
