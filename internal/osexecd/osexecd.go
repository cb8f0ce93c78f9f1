// Package osexecd runs OpenSandbox's real execd on this machine, for the
// tests that check the provider against it: Build builds it from the
// sources beside ../shared/opensandbox/execd.sh, Start runs one under
// bubblewrap over a sandbox's tree, and Front puts real execds behind the
// fake lifecycle server (opensandboxtest), one a sandbox, each serving the
// tree of a LocalBackend's sandbox.
//
// It is apart from opensandboxtest, as internal/osstack is, so that the
// fake is measured by its own tests: nothing here runs without the real
// execd's sources and bubblewrap, but LocalBackend.
package osexecd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxowner/owner/internal/diewith"
	"github.com/sandboxowner/owner/internal/freeport"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// ErrNoExecd: the real execd's sources (../shared/opensandbox) or a tool
// its script needs is not on this machine; a test skips.
var ErrNoExecd = errors.New("osexecd: the real execd cannot be built here")

// Build builds OpenSandbox's real execd from the sources in shared
// (the folder holding execd.sh) into a cache keyed by the sources' hash,
// under the user cache directory, and returns the binary. Only the first
// build after the sources change pays (a minute or more: modules come from
// the Go module proxy).
func Build(shared string) (string, error) {
	script, err := filepath.Abs(filepath.Join(shared, "execd.sh"))
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(script); err != nil {
		return "", fmt.Errorf("%w: %s is absent", ErrNoExecd, script)
	}
	if _, err := exec.LookPath("curl"); err != nil {
		return "", fmt.Errorf("%w: curl, which execd.sh needs, is not installed", ErrNoExecd)
	}
	root := filepath.Dir(script)
	sum := sha256.New()
	for _, sub := range []string{"execd.sh", "src/components/execd", "src/components/internal"} {
		err := filepath.WalkDir(filepath.Join(root, sub), func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fmt.Fprintf(sum, "%s %d\n", strings.TrimPrefix(p, root), len(b))
			sum.Write(b)
			return nil
		})
		if err != nil {
			return "", err
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "sandboxowner-execd", hex.EncodeToString(sum.Sum(nil))[:16])
	bin := filepath.Join(dir, "execd")
	if _, err := os.Stat(bin); err == nil {
		return bin, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	// Build elsewhere and rename, so that a concurrent run never sees half
	// a binary.
	tmp, err := os.MkdirTemp(dir, "build-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	if out, err := exec.Command(script, "build", tmp).CombinedOutput(); err != nil {
		return "", fmt.Errorf("execd.sh build (needs the Go module proxy): %w\n%s", err, out)
	}
	return bin, os.Rename(filepath.Join(tmp, "execd"), bin)
}

// Execd is a running real execd.
type Execd struct {
	// Endpoint is host:port, as a lifecycle server hands it out.
	Endpoint string
	// Token goes in opensandboxtest.ExecdTokenHeader.
	Token string
	pgid  int
}

// Stop kills the execd (its whole process group).
func (e *Execd) Stop() { _ = syscall.Kill(-e.pgid, syscall.SIGKILL) }

// Start starts the execd binary bin on a free loopback port,
// inside bubblewrap with tree bound at workdir (the rest of the host
// read-only, a private /tmp), so that the sandbox it serves sees tree where
// a container would have its workdir. It waits until execd answers /ping.
//
// execd takes a port, not 0, and a port found free stays free only until
// another process's bind: an execd that could not listen on its port (an
// exit saying so) is started again on another, a few times.
func Start(ctx context.Context, bin, tree, workdir, token string) (*Execd, error) {
	return start(ctx, bin, tree, workdir, token, freeport.Loopback)
}

// portTries bounds the starts of one execd whose port was taken.
const portTries = 3

// errPortTaken: execd exited because its port was taken meanwhile.
var errPortTaken = errors.New("osexecd: execd's port was taken before it listened")

func start(ctx context.Context, bin, tree, workdir, token string, port func() (int, error)) (*Execd, error) {
	bwrap, err := exec.LookPath("bwrap")
	if err != nil {
		return nil, fmt.Errorf("%w: bubblewrap is not installed", ErrNoExecd)
	}
	args := []string{"--tmpfs", "/"}
	entries, err := os.ReadDir("/")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		p := "/" + e.Name()
		switch {
		case p == "/proc" || p == "/dev" || p == "/tmp" || p == "/sys" || p == workdir:
		case e.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return nil, err
			}
			args = append(args, "--symlink", target, p)
		case e.IsDir():
			args = append(args, "--ro-bind", p, p)
		}
	}
	args = append(args, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp", "--bind", tree, workdir,
		"--ro-bind", bin, "/tmp/execd", "--chdir", workdir, "--setenv", "EXECD_ACCESS_TOKEN", token, "--setenv", "TMPDIR", "/tmp",
		"--", "/tmp/execd", "--log-level", "2", "--port")
	for try := 1; ; try++ {
		p, err := port()
		if err != nil {
			return nil, err
		}
		e, err := startOn(ctx, bwrap, append(args[:len(args):len(args)], strconv.Itoa(p)), p, token)
		if !errors.Is(err, errPortTaken) || try == portTries {
			return e, err
		}
	}
}

// startOn runs bwrap with args (execd's on port last) and waits until
// execd answers /ping on port, or exits.
func startOn(ctx context.Context, bwrap string, args []string, port int, token string) (*Execd, error) {
	// Dies with the test binary that starts it, killed mid-run or not:
	// bwrap by the parent-death signal, execd with bwrap.
	cmd := exec.Command(bwrap, append([]string{"--die-with-parent"}, args...)...)
	// Its own process group: Stop kills execd and anything it left.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	diewith.Parent(cmd, syscall.SIGKILL)
	// A file, read only if execd fails: a buffer would be written while
	// it is read.
	out, err := os.CreateTemp("", "execd-log-")
	if err != nil {
		return nil, err
	}
	defer os.Remove(out.Name())
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	e := &Execd{Endpoint: fmt.Sprintf("127.0.0.1:%d", port), Token: token, pgid: cmd.Process.Pid}
	for deadline := time.Now().Add(time.Minute); ; {
		select {
		case <-exited:
			// Nothing answering on the port now is this execd. Its log
			// loses the error it exits with: whether another socket
			// holds the port says why.
			log, _ := os.ReadFile(out.Name())
			if freeport.Held(port) {
				return nil, fmt.Errorf("%w: %s", errPortTaken, log)
			}
			return nil, fmt.Errorf("execd on %s exited: %s", e.Endpoint, log)
		default:
		}
		// Each ping bounded: what took the port may never answer.
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		req, _ := http.NewRequestWithContext(pctx, http.MethodGet, "http://"+e.Endpoint+"/ping", nil)
		req.Header.Set(opensandboxtest.ExecdTokenHeader, token)
		resp, err := http.DefaultClient.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			e.Stop()
			log, _ := os.ReadFile(out.Name())
			return nil, fmt.Errorf("execd on %s did not answer /ping: %s", e.Endpoint, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// LocalBackend is the local provider as a Server's backend. The Server
// makes sandboxes whose workdir is "/" (a container's root), which the
// local provider refuses: they get Workdir instead, and a command or read
// in "/" happens in Workdir.
type LocalBackend struct {
	*local.Provider
	Workdir string
}

// Capabilities are the local provider's with b's Fork; no FileOpener,
// whose paths would miss ReadFile's "/".
func (b LocalBackend) Capabilities() provider.Capabilities {
	c := b.Provider.Capabilities()
	c.Snapshotter, c.FileOpener = b, nil
	return c
}

// Start starts a sandbox whose workdir is b.Workdir.
func (b LocalBackend) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	spec.Workdir = b.Workdir
	return b.Provider.Start(ctx, spec)
}

// Fork forks a sandbox whose workdir is b.Workdir.
func (b LocalBackend) Fork(ctx context.Context, spec provider.Spec, snapshotID string) (provider.Handle, error) {
	spec.Workdir = b.Workdir
	return b.Provider.Fork(ctx, spec, snapshotID)
}

// Exec runs a command; one in "/" runs in the workdir.
func (b LocalBackend) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if req.Cwd == "/" {
		req.Cwd = b.Workdir
	}
	return b.Provider.Exec(ctx, h, req)
}

// ReadFile reads a file; "/" is the workdir.
func (b LocalBackend) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	if name == "/" {
		name = b.Workdir
	}
	return b.Provider.ReadFile(ctx, h, name)
}

// Tree is the host directory of a sandbox's tree (copy mode).
func (b LocalBackend) Tree(h provider.Handle) (string, error) {
	var d local.Descriptor
	if err := json.Unmarshal(h.Descriptor, &d); err != nil || d.Root == "" || d.SandboxID == "" {
		return "", fmt.Errorf("osexecd: not a local handle: %s", h.Descriptor)
	}
	return filepath.Join(d.Root, "sandboxes", d.SandboxID, "fs"), nil
}

// Front is a front for a fake Server whose backend is a LocalBackend:
// it passes every request on to the Server, except that an endpoint of
// execd's port names a real execd (bin, started on first use) serving that
// sandbox's tree, so that the provider talks to the real execd while the
// Server keeps the lifecycle, snapshots and forks.
type Front struct {
	*httptest.Server
	// Domain is host:port, what sandbox.opensandbox.domain takes.
	Domain string

	srv     *opensandboxtest.Server
	backend LocalBackend
	bin     string

	mu     sync.Mutex
	execds map[string]*Execd
}

// NewFront starts a front for srv.
func NewFront(srv *opensandboxtest.Server, backend LocalBackend, bin string) *Front {
	f := &Front{srv: srv, backend: backend, bin: bin, execds: map[string]*Execd{}}
	target, _ := url.Parse(srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	mux := http.NewServeMux()
	mux.Handle("/", proxy)
	mux.HandleFunc("GET /v1/sandboxes/{id}/endpoints/{port}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("port") != strconv.Itoa(opensandboxtest.ExecdPort) {
			proxy.ServeHTTP(w, r)
			return
		}
		// The Server answers first (the API key, a sandbox that is gone);
		// only its 200 is replaced.
		rec := httptest.NewRecorder()
		proxy.ServeHTTP(rec, r)
		if rec.Code != http.StatusOK {
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = io.Copy(w, rec.Body)
			return
		}
		// A caller that goes away (a server killed mid-request) does not
		// cut a start short.
		e, err := f.execd(context.WithoutCancel(r.Context()), r.PathValue("id"))
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]any{"code": "SANDBOX::UNREACHABLE", "message": err.Error()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"endpoint": e.Endpoint})
	})
	f.Server = httptest.NewServer(mux)
	f.Domain = strings.TrimPrefix(f.URL, "http://")
	return f
}

// execd returns the real execd of sandbox id, starting it on first use.
func (f *Front) execd(ctx context.Context, id string) (*Execd, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if e, ok := f.execds[id]; ok {
		return e, nil
	}
	h, ok := f.srv.BackendHandle(id)
	if !ok {
		return nil, fmt.Errorf("no sandbox %s", id)
	}
	tree, err := f.backend.Tree(h)
	if err != nil {
		return nil, err
	}
	// The token the create gave it, as the Docker runtime passes the
	// create's env to the container execd starts in.
	e, err := Start(ctx, f.bin, tree, f.backend.Workdir, f.srv.ExecdToken(id))
	if err != nil {
		return nil, err
	}
	f.execds[id] = e
	return e, nil
}

// Started is how many real execds the front has started (one a sandbox).
func (f *Front) Started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.execds)
}

// Close stops the front and every execd it started.
func (f *Front) Close() {
	f.Server.Close()
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, e := range f.execds {
		e.Stop()
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
