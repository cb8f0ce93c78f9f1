package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// childEnv makes this test binary the wrapped one: it spins until it has
// used the CPU time the variable gives (however loaded the machine), then
// exits with status 3.
const childEnv = "TESTRUSAGE_TEST_CHILD"

func TestMain(m *testing.M) {
	if d, err := time.ParseDuration(os.Getenv(childEnv)); err == nil {
		for cpuTime() < d {
		}
		os.Exit(3)
	}
	os.Exit(m.Run())
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The wrapper runs the binary with its arguments in go test's directory,
// exits with its status, and records its run: its CPU (what it spun, at
// least) within its wall time.
func TestWrapRecordsTheBinarysRun(t *testing.T) {
	out := filepath.Join(t.TempDir(), "r.jsonl")
	t.Setenv(childEnv, "200ms")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	for range 2 {
		if code := run([]string{"-o", out, self, "-test.run", "none"}, &bytes.Buffer{}, &stderr); code != 3 {
			t.Fatalf("exit %d, want the binary's 3; stderr %s", code, stderr.String())
		}
	}
	recs, err := readRecords(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 2 {
		t.Fatalf("%d records, want one per run", len(recs))
	}
	dir, _ := os.Getwd()
	for _, r := range recs {
		wall, cpu := r.End.Sub(r.Start), r.User+r.Sys
		if r.Dir != dir || r.Binary != filepath.Base(self) || r.Exit != 3 || cpu < 200*time.Millisecond || cpu > 2*wall+time.Second || r.MaxRSSKB <= 0 || r.LoadStart == "" {
			t.Errorf("record %+v (wall %v, cpu %v)", r, wall, cpu)
		}
	}
}

func TestReportOrdersByStart(t *testing.T) {
	t0 := time.Date(2026, 12, 6, 0, 0, 0, 0, time.UTC)
	recs := []Record{
		{Dir: "/m/sim/process", Binary: "process.test", Start: t0.Add(2 * time.Second), End: t0.Add(12 * time.Second), User: 3 * time.Second, Sys: time.Second, MaxRSSKB: 2048, LoadStart: "1.00 1.00 1.00", LoadEnd: "2.00 1.00 1.00"},
		{Dir: "/m/app", Binary: "app.test", Start: t0, End: t0.Add(4 * time.Second), User: 2 * time.Second, Sys: 2 * time.Second, MaxRSSKB: 1024, LoadStart: "0.50 0.50 0.50", LoadEnd: "1.00 0.50 0.50", Exit: 1},
	}
	var b bytes.Buffer
	writeReport(&b, recs)
	want := strings.Join([]string{
		"| package | start | end | wall | user | sys | cpu/wall | max RSS | load start → end | exit |",
		"|---|---:|---:|---:|---:|---:|---:|---:|---|---:|",
		"| app | 0.0 s | 4.0 s | 4.0 s | 2.0 s | 2.0 s | 1.00 | 1 MiB | 0.50 0.50 0.50 → 1.00 0.50 0.50 | 1 |",
		"| sim/process | 2.0 s | 12.0 s | 10.0 s | 3.0 s | 1.0 s | 0.40 | 2 MiB | 1.00 1.00 1.00 → 2.00 1.00 1.00 | 0 |",
		"",
		"2 binaries; span 12.0 s (first start to last end); wall summed 14.0 s; CPU summed 8.0 s (user+sys)",
		"",
	}, "\n")
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
}

func TestUsage(t *testing.T) {
	var stderr bytes.Buffer
	if code := run(nil, &bytes.Buffer{}, &stderr); code != 2 || !strings.Contains(stderr.String(), "usage") {
		t.Errorf("no arguments: exit %d, %q", code, stderr.String())
	}
	if code := run([]string{"-report", filepath.Join(t.TempDir(), "absent")}, &bytes.Buffer{}, &stderr); code != 1 {
		t.Errorf("an absent report file: exit %d", code)
	}
}
