package local

import "github.com/sandboxowner/owner/provider/local/seccomp"

// Seccomp modes (Options.Seccomp); anything else names a file.
const (
	SeccompDefault = seccomp.Default
	SeccompOff     = seccomp.Off
)
