// Command opensandbox measures commit and restore on the OpenSandbox
// provider against the fake OpenSandbox server, and writes
// bench/opensandbox.md:
//
//	go run ./bench/opensandbox                 # N = 10, 100, 1000; L = 200ms
//	go run ./bench/opensandbox -n 10,100 -l 50ms
//
// Every create (Pending -> Running) and every capture (Creating -> Ready)
// takes L on the server, which captures at most two snapshots at once. A
// commit of N sessions cannot beat ceil(N/2)*L (the server's own limit); a
// restore of N forks at owner parallelism P cannot beat ceil(N/P)*L. The
// goal is at most 1.1x those.
//
// The owner and the fake server run in this process over loopback HTTP; the
// client polls every few milliseconds (PollInterval), which is what the
// ratio's remainder is mostly made of.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/bench/internal/osbench"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

func main() { osbench.Main("bench/opensandbox", run) }

// row is one measured cell.
type row struct {
	op       string
	n, par   int
	snaps    int // max_concurrent_snapshots
	latency  time.Duration
	measured time.Duration
	ideal    time.Duration
	peak     int // server: most captures at once
}

func (r row) ratio() float64 { return float64(r.measured) / float64(r.ideal) }

func run() error {
	sizes := flag.String("n", "10,100,1000", "comma-separated session counts")
	lat := flag.Duration("l", 200*time.Millisecond, "create and capture latency of the fake server")
	par := flag.Int("p", 16, "checkpoint.parallelism of the owner")
	snaps := flag.String("snapshots", "2,4", "comma-separated max_concurrent_snapshots to try")
	poll := flag.Duration("poll", 5*time.Millisecond, "the client's longest wait between polls")
	out := flag.String("out", "bench/opensandbox.md", "where the results go")
	flag.Parse()
	ns, err := osbench.Ints(*sizes)
	if err != nil {
		return err
	}
	ss, err := osbench.Ints(*snaps)
	if err != nil {
		return err
	}
	var rows []row
	for _, s := range ss {
		for _, n := range ns {
			r, err := cell(n, *par, s, *lat, *poll)
			if err != nil {
				return fmt.Errorf("cell n=%d, snapshots %d: %w", n, s, err)
			}
			for _, x := range r {
				fmt.Fprintf(os.Stderr, "%-7s N=%-5d P=%-3d S=%d  %9v  ideal %9v  %.3fx  (server peak captures %d)\n",
					x.op, x.n, x.par, x.snaps, x.measured.Round(time.Millisecond), x.ideal, x.ratio(), x.peak)
			}
			rows = append(rows, r...)
		}
	}
	md := markdown(rows, *lat, *poll)
	fmt.Print(md)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*out, []byte(md), 0o644)
}

// cell seeds n sessions, commits them, abandons the owner (a crash), and
// restores them in a fresh owner.
func cell(n, par, snaps int, lat, poll time.Duration) ([]row, error) {
	ctx := context.Background()
	srv := opensandboxtest.NewServer(opensandboxtest.Options{CreateLatency: lat, SnapshotLatency: lat})
	defer srv.Close()
	lg := osbench.Quiet()
	prov, err := opensandbox.New(opensandbox.Options{
		Domain: srv.Domain, PollInterval: poll, MaxConcurrentSnapshots: snaps,
		MaxConcurrentCreates: 256, ListLabels: map[string]string{owner.LabelOwner: "bench"}, Logger: lg,
	})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "bench-opensandbox-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	open := osbench.Opener(ctx, "bench", prov, lg, dir, par)
	o, err := open()
	if err != nil {
		return nil, err
	}
	if err := osbench.Seed(ctx, o, n, 128, "notes"); err != nil {
		return nil, err
	}
	runtime.GC()
	t0 := time.Now()
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "ck1"}); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	commit := time.Since(t0)
	peak := srv.Stats().PeakCaptures
	o.Abandon()
	o2, err := open()
	if err != nil {
		return nil, err
	}
	defer o2.Close()
	runtime.GC()
	t0 = time.Now()
	if _, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointID: "ck1"}); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	restore := time.Since(t0)
	waves := func(k int) time.Duration { return time.Duration((n+k-1)/k) * lat }
	return []row{
		{op: "commit", n: n, par: par, snaps: snaps, latency: lat, measured: commit, ideal: waves(2), peak: peak},
		{op: "restore", n: n, par: par, snaps: snaps, latency: lat, measured: restore, ideal: waves(par)},
	}, nil
}

func markdown(rows []row, lat, poll time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Commit and restore on the OpenSandbox provider\n\n")
	fmt.Fprintf(&b, "`go run ./bench/opensandbox` on %s, %d CPUs, %s. The fake OpenSandbox server (in process, loopback HTTP) "+
		"takes L = %v per create and per capture and captures at most two snapshots at once; the client polls at most every %v. "+
		"Ideal: commit ⌈N/2⌉·L (the server's capture limit), restore ⌈N/P⌉·L (P = checkpoint.parallelism). Goal ≤ 1.1×. "+
		"S is sandbox.opensandbox.max_concurrent_snapshots.\n\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), lat, poll)
	b.WriteString("| op | N | P | S | measured | ideal | ratio | server's peak captures |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		peak := ""
		if r.op == "commit" {
			peak = strconv.Itoa(r.peak)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %v | %v | %.3f× | %s |\n", r.op, r.n, r.par, r.snaps,
			r.measured.Round(time.Millisecond), r.ideal, r.ratio(), peak)
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "\nLoad average (1, 5, 15 min) when the run ended: %s.\n", strings.Join(strings.Fields(string(la))[:3], ", "))
	}
	return b.String()
}
