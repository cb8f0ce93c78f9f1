package harness

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Machine describes where a run happened: results from two machines are not
// comparable, so every report carries one.
type Machine struct {
	CPU       string // model name from /proc/cpuinfo
	Cores     int    // logical CPUs the Go runtime may use
	MemoryKiB int64  // MemTotal from /proc/meminfo
	Kernel    string // from /proc/sys/kernel/osrelease
	GoVersion string
	Date      time.Time
	Commit    string // git HEAD, with "+dirty" when the tree has changes
	// LoadStart and LoadEnd are /proc/loadavg's 1-minute load when the run
	// began and ended: other work on the machine skews every figure.
	LoadStart, LoadEnd string
}

// DescribeMachine reads /proc and asks git for the commit of dir. Missing
// sources leave their fields as "unknown" (or zero); nothing fails.
func DescribeMachine(dir string) Machine {
	m := Machine{
		CPU:       "unknown",
		Cores:     runtime.GOMAXPROCS(0),
		Kernel:    "unknown",
		GoVersion: runtime.Version(),
		Date:      time.Now().UTC(),
		Commit:    "unknown",
	}
	if v, ok := procField("/proc/cpuinfo", "model name"); ok {
		m.CPU = v
	}
	if v, ok := procField("/proc/meminfo", "MemTotal"); ok {
		m.MemoryKiB = parseKiB(v)
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	m.Commit = gitCommit(dir)
	m.LoadStart = LoadAverage()
	return m
}

// LoadAverage is the 1-minute load average from /proc/loadavg ("unknown"
// when it cannot be read).
func LoadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "unknown"
}

// procField returns the value of the first "key: value" line of a /proc
// file whose key is key.
func procField(path, key string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// parseKiB reads "24683628 kB" as 24683628.
func parseKiB(v string) int64 {
	n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
	return n
}

// VmRSS is the process's resident set in bytes, from /proc/self/status.
func VmRSS() (int64, error) {
	v, ok := procField("/proc/self/status", "VmRSS")
	if !ok {
		return 0, fmt.Errorf("read VmRSS: no VmRSS line in /proc/self/status")
	}
	return parseKiB(v) << 10, nil
}

func gitCommit(dir string) string {
	run := func(args ...string) (string, error) {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		out, err := cmd.Output()
		return string(bytes.TrimSpace(out)), err
	}
	head, err := run("rev-parse", "--short=12", "HEAD")
	if err != nil || head == "" {
		return "unknown"
	}
	if st, err := run("status", "--porcelain", "--untracked-files=no"); err == nil && st != "" {
		head += "+dirty"
	}
	return head
}

func (m Machine) markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "| | |\n|---|---|\n")
	fmt.Fprintf(&b, "| CPU | %s |\n", m.CPU)
	fmt.Fprintf(&b, "| cores (GOMAXPROCS) | %d |\n", m.Cores)
	fmt.Fprintf(&b, "| memory | %.1f GiB |\n", float64(m.MemoryKiB)/(1<<20))
	fmt.Fprintf(&b, "| kernel | %s |\n", m.Kernel)
	fmt.Fprintf(&b, "| Go | %s |\n", m.GoVersion)
	fmt.Fprintf(&b, "| date | %s |\n", m.Date.Format(time.RFC3339))
	fmt.Fprintf(&b, "| commit | %s |\n", m.Commit)
	fmt.Fprintf(&b, "| load average (1 min) at start, end | %s, %s |\n", m.LoadStart, m.LoadEnd)
	return b.String()
}
