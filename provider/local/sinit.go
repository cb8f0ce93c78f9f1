package local

import "github.com/sandboxowner/owner/provider/local/sinit"

// A sandbox's init is the server's own binary run again with argv[0]
// sinit.Name (package sinit runs it from its initialisation, before this
// package's), or a separate init binary (Options.InitBinary); the memory
// probe and the user namespace helper are modes of the same binary.

// killLimit bounds killMarked and a cgroup's kill and remove. They take no
// context: a caller that gives up must not leave processes behind.
const killLimit = sinit.KillLimit
