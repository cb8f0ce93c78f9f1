package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/provider/local/cmdenv"
	"github.com/sandboxowner/owner/provider/local/sinit"
)

// The memory probe's limit, and what it touches (see
// sinit.RunMemoryProbe).
const (
	memProbeLimitMiB = 16
	memProbeTouchMiB = sinit.MemoryProbeTouchMiB
)

// errNotEnforced: a limit the kernel lets a process exceed.
var errNotEnforced = errors.New("not enforced by the kernel")

// probeMemory checks that a memory limit holds here: in a throwaway cgroup
// under parent limited to limitMiB (memProbeLimitMiB), the probe (the init
// binary bin in its memory probe mode) touching memProbeTouchMiB must be
// killed. A host whose kernel does not charge
// memory to the cgroup lets it finish (errNotEnforced).
func probeMemory(bin, parent string, v2 bool, limitMiB int) error {
	dir := filepath.Join(parent, "probe-memory-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	g := &sandboxCgroup{v2: v2, dirs: map[string]string{"memory": dir}}
	defer g.remove()
	limit := strconv.Itoa(limitMiB << 20)
	files := []string{"memory.limit_in_bytes", "memory.memsw.limit_in_bytes"}
	if v2 {
		files = []string{"memory.max", "memory.swap.max"}
	}
	for i, f := range files {
		v := limit
		if v2 && i == 1 {
			v = "0"
		}
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0); err != nil && i == 0 {
			return err
		}
	}
	procs, err := g.procsFiles()
	if err != nil {
		return err
	}
	defer closeAll(procs)
	cmd := &exec.Cmd{Path: bin, Args: []string{sinit.Name, sinit.StageMemoryProbe}, Env: []string{}, Dir: "/"}
	if err := startJoined(cmd, procs, nil); err != nil {
		return err
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return nil
		}
	}
	if err == nil {
		return fmt.Errorf("%w: a process touched %d MiB under a %d MiB limit", errNotEnforced, memProbeTouchMiB, limitMiB)
	}
	return fmt.Errorf("the memory probe: %w", err)
}

// probePidsForks is how many background processes the pids probe forks;
// probePidsLimit the limit it must not get past.
const (
	probePidsForks = 8
	probePidsLimit = 4
)

// probePids checks that a pids limit holds here: in a throwaway cgroup
// under parent limited to limit processes, a shell forking
// probePidsForks children that wait on a pipe must be refused a fork.
// A limit the kernel does not enforce lets them all start
// (errNotEnforced).
func probePids(parent string, v2 bool, limit int) error {
	dir := filepath.Join(parent, "probe-pids-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	g := &sandboxCgroup{v2: v2, dirs: map[string]string{"pids": dir}}
	defer g.remove()
	if err := os.WriteFile(filepath.Join(dir, "pids.max"), []byte(strconv.Itoa(limit)), 0); err != nil {
		return err
	}
	procs, err := g.procsFiles()
	if err != nil {
		return err
	}
	defer closeAll(procs)
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	// A background job's stdin is /dev/null: each waits on fd 3.
	script := "i=0; while [ $i -lt " + strconv.Itoa(probePidsForks) + " ]; do (read x <&3) & i=$((i+1)); done; echo started $i"
	// Output to a file, not a pipe: the waiting children hold it too.
	f, err := outputFile("pids-probe")
	if err != nil {
		w.Close()
		return err
	}
	defer f.Close()
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", script}, Env: []string{"PATH=" + cmdenv.BasePath}, ExtraFiles: []*os.File{r}, Stdout: f, Stderr: f}
	if err := startJoined(cmd, procs, nil); err != nil {
		w.Close()
		return err
	}
	err = cmd.Wait()
	w.Close() // the children that started read EOF and exit
	out, _ := readOutput(f, 4<<10)
	if err == nil && strings.Contains(out, "started "+strconv.Itoa(probePidsForks)) {
		return fmt.Errorf("%w: %d processes started under a limit of %d", errNotEnforced, probePidsForks+1, limit)
	}
	if strings.Contains(strings.ToLower(out), "fork") {
		return nil
	}
	return fmt.Errorf("the pids probe: %v: %s", err, strings.TrimSpace(out))
}

// The cpu probe's limit: the kernel's smallest quota over a long period, so
// that a shell spinning on a saturated host, given well under a tenth of a
// CPU, still exceeds it within a period and is throttled. A quota of a
// tenth of a CPU was never reached at a load of 20 on two cores, and the
// probe then called an enforced limit unenforced.
const (
	probeCPUPeriodUS = 250000
	probeCPUQuotaUS  = 1000
)

// probeCPUWait bounds how long the cpu probe spins waiting to be
// throttled: twelve periods.
const probeCPUWait = 3 * time.Second

// probeCPU checks that a CPU limit holds here: in a throwaway cgroup under
// parent limited to quotaUS of CPU time per probeCPUPeriodUS, a shell that
// spins must be throttled (cpu.stat's nr_throttled grows) within
// probeCPUWait. A limit the kernel does not enforce never throttles it
// (errNotEnforced).
func probeCPU(parent string, v2 bool, quotaUS int) error {
	dir := filepath.Join(parent, "probe-cpu-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	g := &sandboxCgroup{v2: v2, dirs: map[string]string{"cpu": dir}}
	defer g.remove()
	var err error
	if v2 {
		err = os.WriteFile(filepath.Join(dir, "cpu.max"), []byte(strconv.Itoa(quotaUS)+" "+strconv.Itoa(probeCPUPeriodUS)), 0)
	} else if err = os.WriteFile(filepath.Join(dir, "cpu.cfs_period_us"), []byte(strconv.Itoa(probeCPUPeriodUS)), 0); err == nil {
		err = os.WriteFile(filepath.Join(dir, "cpu.cfs_quota_us"), []byte(strconv.Itoa(quotaUS)), 0)
	}
	if err != nil {
		return err
	}
	procs, err := g.procsFiles()
	if err != nil {
		return err
	}
	defer closeAll(procs)
	cmd := &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", "while :; do :; done"}, Env: []string{}}
	if err := startJoined(cmd, procs, nil); err != nil {
		return err
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(probeCPUWait)
	for time.Now().Before(deadline) {
		if throttled(dir) > 0 {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%w: a process spun for %s under a quota of %d µs per %d µs and was never throttled", errNotEnforced, probeCPUWait, quotaUS, probeCPUPeriodUS)
}

// throttled is cpu.stat's nr_throttled in the cgroup dir.
func throttled(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "cpu.stat"))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "nr_throttled "); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
