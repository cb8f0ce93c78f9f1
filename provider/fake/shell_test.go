package fake_test

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// TestExecWords: the fake splits a command line as sh does (tabs and
// newlines are blanks, quotes and backslashes keep what they quote, an
// empty quoted word is a word) and refuses, with sh's exit status 2 for a
// syntax error, what it does not interpret; its built-ins answer their
// misuse as sh's do.
func TestExecWords(t *testing.T) {
	ctx := context.Background()
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{Files: map[string]string{"a b": "spaced", "a.txt": "A"}})
	for _, tc := range []struct {
		cmd    string
		stdout string
		code   int
	}{
		{"echo a\tb\nc", "a b c\n", 0},
		{`echo a\ b \$x \"`, "a b $x \"\n", 0},
		{`echo x\`, "x\n", 0},
		{`echo "" x`, " x\n", 0},
		{`echo ''`, "\n", 0},
		{`echo "a\\b" "c\nd" "e\"f"`, `a\b c\nd e"f` + "\n", 0},
		{`echo "'$'"`, "", 2},
		{"echo \"`x`\"", "", 2},
		{`echo "open`, "", 2},
		{`echo "open\"`, "", 2},
		{`echo "open\`, "", 2},
		{`echo "x\\" y`, `x\ y` + "\n", 0},
		{"echo", "\n", 0},
		{`echo a#b c~d`, "a#b c~d\n", 0},
		{`echo #c`, "", 2},
		{`echo ~`, "", 2},
		{`cat 'a b'`, "spaced", 0},
		{`cat a\ b`, "spaced", 0},
		{"echo x > a > b", "", 2},
		{"echo x >> > a", "", 2},
		{"echo x >", "", 2},
		{"exit 257", "", 1},
		{"exit x", "", 2},
		{"ls a b", "", 2},
		{"test -e a.txt", "", 2},
		{"test -f", "", 2},
		{"test -f a.txt x", "", 2},
		{"test -f ../../..", "", 1},
		{"cat ../../../x", "", 1},
		{"ls ../../..", "", 2},
	} {
		got, err := p.Exec(ctx, h, provider.ExecRequest{Command: tc.cmd})
		if err != nil {
			t.Errorf("Exec(%q): %v", tc.cmd, err)
			continue
		}
		if diff := cmp.Diff([]any{tc.stdout, tc.code}, []any{got.Stdout, got.ExitCode}); diff != "" {
			t.Errorf("Exec(%q): stdout and exit status (-want +got):\n%s\nstderr %q", tc.cmd, diff, got.Stderr)
		}
	}
}

// TestFaultsClearedByZero: a count or probability of zero or less, and a
// latency range whose top is zero or less, clear what was set: the next
// call runs at once and succeeds.
func TestFaultsClearedByZero(t *testing.T) {
	for _, n := range []int{0, -1} {
		for name, set := range map[string]func(p *fake.Provider, id string, on bool){
			"FailNext": func(p *fake.Provider, _ string, on bool) {
				p.FailNext(fake.OpExec, map[bool]int{true: 3, false: n}[on])
			},
			"FailNextFor": func(p *fake.Provider, id string, on bool) {
				p.FailNextFor(fake.OpExec, id, map[bool]int{true: 3, false: n}[on])
			},
			"FailAfterEffect": func(p *fake.Provider, _ string, on bool) {
				p.FailAfterEffect(fake.OpExec, map[bool]int{true: 3, false: n}[on])
			},
			"HangNext": func(p *fake.Provider, _ string, on bool) {
				p.HangNext(fake.OpExec, map[bool]int{true: 3, false: n}[on])
			},
			"FailWithProbability": func(p *fake.Provider, _ string, on bool) {
				p.FailWithProbability(fake.OpExec, map[bool]float64{true: 1, false: float64(n)}[on])
			},
			"SetLatency": func(p *fake.Provider, _ string, on bool) {
				p.SetLatency(fake.OpExec, map[bool]time.Duration{true: time.Hour, false: time.Duration(n)}[on])
			},
			"SetLatencyRange": func(p *fake.Provider, _ string, on bool) {
				if on {
					p.SetLatencyRange(fake.OpExec, time.Hour, 2*time.Hour)
				} else {
					p.SetLatencyRange(fake.OpExec, time.Duration(n), time.Duration(n))
				}
			},
		} {
			// The manual clock never moves: a latency left set would wait
			// until the context's end.
			p := fake.New(fake.Options{Clock: clock.NewManual(t0)})
			h := start(t, p, provider.Spec{})
			set(p, h.SandboxID, true)
			set(p, h.SandboxID, false)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo ok"})
			cancel()
			if err != nil || res.Stdout != "ok\n" {
				t.Errorf("%s cleared with %d: %+v, %v", name, n, res, err)
			}
		}
	}
}

// TestStatsCountTheFaultsAlone: Injected counts the calls a fault was
// injected into, not the others; once no call is in flight, InFlight names
// no op.
func TestStatsCountTheFaultsAlone(t *testing.T) {
	p := fake.New(fake.Options{})
	h := start(t, p, provider.Spec{})
	p.FailNext(fake.OpExec, 1)
	for range 3 {
		_, _ = p.Exec(context.Background(), h, provider.ExecRequest{Command: "true"})
	}
	st := p.Stats()
	got := []any{st.Calls[fake.OpExec], st.Failures[fake.OpExec], st.Injected[fake.OpExec], st.InFlight}
	if diff := cmp.Diff([]any{3, 1, 1, map[fake.Op]int{}}, got); diff != "" {
		t.Errorf("calls, failures, injected, in flight (-want +got):\n%s", diff)
	}
}

// TestFailWithProbabilityFailsThatShare: a probability of 1 fails every
// call, a small one few; the calls of an op with no probability draw
// nothing from the seeded faults, so they leave another op's outcomes as
// they were.
func TestFailWithProbabilityFailsThatShare(t *testing.T) {
	outcomes := func(prob float64, interleave bool) (failed []bool) {
		p := fake.New(fake.Options{Seed: 7})
		h := start(t, p, provider.Spec{})
		p.FailWithProbability(fake.OpExec, prob)
		for range 64 {
			if interleave {
				if _, err := p.Status(context.Background(), h); err != nil {
					t.Fatal(err)
				}
			}
			_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "true"})
			failed = append(failed, err != nil)
		}
		return failed
	}
	count := func(fs []bool) (n int) {
		for _, f := range fs {
			if f {
				n++
			}
		}
		return n
	}
	if n := count(outcomes(1, false)); n != 64 {
		t.Errorf("probability 1: %d of 64 calls failed", n)
	}
	if n := count(outcomes(0.05, false)); n > 16 {
		t.Errorf("probability 0.05: %d of 64 calls failed", n)
	}
	if diff := cmp.Diff(outcomes(0.5, false), outcomes(0.5, true)); diff != "" {
		t.Errorf("status calls between the execs changed their outcomes (-alone +interleaved):\n%s", diff)
	}
}
