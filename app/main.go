package app

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

// Main is cmd/server's whole program: Run on the process's arguments, with
// SIGTERM or an interrupt stopping the server gracefully; it returns the
// exit status. Test binaries that run themselves as the server
// (internal/servertest) call it too, so that they run what the binary runs.
func Main() int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
}
