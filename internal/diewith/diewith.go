// Package diewith ties the helper processes a test binary starts (servers,
// execd, a lifecycle server of its own) to the test binary's life: a test
// binary killed mid-run (its -timeout, go test's kill after it, a CI job
// cancelled) runs none of its cleanups, and a helper it started would run
// on, holding ports, sandboxes and directories on a shared machine.
//
// A direct child gets a signal from the kernel when the test binary dies
// (Parent: Linux's parent-death signal). A helper that leaves the test
// binary's tree (stack.sh starts the lifecycle server with setsid and
// exits) cannot be reached so: a watcher of its own (OnExit), in a session
// of its own, runs the helper's stop command once the test binary is gone,
// which it learns from the end of a pipe only the test binary holds open.
package diewith

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
)

// Parent has cmd (not yet started) get sig when the process that starts it
// dies, however it dies. The kernel sends it when the thread that forked
// the child ends; the Go runtime ends a thread only when a goroutine locked
// to it returns, so cmd must not be started from a goroutine that called
// runtime.LockOSThread and will return. Other SysProcAttr fields are kept.
func Parent(cmd *exec.Cmd, sig syscall.Signal) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = sig
}

// Watcher runs a stop command when Run is called or, if it never is, when
// the process that made it dies.
type Watcher struct {
	cmd  *exec.Cmd
	w    *os.File
	log  *os.File
	once sync.Once
	err  error
}

// OnExit starts a watcher that runs stop (not yet started: its path, args,
// environment and directory are used) once this process dies or Run is
// called, whichever comes first. The watcher is a shell in a session of
// its own, so that a kill of the test binary's process group spares it;
// its stdin is a pipe whose write end only this process holds, so it
// reads end of file once this process is gone. stop's output goes to a
// file that Run reports on failure (a pipe would end with the reader and
// kill stop with SIGPIPE).
func OnExit(stop *exec.Cmd) (*Watcher, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	log, err := os.CreateTemp("", "diewith-*.log")
	if err != nil {
		w.Close()
		return nil, err
	}
	_ = os.Remove(log.Name()) // the open file is enough
	// read returns at end of file (or on a line, which nothing writes).
	args := append([]string{"-c", `read -r _ || :; exec "$0" "$@"`, stop.Path}, stop.Args[1:]...)
	cmd := exec.Command("/bin/sh", args...)
	cmd.Env, cmd.Dir = stop.Env, stop.Dir
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		log.Close()
		return nil, fmt.Errorf("start the watcher of %s: %w", stop.Path, err)
	}
	return &Watcher{cmd: cmd, w: w, log: log}, nil
}

// Pid is the watcher's process id.
func (wt *Watcher) Pid() int { return wt.cmd.Process.Pid }

// Run runs the stop command now (once: later calls return the first's
// result) and waits for it.
func (wt *Watcher) Run() error {
	wt.once.Do(func() {
		wt.w.Close()
		if err := wt.cmd.Wait(); err != nil {
			_, _ = wt.log.Seek(0, io.SeekStart)
			out, _ := io.ReadAll(wt.log)
			wt.err = fmt.Errorf("%s: %w: %s", strings.Join(wt.cmd.Args[3:], " "), err, strings.TrimSpace(string(out)))
		}
		wt.log.Close()
	})
	return wt.err
}
