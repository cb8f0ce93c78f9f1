package app

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultSessionIdleTimeout is session_idle_timeout's default.
const DefaultSessionIdleTimeout = 6 * time.Hour

// Sizing of max_sessions' default: every session is given MemoryPerSession
// of the machine's memory (its sandbox's processes and page cache, the
// owner's own cost being a few KB), within these bounds.
const (
	MemoryPerSession = 16 << 20
	MinMaxSessions   = 64
	MaxMaxSessions   = 16384
	// fallbackMaxSessions is used when the memory cannot be read.
	fallbackMaxSessions = 1024
)

// DefaultMaxSessions is max_sessions' default for this machine: its memory
// over MemoryPerSession, between MinMaxSessions and MaxMaxSessions (1,472
// on a 23 GiB machine).
func DefaultMaxSessions() int {
	total, ok := memTotal()
	if !ok {
		return fallbackMaxSessions
	}
	return int(min(max(total/MemoryPerSession, MinMaxSessions), MaxMaxSessions))
}

// memTotal reads MemTotal from /proc/meminfo, in bytes.
func memTotal() (int64, bool) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), "MemTotal:")
		if !ok {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) != 2 || fields[1] != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		return kb << 10, err == nil && kb > 0
	}
	return 0, false
}
