package localtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// InitPackage is the separate init binary's package (see
// local.Options.InitBinary).
const InitPackage = "github.com/sandboxowner/owner/cmd/sandbox-init"

var initBin struct {
	once sync.Once
	path string
	err  error
	out  []byte
}

// InitBinary is cmd/sandbox-init, built once per test binary's run into a
// directory of its own under os.TempDir() (a TempRoot's, when TestMain
// called it): the init a test's local provider runs instead of the test
// binary, which under -race is several times larger and slower to start,
// twice per isolated sandbox. It is built without -race (it is small and
// quick to build, and a sandbox's init is not what the race detector is
// for here), whatever the test binary was built with. A failed build fails
// t, and every later caller.
func InitBinary(t testing.TB) string {
	t.Helper()
	initBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "sandbox-init-")
		if err != nil {
			initBin.err = err
			return
		}
		path := filepath.Join(dir, "sandbox-init")
		// -race=false overrides a GOFLAGS=-race the run may carry.
		cmd := exec.Command("go", "build", "-race=false", "-o", path, InitPackage)
		initBin.out, initBin.err = cmd.CombinedOutput()
		initBin.path = path
	})
	if initBin.err != nil {
		t.Fatalf("build %s: %v\n%s", InitPackage, initBin.err, initBin.out)
	}
	return initBin.path
}
