// Package flocktest stands in for the child a fork leaves between fork and
// exec, which holds a copy of every descriptor its parent had open.
package flocktest

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
)

// HoldCopies starts a child that holds a copy of every descriptor this
// process has open (each open file the same, locks included), as a child
// forked and not yet exec'd does, and keeps them until the test ends.
func HoldCopies(t testing.TB) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	var files []*os.File
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil || fd < 3 {
			continue
		}
		// A dup shares the open file, as a fork's copy does. The fd the
		// read of the directory used is closed by now: EBADF.
		d, err := syscall.Dup(fd)
		if err != nil {
			continue
		}
		syscall.CloseOnExec(d)
		files = append(files, os.NewFile(uintptr(d), "copy of fd "+e.Name()))
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("/bin/sh", "-c", "read x")
	cmd.Stdin, cmd.ExtraFiles = r, files
	err = cmd.Start()
	_ = r.Close()
	if err != nil {
		_ = w.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = w.Close()
		_ = cmd.Wait()
	})
}
