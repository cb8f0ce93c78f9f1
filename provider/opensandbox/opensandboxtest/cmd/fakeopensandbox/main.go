// Command fakeopensandbox runs the fake OpenSandbox server on its own, for
// trying the server's opensandbox provider by hand:
//
//	go run ./provider/opensandbox/opensandboxtest/cmd/fakeopensandbox -addr 127.0.0.1:8090 -api-key k
//	go run ./cmd/server -sandbox.provider opensandbox -sandbox.opensandbox.domain 127.0.0.1:8090 -sandbox.opensandbox.api_key k
//
// Sandboxes live in memory (the fake provider's files and its small shell)
// until the command ends (SIGINT or SIGTERM).
package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "address to listen on")
	key := flag.String("api-key", "", "API key to require in OPEN-SANDBOX-API-KEY (none: no auth)")
	create := flag.Duration("create-latency", 200*time.Millisecond, "how long a sandbox stays Pending")
	snap := flag.Duration("snapshot-latency", 200*time.Millisecond, "how long a capture takes (two at once)")
	lower := flag.Bool("lower-case-states", false, "spell states in lower case")
	flag.Parse()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fakeopensandbox:", err)
		os.Exit(1)
	}
	srv := opensandboxtest.NewServer(opensandboxtest.Options{
		APIKey: *key, CreateLatency: *create, SnapshotLatency: *snap, LowerCaseStates: *lower, Listener: ln,
	})
	fmt.Fprintf(os.Stderr, "fakeopensandbox: serving the lifecycle API at %s/v1 (domain %s)\n", srv.URL, srv.Domain)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	srv.Close()
	if v := srv.Violations(); len(v) > 0 {
		fmt.Fprintf(os.Stderr, "fakeopensandbox: %d requests broke the spec:\n", len(v))
		for _, line := range v {
			fmt.Fprintln(os.Stderr, "  "+line)
		}
		os.Exit(1)
	}
}
