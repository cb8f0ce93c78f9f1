package seccomp

import "golang.org/x/sys/unix"

// auditArch is the architecture the default filter allows calls of.
const auditArch = unix.AUDIT_ARCH_X86_64

// x32Bit marks x32 calls, which the default filter refuses.
const x32Bit = 0x40000000

// archDeniedSyscalls are the calls only this architecture has.
var archDeniedSyscalls = []uintptr{
	unix.SYS_IOPL, unix.SYS_IOPERM, unix.SYS_CREATE_MODULE, unix.SYS_GET_KERNEL_SYMS,
	unix.SYS_QUERY_MODULE, unix.SYS_USELIB, unix.SYS_USTAT, unix.SYS_SYSFS,
	unix.SYS__SYSCTL, unix.SYS_MODIFY_LDT,
}
