//go:build !amd64 && !arm64

package seccomp

// auditArch 0: no default filter is built for this architecture, so
// "default" fails New with isolation container and "auto" says so.
const auditArch = 0

const x32Bit = 0

var deniedSyscalls []uintptr
