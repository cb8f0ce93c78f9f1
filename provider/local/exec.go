package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	"github.com/sandboxowner/owner/provider"
)

// basePath is the PATH of every command before the spec's and request's env.
const basePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// pipeGrace bounds how long Exec waits for output pipes after the command's
// process group was killed (a process that left the group can hold them).
const pipeGrace = 2 * time.Second

// Exec runs req.Command with /bin/sh -c in the sandbox: in the workdir (or
// req.Cwd), with a small base environment (PATH, HOME, LANG), the spec's env,
// req.Env and SandboxIDEnv. Under bubblewrap the tree is at the workdir, the
// host is read-only, /tmp is private and there is no network unless the spec
// asked for it; unisolated, the command runs in the tree's host directory.
//
// The command's whole process group is killed when its timeout (req.Timeout,
// else Options.DefaultExecTimeout) passes (TimedOut is set and the exit code
// is 137), when ctx ends (the error wraps ctx.Err()), and when the shell
// exits: nothing a command starts outlives its Exec. stdout and stderr keep
// their first Options.OutputCap bytes each; Truncated reports a cut. A
// command killed by signal N exits 128+N, as in a shell.
func (p *Provider) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if err := ctxErr(ctx, "exec"); err != nil {
		return provider.ExecResult{}, err
	}
	s, err := p.live(h, true)
	if err != nil {
		return provider.ExecResult{}, err
	}
	if err := checkEnv(req.Env); err != nil {
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
	rel, err := sandboxRel(s.meta.Workdir, cwd)
	if err != nil {
		return provider.ExecResult{}, fmt.Errorf("local: exec cwd: %w", err)
	}
	if err := checkDir(s.fsDir(), rel); err != nil {
		return provider.ExecResult{}, err
	}

	cgFiles, err := p.cgroupFiles(s)
	if err != nil {
		return provider.ExecResult{}, err
	}
	defer p.releaseCgroup(s)
	defer closeAll(cgFiles)
	cmd, closeFilter, err := p.command(s, rel, req)
	if err != nil {
		return provider.ExecResult{}, err
	}
	defer closeFilter()
	stdout, stderr := &cappedBuffer{max: p.outputCap}, &cappedBuffer{max: p.outputCap}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = pipeGrace

	began := time.Now()
	s.gate.RLock()
	if err := p.stillLive(s); err != nil {
		s.gate.RUnlock()
		return provider.ExecResult{}, err
	}
	if err := startJoined(cmd, cgFiles); err != nil {
		s.gate.RUnlock()
		return provider.ExecResult{}, fmt.Errorf("local: exec: start: %w", err)
	}
	pgid := cmd.Process.Pid
	s.mu.Lock()
	s.groups[pgid] = struct{}{}
	s.mu.Unlock()
	s.gate.RUnlock()

	exited := make(chan error, 1)
	go func() { exited <- waitExited(pgid) }()
	timer := p.execClk.NewTimer(timeout)
	var timedOut, canceled bool
	select {
	case <-exited:
	case <-timer.C():
		timedOut = true
		killGroup(pgid)
		<-exited
	case <-ctx.Done():
		canceled = true
		killGroup(pgid)
		<-exited
	}
	timer.Stop()
	// The leader has exited but is not reaped, so its group id is still
	// ours: kill whatever the command left behind, and wait for it to be
	// gone (bubblewrap's exit does not wait for its sandbox's init, whose
	// exit takes the sandbox's every process with it).
	killGroup(pgid)
	if p.bwrap != nil {
		if err := waitGroupGone(pgid, killLimit); err != nil {
			p.log.WithError(err).WithField("sandbox_id", s.id).Warn("local: a command's processes outlived it")
		}
	}
	waitErr := cmd.Wait()

	s.mu.Lock()
	delete(s.groups, pgid)
	stopped := s.stopped
	s.mu.Unlock()

	log := p.log.WithFields(logrus.Fields{"sandbox_id": s.id, "duration_ms": time.Since(began).Milliseconds()})
	var exitErr *exec.ExitError
	if waitErr != nil && !errors.As(waitErr, &exitErr) && !errors.Is(waitErr, exec.ErrWaitDelay) {
		return provider.ExecResult{}, fmt.Errorf("local: exec: %w", waitErr)
	}
	if stopped {
		return provider.ExecResult{}, fmt.Errorf("local: sandbox %s was stopped while a command ran: %w", s.id, provider.ErrSandboxNotFound)
	}
	if canceled {
		return provider.ExecResult{}, fmt.Errorf("local: exec: %w", ctx.Err())
	}
	res := provider.ExecResult{
		Stdout:    string(stdout.buf),
		Stderr:    string(stderr.buf),
		ExitCode:  exitCode(cmd.ProcessState),
		Truncated: stdout.cut || stderr.cut,
		TimedOut:  timedOut,
	}
	log.WithFields(logrus.Fields{"exit_code": res.ExitCode, "timed_out": timedOut, "truncated": res.Truncated}).Debug("local: exec")
	return res, nil
}

// command builds the process for req in s, with its cwd at rel in the tree.
// It is started by startJoined, which puts it in the sandbox's cgroups and
// sets its rlimits before it runs.
func (p *Provider) command(s *sandbox, rel string, req provider.ExecRequest) (*exec.Cmd, func(), error) {
	s.mu.Lock()
	meta := s.meta
	s.mu.Unlock()
	caches, err := p.sandboxMounts(meta.Spec, meta.Workdir, s.dir, true)
	if err != nil {
		return nil, nil, err
	}
	home := s.fsDir()
	if p.bwrap != nil {
		home = meta.Workdir
	}
	env := map[string]string{"PATH": basePath, "HOME": home, "LANG": "C.UTF-8"}
	for k, v := range meta.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}
	if p.bwrap == nil {
		rewriteCacheEnv(env, caches)
	}
	env[SandboxIDEnv] = s.id
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]string, 0, len(keys))
	for _, k := range keys {
		list = append(list, k+"="+env[k])
	}
	if p.bwrap != nil {
		// The environment asked for is the command's, inside the sandbox;
		// bubblewrap itself starts with a fixed one, as the sandbox's uid.
		cwd := path.Join(meta.Workdir, rel)
		cmd := exec.Command(p.bwrap.bin, p.bwrap.args(s.fsDir(), meta.Workdir, cwd, meta.Network, list, req.Command, cacheBindArgs(caches)...)...)
		cmd.Env = hostEnv(s.id)
		cmd.SysProcAttr = p.bwrap.sysProcAttr()
		closeFilter, err := p.bwrap.attachFilter(cmd)
		if err != nil {
			return nil, nil, err
		}
		return cmd, closeFilter, nil
	}
	cmd := exec.Command("/bin/sh", "-c", req.Command)
	cmd.Dir = filepath.Join(s.fsDir(), filepath.FromSlash(rel))
	cmd.Env = list
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return cmd, func() {}, nil
}

// checkDir checks that rel is a directory inside the tree at fsDir.
func checkDir(fsDir, rel string) error {
	top, err := openTree(fsDir)
	if err != nil {
		return err
	}
	defer unix.Close(top)
	fd, err := openBeneath(top, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return pathErr("exec cwd", rel, err)
	}
	unix.Close(fd)
	return nil
}

func exitCode(ps *os.ProcessState) int {
	if ps == nil {
		return -1
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// cappedBuffer keeps the first max bytes written to it and notes a cut. Each
// of os/exec's copying goroutines owns one, and reads happen after Wait.
type cappedBuffer struct {
	buf []byte
	max int
	cut bool
}

func (b *cappedBuffer) Write(p []byte) (int, error) {
	if room := b.max - len(b.buf); len(p) > room {
		b.buf = append(b.buf, p[:max(room, 0)]...)
		b.cut = true
	} else {
		b.buf = append(b.buf, p...)
	}
	return len(p), nil
}

// cgroupFiles makes the sandbox's cgroups (when no command has them) and
// opens the files a command writes to enter them; none where the host
// offers no cgroups. A command that got them calls releaseCgroup when done:
// the cgroups live only while commands run, so that a server that dies
// leaves none behind (the sandbox's processes die with it).
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

// releaseCgroup ends a command's use of the sandbox's cgroups, removing
// them, with any process left in them, (and this server's parent
// directories, when empty) after the last.
func (p *Provider) releaseCgroup(s *sandbox) {
	if p.cg == nil {
		return
	}
	s.mu.Lock()
	s.cgUsers--
	if s.cgUsers == 0 && s.cgroup != nil {
		// No command runs: what is left in the cgroups outlived its
		// command (a setsid child of an unisolated one) and goes too.
		if err := s.cgroup.remove(); err != nil {
			p.log.WithError(err).WithField("sandbox_id", s.id).Warn("local: remove a sandbox's cgroups after its commands")
		} else {
			s.cgroup = nil
			p.cg.tidy()
		}
	}
	s.mu.Unlock()
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
