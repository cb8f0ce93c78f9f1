// Package testparallel raises how many parallel tests a test binary runs
// when its command line does not say, for packages whose tests mostly wait
// on processes, sandboxes and servers rather than on the CPU: go test's
// default (GOMAXPROCS, 2 on a small machine) leaves those waits in a row.
package testparallel

import (
	"flag"
	"runtime"
	"strconv"
)

// AtLeast sets -test.parallel to the larger of n and GOMAXPROCS unless the
// command line set it. Call it from TestMain after flag.Parse.
func AtLeast(n int) {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}
