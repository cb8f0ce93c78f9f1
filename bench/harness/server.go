package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources/notes"
)

// DefaultServer starts the owner's HTTP server in this process, as
// cmd/server runs it: the notes resources server (package resources/notes)
// over package http, on an owner with checkpointing on (so requests pass the
// admission gate) and the fake provider at zero latency, on a loopback
// listener.
func DefaultServer(ctx context.Context, dir string) (Target, error) {
	t, _, err := serveOwner(ctx, dir, fake.New(fake.Options{Seed: 1}))
	return t, err
}

// serveOwner starts the notes server on fk with its state under dir on a
// loopback listener. Target.Close shuts it down cleanly; crash drops it as
// a killed process would (the owner abandoned, nothing stopped), so that a
// fresh server on the same dir and fake can restore.
func serveOwner(ctx context.Context, dir string, fk *fake.Provider) (t Target, crash func(), err error) {
	srv, o, err := newServer(ctx, dir, fk)
	if err != nil {
		return Target{}, nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = o.Close()
		return Target{}, nil, fmt.Errorf("listen: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	shutdown := func() error {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := srv.Shutdown(sctx)
		wg.Wait()
		return err
	}
	crash = func() {
		o.Abandon()
		_ = shutdown()
	}
	return Target{Addr: ln.Addr().String(), Close: func() error {
		err := shutdown()
		return errors.Join(err, o.Close())
	}}, crash, nil
}

// benchControlToken guards the control plane of the servers the harness
// starts.
const benchControlToken = "bench-control-token"

// newServer builds the notes server on fk with its state under dir, not yet
// serving.
func newServer(ctx context.Context, dir string, fk *fake.Provider) (*httpapi.Server, *owner.Owner, error) {
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	o, err := owner.New(ctx, owner.Config{
		Name:       "notes",
		Provider:   fk,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: dir},
		Logger:     lg,
	})
	if err != nil {
		return nil, nil, fmt.Errorf("start owner: %w", err)
	}
	secret, _, err := httpapi.LoadSessionSecret("", dir)
	if err != nil {
		_ = o.Close()
		return nil, nil, fmt.Errorf("session secret: %w", err)
	}
	srv, err := httpapi.New(httpapi.Config{
		Owner:            o,
		Resources:        notes.New(notes.Options{}),
		Logger:           lg,
		SessionSecret:    secret,
		ControlAuthToken: benchControlToken,
	})
	if err != nil {
		_ = o.Close()
		return nil, nil, fmt.Errorf("start HTTP server: %w", err)
	}
	return srv, o, nil
}
