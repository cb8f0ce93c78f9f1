package localtest

import (
	"fmt"
	"os"
	"testing"
)

// Run is a test binary's TestMain after its own branches (a child process's
// role, flags): it runs each of before in order, then takes the binary's
// TempRoot, runs the tests, gives the root back, and returns the code to
// exit with. before runs while TMPDIR is still the system's: a setting that
// must name what outlives this run or is shared with other test binaries
// (the real stack's directory, kept caches) is fixed there. A before that
// fails, or a TempRoot that cannot be made, is said on stderr and returns
// 2 without running the tests.
func Run(m *testing.M, before ...func() error) int {
	for _, f := range before {
		if err := f(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	// A run killed by -timeout leaves its sandboxes mounted under its
	// temporary directories: the next run of any package using Run clears
	// them, and this one keeps its own under a root it can be found by.
	done, err := TempRoot()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer done()
	return m.Run()
}
