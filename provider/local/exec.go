package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local/beneath"
	"github.com/sandboxowner/owner/provider/local/cmdenv"
)

// Exec runs req.Command with /bin/sh -c in the sandbox, started by its init
// (see sinit.Run): in the workdir (or req.Cwd), with a small base environment
// (PATH, HOME, LANG), the spec's env, req.Env and SandboxIDEnv. Under
// isolation the tree is at the workdir, the host is read-only, /tmp is the
// sandbox's own and there is no network but the sandbox's loopback unless
// the spec asked for it; unisolated, the command runs in the tree's host
// directory.
//
// The command's process group is killed when its timeout (req.Timeout,
// else Options.DefaultExecTimeout) passes (TimedOut is set and the exit code
// is 137) and when ctx ends (the error wraps ctx.Err()). Exec returns when
// the shell exits; what it left running keeps running until the sandbox
// stops. stdout and stderr reach the server through pipes only it reads
// (see outputPipe), which keeps their first Options.OutputCap bytes each,
// up to the shell's exit; Truncated reports a cut. A command killed by signal N exits 128+N, as in
// a shell.
func (p *Provider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if err := ctxErr(ctx, "exec"); err != nil {
		return provider.ExecResult{}, err
	}
	s, err := p.live(ctx, h, true)
	if err != nil {
		return provider.ExecResult{}, err
	}
	if err := cmdenv.Check(req.Env); err != nil {
		return provider.ExecResult{}, err
	}
	if req.Timeout < 0 || req.Timeout > p.maxExecTimeout {
		return provider.ExecResult{}, fmt.Errorf("local: exec: timeout %s is not within 0 and the maximum %s: %w", req.Timeout, p.maxExecTimeout, provider.ErrInvalidSpec)
	}
	timeout := req.Timeout
	if timeout == 0 {
		timeout = p.execTimeout
	}
	cwd := req.Cwd
	if cwd == "" {
		cwd = "."
	}
	rel, err := beneath.Rel(s.meta.Workdir, cwd)
	if err != nil {
		return provider.ExecResult{}, fmt.Errorf("local: exec cwd: %w", err)
	}
	if err := checkDir(s.fsDir(), rel); err != nil {
		return provider.ExecResult{}, err
	}

	env, dir := p.commandEnv(s, rel, req)
	stdout, stdoutW, err := newOutputPipe(p.outputCap)
	if err != nil {
		return provider.ExecResult{}, err
	}
	defer stdout.settle()
	stderr, stderrW, err := newOutputPipe(p.outputCap)
	if err != nil {
		unix.Close(stdoutW)
		return provider.ExecResult{}, err
	}
	defer stderr.settle()

	began := time.Now()
	s.gate.RLock()
	if err := p.stillLive(s); err != nil {
		s.gate.RUnlock()
		unix.Close(stdoutW)
		unix.Close(stderrW)
		return provider.ExecResult{}, err
	}
	in, err := p.sandboxInit(ctx, s)
	var id uint64
	var status *commandStatus
	if err == nil {
		id, status, err = in.run(req.Command, env, dir, stdoutW, stderrW)
	}
	s.gate.RUnlock()
	// The command holds the write ends now (or never will): once it and
	// what it started are gone, the pipes end.
	unix.Close(stdoutW)
	unix.Close(stderrW)
	if err != nil {
		if p.stillLive(s) != nil {
			return provider.ExecResult{}, fmt.Errorf("local: sandbox %s was stopped while a command started: %w", s.id, provider.ErrSandboxNotFound)
		}
		return provider.ExecResult{}, err
	}
	if p.hook != nil {
		p.hook("sent", s.id)
	}

	// The exec waits on the command's status pipe itself; the timeout and
	// ctx only ask the init to kill the command (the first of them that
	// comes), whose exit then ends the wait. Both are callbacks, not a
	// goroutine watching them: nothing more to start, and to wake at the
	// end, per command. A kill after the exit finds nothing to kill.
	const (
		timedOutEnd = iota + 1
		canceledEnd
	)
	var ended atomic.Int32
	end := func(why int32) {
		if ended.CompareAndSwap(0, why) {
			in.kill(id)
		}
	}
	timer := p.execClk.AfterFunc(timeout, func() { end(timedOutEnd) })
	stopCancel := context.AfterFunc(ctx, func() { end(canceledEnd) })
	m, ok := status.wait(ctx, p.answerGrace)
	timer.Stop()
	stopCancel()
	why := ended.Load()
	timedOut, canceled := why == timedOutEnd, why == canceledEnd

	log := logs.ForRequest(ctx, p.log).WithFields(logrus.Fields{"sandbox_id": s.id, "duration_ms": time.Since(began).Milliseconds()})
	if !ok && ctx.Err() != nil {
		log.Warn("local: exec: the command did not answer the kill its caller's end asked for (its sandbox frozen?)")
		return provider.ExecResult{}, fmt.Errorf("local: exec: %w", ctx.Err())
	}
	if !ok {
		if p.stillLive(s) != nil {
			return provider.ExecResult{}, fmt.Errorf("local: sandbox %s was stopped while a command ran: %w", s.id, provider.ErrSandboxNotFound)
		}
		return provider.ExecResult{}, fmt.Errorf("local: exec: %w", errInitGone)
	}
	if err := startErr(m); err != nil {
		return provider.ExecResult{}, err
	}
	if canceled {
		return provider.ExecResult{}, fmt.Errorf("local: exec: %w", ctx.Err())
	}
	res := provider.ExecResult{ExitCode: exitStatus(syscall.WaitStatus(m.Status)), TimedOut: timedOut}
	var cut1, cut2 bool
	res.Stdout, cut1 = stdout.settle()
	res.Stderr, cut2 = stderr.settle()
	res.Truncated = cut1 || cut2
	log.WithFields(logrus.Fields{"exit_code": res.ExitCode, "timed_out": timedOut, "truncated": res.Truncated}).Debug("local: exec")
	return res, nil
}

// commandEnv is the environment and working directory (in the init's view)
// of req's command in s: PATH, HOME, LANG, the spec's env, the request's
// env and SandboxIDEnv.
func (p *Provider) commandEnv(s *sandbox, rel string, req provider.ExecRequest) ([]string, string) {
	s.mu.Lock()
	meta := s.meta
	s.mu.Unlock()
	home, dir := s.fsDir(), filepath.Join(s.fsDir(), filepath.FromSlash(rel))
	if p.ctr != nil {
		home, dir = meta.Workdir, path.Join(meta.Workdir, rel)
	}
	var rewrites []cmdenv.Rewrite
	if p.ctr == nil {
		if caches, err := p.sandboxMounts(meta.Spec, meta.Workdir, s.writableDir(), true); err == nil {
			for _, m := range caches {
				rewrites = append(rewrites, cmdenv.Rewrite{From: m.path, To: m.host})
			}
		}
	}
	return cmdenv.Command(home, meta.Env, req.Env, rewrites, s.id), dir
}

// sandboxInit returns the sandbox's running init, starting one (in the
// sandbox's cgroups, made for it) when it has none or it died.
func (p *Provider) sandboxInit(ctx context.Context, s *sandbox) (*sandboxInit, error) {
	if err := p.isolationUp(); err != nil {
		return nil, err
	}
	s.initMu.Lock()
	defer s.initMu.Unlock()
	s.mu.Lock()
	in := s.init
	s.mu.Unlock()
	if in != nil && in.alive() {
		return in, nil
	}
	for attempt := 0; ; attempt++ {
		cgFiles, err := p.cgroupFiles(s)
		if err != nil {
			return nil, err
		}
		in, err = p.startInit(ctx, s, cgFiles)
		closeAll(cgFiles)
		if err == nil {
			break
		}
		p.releaseCgroup(s)
		// A cgroup removed as it was joined (by another process on the
		// root, or the last user of a previous init) is made again.
		if !errors.Is(err, syscall.ENODEV) || attempt == 2 {
			return nil, err
		}
	}
	s.mu.Lock()
	s.init = in
	s.groups[in.pgid] = struct{}{}
	s.mu.Unlock()
	go func() {
		// The init holds the cgroups while it lives.
		<-in.dead
		s.mu.Lock()
		delete(s.groups, in.pgid)
		s.mu.Unlock()
		p.releaseCgroup(s)
		close(in.released)
	}()
	return in, nil
}

// outputFile is where a command's stdout or stderr goes: a file in memory,
// read back up to the cap once the command exits, so that what it leaves
// running may keep writing without holding the exec.
func outputFile(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("local: exec: %s: %w", name, err)
	}
	return os.NewFile(uintptr(fd), name), nil
}

// readOutput reads the first limit bytes of f and reports whether it
// holds more.
func readOutput(f *os.File, limit int) (string, bool) {
	fi, err := f.Stat()
	if err != nil {
		return "", false
	}
	n := min(fi.Size(), int64(limit))
	b := make([]byte, n)
	got, _ := f.ReadAt(b, 0)
	return string(b[:got]), fi.Size() > int64(limit)
}

// checkDir checks that rel is a directory inside the tree at fsDir.
func checkDir(fsDir, rel string) error {
	top, err := beneath.OpenTree(fsDir)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	if rel == "." {
		return nil // the tree itself, a directory: OpenTree said so
	}
	fd, err := beneath.Open(top, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return beneath.PathErr("exec cwd", rel, err)
	}
	unix.Close(fd)
	return nil
}

// exitStatus is a command's exit code: 128+N when signal N killed it, as
// in a shell.
func exitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// cgroupFiles makes the sandbox's cgroups (when it has none) and opens the
// membership files its init is put in through (see startJoined); none
// where the host offers no cgroups. An init that got them calls
// releaseCgroup once it is gone: the cgroups live as long as it does.
func (p *Provider) cgroupFiles(s *sandbox) (_ []*os.File, err error) {
	if p.cg == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cgUsers++
	defer func() {
		if err != nil {
			s.cgUsers--
		}
	}()
	if s.cgroup == nil {
		g, err := p.cg.create(s.id, p.limits)
		if err != nil {
			return nil, fmt.Errorf("local: sandbox %s: limits: %w", s.id, err)
		}
		s.cgroup = g
	}
	files, err := s.cgroup.procsFiles()
	if errors.Is(err, os.ErrNotExist) {
		// Removed behind this server's back: made again.
		if s.cgroup, err = p.cg.create(s.id, p.limits); err == nil {
			files, err = s.cgroup.procsFiles()
		}
	}
	if err != nil {
		return nil, fmt.Errorf("local: sandbox %s: limits: %w", s.id, err)
	}
	return files, nil
}

// releaseCgroup ends an init's use of the sandbox's cgroups, removing
// them, with any process left in them, (and this server's parent
// directories, when empty) after the last.
func (p *Provider) releaseCgroup(s *sandbox) {
	if p.cg == nil {
		return
	}
	s.mu.Lock()
	s.cgUsers--
	if s.cgUsers == 0 && s.cgroup != nil {
		// The init is gone: what is left in the cgroups (an unisolated
		// sandbox's processes) goes too.
		if err := s.cgroup.remove(); err != nil {
			p.log.WithError(err).WithField("sandbox_id", s.id).Warn("local: remove a sandbox's cgroups after its commands")
		} else {
			s.cgroup = nil
			p.tidyCgroups(s.id)
		}
	}
	s.mu.Unlock()
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
