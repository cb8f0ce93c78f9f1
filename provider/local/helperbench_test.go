package local

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/localtest"
)

// The provider's helpers as the server's binary (this test binary) and as
// the small init (localtest.InitBinary). Not timed tests: they report
// figures, beside the load average.
//
//	go test -run XXX -bench 'NamespaceHelper|MemoryProbe' -benchtime 20x ./provider/local/

// helperBinaries are the two binaries a helper can be; $BENCH_SERVER_BINARY
// names the server's (go build ./cmd/server) instead of this test binary.
func helperBinaries(b *testing.B) []struct {
	name string
	bin  string
} {
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	if s := os.Getenv("BENCH_SERVER_BINARY"); s != "" {
		self = s
	}
	return []struct {
		name string
		bin  string
	}{{"server-binary", self}, {"small-init", localtest.InitBinary(b)}}
}

// BenchmarkNamespaceHelper: the user namespace helper's CPU time to its
// first namespace (its start and one namespace) and per namespace after
// (the fork of the helper into each), from its threads' schedstat.
func BenchmarkNamespaceHelper(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("SKIP: idmapped namespaces need root")
	}
	for _, c := range helperBinaries(b) {
		b.Run(c.name, func(b *testing.B) {
			m := newNSMaker()
			m.exe = func() (string, error) { return c.bin, nil }
			b.Cleanup(m.close)
			ctx := context.Background()
			mk := func(i int) {
				fd, err := m.make(ctx, nsStorage, owner{1_600_100 + i, 1_600_100 + i})
				if err != nil {
					b.Fatal(err)
				}
				unix.Close(fd)
			}
			t0 := time.Now()
			mk(0)
			first := time.Since(t0)
			m.mu.RLock()
			pid := m.cmd.Process.Pid
			m.mu.RUnlock()
			start := taskCPU(pid)
			i := 1
			for b.Loop() {
				mk(i % 1000)
				i++
			}
			b.ReportMetric(float64(start.Microseconds())/1000, "first-ns-cpu-ms")
			b.ReportMetric(float64(first.Microseconds())/1000, "first-ns-wall-ms")
			b.ReportMetric(float64((taskCPU(pid)-start).Microseconds())/1000/float64(b.N), "cpu-ms/ns")
			b.Logf("load average %s", loadAverage())
		})
	}
}

// BenchmarkMemoryProbe: one memory probe (a process touching 64 MiB under
// a 16 MiB limit, killed), its wall time and its CPU time (rusage of the
// waited children).
func BenchmarkMemoryProbe(b *testing.B) {
	cg := testCgroups(b)
	dir, ok := cg.memoryDir()
	if !ok {
		b.Skip("SKIP: the host lets the server make no memory cgroup here")
	}
	for _, c := range helperBinaries(b) {
		b.Run(c.name, func(b *testing.B) {
			var before, after syscall.Rusage
			_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &before)
			for b.Loop() {
				if err := probeMemory(c.bin, dir, cg.v2, memProbeLimitMiB); err != nil {
					b.Fatal(err)
				}
			}
			_ = syscall.Getrusage(syscall.RUSAGE_CHILDREN, &after)
			cpu := time.Duration(after.Utime.Nano()+after.Stime.Nano()-before.Utime.Nano()-before.Stime.Nano()) / time.Duration(b.N)
			b.ReportMetric(float64(cpu.Microseconds())/1000, "cpu-ms/probe")
			b.Logf("load average %s", loadAverage())
		})
	}
}

// taskCPU is the CPU time of pid's threads that live (schedstat).
func taskCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*/schedstat")
	var ns int64
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if fs := strings.Fields(string(b)); len(fs) > 0 {
			v, _ := strconv.ParseInt(fs[0], 10, 64)
			ns += v
		}
	}
	return time.Duration(ns)
}

func loadAverage() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
