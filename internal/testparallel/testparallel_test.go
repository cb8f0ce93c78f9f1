package testparallel_test

import (
	"flag"
	"runtime"
	"strconv"
	"testing"

	"github.com/sandboxowner/owner/internal/testparallel"
)

func TestAtLeast(t *testing.T) {
	f := flag.Lookup("test.parallel")
	before := f.Value.String()
	t.Cleanup(func() { _ = flag.Set("test.parallel", before) })
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	n := runtime.GOMAXPROCS(0) + 3
	testparallel.AtLeast(n)
	want := strconv.Itoa(n)
	if explicit {
		want = before // the command line's -parallel wins
	}
	if got := f.Value.String(); got != want {
		t.Errorf("-test.parallel %s after AtLeast(%d), want %s (set on the command line: %v)", got, n, want, explicit)
	}
	// Explicitly set now: a second call leaves it.
	testparallel.AtLeast(n + 1)
	if got := f.Value.String(); got != want {
		t.Errorf("-test.parallel %s after a second AtLeast, want %s kept", got, want)
	}
}
