package osstack

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/internal/diewith/diewithtest"
)

// TestChildStartsItsOwnServer is the child's part of
// TestOwnServerDiesWithTheTestBinary: it starts a lifecycle server of its
// own.
func TestChildStartsItsOwnServer(t *testing.T) {
	if !diewithtest.Child() {
		t.Skip("the child of TestOwnServerDiesWithTheTestBinary")
	}
	st, err := Up()
	own := Require(t, st, err).OwnServer(t)
	b, err := os.ReadFile(filepath.Join(own.Dir, "run", "server.pid"))
	if err != nil {
		t.Fatal(err)
	}
	diewithtest.Write(t, strings.TrimSpace(string(b)), own.Dir)
}

// A test binary SIGKILLed while its own lifecycle server runs (a -timeout,
// a cancelled CI job: no cleanup runs) leaves no server behind: stack.sh
// started it in a session of its own, and its watcher stops it.
func TestOwnServerDiesWithTheTestBinary(t *testing.T) {
	if diewithtest.Child() {
		t.Skip("in the child")
	}
	if _, err := Script(); err != nil {
		t.Skipf("skipped: %v", err)
	}
	words := diewithtest.Kill(t, "TestChildStartsItsOwnServer", 5*time.Minute)
	// The killed child's TempDir (its test's directory over it), which
	// its cleanup would have removed.
	t.Cleanup(func() { _ = os.RemoveAll(filepath.Dir(words[1])) })
	pid, err := strconv.Atoi(words[0])
	if err != nil {
		t.Fatalf("%q: %v", words, err)
	}
	diewithtest.Gone(t, map[int]string{pid: "the killed test binary's own lifecycle server"})
}
