//go:build amd64 || arm64

package seccomp

import "golang.org/x/sys/unix"

// deniedSyscalls are refused (EPERM) to every sandboxed command by the
// default filter, as container runtimes' default profiles refuse them: the
// kernel's largest attack surfaces that a build or a test does not need
// (keyrings, eBPF, perf, userfaultfd, io_uring), and what would change the
// machine rather than the sandbox (modules, kexec, mounts, swap, clocks,
// reboot, accounting, quotas). Namespace calls are refused too: a sandbox
// makes none. ptrace stays allowed: a sandbox may debug its own processes
// (its pid namespace shows it no other).
var deniedSyscalls = append([]uintptr{
	unix.SYS_ADD_KEY, unix.SYS_KEYCTL, unix.SYS_REQUEST_KEY,
	unix.SYS_BPF, unix.SYS_PERF_EVENT_OPEN, unix.SYS_USERFAULTFD,
	unix.SYS_IO_URING_SETUP, unix.SYS_IO_URING_ENTER, unix.SYS_IO_URING_REGISTER,
	unix.SYS_KEXEC_LOAD, unix.SYS_KEXEC_FILE_LOAD,
	unix.SYS_INIT_MODULE, unix.SYS_FINIT_MODULE, unix.SYS_DELETE_MODULE,
	unix.SYS_MOUNT, unix.SYS_UMOUNT2, unix.SYS_PIVOT_ROOT, unix.SYS_MOVE_MOUNT,
	unix.SYS_OPEN_TREE, unix.SYS_FSOPEN, unix.SYS_FSCONFIG, unix.SYS_FSMOUNT,
	unix.SYS_FSPICK, unix.SYS_MOUNT_SETATTR,
	unix.SYS_UNSHARE, unix.SYS_SETNS,
	unix.SYS_SWAPON, unix.SYS_SWAPOFF, unix.SYS_REBOOT, unix.SYS_ACCT,
	unix.SYS_SETTIMEOFDAY, unix.SYS_CLOCK_SETTIME, unix.SYS_CLOCK_ADJTIME, unix.SYS_ADJTIMEX,
	unix.SYS_QUOTACTL, unix.SYS_QUOTACTL_FD, unix.SYS_NFSSERVCTL,
	unix.SYS_OPEN_BY_HANDLE_AT, unix.SYS_NAME_TO_HANDLE_AT,
	unix.SYS_LOOKUP_DCOOKIE, unix.SYS_SYSLOG, unix.SYS_VHANGUP,
	unix.SYS_FANOTIFY_INIT,
}, archDeniedSyscalls...)
