package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// BenchmarkSandboxCPUBesideBusyHost: a CPU-bound job (a shell counting to
// 300,000) in one of $BENCH_SANDBOXES (default 4) live isolated sandboxes,
// beside $BENCH_BUSY (default 8) busy host processes (spinning shells,
// children of this process, in its cgroup), the sandboxes' weight bounded
// by $BENCH_CPU_WEIGHT_MAX (unset: the default; 1: one process's worth
// for all of them, as before sandbox.local.cpu_weight_max). Not a timed
// test: it reports the job's wall time, its CPU time (the shell's own
// `times`), their ratio, and the sandboxes' parent weight while it ran.
//
//	go test -run XXX -bench SandboxCPUBesideBusyHost -benchtime 5x ./bench/
//	BENCH_CPU_WEIGHT_MAX=1 go test -run XXX -bench SandboxCPUBesideBusyHost -benchtime 5x ./bench/
//
// On a shared machine the rest of the host's load counts as busy
// processes too: report it beside the figures.
func BenchmarkSandboxCPUBesideBusyHost(b *testing.B) {
	envInt := func(name string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
			return v
		}
		return def
	}
	weightMax, _ := strconv.ParseFloat(os.Getenv("BENCH_CPU_WEIGHT_MAX"), 64)
	log := logrus.New()
	log.SetOutput(io.Discard)
	p, err := local.New(local.Options{Root: b.TempDir(), Isolation: local.IsolationContainer, CPUWeightMax: weightMax,
		InitBinary: os.Getenv("BENCH_INIT_BINARY"), Logger: log})
	if errors.Is(err, local.ErrIsolationUnavailable) {
		b.Skipf("SKIP: the kernel refuses containers here: %v", err)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		list, _ := p.ListSandboxes(context.Background())
		for _, s := range list {
			_ = p.Stop(context.Background(), s.Handle)
		}
		_ = p.Close()
	})
	ctx := context.Background()
	var job provider.Handle
	for i := range max(1, envInt("BENCH_SANDBOXES", 4)) {
		h := localStart(b, p, provider.Spec{})
		if res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true"}); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %+v %v", res, err) // its init, and so its cgroups, run
		}
		if i == 0 {
			job = h
		}
	}
	for range envInt("BENCH_BUSY", 8) {
		cmd := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	var wall, cpu time.Duration
	weight := ""
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		res, err := p.Exec(ctx, job, provider.ExecRequest{Command: "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; times", Timeout: 20 * time.Minute})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("the job: %+v %v", res, err)
		}
		wall += time.Since(t0)
		weight = sandboxesWeight()
		// times: the shell's user and system time, then its children's.
		f := strings.Fields(res.Stdout)
		if len(f) < 2 {
			b.Fatalf("the job's times: %q", res.Stdout)
		}
		for _, s := range f[:2] {
			cpu += shellDuration(b, s)
		}
	}
	n := float64(b.N)
	b.ReportMetric(wall.Seconds()/n, "wall-s/job")
	b.ReportMetric(cpu.Seconds()/n, "cpu-s/job")
	b.ReportMetric(wall.Seconds()/cpu.Seconds(), "wall/cpu")
	b.Logf("load average %s; the sandboxes' parent weight %s; cpu_weight_max %q", loadavg(), weight, os.Getenv("BENCH_CPU_WEIGHT_MAX"))
}

// shellDuration parses a `times` figure such as 0m1.250s.
func shellDuration(b *testing.B, s string) time.Duration {
	m, sec, ok := strings.Cut(strings.TrimSuffix(s, "s"), "m")
	mins, err1 := strconv.Atoi(m)
	secs, err2 := strconv.ParseFloat(sec, 64)
	if !ok || err1 != nil || err2 != nil {
		b.Fatalf("a time of `times`: %q", s)
	}
	return time.Duration((float64(mins)*60 + secs) * float64(time.Second))
}

// sandboxesWeight is the sandboxes' cpu parent's weight file (cgroup v1
// cpu.shares, v2 cpu.weight), "?" where it is not found.
func sandboxesWeight() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "?"
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		// One parent per provider root, sandboxowner-<hash>.
		var pattern string
		switch {
		case parts[1] == "" && parts[0] == "0":
			pattern = filepath.Join("/sys/fs/cgroup", parts[2], "sandboxowner-*", "cpu.weight")
		case strings.Contains(","+parts[1]+",", ",cpu,"):
			pattern = filepath.Join("/sys/fs/cgroup", parts[1], parts[2], "sandboxowner-*", "cpu.shares")
		default:
			continue
		}
		files, _ := filepath.Glob(pattern)
		var found []string
		for _, file := range files {
			if v, err := os.ReadFile(file); err == nil {
				found = append(found, file+"="+strings.TrimSpace(string(v)))
			}
		}
		if len(found) > 0 {
			return strings.Join(found, " ")
		}
	}
	return "?"
}
