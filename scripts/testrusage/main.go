// Command testrusage measures each test binary of a go test run: when it
// ran, its wall time, its CPU time (user and system: the binary and every
// process it waited for, its servers, sandboxes and builds included) and its
// peak memory, with the load average at its start and end. It is go test's
// -exec wrapper:
//
//	go build -o /tmp/testrusage ./scripts/testrusage
//	go test -race -exec "/tmp/testrusage -o /tmp/rusage.jsonl" ./...
//	/tmp/testrusage -report /tmp/rusage.jsonl
//
// As a wrapper it runs the test binary with its arguments, appends one JSON
// line to the -o file, and exits with the binary's status (128 plus the
// signal's number when a signal ended it); signals the wrapper gets go to the
// binary, and the binary is killed if the wrapper dies. -report prints the lines as a table
// in the order the binaries started, with the run's span and totals: go
// test's -p bounds how many binaries run at once, so the span is bounded
// below by the total CPU over the cores and by the longest binary, and each
// binary's wall against its CPU says whether it waits or computes.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// Record is one test binary's run.
type Record struct {
	// Dir is the directory go test ran it in: its package's.
	Dir    string    `json:"dir"`
	Binary string    `json:"binary"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
	// User and Sys are the CPU times of the binary and of every process
	// it waited for (wait4's rusage, as /usr/bin/time reports it).
	User     time.Duration `json:"user_ns"`
	Sys      time.Duration `json:"sys_ns"`
	MaxRSSKB int64         `json:"max_rss_kb"`
	// Exit is the binary's exit status, -1 when a signal ended it.
	Exit      int    `json:"exit"`
	LoadStart string `json:"load_start"`
	LoadEnd   string `json:"load_end"`
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("testrusage", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("o", "", "append each test binary's record to this file (JSON lines)")
	report := fs.String("report", "", "print the records of this file as a table")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *report != "" {
		recs, err := readRecords(*report)
		if err != nil {
			fmt.Fprintln(stderr, "testrusage:", err)
			return 1
		}
		writeReport(stdout, recs)
		return 0
	}
	if *out == "" || fs.NArg() == 0 {
		fmt.Fprintln(stderr, "usage: testrusage -o FILE BINARY [ARGS...] (as go test's -exec), or testrusage -report FILE")
		return 2
	}
	return wrap(*out, fs.Args(), stderr)
}

// wrap runs argv, records it in out, and returns the status to exit with.
func wrap(out string, argv []string, stderr io.Writer) int {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	// go test kills the wrapper at its -timeout: the binary goes too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	sigs := make(chan os.Signal, 4)
	forwarded := []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGQUIT, syscall.SIGHUP}
	signal.Notify(sigs, forwarded...)
	dir, _ := os.Getwd()
	rec := Record{Dir: dir, Binary: filepath.Base(argv[0]), Start: time.Now(), LoadStart: loadAverage()}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testrusage:", err)
		return 1
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	err := cmd.Wait()
	close(done)
	rec.End, rec.LoadEnd = time.Now(), loadAverage()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		fmt.Fprintln(stderr, "testrusage:", err)
		return 1
	}
	st := cmd.ProcessState
	if ru, ok := st.SysUsage().(*syscall.Rusage); ok {
		rec.User, rec.Sys, rec.MaxRSSKB = time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano()), ru.Maxrss
	}
	rec.Exit = st.ExitCode()
	if err := appendRecord(out, rec); err != nil {
		fmt.Fprintln(stderr, "testrusage:", err)
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return rec.Exit
}

// appendRecord appends rec as one line: a write of one line with O_APPEND
// is whole beside the other binaries' (go test runs them at once).
func appendRecord(path string, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	return errors.Join(err, f.Close())
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func readRecords(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var recs []Record
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		var r Record
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", path, n, err)
		}
		recs = append(recs, r)
	}
	return recs, sc.Err()
}

// writeReport prints recs in the order they started: each binary's start
// and end from the first start, wall, CPU and its share of the wall, peak
// memory, load; then the span and the totals.
func writeReport(w io.Writer, recs []Record) {
	if len(recs) == 0 {
		fmt.Fprintln(w, "no records")
		return
	}
	slices.SortStableFunc(recs, func(a, b Record) int { return a.Start.Compare(b.Start) })
	dirs := make([]string, len(recs))
	for i, r := range recs {
		dirs[i] = r.Dir
	}
	root := commonDir(dirs)
	first, last := recs[0].Start, recs[0].End
	var wall, cpu time.Duration
	fmt.Fprintln(w, "| package | start | end | wall | user | sys | cpu/wall | max RSS | load start → end | exit |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
	for _, r := range recs {
		pkg, err := filepath.Rel(root, r.Dir)
		if err != nil {
			pkg = r.Dir
		}
		d := r.End.Sub(r.Start)
		wall, cpu = wall+d, cpu+r.User+r.Sys
		last = later(last, r.End)
		share := 0.0
		if d > 0 {
			share = float64(r.User+r.Sys) / float64(d)
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %.2f | %d MiB | %s → %s | %d |\n", pkg, secs(r.Start.Sub(first)), secs(r.End.Sub(first)),
			secs(d), secs(r.User), secs(r.Sys), share, r.MaxRSSKB>>10, r.LoadStart, r.LoadEnd, r.Exit)
	}
	fmt.Fprintf(w, "\n%d binaries; span %s (first start to last end); wall summed %s; CPU summed %s (user+sys)\n", len(recs), secs(last.Sub(first)), secs(wall), secs(cpu))
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func secs(d time.Duration) string { return fmt.Sprintf("%.1f s", d.Seconds()) }

// commonDir is the deepest directory holding every one of dirs ("" for
// none in common).
func commonDir(dirs []string) string {
	root := dirs[0]
	for _, d := range dirs[1:] {
		for root != "" && d != root && !strings.HasPrefix(d, root+string(filepath.Separator)) {
			if parent := filepath.Dir(root); parent != root {
				root = parent
			} else {
				root = ""
			}
		}
	}
	if len(dirs) == 1 {
		return filepath.Dir(root)
	}
	return root
}
