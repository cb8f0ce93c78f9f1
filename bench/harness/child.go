package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/sandboxowner/owner/internal/racebuild"
)

// ChildEnv marks a process the harness started as one of its children. A
// main (or TestMain) that finds it set must hand over to Child:
//
//	if harness.IsChild() {
//		os.Exit(harness.Child(os.Args[1:], os.Stdout, os.Stderr))
//	}
const ChildEnv = "OWNER_BENCH_CHILD"

// IsChild reports whether this process is a harness child.
func IsChild() bool { return os.Getenv(ChildEnv) == "1" }

// Child runs the child named by args[0] ("load" or "memory") with the rest
// of args as its flags, writes its JSON result to stdout, and returns the
// exit status.
func Child(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "harness child: no child named")
		return 2
	}
	var err error
	switch args[0] {
	case "load":
		err = loadChild(args[1:], stdout)
	case "memory":
		err = memoryChild(args[1:], stdout)
	case "scale":
		err = scaleChild(args[1:], stdout)
	default:
		err = fmt.Errorf("unknown child %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(stderr, "harness child %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

// selfChild re-runs this executable as a child.
func selfChild(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := exec.Command(exe, args...)
	// A -race test binary's child would sleep a second as it exits.
	cmd.Env = racebuild.NoExitSleep(append(os.Environ(), ChildEnv+"=1"))
	return cmd
}

// runChild runs a child to completion and decodes its JSON result into out.
func (h *harness) runChild(ctx context.Context, out any, args ...string) error {
	cmd := h.opts.Child(args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start child %s: %w", args[0], err)
	}
	stop := killOnDone(ctx, cmd)
	err := cmd.Wait()
	stop()
	if err != nil {
		return fmt.Errorf("child %s: %w: %s", args[0], err, bytes.TrimSpace(stderr.Bytes()))
	}
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		return fmt.Errorf("child %s: result: %w (stdout %q, stderr %q)", args[0], err, stdout.String(), stderr.String())
	}
	return nil
}

// killOnDone kills the started cmd (that process only) if ctx ends before
// the returned stop is called; call stop once Wait returned.
func killOnDone(ctx context.Context, cmd *exec.Cmd) (stop func()) {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			_ = cmd.Process.Kill()
		case <-done:
		}
	}()
	return func() { close(done) }
}

// childFlags parses a child's flags, reporting errors instead of exiting.
func childFlags(name string, args []string, define func(fs *flag.FlagSet)) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	define(fs)
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%s flags: %w", name, err)
	}
	if fs.NArg() > 0 {
		return errors.New(name + ": unexpected arguments")
	}
	return nil
}
