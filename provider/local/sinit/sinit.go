// Package sinit is what a local sandbox's init runs: the long-lived
// process every command of a sandbox is started from (Run), its first
// stage that builds an isolated sandbox's root (RunSetup), and the
// messages the server and the init exchange. It is imported by the
// provider (package local, the server's side) and by cmd/sandbox-init, a
// small binary that runs only this, so that an init need not be the
// whole server's binary: its start costs about a third of the server's
// (10 ms of CPU and 194 page faults against 29 ms and 543, measured on a
// loaded 2-core machine). Its imports stay few for that reason: each
// package's initialisation runs at every init's start.
//
// Either binary dispatches on its argv in this package's init (see
// Dispatch), before the rest of the server's packages are initialised.
// The provider's memory probe and user namespace helper are modes of it
// too (see StageMemoryProbe, StageUserNS).
package sinit

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Name is argv[0] of a sandbox's init. An isolated sandbox's init runs in
// two stages, StageSetup then StageRun (its argv[1]); an unisolated one's
// has no argv[1]. StageIdentity (argv[1]) prints Identity and exits: the
// provider's check that a separate init binary speaks its protocol.
const (
	Name          = "sandbox-init"
	StageSetup    = "setup"
	StageRun      = "run"
	StageIdentity = "identity"
)

// Fd is the init's end of its control socket; ExeFd, in an isolated
// init's setup stage, the binary it executes as the init proper.
const (
	Fd    = 3
	ExeFd = 4
)

// Msg is one message on an init's control socket (SOCK_SEQPACKET: one
// message per packet), or a command's answer on its status pipe (one
// message, then the pipe closes).
//
//	server → init  {"op":"setup","setup"}: first, to an isolated sandbox's init (see RunSetup)
//	init → server  {"op":"ready"} once it runs commands; {"op":"exit","error"} if it cannot
//	server → init  {"op":"run","id","command","env","dir"} + the command's stdout, stderr and status pipe
//	server → init  {"op":"kill","id"}: SIGKILL to the command's process group
//	init → status  {"op":"exit","id","status"} once the command exited, or
//	init → status  {"op":"exit","id","error"} when it could not start; then the pipe closes
type Msg struct {
	Op      string   `json:"op"`
	ID      uint64   `json:"id"`
	Command string   `json:"command,omitempty"`
	Env     []string `json:"env,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	Status  uint32   `json:"status,omitempty"`
	Error   string   `json:"error,omitempty"`
	Setup   *Setup   `json:"setup,omitempty"`
}

// closeRangeCloexec is close_range(2)'s CLOSE_RANGE_CLOEXEC: mark the
// descriptors close-on-exec instead of closing them.
const closeRangeCloexec = 1 << 2

// MaxMsg bounds one control message (a command and its environment).
const MaxMsg = 1 << 20

// KillLimit bounds how long the init keeps killing what a killed command
// (or, unisolated, a sandbox whose server went away) left running.
const KillLimit = 5 * time.Second

func init() {
	if code, ok := Dispatch(os.Args); ok {
		os.Exit(code)
	}
}

// Dispatch runs what args (a process's argv) names, if it names an init
// (argv[0]'s base is Name): the process never goes on to its main. ok is
// false, and nothing ran, for any other argv.
func Dispatch(args []string) (code int, ok bool) {
	if len(args) == 0 || filepath.Base(args[0]) != Name {
		return 0, false
	}
	switch {
	case len(args) == 1:
		return Run(false), true
	case len(args) == 2 && args[1] == StageSetup:
		return RunSetup(), true
	case len(args) == 2 && args[1] == StageRun:
		return Run(true), true
	case len(args) == 2 && args[1] == StageMemoryProbe:
		return RunMemoryProbe(), true
	case len(args) == 2 && args[1] == StageUserNS:
		return RunUserNS(), true
	case len(args) == 2 && args[1] == StageIdentity:
		if _, err := os.Stdout.WriteString(Identity() + "\n"); err != nil {
			return 1, true
		}
		return 0, true
	}
	return 0, false
}

// Run is a sandbox's init: the long-lived process every command of
// the sandbox is started from, so that what a command leaves running
// keeps running until the sandbox stops. It is not dumpable (no process of
// the sandbox may ptrace it or read its memory), reaps every orphan (it is
// the sandbox's pid 1, or else a child subreaper), starts each command in
// a process group of its own with exactly the environment the request
// gave, and exits when the server's end of the control socket closes.
// Isolated, it follows RunSetup, and tells the server it is ready.
//
// It keeps its threads asleep between commands, which on a loaded (or
// virtual) machine is most of what it costs: it runs on one P (its
// environment says GOMAXPROCS=1, set by the provider), and waits
// for the server's messages in the runtime's poller rather than in a
// blocking recvmsg. A goroutine in a blocking syscall keeps its P, and
// while any P is held the runtime's monitor thread wakes every 20 µs to
// 10 ms (40 wakeups per exec of `true` measured), where with every P idle
// it sleeps.
func Run(isolated bool) int {
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		return 125
	}
	// No command inherits the control socket, nor what the server itself
	// inherited from whatever started it.
	unix.CloseOnExec(Fd)
	_ = unix.CloseRange(Fd+1, ^uint(0), closeRangeCloexec)
	if os.Getpid() != 1 {
		_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	}
	type started struct {
		id     uint64
		status int // the command's status pipe
	}
	var (
		mu     sync.Mutex
		procs  = map[int]started{} // pid → the request that started it
		killed = map[uint64]bool{} // requests whose group was killed
	)
	// answer writes a command's one answer to its status pipe and closes
	// it.
	answer := func(status int, m Msg) {
		b, _ := json.Marshal(m)
		_, _ = unix.Write(status, b)
		unix.Close(status)
	}
	send := func(m Msg) {
		b, _ := json.Marshal(m)
		_ = unix.Sendmsg(Fd, b, nil, nil, 0)
	}
	// Its answers go on each command's own pipe, not the socket: the exec
	// waiting for one reads it itself, and no reader in the server stands
	// between (a wakeup and a goroutine hop less per command).
	// The reaper waits in wait4 itself rather than for SIGCHLD: a
	// signal reaches it through the runtime's signal goroutine, a wakeup
	// more per command, which a loaded machine makes milliseconds. With no
	// child to wait for it waits for the next command to start.
	spawned := make(chan struct{}, 1)
	go func() {
		for {
			var ws unix.WaitStatus
			pid, err := unix.Wait4(-1, &ws, 0, nil)
			switch {
			case err == unix.ECHILD:
				<-spawned
				continue
			case err != nil || pid <= 0:
				continue
			}
			mu.Lock()
			st, ok := procs[pid]
			delete(procs, pid)
			wasKilled := killed[st.id]
			delete(killed, st.id)
			mu.Unlock()
			if !ok {
				continue
			}
			if wasKilled {
				// What the kill hit is gone before the exit is told.
				reapGroup(pid)
			}
			answer(st.status, Msg{Op: "exit", ID: st.id, Status: uint32(ws)})
		}
	}()
	devnull, err := unix.Open("/dev/null", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return 125
	}
	if isolated {
		// Executed from a descriptor: its name would be the number.
		name := append([]byte(Name), 0)
		_ = unix.Prctl(unix.PR_SET_NAME, uintptr(unsafe.Pointer(&name[0])), 0, 0, 0)
		send(Msg{Op: "ready"})
	}
	if err := unix.SetNonblock(Fd, true); err != nil {
		return 125
	}
	// Read through the poller: a wait there holds no P.
	control, err := os.NewFile(Fd, "control").SyscallConn()
	if err != nil {
		return 125
	}
	buf := make([]byte, MaxMsg)
	oob := make([]byte, unix.CmsgSpace(3*4))
	serve := func() int {
		for {
			var n, oobn int
			var err error
			if rerr := control.Read(func(fd uintptr) bool {
				n, oobn, err = recvmsgNow(int(fd), buf, oob)
				return err != unix.EAGAIN
			}); rerr != nil {
				err = rerr
			}
			if err != nil || n == 0 {
				// The server is gone: so is the sandbox. As pid 1 the
				// kernel kills the rest on exit; as a subreaper, kill it.
				if os.Getpid() != 1 {
					killDescendants()
				}
				return 0
			}
			fds := ReceivedFds(oob[:oobn])
			var m Msg
			if json.Unmarshal(buf[:n], &m) != nil {
				CloseFds(fds)
				continue
			}
			switch m.Op {
			case "run":
				if len(fds) != 3 {
					// No status pipe to answer on: the server's wait ends
					// without an answer.
					CloseFds(fds)
					continue
				}
				attr := &syscall.ProcAttr{Dir: m.Dir, Env: m.Env, Files: []uintptr{uintptr(devnull), uintptr(fds[0]), uintptr(fds[1])},
					Sys: &syscall.SysProcAttr{Setpgid: true}}
				// Under mu until the pid is recorded: the reaper looks it
				// up under mu.
				mu.Lock()
				pid, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", m.Command}, attr)
				if err == nil {
					procs[pid] = started{id: m.ID, status: fds[2]}
					select {
					case spawned <- struct{}{}:
					default:
					}
				}
				mu.Unlock()
				CloseFds(fds[:2])
				if err != nil {
					answer(fds[2], Msg{Op: "exit", ID: m.ID, Error: err.Error()})
				}
			case "kill":
				mu.Lock()
				for pid, st := range procs {
					if st.id == m.ID {
						killed[st.id] = true
						_ = unix.Kill(-pid, unix.SIGKILL)
						_ = unix.Kill(pid, unix.SIGKILL)
					}
				}
				mu.Unlock()
			default:
				CloseFds(fds)
			}
		}
	}
	// The main goroutine is locked to the main thread while package
	// initialisers run, which is where the init runs: it waits here, and
	// the loop runs on whichever thread the runtime has free rather than
	// having its P handed to the main one for each message.
	exit := make(chan int, 1)
	go func() { exit <- serve() }()
	return <-exit
}

// recvmsgNow is recvmsg(2) of one control message and its descriptors
// (close-on-exec) without waiting: EAGAIN when none is there. A raw
// syscall: one that cannot block needs not tell the runtime, which would
// wake its monitor thread to watch it.
func recvmsgNow(fd int, p, oob []byte) (n, oobn int, err error) {
	iov := unix.Iovec{Base: &p[0]}
	iov.SetLen(len(p))
	msg := unix.Msghdr{Iov: &iov, Control: &oob[0]}
	msg.SetIovlen(1)
	msg.SetControllen(len(oob))
	for {
		r, _, e := unix.RawSyscall(unix.SYS_RECVMSG, uintptr(fd), uintptr(unsafe.Pointer(&msg)), unix.MSG_CMSG_CLOEXEC|unix.MSG_DONTWAIT)
		switch e {
		case 0:
			return int(r), int(msg.Controllen), nil
		case unix.EINTR:
			continue
		}
		return 0, 0, e
	}
}

// reapGroup waits until no live process of process group pgid is left
// (for at most KillLimit), killing what is. Their zombies are the reaper's.
func reapGroup(pgid int) {
	deadline := time.Now().Add(KillLimit)
	for time.Now().Before(deadline) {
		alive := false
		for _, e := range ListProcs() {
			if e.Pgrp == pgid && e.State != 'Z' && e.State != 'X' {
				alive = true
				_ = unix.Kill(e.Pid, unix.SIGKILL)
			}
		}
		if !alive {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// killDescendants kills the init's children until it has none left:
// orphans of the sandbox are reparented to it, the subreaper, as their
// parents die (for at most KillLimit).
func killDescendants() {
	self := os.Getpid()
	deadline := time.Now().Add(KillLimit)
	for time.Now().Before(deadline) {
		for _, pid := range childrenOf(self) {
			_ = unix.Kill(-pid, unix.SIGKILL)
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		var ws unix.WaitStatus
		if _, err := unix.Wait4(-1, &ws, 0, nil); err == unix.ECHILD {
			return
		}
	}
}

// childrenOf lists the children of process pid.
func childrenOf(pid int) []int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/task/" + strconv.Itoa(pid) + "/children")
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if c, err := strconv.Atoi(f); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// ReceivedFds are the descriptors a control message carried.
func ReceivedFds(oob []byte) []int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

// CloseFds closes each of fds.
func CloseFds(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
