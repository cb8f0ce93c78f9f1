// Package osbench is what the OpenSandbox benchmark commands share: their
// command-line plumbing, a quiet logger, seeding notes sessions and opening
// a checkpointing owner on a provider.
package osbench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/sandbox"
)

// Main runs a command's body and exits 1 with its error, named by prog.
func Main(prog string, run func() error) {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, prog+":", err)
		os.Exit(1)
	}
}

// Ints parses a comma-separated list of positive integers (a flag such as
// -n 1,8,32).
func Ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Quiet is a logger that writes nothing: the benchmarks print tables.
func Quiet() *logrus.Logger {
	l := logrus.New()
	l.SetOutput(io.Discard)
	return l
}

// Opener returns what opens an exported owner named name on prov, its
// state in dir; a second call after Abandon is the restart of a crash.
func Opener(ctx context.Context, name string, prov provider.Provider, lg *logrus.Logger, dir string, par int) func() (*owner.Owner, error) {
	return func() (*owner.Owner, error) {
		return owner.New(ctx, owner.Config{
			Name: name, Provider: prov, Logger: lg, DefaultTTL: time.Hour,
			Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: dir, Parallelism: par, RoundTimeout: time.Hour},
		})
	}
}

// Seed starts n notes sessions from image, workers at a time, each with one
// line in notes.txt (seeding is not measured).
func Seed(ctx context.Context, o *owner.Owner, n, workers int, image string) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	slots := make(chan struct{}, workers)
	for i := 0; i < n; i++ {
		wg.Add(1)
		slots <- struct{}{}
		go func(i int) {
			defer wg.Done()
			defer func() { <-slots }()
			sid := fmt.Sprintf("s-%06d", i)
			_, err := o.StartSessionSandbox(ctx, sid, provider.Spec{Image: image}, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
				return json.RawMessage(`{}`), p.WriteFile(ctx, sb.Handle, "notes.txt", []byte("one\n"))
			}, "")
			if err != nil {
				errs <- fmt.Errorf("seed %s: %w", sid, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	return <-errs
}
