package sinit

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// Two helpers the provider runs besides inits, as the init's binary with
// argv[1] naming them, so that they start as small as an init does (they
// were the server's whole binary, and under `go test` the -race test
// binary):
//
//   - StageMemoryProbe touches MemoryProbeTouchMiB of fresh memory and
//     exits 0, unless the kernel kills it first: the provider's check, in
//     a throwaway cgroup with a smaller memory limit, that the limit holds.
//   - StageUserNS makes the user namespaces the provider's idmapped mounts
//     map through, one per request on its control socket (UserNSFd), and
//     ends when the socket closes. A namespace is made by cloning a
//     process into it, and Go clones with a full fork when the child
//     enters a new user namespace: this process's memory map, not the
//     server's, is what each namespace's fork copies.
const (
	StageMemoryProbe = "memory-probe"
	StageUserNS      = "userns"
)

// MemoryProbeTouchMiB is how much memory the memory probe touches.
const MemoryProbeTouchMiB = 64

// RunMemoryProbe touches MemoryProbeTouchMiB of fresh memory, a page at a
// time.
func RunMemoryProbe() int {
	b := make([]byte, MemoryProbeTouchMiB<<20)
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	if b[len(b)-4096] != 1 {
		return 1
	}
	return 0
}

// UserNSFd is the user namespace helper's end of its control socket.
const UserNSFd = 3

// IDMapHolderName is argv[0] of the process that holds a user namespace
// while it is opened: a shell that waits for its stdin to close.
const IDMapHolderName = "sandbox-idmap"

// NSRequest asks the helper for a user namespace that maps root to root
// and the storage ids to the sandbox's. It travels on the control socket
// with one descriptor, the socket the answer goes to: an NSAnswer, with
// the namespace's descriptor when it was made.
type NSRequest struct {
	StorageUID int `json:"storage_uid"`
	StorageGID int `json:"storage_gid"`
	UID        int `json:"uid"`
	GID        int `json:"gid"`
}

// NSAnswer is the helper's answer to an NSRequest.
type NSAnswer struct {
	Error string `json:"error,omitempty"`
}

// RunUserNS is the user namespace helper: it makes each namespace asked
// for on its control socket, at once, and ends when the socket closes.
func RunUserNS() int {
	buf := make([]byte, 4<<10)
	oob := make([]byte, unix.CmsgSpace(4))
	for {
		n, oobn, _, _, err := unix.Recvmsg(UserNSFd, buf, oob, unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0
		}
		fds := ReceivedFds(oob[:oobn])
		if len(fds) == 0 {
			continue
		}
		reply := fds[0]
		CloseFds(fds[1:])
		var req NSRequest
		if err := json.Unmarshal(buf[:n], &req); err != nil {
			unix.Close(reply)
			continue
		}
		go answerNS(req, reply)
	}
}

// answerNS makes the namespace req asks for and sends it, or why not, on
// reply.
func answerNS(req NSRequest, reply int) {
	defer unix.Close(reply)
	fd, err := holdUserNS(req)
	var a NSAnswer
	var rights []byte
	if err != nil {
		a.Error = err.Error()
	} else {
		defer unix.Close(fd)
		rights = unix.UnixRights(fd)
	}
	b, _ := json.Marshal(a)
	_ = unix.Sendmsg(reply, b, rights, nil, unix.MSG_NOSIGNAL) // a server that gave up closed its end
}

// holdUserNS returns a user namespace (an open descriptor) that maps root
// to root and req's storage ids to its ids. A namespace lives as long as
// a process or a descriptor holds it: a shell (which every sandbox needs
// anyway, and which starts in a fraction of the time a Go binary takes)
// is cloned into it, waits while the namespace is opened, and ends when
// its stdin closes.
func holdUserNS(req NSRequest) (int, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return -1, err
	}
	defer r.Close()
	proc, err := os.StartProcess("/bin/sh", []string{IDMapHolderName, "-c", "read x"}, &os.ProcAttr{
		Dir:   "/",
		Env:   []string{},
		Files: []*os.File{r, nil, nil},
		Sys: &syscall.SysProcAttr{
			Cloneflags:                 syscall.CLONE_NEWUSER,
			Pdeathsig:                  syscall.SIGKILL,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: req.StorageUID, HostID: req.UID, Size: 1}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}, {ContainerID: req.StorageGID, HostID: req.GID, Size: 1}},
			GidMappingsEnableSetgroups: true,
		},
	})
	if err != nil {
		w.Close()
		return -1, fmt.Errorf("idmap namespace: %w", err)
	}
	fd, err := unix.Open("/proc/"+strconv.Itoa(proc.Pid)+"/ns/user", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	w.Close()
	// The holder exits on its stdin's end: reaped in the background,
	// since the namespace outlives it held by fd.
	go func() { _, _ = proc.Wait() }()
	if err != nil {
		return -1, fmt.Errorf("idmap namespace: %w", err)
	}
	return fd, nil
}
