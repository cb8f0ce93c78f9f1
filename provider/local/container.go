package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider/local/cmdenv"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

// errInitGone: the sandbox's init ended (the sandbox was stopped, or the
// init was killed) while a command was started or awaited.
var errInitGone = errors.New("local: the sandbox's init is gone")

// sandboxInit is the server's side of a sandbox's init (see sinit.Run): the
// process and the control socket.
type sandboxInit struct {
	cmd  *exec.Cmd
	pgid int // the host process group of the init
	fd   int // the server's end of the control socket

	mu   sync.Mutex
	next uint64
	gone bool // the control socket closed: the init exited
	// dead is closed once the init has exited and been reaped, released
	// once the sandbox's cgroups were let go after it.
	dead, released chan struct{}
}

// startInit starts the sandbox's init in its cgroups (cgFiles) and returns
// once it runs commands. Isolated, the init is the sandbox's pid 1, in the
// sandbox's own user, pid, mount, network, ipc, uts and cgroup namespaces,
// with the syscall filter (see sinit.RunSetup).
func (p *Provider) startInit(ctx context.Context, s *sandbox, cgFiles []*os.File) (_ *sandboxInit, err error) {
	s.mu.Lock()
	meta := s.meta
	s.mu.Unlock()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("local: init socket: %w", err)
	}
	child := os.NewFile(uintptr(fds[1]), "init-control")
	defer child.Close()
	defer func() {
		if err != nil {
			unix.Close(fds[0])
		}
	}()
	exe, err := p.initBinary()
	if err != nil {
		return nil, err
	}
	var cmd *exec.Cmd
	var setup *sinit.Setup
	var as *owner
	extra := []*os.File{child}
	if p.ctr != nil {
		if err := p.mountLayers(ctx, s, meta.Spec, sandboxIDs(meta)); err != nil {
			return nil, err
		}
		caches, err := p.sandboxMounts(meta.Spec, meta.Workdir, s.writableDir(), true)
		if err != nil {
			return nil, err
		}
		tree := s.fsDir()
		if ids := sandboxIDs(meta); ids != nil {
			// Its tree (in copy mode; an overlay is mounted over views
			// already), caches and writable mounts, through its views.
			if _, _, _, caches, err = p.makeViews(ctx, s, *ids, -1, nil, caches); err != nil {
				return nil, err
			}
			if !meta.Overlay {
				tree = s.viewOf(s.fsDir())
			}
			as = ids
		}
		setup = p.ctr.setup(tree, meta.Workdir, meta.Network, caches)
		// The init proper is executed from this descriptor (see
		// sinit.RunSetup), opened here, in the server's mount namespace: the
		// binary a process runs holds the mount it was opened through,
		// and one opened in the init's own namespace would be the copy
		// of the host's root that namespace began with, which holds
		// every host mount under it (they are locked to it), a few per
		// live sandbox. Each init would keep them all for its life.
		bin, err := os.Open(exe)
		if err != nil {
			return nil, fmt.Errorf("local: open the init's binary: %w", err)
		}
		defer bin.Close()
		extra = append(extra, bin)
		cmd = &exec.Cmd{Path: exe, Args: []string{sinit.Name, sinit.StageSetup}, Dir: "/", Env: initEnv(s.id)}
		cmd.SysProcAttr = p.ctr.sysProcAttr(meta.Network, as)
	} else {
		// No death signal: when the server dies the init sees its control
		// socket close and kills what it started before it exits.
		cmd = &exec.Cmd{Path: exe, Args: []string{sinit.Name}, Dir: s.fsDir(), Env: initEnv(s.id)}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	}
	cmd.ExtraFiles = extra
	stderr := &limitedBuffer{max: 4 << 10}
	cmd.Stderr = stderr
	if err := startJoined(cmd, cgFiles, as); err != nil {
		return nil, fmt.Errorf("local: start the sandbox's init: %w", err)
	}
	child.Close() // the init's end is the init's alone: its exit closes it
	if setup != nil {
		if err := awaitSetup(ctx, fds[0], setup); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			if msg := stderr.String(); msg != "" {
				err = fmt.Errorf("%w: %s", err, msg)
			}
			return nil, fmt.Errorf("local: start the sandbox's init: %w", err)
		}
	}
	in := &sandboxInit{cmd: cmd, pgid: cmd.Process.Pid, fd: fds[0], dead: make(chan struct{}), released: make(chan struct{})}
	go in.read()
	go func() {
		err := cmd.Wait()
		if msg := stderr.String(); msg != "" || (err != nil && p.stillLive(s) == nil) {
			p.log.WithError(err).WithFields(map[string]any{"sandbox_id": s.id, "stderr": msg}).Info("local: a sandbox's init ended")
		}
		close(in.dead)
	}()
	return in, nil
}

// initEnv is the environment of sandbox id's init (not of its commands,
// which get exactly theirs): the host's base, and one P for the Go
// runtime from its start (see sinit.Run). Set by runtime.GOMAXPROCS once
// running instead, the init's idle memory was 0.3 MiB more.
func initEnv(id string) []string {
	return append(cmdenv.Host(id), "GOMAXPROCS=1")
}

// setupTimeout bounds how long an init may take to build its sandbox. It
// guards against an answer that never comes (the init is the server's own
// code, and the agent runs nothing before the setup ends), not against a
// slow one: on a saturated machine an init's two starts of the server's
// binary took over 30 s (a -race build, load 60-75, every process getting a
// few percent of a core), and a seed failed for it. A start on a caller's
// behalf ends sooner with the caller's context.
const setupTimeout = 5 * time.Minute

// awaitSetup sends an isolated init its setup on the control socket fd
// and waits until it says it is ready (or why it is not), for at most
// setupTimeout and no longer than ctx: at either's end the socket is shut
// down, which ends the wait (and, to the init, the server's end: the
// caller kills it).
func awaitSetup(ctx context.Context, fd int, setup *sinit.Setup) (err error) {
	b, err := json.Marshal(sinit.Msg{Op: "setup", Setup: setup})
	if err != nil {
		return err
	}
	if len(b) > sinit.MaxMsg {
		return fmt.Errorf("the setup is %d bytes, more than %d", len(b), sinit.MaxMsg)
	}
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { _ = unix.Shutdown(fd, unix.SHUT_RDWR) })
	defer func() {
		if !stop() && err == nil {
			// Shut down as the answer came: the init will see its end.
			err = fmt.Errorf("wait for the init: %w", ctx.Err())
		}
	}()
	// ended is the wait's error once the socket was shut down, if it was.
	ended := func(what error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("wait for the init: %w", ctx.Err())
		}
		return what
	}
	if err := unix.Sendmsg(fd, b, nil, nil, 0); err != nil {
		return ended(fmt.Errorf("send the setup: %w", err))
	}
	buf := make([]byte, 64<<10)
	for {
		n, _, _, _, err := unix.Recvmsg(fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ended(fmt.Errorf("wait for the init: %w", err))
		}
		if n == 0 {
			return ended(errors.New("the init exited while it set the sandbox up"))
		}
		var m sinit.Msg
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			return fmt.Errorf("the init's answer: %w", err)
		}
		switch m.Op {
		case "ready":
			return nil
		case "exit":
			return fmt.Errorf("set the sandbox up: %s", m.Error)
		}
	}
}

// initBinary is the binary sandboxes' inits run: Options.InitBinary's
// (placed by New, see useInitBinary), else the server's own, where the
// sandbox's uid can reach it (the init executes it as that uid, by path):
// a hard link (else a copy) of the running binary under the provider's
// root, made once (see placeRunning).
func (p *Provider) initBinary() (string, error) {
	p.initBinMu.Lock()
	defer p.initBinMu.Unlock()
	if p.initBin != "" {
		return p.initBin, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("local: find the server's binary: %w", err)
	}
	if p.ctr == nil {
		p.initBin = exe
		return exe, nil
	}
	bin, err := p.placeBinary(exe, true)
	if err != nil {
		return "", err
	}
	p.initBin = bin
	return bin, nil
}

// useInitBinary makes the separate init binary at path the one sandboxes'
// inits run, once its placed copy proves to speak this server's protocol
// (see checkInitBinary). A copy, never a link, is checked and run: what
// path names later, or what is written into its file, is not (a hard
// link would share the operator's file, and one made to a symlink is
// that symlink, followed at each start).
func (p *Provider) useInitBinary(path string) error {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("%w: init binary %q: %v", ErrBadOptions, path, err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.Mode().IsRegular() {
		if err == nil {
			err = errors.New("not a regular file")
		}
		return fmt.Errorf("%w: init binary %s: %v", ErrBadOptions, abs, err)
	}
	bin, err := p.placeBinary(abs, false)
	if err != nil {
		return err
	}
	if err := checkInitBinary(bin); err != nil {
		_ = os.RemoveAll(filepath.Dir(bin))
		return fmt.Errorf("%w: init binary %s: %v", ErrBadOptions, abs, err)
	}
	p.initBinMu.Lock()
	p.initBin = bin
	p.initBinMu.Unlock()
	return nil
}

// placeBinary copies the executable src into a directory of its own
// under the provider's root, as sinit.Name, readable and executable by
// every uid; when link (src is the server's own binary), it places the
// running binary instead (see placeRunning).
func (p *Provider) placeBinary(src string, link bool) (string, error) {
	if link {
		return p.placeRunning(src, "/proc/self/exe")
	}
	return p.placeAt(func(bin string) error { return copyFile(src, bin) })
}

// placeRunning places the binary this process runs (running, which names
// its file whatever happened to its path since) for sandboxes' inits and
// the provider's helpers: a hard link of exe, the path it was started
// from, when exe is still that file, else a copy of running. Linked, not
// copied, when it can: the server's binary is tens of megabytes (and a
// -race test binary more) copied at each provider's start, and nothing
// can change the file while the server runs it (the kernel refuses to
// open a running binary for writing, ETXTBSY) nor after (no init outlives
// its server, and the next server removes what was placed). A path that
// now names another file (a new build moved over it) is never linked:
// inits and helpers speak the running server's protocol.
func (p *Provider) placeRunning(exe, running string) (string, error) {
	return p.placeAt(func(bin string) error {
		if err := os.Link(exe, bin); err == nil {
			if sameFile(bin, running) {
				return nil
			}
			_ = os.Remove(bin)
		}
		return copyFile(running, bin)
	})
}

// placeAt makes a directory of its own under the provider's root,
// searchable by every uid, and has place put the binary there (as
// sinit.Name).
func (p *Provider) placeAt(place func(bin string) error) (string, error) {
	dir, err := os.MkdirTemp(p.root, "init-")
	if err != nil {
		return "", fmt.Errorf("local: place the init: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("local: place the init: %w", err)
	}
	bin := filepath.Join(dir, sinit.Name)
	if err := place(bin); err != nil {
		return "", fmt.Errorf("local: place the init: %w", err)
	}
	return bin, nil
}

// sameFile reports whether paths a and b name one file (b followed, as
// /proc/self/exe is).
func sameFile(a, b string) bool {
	fa, err := os.Stat(a)
	if err != nil {
		return false
	}
	fb, err := os.Stat(b)
	return err == nil && os.SameFile(fa, fb)
}

// initCheckTimeout bounds checkInitBinary's run of a binary, one that
// never answers included. Generous: it guards against a hang, not a slow
// start on a loaded machine.
const initCheckTimeout = time.Minute

// checkInitBinary runs bin as an init asked for its protocol
// (sinit.StageIdentity) and fails unless it answers exactly this server's
// sinit.Identity: a binary built from other sources (an older
// cmd/sandbox-init) or not an init at all.
func checkInitBinary(bin string) error {
	ctx, cancel := context.WithTimeout(context.Background(), initCheckTimeout)
	defer cancel()
	stdout, stderr := &limitedBuffer{max: 4 << 10}, &limitedBuffer{max: 4 << 10}
	cmd := exec.CommandContext(ctx, bin, sinit.StageIdentity)
	cmd.Args[0] = sinit.Name
	cmd.Env, cmd.Dir, cmd.Stdout, cmd.Stderr = []string{}, "/", stdout, stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			err = fmt.Errorf("%w: %s", err, msg)
		}
		return fmt.Errorf("not a sandbox init: asked for its protocol, it failed: %v", err)
	}
	got, want := strings.TrimSpace(stdout.String()), sinit.Identity()
	if got != want {
		return fmt.Errorf("not this server's init: it answered %q, this server speaks %q (build it from the server's sources: go build ./cmd/sandbox-init)", got, want)
	}
	return nil
}

// copyFile copies the executable src to dst (mode 0755, whatever the
// umask: every uid runs it).
//
// It holds syscall.ForkLock while dst is open for writing. A process this
// server forks (os/exec and syscall.ForkExec take the lock's read side)
// holds a copy of every descriptor until its exec closes it; one forked
// while dst was open would make dst's exec fail with ETXTBSY ("text file
// busy") until then: a check or a sandbox start racing any other exec.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	syscall.ForkLock.Lock()
	defer syscall.ForkLock.Unlock()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if err := out.Chmod(0o755); err != nil {
		out.Close()
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// read waits until the control socket closes (the init exited); the
// init sends nothing after its setup (a command's exit goes on the
// command's own status pipe, see run).
func (in *sandboxInit) read() {
	buf := make([]byte, 4<<10)
	for {
		n, _, _, _, err := unix.Recvmsg(in.fd, buf, nil, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			break
		}
	}
	in.mu.Lock()
	in.gone = true
	unix.Close(in.fd) // under mu: no send is on its way
	in.mu.Unlock()
}

// send sends one control message, unless the socket is closed.
func (in *sandboxInit) send(b, rights []byte) error {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.gone {
		return errInitGone
	}
	if err := unix.Sendmsg(in.fd, b, rights, nil, 0); err != nil {
		return fmt.Errorf("%w: %v", errInitGone, err)
	}
	return nil
}

// run asks the init to start command with env in dir, its stdout and
// stderr on the given files, and returns once the init has the request,
// with the command's status pipe (see commandStatus). The request is
// sent, not awaited: the init starts the command and kills it (see kill)
// in the order it reads them, and a start awaited would cost a wakeup of
// the server more per command.
func (in *sandboxInit) run(command string, env []string, dir string, stdout, stderr int) (uint64, *commandStatus, error) {
	in.mu.Lock()
	in.next++
	id := in.next
	in.mu.Unlock()
	b, err := json.Marshal(sinit.Msg{Op: "run", ID: id, Command: command, Env: env, Dir: dir})
	if err != nil {
		return 0, nil, err
	}
	if len(b) > sinit.MaxMsg {
		return 0, nil, fmt.Errorf("local: exec: the command and its environment are %d bytes, more than %d", len(b), sinit.MaxMsg)
	}
	r, w, err := commandPipe()
	if err != nil {
		return 0, nil, fmt.Errorf("local: exec: status pipe: %w", err)
	}
	err = in.send(b, unix.UnixRights(stdout, stderr, w))
	// The init holds its own copy now (or never will): its write, or its
	// exit, ends the pipe.
	unix.Close(w)
	if err != nil {
		r.Close()
		return 0, nil, err
	}
	return id, &commandStatus{r: r}, nil
}

// commandStatus is the read end of a command's status pipe: the init
// writes the command's one answer to it (its exit, or why it could not
// start) and closes it. The caller reads it itself, so that the answer
// wakes the exec that waits for it and nothing in between; the pipe is
// the server's (mode 0600), held in the sandbox only by its init, which
// no process of the sandbox can reach.
type commandStatus struct{ r *os.File }

// wait returns the command's answer; ok is false when the init ended
// without one, or when ctx ended and grace passed since without one: an
// init that cannot act (its cgroup frozen) never answers the kill ctx's
// end asked it for, and the exec must not wait for it past its caller.
func (c *commandStatus) wait(ctx context.Context, grace time.Duration) (m sinit.Msg, ok bool) {
	defer c.r.Close()
	// The pipe is non-blocking, so a deadline wakes the read.
	defer context.AfterFunc(ctx, func() { _ = c.r.SetReadDeadline(time.Now().Add(grace)) })()
	b, err := io.ReadAll(io.LimitReader(c.r, 4<<10))
	if err != nil || len(b) == 0 || json.Unmarshal(b, &m) != nil {
		return sinit.Msg{}, false
	}
	return m, true
}

// startErr is why the init could not start a command, nil if it started
// (m is its exit).
func startErr(m sinit.Msg) error {
	if m.Error == "" {
		return nil
	}
	return fmt.Errorf("local: exec: start the command: %s", m.Error)
}

// kill asks the init to kill the command id's process group.
func (in *sandboxInit) kill(id uint64) {
	b, _ := json.Marshal(sinit.Msg{Op: "kill", ID: id})
	_ = in.send(b, nil)
}

// alive reports whether the init still runs.
func (in *sandboxInit) alive() bool {
	select {
	case <-in.dead:
		return false
	default:
		return true
	}
}

// limitedBuffer keeps the first max bytes written to it, safe for
// concurrent use.
type limitedBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if room := b.max - len(b.buf); room > 0 {
		b.buf = append(b.buf, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (b *limitedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
