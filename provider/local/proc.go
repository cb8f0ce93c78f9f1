package local

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strconv"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// killGroup sends SIGKILL to process group pgid; a group already gone is fine.
func killGroup(pgid int) { signalGroup(pgid, syscall.SIGKILL) }

func signalGroup(pgid int, sig syscall.Signal) {
	if pgid > 1 {
		_ = syscall.Kill(-pgid, sig)
	}
}

// markedProcesses returns the pids of processes whose environment holds
// SandboxIDEnv=id.
func markedProcesses(id string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	marker := []byte("\x00" + SandboxIDEnv + "=" + id + "\x00")
	self := os.Getpid()
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || len(env) == 0 {
			continue
		}
		if bytes.Contains(append([]byte{0}, env...), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killMarked kills every process marked with the sandbox's id, in rounds
// until none is left (a process may fork while it is being killed, and a
// killed one keeps its environment until it is a zombie), for at most
// killLimit, and returns how many kills it sent.
func killMarked(id string) int {
	n := 0
	deadline := time.Now().Add(killLimit)
	for {
		pids := markedProcesses(id)
		if len(pids) == 0 || time.Now().After(deadline) {
			return n
		}
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err == nil {
				n++
			}
		}
		time.Sleep(pollEvery)
	}
}

// errNotStopped: a process of a paused group did not reach the stopped
// state in time (it may be in uninterruptible sleep).
var errNotStopped = errors.New("local: a paused command did not stop in time")

// waitPidsStopped waits until every process of pids is stopped (or
// dead), polling /proc, for at most limit and while ctx lasts.
func waitPidsStopped(ctx context.Context, pids []int, limit time.Duration) error {
	want := make(map[int]bool, len(pids))
	for _, pid := range pids {
		want[pid] = true
	}
	deadline := time.Now().Add(limit)
	for {
		pending := false
		for _, e := range sinit.ListProcs() {
			if want[e.Pid] && e.State != 'T' && e.State != 't' && e.State != 'Z' && e.State != 'X' {
				pending = true
				break
			}
		}
		if !pending {
			return nil
		}
		if time.Now().After(deadline) {
			return errNotStopped
		}
		if err := pollPause(ctx); err != nil {
			return err
		}
	}
}

// pollEvery is how often the provider looks again at what it waits for
// the kernel to do (processes stopped, frozen or gone).
const pollEvery = time.Millisecond

// pollPause waits pollEvery, or returns ctx's error once ctx ends first.
func pollPause(ctx context.Context) error {
	t := time.NewTimer(pollEvery)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
