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
	srv, o, err := newServer(ctx, dir)
	if err != nil {
		return Target{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		_ = o.Close()
		return Target{}, fmt.Errorf("listen: %w", err)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = srv.Serve(ln)
	}()
	return Target{Addr: ln.Addr().String(), Close: func() error {
		sctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err := srv.Shutdown(sctx)
		wg.Wait()
		return errors.Join(err, o.Close())
	}}, nil
}

// newServer builds DefaultServer's owner and HTTP server, not yet serving.
func newServer(ctx context.Context, dir string) (*httpapi.Server, *owner.Owner, error) {
	lg := logrus.New()
	lg.SetOutput(io.Discard)
	o, err := owner.New(ctx, owner.Config{
		Name:       "notes",
		Provider:   fake.New(fake.Options{Seed: 1}),
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
		ControlAuthToken: "bench-control-token",
	})
	if err != nil {
		_ = o.Close()
		return nil, nil, fmt.Errorf("start HTTP server: %w", err)
	}
	return srv, o, nil
}
