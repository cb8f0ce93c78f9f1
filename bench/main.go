// Command bench measures the sandbox owner against the project's performance goals and
// writes results.md and results.svg to $TMPDIR/sandboxowner-bench (or -out DIR):
//
//	go run ./bench          # the full run, a few minutes
//	go run ./bench -quick   # about a minute
//
// Flags: -sections checkpoint,memory,http to run part of it; -out DIR for
// where the results go (never the source tree unless asked: bench/results.md
// is the run README quotes, replaced only by -out bench); -cpuprofile, -memprofile and
// -mutexprofile FILE for runtime/pprof profiles of the harness process (the owner under test
// runs in it; the load generator and memory probes are children). See
// bench/README.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/bench/harness"
)

func main() {
	if harness.IsChild() {
		os.Exit(harness.Child(os.Args[1:], os.Stdout, os.Stderr))
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run() error {
	quick := flag.Bool("quick", false, "a one-minute pass: fewer sizes and repetitions")
	tiny := flag.Bool("tiny", false, "a few-second pass that checks the harness works (figures meaningless)")
	sections := flag.String("sections", "", "comma-separated sections to run: checkpoint (or commit, release), memory, sandboxes, scale, http (default all)")
	out := flag.String("out", "", "directory for results.md and results.svg (default $TMPDIR/sandboxowner-bench; -out bench replaces the run README quotes)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the harness process to this file")
	memprofile := flag.String("memprofile", "", "write a heap profile of the harness process to this file at the end")
	mutexprofile := flag.String("mutexprofile", "", "write a profile of the harness process's lock waiting (one contention in 5 sampled) to this file at the end")
	var cells cellFlags
	var sandboxN []int
	sandboxModes := flag.String("sandboxes-modes", "", "comma-separated fs modes of the sandboxes section: copy, overlay (default both)")
	flag.Var(listFlag[int]{&sandboxN, positive}, "sandboxes-n", "comma-separated sandbox counts of the sandboxes section, replacing the mode's")
	flag.Var(listFlag[int]{&cells.sessions, positive}, "n", "comma-separated session counts, replacing the mode's (to profile one cell)")
	flag.Var(listFlag[int]{&cells.parallelism, positive}, "p", "comma-separated parallelisms, replacing the mode's")
	flag.Var(listFlag[time.Duration]{&cells.latencies, duration}, "l", "comma-separated provider latencies, replacing the mode's (e.g. 0,20ms)")
	flag.Parse()

	opts := harness.Options{Mode: harness.ModeFull, Progress: os.Stderr}
	switch {
	case *tiny:
		opts.Mode = harness.ModeTiny
	case *quick:
		opts.Mode = harness.ModeQuick
	}
	opts.Sessions, opts.Parallelism, opts.Latencies = cells.sessions, cells.parallelism, cells.latencies
	opts.SandboxSessions = sandboxN
	if *sandboxModes != "" {
		opts.SandboxModes = strings.Split(*sandboxModes, ",")
	}
	if *sections != "" {
		opts.Sections = strings.Split(*sections, ",")
	}
	dir := *out
	if dir == "" {
		dir = defaultOut()
	}
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	if *mutexprofile != "" {
		runtime.SetMutexProfileFraction(5)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("results dir: %w", err)
	}
	// Every finished cell is written at once: a run that dies later keeps
	// what it measured.
	opts.OnUpdate = func(r *harness.Report) {
		if err := r.Write(dir); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
	}
	rep, runErr := harness.Run(ctx, opts)
	if rep == nil {
		return runErr
	}
	if *memprofile != "" {
		if err := writeHeapProfile(*memprofile); err != nil {
			return err
		}
	}
	if *mutexprofile != "" {
		if err := writeProfile("mutex", *mutexprofile); err != nil {
			return err
		}
	}
	fmt.Print(rep.Markdown())
	if err := rep.Write(dir); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "bench: wrote %s/results.md and %s/results.svg\n", dir, dir)
	return runErr
}

type cellFlags struct {
	sessions, parallelism []int
	latencies             []time.Duration
}

// listFlag is a flag of comma-separated values, each read by parse.
type listFlag[T any] struct {
	v     *[]T
	parse func(string) (T, error)
}

func (l listFlag[T]) String() string {
	if l.v == nil {
		return ""
	}
	return fmt.Sprint(*l.v)
}

func (l listFlag[T]) Set(s string) error {
	for _, f := range strings.Split(s, ",") {
		x, err := l.parse(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		*l.v = append(*l.v, x)
	}
	return nil
}

func positive(s string) (int, error) {
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%q is not a positive integer", s)
	}
	return n, nil
}

func duration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return 0, fmt.Errorf("%q is not a duration", s)
	}
	return d, nil
}

// defaultOut is outside the source tree, so that a run leaves the clone
// clean and the figures README quotes stay those of the run it names.
func defaultOut() string {
	return filepath.Join(os.TempDir(), "sandboxowner-bench")
}

// writeProfile writes the named runtime/pprof profile to path.
func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("%s profile: %w", name, err)
	}
	defer f.Close()
	if err := pprof.Lookup(name).WriteTo(f, 0); err != nil {
		return fmt.Errorf("%s profile: %w", name, err)
	}
	return nil
}

func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		return fmt.Errorf("heap profile: %w", err)
	}
	return nil
}
