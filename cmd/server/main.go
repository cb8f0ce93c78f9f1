// Command server runs a resources server on the sandbox owner: by default
// the notes server on 127.0.0.1:8080. See package app for the flags and the
// configuration keys.
package main

import (
	"os"

	"github.com/sandboxowner/owner/app"
)

func main() {
	os.Exit(app.Main())
}
