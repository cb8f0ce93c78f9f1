// Package seccomp builds the syscall filter a sandbox's commands run under:
// the default classic BPF program (the calls container runtimes refuse, a
// call of another architecture, sockets to the host's hypervisor and most
// netlink families) or a compiled program read from a file. It only builds
// bytes, so its decisions are tested by running the program in an
// interpreter in milliseconds, apart from the sandboxes that load it.
package seccomp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Modes of Load; anything else names a file.
const (
	Default = "default"
	Off     = "off"
)

// seccomp_data's layout: nr, arch, instruction pointer, then six 64-bit
// arguments (their low halves first on little-endian machines).
const (
	offNr   = 0
	offArch = 4
	offArg0 = 16
	offArg2 = 32
)

// Filter is the default syscall filter as a classic BPF program:
// a call of another architecture (int 0x80, x32) is refused, each of
// deniedSyscalls is EPERM, and socket(2) is EAFNOSUPPORT for AF_VSOCK
// (the host's hypervisor) and for AF_NETLINK but NETLINK_ROUTE (the
// audit, kernel-event and other families; the route family, in the
// sandbox's own network namespace, is what resolvers and `ip` use).
func Filter() ([]unix.SockFilter, error) {
	if auditArch == 0 {
		return nil, errors.New("no syscall filter is built for this architecture")
	}
	const (
		ldw  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq  = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		jge  = unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K
		ret  = unix.BPF_RET | unix.BPF_K
		deny = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		noAF = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
	)
	allow := uint32(unix.SECCOMP_RET_ALLOW)
	var f []unix.SockFilter
	stmt := func(code uint16, k uint32) { f = append(f, unix.SockFilter{Code: code, K: k}) }
	jump := func(code uint16, k uint32, jt, jf uint8) {
		f = append(f, unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf})
	}
	stmt(ldw, offArch)
	jump(jeq, auditArch, 1, 0)
	stmt(ret, deny)
	stmt(ldw, offNr)
	if x32Bit != 0 {
		jump(jge, x32Bit, 0, 1)
		stmt(ret, deny)
	}
	for _, nr := range deniedSyscalls {
		jump(jeq, uint32(nr), 0, 1)
		stmt(ret, deny)
	}
	jump(jeq, unix.SYS_SOCKET, 1, 0)
	stmt(ret, allow)
	stmt(ldw, offArg0)
	jump(jeq, unix.AF_VSOCK, 0, 1)
	stmt(ret, noAF)
	jump(jeq, unix.AF_NETLINK, 0, 3)
	stmt(ldw, offArg2)
	jump(jeq, unix.NETLINK_ROUTE, 1, 0)
	stmt(ret, noAF)
	stmt(ret, allow)
	if len(f) > 4096 {
		return nil, fmt.Errorf("the syscall filter has %d instructions, more than the kernel's 4096", len(f))
	}
	return f, nil
}

// Encode is a program as a sandbox's init loads it: the kernel's
// struct sock_filter, in the machine's byte order.
func Encode(f []unix.SockFilter) []byte {
	var b bytes.Buffer
	_ = binary.Write(&b, binary.NativeEndian, f)
	return b.Bytes()
}

// Load returns the compiled filter mode asks for: nil
// for "off", the default one for "" and "default", else the file's bytes
// (a classic BPF program, such as libseccomp's seccomp_export_bpf writes).
func Load(mode string) ([]byte, error) {
	switch mode {
	case Off:
		return nil, nil
	case "", Default:
		f, err := Filter()
		if err != nil {
			return nil, err
		}
		return Encode(f), nil
	}
	b, err := os.ReadFile(mode)
	if err != nil {
		return nil, fmt.Errorf("seccomp filter: %w", err)
	}
	if len(b) == 0 || len(b)%8 != 0 || len(b)/8 > 4096 {
		return nil, fmt.Errorf("seccomp filter %s: %d bytes is not a BPF program of 1 to 4096 instructions", mode, len(b))
	}
	return b, nil
}
