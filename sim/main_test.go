package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The command's whole output (stdout and stderr) for -v is a function of
// the seed: two runs of `go run ./sim -seed S -runs 1 -v` print the same
// bytes.
func TestVerboseRunPrintsTheSameBytesTwice(t *testing.T) {
	for _, seed := range []string{"7", "42", "204"} {
		var out [2]bytes.Buffer
		for i := range out {
			if code := run([]string{"-seed", seed, "-runs", "1", "-v"}, &out[i], &out[i], false); code != 0 {
				t.Fatalf("seed %s: exit %d:\n%s", seed, code, out[i].String())
			}
		}
		if diff := cmp.Diff(out[0].String(), out[1].String()); diff != "" {
			t.Errorf("two runs of seed %s printed differently (-first +second):\n%s", seed, diff)
		}
		if !strings.Contains(out[0].String(), "mode deterministic") || !strings.Contains(out[0].String(), "[ 40]") {
			t.Errorf("seed %s: the output names no mode or lacks the last step:\n%s", seed, out[0].String())
		}
	}
}

func TestBadFlagsExit2(t *testing.T) {
	for _, args := range [][]string{
		{"-mode", "bogus"},
		{"-provider", "opensandbox", "-mode", "deterministic"},
		{"-runs", "0"},
		{"-faults", "no-such-fault"},
	} {
		var out bytes.Buffer
		if code := run(args, &out, &out, false); code != 2 {
			t.Errorf("%v: exit %d, want 2:\n%s", args, code, out.String())
		}
	}
}
