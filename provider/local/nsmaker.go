package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// The user namespaces views map through (see idmapNS) are made by a
// helper process, not by the server. A namespace is made by cloning a
// process into it, and Go clones a process that enters a new user
// namespace with a full fork (the child waits for its maps, which a
// vfork's parent could not write): the server's whole memory map is
// copied, under its fork lock, once per namespace. Within the server that
// costs more than the fork: 32 loop devices attached at once took 0.04–0.06 s
// alone and 1.9 s beside 32 such forks (docs/benchmarks.md). The helper is
// the inits' binary in its user namespace mode (see sinit.RunUserNS: the
// small init when the provider has one, else the server's own binary run
// again), small, whose forks are cheap and touch nothing of the server's;
// the server asks it for a namespace and gets an open descriptor back.
//
// Each provider has its own helper: it is started at the first namespace
// the provider asks for, ends when the provider closes or the server ends
// (its control socket closes), and is started again if it died.

// errHelperGone: the helper ended (or was never started) before it took
// or answered a request.
var errHelperGone = errors.New("user namespace: the helper is gone")

// errNSMakerClosed: the provider the helper served was closed.
var errNSMakerClosed = errors.New("user namespace: the provider is closed")

// nsMaker is the server's side of the helper. Each provider has its own,
// started at the first namespace it asks for and ended by its Close.
type nsMaker struct {
	mu     sync.RWMutex // write-held while a helper is started
	fd     int          // the server's end of the control socket; -1: none runs
	gen    uint64       // counts the helpers started; 0: none was
	closed bool
	cmd    *exec.Cmd
	stderr *limitedBuffer
	// exe names the binary the helper runs (sinit.StageUserNS): the
	// provider's inits' binary. Nil: the server's own (/proc/self/exe).
	exe func() (string, error)

	// full, when set by a test, runs when a request finds the control
	// socket full, before it waits for room.
	full func()
}

func newNSMaker() *nsMaker { return &nsMaker{fd: -1} }

// close ends the helper (it ends when its control socket closes); a
// namespace asked for afterwards is refused with errNSMakerClosed. A
// request still waiting for room on the control socket fails: the
// shutdown reaches the copies requests send on (see send).
func (m *nsMaker) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	if m.fd >= 0 {
		_ = unix.Shutdown(m.fd, unix.SHUT_RDWR)
		unix.Close(m.fd)
		m.fd = -1
	}
}

// make returns a user namespace (an open descriptor the caller closes)
// that maps root to root and storage's ids to ids', made by the helper.
// A helper that ended before it answered is started again, once per
// namespace asked for. ctx bounds the wait for room on the control socket
// and for the answer.
func (m *nsMaker) make(ctx context.Context, storage, ids owner) (int, error) {
	req, err := json.Marshal(sinit.NSRequest{StorageUID: storage.uid, StorageGID: storage.gid, UID: ids.uid, GID: ids.gid})
	if err != nil {
		return -1, err
	}
	var gone uint64
	for attempt := 0; ; attempt++ {
		fd, gen, err := m.ask(ctx, req, gone)
		if !errors.Is(err, errHelperGone) || attempt > 0 {
			return fd, err
		}
		gone = gen
	}
}

// ask asks the helper for a namespace (see send); gen names the helper
// asked.
func (m *nsMaker) ask(ctx context.Context, req []byte, gone uint64) (fd int, gen uint64, err error) {
	if err := ctx.Err(); err != nil {
		return -1, 0, fmt.Errorf("user namespace: %w", err)
	}
	pair, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("user namespace: answer socket: %w", err)
	}
	// The server's end waits in the runtime's poller, which a deadline
	// (ctx's end) wakes; the helper's end stays blocking.
	if err := unix.SetNonblock(pair[0], true); err != nil {
		unix.Close(pair[0])
		unix.Close(pair[1])
		return -1, 0, fmt.Errorf("user namespace: answer socket: %w", err)
	}
	answer := os.NewFile(uintptr(pair[0]), "userns-answer")
	defer answer.Close()
	gen, err = m.send(ctx, req, pair[1], gone)
	unix.Close(pair[1]) // the helper holds its own copy, or never will
	if err != nil {
		return -1, gen, err
	}
	buf := make([]byte, 4<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	var n, oobn int
	err = awaitFd(ctx, answer, false, func(fd int) (err error) {
		n, oobn, _, _, err = unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		return err
	}, nil)
	if err != nil {
		return -1, gen, fmt.Errorf("user namespace: wait for the helper: %w", err)
	}
	fd = rightsFd(oob[:oobn])
	var a sinit.NSAnswer
	switch {
	case n == 0:
		// Its end closed unanswered: the helper ended.
		return -1, gen, fmt.Errorf("%w%s", errHelperGone, m.said())
	case json.Unmarshal(buf[:n], &a) != nil:
		a.Error = "an answer that does not parse"
	case a.Error == "" && fd < 0:
		a.Error = "an answer without a namespace"
	}
	if a.Error != "" {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, gen, fmt.Errorf("user namespace: %s", a.Error)
	}
	return fd, gen, nil
}

// awaitFd runs op on f's descriptor until it does not fail with EAGAIN
// (a write when write, else a read), waiting in the runtime's poller for
// f to be ready between tries, and returns op's error; or ctx's, once ctx
// ends first. blocked, if set, runs each time op found f not ready.
func awaitFd(ctx context.Context, f *os.File, write bool, op func(fd int) error, blocked func()) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	// A deadline in the past wakes the wait; a file already closed
	// refuses it harmlessly.
	stop := context.AfterFunc(ctx, func() { _ = f.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var opErr error
	try := func(fd uintptr) bool {
		for {
			opErr = op(int(fd))
			if opErr != unix.EINTR {
				break
			}
		}
		if opErr == unix.EAGAIN {
			if blocked != nil {
				blocked()
			}
			return false
		}
		return true
	}
	if write {
		err = rc.Write(try)
	} else {
		err = rc.Read(try)
	}
	if err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return ctxErr
		}
		return err
	}
	return opErr
}

// send sends req, with the answer socket reply, to the running helper,
// unless it is gone's (a helper found gone): then, or when none runs, to
// a new one it starts. It returns which helper it sent to. A control
// socket the helper has not emptied is waited on until ctx ends: the
// request goes on a copy of the server's end of its own, whose deadline
// is the request's alone.
func (m *nsMaker) send(ctx context.Context, req []byte, reply int, gone uint64) (uint64, error) {
	gen, control, err := m.controlCopy(gone)
	if err != nil {
		return gen, err
	}
	f := os.NewFile(uintptr(control), "userns-control")
	defer f.Close()
	rights := unix.UnixRights(reply)
	err = awaitFd(ctx, f, true, func(fd int) error {
		return unix.Sendmsg(fd, req, rights, nil, unix.MSG_NOSIGNAL|unix.MSG_DONTWAIT)
	}, m.full)
	switch {
	case err == nil:
		return gen, nil
	case ctx.Err() != nil:
		return gen, fmt.Errorf("user namespace: send to the helper: %w", err)
	}
	return gen, fmt.Errorf("%w: %v%s", errHelperGone, err, m.said())
}

// controlCopy returns a copy of the server's end of the running helper's
// control socket (non-blocking, as the end is), unless the helper is
// gone's: then, or when none runs, of a new one it starts. gen names the
// helper.
func (m *nsMaker) controlCopy(gone uint64) (gen uint64, fd int, err error) {
	m.mu.RLock()
	gen, running := m.gen, m.fd >= 0 && m.gen != gone
	if running {
		defer m.mu.RUnlock()
	} else {
		m.mu.RUnlock()
		m.mu.Lock()
		defer m.mu.Unlock()
		if m.closed {
			return gen, -1, errNSMakerClosed
		}
		if m.gen == gen || m.fd < 0 { // none started since it looked
			if err := m.startLocked(); err != nil {
				return gen, -1, err
			}
		}
		gen = m.gen
	}
	fd, err = unix.FcntlInt(uintptr(m.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return gen, -1, fmt.Errorf("user namespace: the helper's socket: %w", err)
	}
	return gen, fd, nil
}

// startLocked starts a helper, killing the one before it if it still
// runs.
func (m *nsMaker) startLocked() error {
	if m.fd >= 0 {
		unix.Close(m.fd)
		m.fd = -1
		_ = m.cmd.Process.Kill() // gone, or past helping
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("user namespace: the helper's socket: %w", err)
	}
	// The server's end waits in the runtime's poller (see send).
	if err := unix.SetNonblock(fds[0], true); err != nil {
		unix.Close(fds[0])
		unix.Close(fds[1])
		return fmt.Errorf("user namespace: the helper's socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "userns-control")
	defer child.Close()
	stderr := &limitedBuffer{max: 4 << 10}
	// The inits' binary (see exe), or the server's, even one replaced on
	// disk since it started. No death signal: it would come with the end
	// of the thread that started the helper, not of the server; the
	// helper ends when its control socket closes instead.
	exe := "/proc/self/exe"
	if m.exe != nil {
		var err error
		if exe, err = m.exe(); err != nil {
			unix.Close(fds[0])
			return fmt.Errorf("user namespace: the helper's binary: %w", err)
		}
	}
	cmd := &exec.Cmd{Path: exe, Args: []string{sinit.Name, sinit.StageUserNS}, Env: []string{}, Dir: "/", ExtraFiles: []*os.File{child}, Stderr: stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		unix.Close(fds[0])
		return fmt.Errorf("user namespace: start the helper: %w", err)
	}
	go func() { _ = cmd.Wait() }()
	m.fd, m.cmd, m.stderr = fds[0], cmd, stderr
	m.gen++
	return nil
}

// said is what the helper wrote to its stderr, for an error.
func (m *nsMaker) said() string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	if m.stderr == nil {
		return ""
	}
	if s := m.stderr.String(); s != "" {
		return ": " + s
	}
	return ""
}

// rightsFd is the first descriptor passed in the control message oob, -1
// if none was; any others are closed.
func rightsFd(oob []byte) int {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	fd := -1
	for _, msg := range msgs {
		fds, err := unix.ParseUnixRights(&msg)
		if err != nil {
			continue
		}
		for _, f := range fds {
			if fd < 0 {
				fd = f
			} else {
				unix.Close(f)
			}
		}
	}
	return fd
}
