package swebench

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/resources/swebench/grading"
)

func TestFramingOfARow(t *testing.T) {
	cases := []struct {
		tc     goToolchain
		parser string
		want   string
	}{
		{goToolchain{true, "go1.26.8"}, "", grading.FramingMarked},
		{goToolchain{true, "go1.26.8"}, "parse_log_gotest", grading.FramingMarked},
		{goToolchain{true, "go1.19.13"}, "gotest", grading.FramingUnmarked},
		{goToolchain{true, "go1.20.14"}, "gotest", grading.FramingMarked},
		{goToolchain{true, "go1.26.8"}, "pytest", grading.FramingLog},
		{goToolchain{false, "go1.26.8"}, "", grading.FramingLog},
		{goToolchain{true, ""}, "gotest", grading.FramingLog},
	}
	for _, c := range cases {
		if got := c.tc.framing(c.parser); got != c.want {
			t.Errorf("%+v.framing(%q) = %s, want %s", c.tc, c.parser, got, c.want)
		}
	}
}

// TestEvalFilterKeepsResultsAndCutsTheMiddle runs the filter with the
// host's awk (as the sandbox's shell does).
func TestEvalFilterKeepsResultsAndCutsTheMiddle(t *testing.T) {
	needTools(t, "awk", "sh")
	var in strings.Builder
	in.WriteString(grading.StartTestOutput + "\n")
	filler := strings.Repeat("x", 1000)
	for i := 0; i < 1000; i++ {
		in.WriteString(filler + "\n")
		if i == 500 {
			in.WriteString("\x16=== RUN   TestMiddle\n\x16--- PASS: TestMiddle (0.00s)\n    --- FAIL: TestOld/sub (0.00s)\ntest a::b ... ok\nPASSED t.py::x\nt.py::y FAILED\n")
		}
	}
	in.WriteString(strings.Repeat("y", 10000) + "\nlast line\n" + grading.EndTestOutput + "\n")
	cmd := exec.Command("sh", "-c", "NG_AWK=awk; "+evalFilter)
	cmd.Env = append(os.Environ(), "LC_ALL=C")
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	got := string(out)
	for _, want := range []string{grading.StartTestOutput, "\x16--- PASS: TestMiddle", "--- FAIL: TestOld/sub", "test a::b ... ok", "PASSED t.py::x", "t.py::y FAILED",
		"last line", grading.EndTestOutput, "lines of output here", strings.Repeat("y", 4096) + "[line cut by the grader]"} {
		if !strings.Contains(got, want) {
			t.Errorf("the filtered output lacks %q", want)
		}
	}
	if len(got) > 600<<10 || len(got) < 500<<10 {
		t.Errorf("filtered to %d bytes, want the head and tail budgets (512 KiB) and the kept lines", len(got))
	}
	if strings.Index(got, "last line") < strings.Index(got, "lines of output here") {
		t.Error("the tail is not after the cut")
	}
}
