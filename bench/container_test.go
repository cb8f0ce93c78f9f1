package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/app"
)

// The container figures: the notes server on the local provider with its
// default isolation (each sandbox a container of the server's own, a uid
// of its own), in this process. Not timed tests: they report figures.
//
//	go test -run XXX -bench Container -benchtime 200x ./bench/
//
// The sandboxes' inits are this test binary re-executed (the server's own
// binary, the default) unless $BENCH_INIT_BINARY names a separate init
// (go build -o /tmp/sandbox-init ./cmd/sandbox-init; see
// sandbox.local.init_binary).
//
// BenchmarkContainerExec: POST /sandboxes/{id}/exec of `true` through the
// sandbox API (HTTP, the token /sandbox_access gave), one session; median
// and 90th percentile, and the median of the floor (see shellFloor)
// measured between them.
// BenchmarkContainerSeed: POST seed_session of a notes session (its
// sandbox started, not yet its init); median.
// BenchmarkContainerFirstExec: a fresh session's first exec of `true`,
// which starts its sandbox's init (the server's fork into the sandbox's
// namespaces, the init's setup of its container); median and 90th
// percentile.
// BenchmarkContainerIdleMemory: b.N sessions each with one exec behind it
// (its init live, idle), per sandbox: the proportional set size of their
// inits (and of the server's other children, the holders of the ready
// user namespaces), the inits' threads, the server's live heap growth, the host's kernel memory growth
// (slab, kernel stacks, page tables, per-cpu), their sum, the page cache
// apart (reclaimable), what the kernel charges their memory cgroups, and
// the host's MemAvailable drop (the host-wide figures are noisy on a
// shared machine: others' work moves them). Linear in b.N but for shared
// text. It stops (fails) rather than take the host's MemAvailable under a
// quarter of its memory.

// notesServer starts the notes server on the local provider over a fresh
// state directory.
func notesServer(b *testing.B) string {
	b.Helper()
	cfg := app.Defaults()
	cfg.Port = 0
	cfg.MaxSessions = 0
	cfg.Sandbox.Local.Root = filepath.Join(b.TempDir(), "sandboxes")
	cfg.Sandbox.Local.InitBinary = os.Getenv("BENCH_INIT_BINARY")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	log := logrus.New()
	log.SetOutput(io.Discard)
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Logger: log})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Stop(context.Background()) })
	return "http://" + a.Addr().String()
}

// notesAgent is one session's client (its cookie).
type notesAgent struct {
	base string
	cl   *http.Client
}

func newNotesAgent(base string) *notesAgent {
	jar, _ := cookiejar.New(nil)
	return &notesAgent{base: base, cl: &http.Client{Jar: jar, Timeout: time.Minute}}
}

func (a *notesAgent) post(b *testing.B, url, bearer string, body any) map[string]any {
	b.Helper()
	raw, _ := json.Marshal(body)
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		b.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	res, err := a.cl.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	defer res.Body.Close()
	var m map[string]any
	out, _ := io.ReadAll(res.Body)
	if err := json.Unmarshal(out, &m); err != nil || res.StatusCode != 200 {
		b.Fatalf("POST %s: %d %s", url, res.StatusCode, out)
	}
	return m
}

// seed seeds the agent's notes session and returns its sandbox API
// endpoint and token.
func (a *notesAgent) seed(b *testing.B, rollout string) (endpoint, token string) {
	b.Helper()
	a.post(b, a.base+"/ng-rollout/"+rollout+"/seed_session", "", map[string]any{"instance_id": rollout})
	acc := a.post(b, a.base+"/ng-rollout/"+rollout+"/sandbox_access", "", nil)
	conn, _ := acc["connection"].(map[string]any)
	desc, _ := conn["descriptor"].(map[string]any)
	endpoint, _ = desc["endpoint"].(string)
	token, _ = desc["token"].(string)
	if endpoint == "" || token == "" {
		b.Fatalf("sandbox_access: %v", acc)
	}
	return endpoint, token
}

func (a *notesAgent) exec(b *testing.B, endpoint, token, command string) {
	b.Helper()
	m := a.post(b, endpoint+"/exec", token, map[string]any{"command": command})
	if m["exit_code"] != 0.0 {
		b.Fatalf("exec %q: %v", command, m)
	}
}

func percentile(d []time.Duration, p float64) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func BenchmarkContainerExec(b *testing.B) {
	a := newNotesAgent(notesServer(b))
	endpoint, token := a.seed(b, "r0")
	a.exec(b, endpoint, token, "true") // the init starts
	measureExecs(b, func() { a.exec(b, endpoint, token, "true") })
	b.Logf("load average %s", loadavg())
}

// measureExecs runs exec once an iteration and reports its median and
// 90th percentile, and the median of shellFloor measured off the timer
// beside it. It also reports what the load moves least, per exec: the
// CPU time and context switches of this process during the execs (the
// server's and the client's: selfcpu-us, selfcsw), and those of the
// sandbox inits it started (initcpu-us, initcsw: every thread of every
// init, before and after the loop), neither counting the command itself
// nor the floor.
func measureExecs(b *testing.B, exec func()) {
	b.Helper()
	var took, floor []time.Duration
	var self usage
	inits := initsUsage()
	for b.Loop() {
		before := selfUsage()
		began := time.Now()
		exec()
		took = append(took, time.Since(began))
		self = self.plus(selfUsage().minus(before))
		b.StopTimer()
		floor = append(floor, shellFloor(b))
		b.StartTimer()
	}
	inits = initsUsage().minus(inits)
	n := float64(len(took))
	b.ReportMetric(percentile(took, 0.5), "median-ms")
	b.ReportMetric(percentile(took, 0.9), "p90-ms")
	b.ReportMetric(percentile(floor, 0.5), "floor-median-ms")
	b.ReportMetric(float64(self.cpu.Microseconds())/n, "selfcpu-us")
	b.ReportMetric(float64(self.switches)/n, "selfcsw")
	b.ReportMetric(float64(inits.cpu.Microseconds())/n, "initcpu-us")
	b.ReportMetric(float64(inits.switches)/n, "initcsw")
}

// usage is CPU time and context switches (voluntary and not): on a
// loaded machine, and on a virtual one where each costs a trip to the
// hypervisor, what an exec costs besides waiting.
type usage struct {
	cpu      time.Duration
	switches int64
}

func (u usage) plus(v usage) usage  { return usage{u.cpu + v.cpu, u.switches + v.switches} }
func (u usage) minus(v usage) usage { return usage{u.cpu - v.cpu, u.switches - v.switches} }

// selfUsage is what this process has used (every thread, user and
// system).
func selfUsage() usage {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return usage{time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Nvcsw + ru.Nivcsw}
}

// initsUsage is what the sandbox inits this process started have used so
// far: each of their threads' run time (schedstat's first field, in
// nanoseconds) and context switches (status).
func initsUsage() usage {
	var sum usage
	for _, pid := range childPids("sandbox-init") {
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(pid) + "/task/*")
		for _, t := range tasks {
			if raw, err := os.ReadFile(t + "/schedstat"); err == nil {
				if f := strings.Fields(string(raw)); len(f) > 0 {
					ns, _ := strconv.ParseInt(f[0], 10, 64)
					sum.cpu += time.Duration(ns)
				}
			}
			raw, _ := os.ReadFile(t + "/status")
			for _, l := range strings.Split(string(raw), "\n") {
				if _, v, ok := strings.Cut(l, "ctxt_switches:"); ok {
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					sum.switches += n
				}
			}
		}
	}
	return sum
}

// childPids lists this process's children named comm.
func childPids(comm string) []int {
	var out []int
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil || !bytes.Contains(stat, []byte("("+comm+")")) {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 2 || f[1] != self {
			continue
		}
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// shellFloor is what `/bin/sh -c true` costs started straight from this
// process (fork, exec, exit, wait; no sandbox, no server), measured
// between the execs so that the load weighs on both alike: no exec of a
// sandbox's shell can take less.
func shellFloor(b *testing.B) time.Duration {
	b.Helper()
	began := time.Now()
	pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", "true"}, &syscall.ProcAttr{Env: []string{"PATH=/usr/bin:/bin"}, Sys: &syscall.SysProcAttr{Setpgid: true}})
	if err != nil {
		b.Fatal(err)
	}
	var ws syscall.WaitStatus
	for {
		if _, err := syscall.Wait4(pid, &ws, 0, nil); err != syscall.EINTR {
			break
		}
	}
	return time.Since(began)
}

func BenchmarkContainerFirstExec(b *testing.B) {
	base := notesServer(b)
	var took []time.Duration
	i := 0
	for b.Loop() {
		b.StopTimer()
		a := newNotesAgent(base)
		endpoint, token := a.seed(b, "r"+strconv.Itoa(i))
		i++
		b.StartTimer()
		began := time.Now()
		a.exec(b, endpoint, token, "true")
		took = append(took, time.Since(began))
	}
	b.ReportMetric(percentile(took, 0.5), "median-ms")
	b.ReportMetric(percentile(took, 0.9), "p90-ms")
	b.Logf("load average %s", loadavg())
}

func BenchmarkContainerSeed(b *testing.B) {
	base := notesServer(b)
	var took []time.Duration
	i := 0
	for b.Loop() {
		a := newNotesAgent(base)
		began := time.Now()
		a.post(b, base+"/ng-rollout/r"+strconv.Itoa(i)+"/seed_session", "", map[string]any{"instance_id": "row"})
		took = append(took, time.Since(began))
		i++
	}
	b.ReportMetric(percentile(took, 0.5), "median-ms")
	b.ReportMetric(percentile(took, 0.9), "p90-ms")
	b.Logf("load average %s", loadavg())
}

func BenchmarkContainerIdleMemory(b *testing.B) {
	base := notesServer(b)
	before := memAvailableKiB(b)
	kBefore := kernelKiB(b)
	slabBefore := slabKiB()
	heapBefore := liveHeapBytes()
	floor := memTotalKiB(b) / 4
	var agents []*notesAgent // kept: the sessions stay live
	n := 0
	for b.Loop() {
		// The host is shared: past a quarter of its memory left, stop
		// rather than squeeze the others.
		if n%50 == 0 && memAvailableKiB(b) < floor {
			b.Fatalf("stopped at %d sandboxes: MemAvailable under a quarter of MemTotal", n)
		}
		a := newNotesAgent(base)
		endpoint, token := a.seed(b, "r"+strconv.Itoa(n))
		a.exec(b, endpoint, token, "true")
		agents = append(agents, a)
		n++
	}
	heapAfter := liveHeapBytes()
	kAfter := kernelKiB(b)
	slabAfter := slabKiB()
	after := memAvailableKiB(b)
	kids := childrenPss(b)
	if kids.inits < n {
		b.Fatalf("%d inits for %d sandboxes", kids.inits, n)
	}
	initKiB := float64(kids.initPss) / float64(n)
	otherKiB := float64(kids.otherPss) / float64(n)
	heapKiB := float64(heapAfter-heapBefore) / 1024 / float64(n)
	b.ReportMetric(initKiB, "init-pss-KiB/sandbox")
	b.ReportMetric(float64(kids.initThreads)/float64(kids.inits), "init-threads")
	b.ReportMetric(otherKiB, "helpers-pss-KiB/sandbox")
	b.ReportMetric(heapKiB, "server-heap-KiB/sandbox")
	var kernel float64
	for _, k := range kernelFields {
		d := float64(kAfter[k]-kBefore[k]) / float64(n)
		kernel += d
		b.ReportMetric(d, "kernel-"+k+"-KiB/sandbox")
	}
	for _, k := range cacheFields {
		b.ReportMetric(float64(kAfter[k]-kBefore[k])/float64(n), "cache-"+k+"-KiB/sandbox")
	}
	b.ReportMetric(initKiB+otherKiB+heapKiB+kernel, "total-KiB/sandbox")
	if cg, k := cgroupsUsageKiB(); k > 0 {
		b.ReportMetric(float64(cg)/float64(k), "cgroup-usage-KiB/sandbox")
	}
	b.ReportMetric(float64(before-after)/float64(n), "memavailable-drop-KiB/sandbox")
	if slabAfter != nil {
		b.Logf("slab caches grown most, KiB a sandbox: %s", topGrowth(slabBefore, slabAfter, n, 8))
	}
	b.Logf("%d sandboxes, %d inits, %d other children (%d KiB), %d sessions kept, load average %s", n, kids.inits, kids.others, kids.otherPss, len(agents), loadavg())
}

// liveHeapBytes is this process's (the server's) live heap after a
// collection.
func liveHeapBytes() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// kernelFields are the host's kernel memory counters (in /proc/meminfo)
// a sandbox grows: its namespaces, mounts, cgroups, loop device and
// seccomp filter are slab and per-cpu objects, its processes' kernel
// stacks and page tables. Host-wide: others' work moves them too.
var kernelFields = []string{"SUnreclaim", "SReclaimable", "KernelStack", "PageTables", "Percpu"}

// cacheFields are the page cache a sandbox's disk image fills (its file's
// pages and its loop device's buffers, the ext4 metadata written and read),
// reported apart: the kernel reclaims it under pressure.
var cacheFields = []string{"Buffers", "Cached", "Dirty"}

func kernelKiB(b *testing.B) map[string]int {
	b.Helper()
	runtime.GC()
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int{}
	for _, l := range strings.Split(string(raw), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || !slices.Contains(kernelFields, k) && !slices.Contains(cacheFields, k) {
			continue
		}
		out[k], _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
	}
	return out
}

// cgroupsUsageKiB sums memory.usage_in_bytes (v1) of the sandboxes'
// memory cgroups under this process's own: what the kernel charges them
// (their processes' memory, their page cache, and kernel memory where it
// is accounted), and counts them.
func cgroupsUsageKiB() (kib, n int) {
	raw, _ := os.ReadFile("/proc/self/cgroup")
	for _, l := range strings.Split(string(raw), "\n") {
		own, ok := strings.CutPrefix(l, strings.SplitN(l, ":", 2)[0]+":memory:")
		if !ok {
			continue
		}
		dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/memory", own, "sandboxowner-*", "sb-*", "memory.usage_in_bytes"))
		for _, d := range dirs {
			b, err := os.ReadFile(d)
			if err != nil {
				continue
			}
			v, _ := strconv.Atoi(strings.TrimSpace(string(b)))
			kib += v >> 10
			n++
		}
	}
	return kib, n
}

func memAvailableKiB(b *testing.B) int { return meminfoKiB(b, "MemAvailable") }

func memTotalKiB(b *testing.B) int { return meminfoKiB(b, "MemTotal") }

func meminfoKiB(b *testing.B, field string) int {
	b.Helper()
	raw, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(l, field+":"); ok {
			n, _ := strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			return n
		}
	}
	b.Fatal("no " + field + " in /proc/meminfo")
	return 0
}

// children is what this process's (the server's) children hold: its
// sandboxes' inits, and any other (the holders of ready user namespaces,
// helpers still running), by proportional set size in KiB.
type children struct {
	inits, initPss, initThreads int
	others, otherPss            int
}

// childrenPss sums the proportional set size of this process's children
// from their smaps_rollup, the inits (named sandbox-init) apart.
func childrenPss(b *testing.B) children {
	b.Helper()
	var c children
	self := strconv.Itoa(os.Getpid())
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		stat, err := os.ReadFile(d + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 18 || f[1] != self {
			continue
		}
		raw, err := os.ReadFile(d + "/smaps_rollup")
		if err != nil {
			continue
		}
		pss := 0
		for _, l := range strings.Split(string(raw), "\n") {
			if v, ok := strings.CutPrefix(l, "Pss:"); ok {
				pss, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
			}
		}
		if strings.Contains(string(stat), "(sandbox-init)") {
			threads, _ := strconv.Atoi(f[17])
			c.inits++
			c.initPss += pss
			c.initThreads += threads
		} else {
			c.others++
			c.otherPss += pss
		}
	}
	return c
}

// slabKiB is the memory of each slab cache in /proc/slabinfo (readable by
// root only; nil otherwise): its slabs times their pages.
func slabKiB() map[string]int {
	raw, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		return nil
	}
	page := os.Getpagesize() >> 10
	out := map[string]int{}
	for _, l := range strings.Split(string(raw), "\n") {
		f := strings.Fields(l)
		// name active num size perslab pagesperslab : tunables l b s : slabdata active num shared
		if len(f) < 16 || f[0] == "#" {
			continue
		}
		pages, _ := strconv.Atoi(f[5])
		slabs, _ := strconv.Atoi(f[14])
		out[f[0]] += slabs * pages * page
	}
	return out
}

// topGrowth names the k caches that grew most from before to after, per
// sandbox of n.
func topGrowth(before, after map[string]int, n, k int) string {
	type grown struct {
		name string
		kib  int
	}
	var g []grown
	for name, v := range after {
		g = append(g, grown{name, v - before[name]})
	}
	slices.SortFunc(g, func(a, b grown) int { return b.kib - a.kib })
	var parts []string
	for _, x := range g[:min(k, len(g))] {
		parts = append(parts, x.name+" "+strconv.FormatFloat(float64(x.kib)/float64(n), 'f', 1, 64))
	}
	return strings.Join(parts, ", ")
}
