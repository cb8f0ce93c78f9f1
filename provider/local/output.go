package local

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// outputPipe is a command's stdout or stderr: a pipe whose read end only
// the server holds, drained as the command writes. Its write end's inode
// is the server's (mode 0600): an isolated sandbox, whose uid is another,
// cannot reopen it through /proc/<pid>/fd, to take what the server has not
// read yet nor to write, and nothing can rewrite what was read. The pipe
// keeps its first limit bytes up to settle (the command's exit: whatever
// the shell and its foreground children wrote is in the pipe by then);
// what arrives later, from processes the command left running, is drained
// and dropped until their last write end closes, so that no writer ever
// blocks on a full pipe.
type outputPipe struct {
	r     *os.File
	limit int

	mu      sync.Mutex
	buf     []byte
	more    bool // bytes past limit arrived before settle
	settled bool

	caughtUp chan struct{} // closed once what was written before settle is kept
	once     sync.Once
}

// newOutputPipe makes a pipe and starts draining it; the command gets the
// write end w, which the caller closes once it was handed over.
func newOutputPipe(limit int) (*outputPipe, int, error) {
	r, w, err := commandPipe()
	if err != nil {
		return nil, -1, fmt.Errorf("local: exec: output pipe: %w", err)
	}
	o := &outputPipe{r: r, limit: limit, caughtUp: make(chan struct{})}
	go o.drain()
	return o, w, nil
}

// commandPipe makes a pipe (close-on-exec) for a command started by a
// sandbox's init: its read end is the server's, read through the
// runtime's poller, and its write end a bare descriptor in blocking mode
// (O_NONBLOCK is the open file's, which the command shares), passed to the
// init and then closed. As an *os.File the write end would enter the
// poller, leave it again to be made blocking and be closed through it:
// six system calls more a pipe, three pipes an exec.
func commandPipe() (*os.File, int, error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, -1, err
	}
	if _, err := unix.FcntlInt(uintptr(p[1]), unix.F_SETFL, 0); err != nil {
		unix.Close(p[0])
		unix.Close(p[1])
		return nil, -1, err
	}
	return os.NewFile(uintptr(p[0]), "pipe"), p[1], nil
}

// past is a read deadline already passed: it wakes the drainer at once.
var past = time.Unix(1, 0)

// settle ends what the pipe keeps: it reads what is in the pipe now
// (without waiting for more) and returns the kept bytes and whether more
// arrived. It is safe to call more than once.
func (o *outputPipe) settle() (string, bool) {
	o.once.Do(func() {
		// Wakes a drainer blocked in Read; an ended one ignores it.
		_ = o.r.SetReadDeadline(past)
	})
	<-o.caughtUp
	o.mu.Lock()
	defer o.mu.Unlock()
	return string(o.buf), o.more
}

func (o *outputPipe) keep(b []byte) {
	if len(b) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.settled {
		return
	}
	room := o.limit - len(o.buf)
	if len(b) > room {
		o.more = true
		b = b[:max(room, 0)]
	}
	o.buf = append(o.buf, b...)
}

// caughtUpNow marks what the pipe keeps as final.
func (o *outputPipe) caughtUpNow() {
	o.mu.Lock()
	if !o.settled {
		o.settled = true
		close(o.caughtUp)
	}
	o.mu.Unlock()
}

// drain reads the pipe until every write end is closed.
func (o *outputPipe) drain() {
	defer o.r.Close()
	defer o.caughtUpNow()
	buf := make([]byte, 64<<10)
	for {
		n, err := o.r.Read(buf)
		o.keep(buf[:n])
		switch {
		case err == nil:
			continue
		case errors.Is(err, os.ErrDeadlineExceeded):
			if eof := o.readBuffered(buf); eof {
				return
			}
			o.caughtUpNow()
			o.discard(buf)
		}
		return
	}
}

// readBuffered keeps what the pipe holds now, without waiting, and reports
// whether every write end is closed. It reads at most the pipe's capacity:
// what a writer the command left running adds meanwhile is not the
// command's.
func (o *outputPipe) readBuffered(buf []byte) (eof bool) {
	_ = o.r.SetReadDeadline(time.Time{})
	rc, err := o.r.SyscallConn()
	if err != nil {
		return true
	}
	_ = rc.Read(func(fd uintptr) bool {
		left, err := unix.FcntlInt(fd, unix.F_GETPIPE_SZ, 0)
		if err != nil {
			left = 1 << 20
		}
		for left > 0 {
			n, err := unix.Read(int(fd), buf[:min(len(buf), left)])
			switch {
			case err == unix.EINTR:
				continue
			case err != nil:
				return true
			case n == 0:
				eof = true
				return true
			}
			o.keep(buf[:n])
			left -= n
		}
		return true
	})
	return eof
}

// discard drops what the pipe carries until its last write end closes.
func (o *outputPipe) discard(buf []byte) {
	for {
		if _, err := o.r.Read(buf); err != nil {
			return
		}
	}
}
