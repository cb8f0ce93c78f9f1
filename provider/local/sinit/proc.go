package sinit

import (
	"bytes"
	"os"
	"strconv"
)

// ProcEntry is what ListProcs reads of one /proc/<pid>/stat.
type ProcEntry struct {
	Pid   int
	State byte
	Pgrp  int
}

// ListProcs reads every process's state and process group.
func ListProcs() []ProcEntry {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	out := make([]ProcEntry, 0, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// "pid (comm) state ppid pgrp ...": comm may hold spaces and ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 3 || len(f[0]) != 1 {
			continue
		}
		pgrp, err := strconv.Atoi(string(f[2]))
		if err != nil {
			continue
		}
		out = append(out, ProcEntry{Pid: pid, State: f[0][0], Pgrp: pgrp})
	}
	return out
}
