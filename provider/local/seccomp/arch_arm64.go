package seccomp

import "golang.org/x/sys/unix"

// auditArch is the architecture the default filter allows calls of.
const auditArch = unix.AUDIT_ARCH_AARCH64

// x32Bit: arm64 has no second ABI in the same numbers.
const x32Bit = 0

// archDeniedSyscalls are the calls only this architecture has.
var archDeniedSyscalls = []uintptr{}
