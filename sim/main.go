// Command sim is the deterministic simulation of the sandbox owner: seeded
// random workloads and fault schedules against the real owner (actors,
// coordinator, snapshot index, the control plane) over the fake provider,
// on one seeded scheduler and virtual time, with the invariants checked
// after every step.
//
//	go run ./sim -runs 1000              # 1000 seeded runs, every fault kind
//	go run ./sim -seed 17 -runs 1 -v     # the trace of one run
//	go run ./sim -faults crash=0.2,race  # only some faults, at chosen rates
//	go run ./sim -mode real-goroutines   # the owner on goroutines and Badger on disk
//
// It exits 1 when any invariant was violated, 2 on bad flags.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/sandboxowner/owner/sim/engine"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr, isTerminal(os.Stderr)))
}

// run is the command on args, writing the trace and table to stdout and
// the rest to stderr (a terminal when tty: a progress bar).
func run(args []string, stdout, stderr io.Writer, tty bool) int {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seed := fs.Int64("seed", 1, "seed of the first run (run i uses seed+i)")
	runs := fs.Int("runs", 100, "number of runs")
	sessions := fs.Int("sessions", 4, "session ids per run")
	steps := fs.Int("steps", 40, "workload steps per run")
	faults := fs.String("faults", "all", `fault kinds and rates: "all", "none", or kind[=rate],... (may start with "all,")`)
	verbose := fs.Bool("v", false, "print the trace of the first run (then -runs is 1)")
	parallel := fs.Int("parallel", runtime.GOMAXPROCS(0), "runs at once")
	mode := fs.String("mode", "", "how the owner's concurrency runs: deterministic (the default with the fake: one seeded scheduler on virtual time, so a seed replays exactly) or real-goroutines (the default and only mode with opensandbox)")
	keyed := fs.Bool("keyed", false, "add the keyed workload: groups of seeds of one task key forking its template (built once), templates expiring, and warm pools in the owner")
	prov := fs.String("provider", engine.ProviderFake, "what the owner drives: fake, or opensandbox (the OpenSandbox client against the fake OpenSandbox server over the same fake)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: go run ./sim [flags]\n\nfault kinds: ")
		for i, k := range engine.Kinds() {
			if i > 0 {
				fmt.Fprint(fs.Output(), ", ")
			}
			fmt.Fprint(fs.Output(), k)
		}
		fmt.Fprintln(fs.Output())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	f, err := engine.ParseFaults(*faults)
	if err != nil {
		fmt.Fprintln(stderr, "sim:", err)
		return 2
	}
	if *runs < 1 || *sessions < 1 || *steps < 1 {
		fmt.Fprintln(stderr, "sim: -runs, -sessions and -steps must be at least 1")
		return 2
	}
	if *prov != engine.ProviderFake && *prov != engine.ProviderOpenSandbox {
		fmt.Fprintf(stderr, "sim: -provider must be %s or %s, not %q\n", engine.ProviderFake, engine.ProviderOpenSandbox, *prov)
		return 2
	}
	if *mode != "" && *mode != engine.RuntimeDeterministic && *mode != engine.RuntimeReal {
		fmt.Fprintf(stderr, "sim: -mode must be %s or %s, not %q\n", engine.RuntimeDeterministic, engine.RuntimeReal, *mode)
		return 2
	}
	if *mode == engine.RuntimeDeterministic && *prov == engine.ProviderOpenSandbox {
		fmt.Fprintln(stderr, "sim: -provider opensandbox talks HTTP and runs only in -mode real-goroutines")
		return 2
	}
	cfg := engine.Config{Sessions: *sessions, Steps: *steps, Faults: f, Provider: *prov, Runtime: *mode, Keyed: *keyed}
	if cfg.Runtime == "" {
		cfg.Runtime = engine.RuntimeDeterministic
		if *prov == engine.ProviderOpenSandbox {
			cfg.Runtime = engine.RuntimeReal
		}
	}
	if *verbose {
		*runs = 1
		cfg.Trace = stdout
	}
	keyedFlag := ""
	if *keyed {
		keyedFlag = " -keyed"
	}
	replay := func(s int64) string {
		return fmt.Sprintf("go run ./sim -provider %s -mode %s -seed %d -runs 1 -sessions %d -steps %d -faults %s%s -v", *prov, cfg.Runtime, s, *sessions, *steps, f, keyedFlag)
	}
	fmt.Fprintf(stderr, "sim: %d runs from seed %d, %d sessions, %d steps, faults %s, %d at once\n", *runs, *seed, *sessions, *steps, f, min(*parallel, *runs))
	if cfg.Runtime == engine.RuntimeReal {
		// Said so that nobody takes a trace for an exact replay: the raced
		// operations interleave as the Go scheduler runs them.
		fmt.Fprintln(stderr, "sim: mode real-goroutines (the owner's actors on goroutines; a seed replays its steps, not the interleaving of raced ones)")
	} else {
		fmt.Fprintln(stderr, "sim: mode deterministic (the owner's actors, effects and waits on one seeded scheduler, virtual time; a seed replays exactly)")
	}
	sum := engine.NewSummary()
	began := time.Now()
	progress := stderr
	if *verbose {
		// Its elapsed time would make two traces of a seed differ.
		progress = io.Discard
	}
	bar := engine.NewProgress(progress, tty && !*verbose, *runs)
	engine.RunSeeds(*seed, *runs, *parallel, cfg, func(r engine.Result) {
		sum.Add(r)
		bar.Done(r)
	})
	bar.Finish()
	sum.Elapsed = time.Since(began)
	if !*verbose {
		// Not with -v: a trace (stdout and stderr) is a function of the
		// seed alone, so two of them can be compared byte for byte.
		fmt.Fprintf(stderr, "sim: %d runs in %v (%.1f runs/s)\n", sum.Runs, sum.Elapsed.Round(time.Millisecond), float64(sum.Runs)/sum.Elapsed.Seconds())
	}
	fmt.Fprintln(stdout)
	sum.WriteTable(stdout, cfg, replay)
	if len(sum.Violations) > 0 {
		return 1
	}
	return 0
}

func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
