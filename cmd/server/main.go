// Command server runs a resources server on the sandbox owner: by default
// the notes server on 127.0.0.1:8080. See package app for the flags and the
// configuration keys.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sandboxowner/owner/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	code := app.Run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
