package seccomp

import (
	"bytes"
	"encoding/binary"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"golang.org/x/sys/unix"
)

// call is one system call as the filter sees it (struct seccomp_data).
type call struct {
	nr         uint32
	arch       uint32
	arg0, arg2 uint32
}

// run runs a classic BPF program, as the kernel would, on c and returns
// what it returns. It knows the instructions Filter writes and fails the
// test on any other.
func run(t *testing.T, prog []unix.SockFilter, c call) uint32 {
	t.Helper()
	var data [64]byte
	binary.NativeEndian.PutUint32(data[offNr:], c.nr)
	binary.NativeEndian.PutUint32(data[offArch:], c.arch)
	binary.NativeEndian.PutUint64(data[offArg0:], uint64(c.arg0))
	binary.NativeEndian.PutUint64(data[offArg2:], uint64(c.arg2))
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case unix.BPF_LD | unix.BPF_W | unix.BPF_ABS:
			acc = binary.NativeEndian.Uint32(data[in.K:])
		case unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K:
			pc += int(map[bool]uint8{true: in.Jt, false: in.Jf}[acc == in.K])
		case unix.BPF_JMP | unix.BPF_JGE | unix.BPF_K:
			pc += int(map[bool]uint8{true: in.Jt, false: in.Jf}[acc >= in.K])
		case unix.BPF_RET | unix.BPF_K:
			return in.K
		default:
			t.Fatalf("instruction %d: code %#x not known", pc, in.Code)
		}
	}
	t.Fatal("the program ran off its end")
	return 0
}

// decode reads a program back from the bytes a sandbox's init loads.
func decode(t *testing.T, b []byte) []unix.SockFilter {
	t.Helper()
	prog := make([]unix.SockFilter, len(b)/8)
	if err := binary.Read(bytes.NewReader(b), binary.NativeEndian, prog); err != nil {
		t.Fatal(err)
	}
	return prog
}

const (
	allow     = unix.SECCOMP_RET_ALLOW
	eperm     = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
	noSupport = unix.SECCOMP_RET_ERRNO | uint32(unix.EAFNOSUPPORT)
)

// The default filter, as Load hands it to a sandbox, refuses each denied
// call and every call of another architecture (x32 included) with EPERM;
// socket(2) for the hypervisor's vsock or a netlink family but the route
// one fails with EAFNOSUPPORT; every other call, socket included, goes
// through.
func TestTheDefaultFilterRefusesWhatItLists(t *testing.T) {
	if auditArch == 0 {
		t.Skip("SKIP: no default filter is built for this architecture")
	}
	type tcase struct {
		name string
		c    call
		want uint32
	}
	for _, mode := range []string{"", Default} {
		b, err := Load(mode)
		if err != nil {
			t.Fatal(err)
		}
		prog := decode(t, b)
		got := map[string]uint32{}
		want := map[string]uint32{}
		for _, nr := range deniedSyscalls {
			name := "denied call " + strconv.Itoa(int(nr))
			got[name] = run(t, prog, call{nr: uint32(nr), arch: auditArch})
			want[name] = eperm
		}
		cases := []tcase{
			{"read", call{nr: unix.SYS_READ, arch: auditArch}, allow},
			{"ptrace", call{nr: unix.SYS_PTRACE, arch: auditArch}, allow},
			{"mount", call{nr: unix.SYS_MOUNT, arch: auditArch}, eperm},
			{"unshare", call{nr: unix.SYS_UNSHARE, arch: auditArch}, eperm},
			{"read of another arch", call{nr: unix.SYS_READ, arch: unix.AUDIT_ARCH_I386}, eperm},
			{"socket inet", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_INET}, allow},
			{"socket unix", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_UNIX}, allow},
			{"socket vsock", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_VSOCK}, noSupport},
			{"socket netlink route", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_NETLINK, arg2: unix.NETLINK_ROUTE}, allow},
			{"socket netlink audit", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_NETLINK, arg2: unix.NETLINK_AUDIT}, noSupport},
			{"socket netlink uevent", call{nr: unix.SYS_SOCKET, arch: auditArch, arg0: unix.AF_NETLINK, arg2: unix.NETLINK_KOBJECT_UEVENT}, noSupport},
			{"read with socket's arguments", call{nr: unix.SYS_READ, arch: auditArch, arg0: unix.AF_VSOCK}, allow},
		}
		if x32Bit != 0 {
			cases = append(cases,
				tcase{"x32 read", call{nr: x32Bit | unix.SYS_READ, arch: auditArch}, eperm},
				tcase{"x32 first call", call{nr: x32Bit, arch: auditArch}, eperm},
				tcase{"the call below x32's", call{nr: x32Bit - 1, arch: auditArch}, allow})
		}
		for _, c := range cases {
			got[c.name] = run(t, prog, c.c)
			want[c.name] = c.want
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("mode %q (-want +got):\n%s", mode, diff)
		}
	}
}

// "off" is no filter; a file is read as a program of 1 to 4096
// instructions (8 bytes each) and refused otherwise, as is a missing one.
func TestLoadReadsAProgramOfWholeInstructions(t *testing.T) {
	if b, err := Load(Off); b != nil || err != nil {
		t.Errorf("Load(off) = %d bytes, %v; want none", len(b), err)
	}
	dir := t.TempDir()
	got := map[int]bool{}
	for _, n := range []int{0, 4, 8, 12, 16, 4096 * 8, 4097 * 8} {
		p := filepath.Join(dir, strconv.Itoa(n))
		data := bytes.Repeat([]byte{1}, n)
		if err := os.WriteFile(p, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b, err := Load(p)
		got[n] = err == nil
		if err == nil && !bytes.Equal(b, data) {
			t.Errorf("%d bytes: Load gave %d other bytes", n, len(b))
		}
	}
	want := map[int]bool{0: false, 4: false, 8: true, 12: false, 16: true, 4096 * 8: true, 4097 * 8: false}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("accepted by size (-want +got):\n%s", diff)
	}
	if _, err := Load(filepath.Join(dir, "missing")); err == nil {
		t.Error("Load of a missing file succeeded")
	}
}
