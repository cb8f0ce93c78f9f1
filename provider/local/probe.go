package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
)

// memProbeName is argv[0] of the memory probe: the server's binary run
// again (see init), which touches memProbeTouchMiB and exits 0 unless the
// kernel kills it first.
const (
	memProbeName     = "sandbox-memory-probe"
	memProbeLimitMiB = 16
	memProbeTouchMiB = 64
)

// runMemProbe touches memProbeTouchMiB of fresh memory, a page at a time.
func runMemProbe() int {
	b := make([]byte, memProbeTouchMiB<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	if b[len(b)-4096] != 1 {
		return 1
	}
	return 0
}

// errNotEnforced: a limit the kernel lets a process exceed.
var errNotEnforced = errors.New("not enforced by the kernel")

// probeMemory checks that a memory limit holds here: in a throwaway cgroup
// under parent limited to limitMiB (memProbeLimitMiB), the probe touching
// memProbeTouchMiB must be killed. A host whose kernel does not charge
// memory to the cgroup lets it finish (errNotEnforced).
func probeMemory(parent string, v2 bool, limitMiB int) error {
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
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cmd := &exec.Cmd{Path: exe, Args: []string{memProbeName}, Env: []string{}}
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
