// Command sandbox-init is a local sandbox's init alone: what the server's
// own binary runs when it is started as a sandbox's init (package sinit),
// without the rest of the server, so that each init starts in a fraction
// of the server's time and memory. The server uses it when
// sandbox.local.init_binary names it, after checking that it speaks the
// server's protocol (built from the same sources); unset, the server runs
// its own binary as the init.
//
// The provider starts it with argv[0] "sandbox-init"; package sinit's
// initialisation runs it then and never returns here. Run by hand,
// `sandbox-init identity` prints the protocol it speaks.
package main

import (
	"fmt"
	"os"

	"github.com/sandboxowner/owner/provider/local/sinit"
)

func main() {
	// Reached only when argv[0] is not "sandbox-init" (see sinit.Dispatch).
	if len(os.Args) == 2 && os.Args[1] == sinit.StageIdentity {
		fmt.Println(sinit.Identity())
		return
	}
	fmt.Fprintln(os.Stderr, "sandbox-init: a local sandbox's init, started by the server (sandbox.local.init_binary); `sandbox-init identity` prints its protocol")
	os.Exit(2)
}
