package opensandbox_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/internal/diewith"
	"github.com/sandboxowner/owner/internal/freeport"
	"github.com/sandboxowner/owner/internal/osexecd"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// sharedOpenSandbox is the real OpenSandbox's sources, from this package.
const sharedOpenSandbox = "../../../shared/opensandbox"

// execdUnderTest is one execd the contract runs against: a provider whose
// sandbox h is served by it.
type execdUnderTest struct {
	p       *opensandbox.Provider
	h       provider.Handle
	workdir string
	// bulk is the size of the output far past the cap, and file that of
	// the big file: the real execd's buffers are what large sizes probe
	// (its uploads are kept in memory up to 32 MiB, gin's multipart
	// default, and go to a temporary file past it; its output is read from
	// a file poll by poll); the fake has none, and only needs to be past
	// the cap (copying 100 MB under -race costs the suite a minute of CPU).
	bulk, file int
	// frame bounds one line of the provider's command streams: against
	// the real execd the provider's own (opensandbox.MaxFrame), which a
	// longer line probes end to end; against the fake a smaller one, cut
	// the same way (a line over 16 MiB through the fake costs half a
	// minute under -race).
	frame int
	// cut makes the next command stream of the provider and sandbox it
	// returns end cleanly after its first keep events, as execd ends one
	// once it takes its request's context for done (the fake does so
	// itself, the real execd behind a proxy that does it); sent counts the
	// commands that provider has sent.
	cut func(t *testing.T, keep int) (p *opensandbox.Provider, h provider.Handle, sent func() int)
}

// TestExecdContract runs the execd behaviours the provider relies on
// against the project's fake execd and against OpenSandbox's real one. What
// a command printed must come back as it was, except for what execd's wire
// cannot carry (see wire).
func TestExecdContract(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"fake", "real"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var e execdUnderTest
			if name == "fake" {
				e = fakeExecd(t)
			} else {
				e = realExecd(t)
			}
			runContract(t, e)
		})
	}
}

// fakeExecd is the fake lifecycle server and its fake execd, running
// commands for real through the local provider (unisolated).
func fakeExecd(t *testing.T) execdUnderTest {
	t.Helper()
	lp, err := local.New(local.Options{Root: t.TempDir(), Templates: map[string]string{"contract": ""}, Isolation: "none", Overlay: "off",
		OutputCap: 128 << 20}) // all of it reaches the fake execd, as all of it reaches the real one
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lp.Close() })
	workdir := filepath.Join(t.TempDir(), "sandbox")
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: key, Backend: osexecd.LocalBackend{Provider: lp, Workdir: workdir}})
	t.Cleanup(srv.Close)
	p, err := opensandbox.New(opensandbox.Options{Domain: srv.Domain, APIKey: key, PollInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	const frame = 2 << 20
	opensandbox.SetFrameCap(p, frame)
	t.Cleanup(p.Wait)
	h, err := p.Start(context.Background(), provider.Spec{Image: "contract", TTLSeconds: 600, Workdir: workdir})
	if err != nil {
		t.Fatal(err)
	}
	cut := func(t *testing.T, keep int) (*opensandbox.Provider, provider.Handle, func() int) {
		srv.CutNextCommandStreams(1, keep)
		return p, h, func() int { return commandsSent(srv) }
	}
	return execdUnderTest{p: p, h: h, workdir: workdir, bulk: 3 << 20, file: 3 << 19, frame: frame, cut: cut}
}

// commandsSent counts the POST /command requests the fake's execd got.
func commandsSent(srv *opensandboxtest.Server) int {
	n := 0
	for _, route := range []string{"execd (direct)", "execd (proxy)"} {
		for _, b := range srv.Requests(route) {
			var body map[string]any
			if json.Unmarshal(b, &body) == nil && body["command"] != nil {
				n++
			}
		}
	}
	return n
}

// realExecd builds (once per source, cached) and starts OpenSandbox's execd
// through ../shared/opensandbox/execd.sh, behind a stub of the lifecycle
// server's endpoint route.
func realExecd(t *testing.T) execdUnderTest {
	t.Helper()
	bin, err := osexecd.Build(sharedOpenSandbox)
	if errors.Is(err, osexecd.ErrNoExecd) {
		t.Skipf("no real execd here (CI has it): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(sharedOpenSandbox, "execd.sh")
	dir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(dir, "execd")); err != nil {
		t.Fatal(err)
	}
	const token = "contract-token"
	// execd takes a port, not 0: one found free may be taken before execd
	// binds it, and then the script fails with the port held by another
	// socket. It is started again on another, a few times.
	var port int
	for try := 1; ; try++ {
		if port, err = freeport.Loopback(); err != nil {
			t.Fatal(err)
		}
		err = startExecd(t, script, dir, port, token)
		if err == nil {
			break
		}
		if try == 3 || !freeport.Held(port) {
			t.Fatal(err)
		}
		t.Logf("port %d was taken before execd listened: started again on another", port)
	}
	workdir := filepath.Join(dir, "sandbox")
	if err := os.Mkdir(workdir, 0o755); err != nil {
		t.Fatal(err)
	}
	const id = "real-execd"
	h := provider.Handle{SandboxID: id, Provider: opensandbox.Name}
	h.Descriptor, _ = json.Marshal(map[string]string{"sandbox_id": id, "workdir": workdir})
	execd := fmt.Sprintf("127.0.0.1:%d", port)
	var once sync.Once
	var cp *opensandbox.Provider
	var c *cutter
	outer := t
	cut := func(_ *testing.T, keep int) (*opensandbox.Provider, provider.Handle, func() int) {
		once.Do(func() {
			c = newCutter(outer, execd)
			cp = stubbedProvider(outer, id, c.addr, token)
		})
		c.arm(keep)
		return cp, h, c.sent
	}
	return execdUnderTest{p: stubbedProvider(t, id, execd, token), h: h, workdir: workdir, bulk: 40 << 20, file: 40 << 20, frame: opensandbox.MaxFrame, cut: cut}
}

// stubbedProvider is a provider whose lifecycle server is a stub, as far as
// the provider needs one for execd calls: sandbox id runs, and its execd is
// at endpoint, with token.
func stubbedProvider(t *testing.T, id, endpoint, token string) *opensandbox.Provider {
	t.Helper()
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", id, opensandbox.ExecdPort):
			_ = json.NewEncoder(w).Encode(map[string]any{"endpoint": endpoint,
				"headers": map[string]string{"X-EXECD-ACCESS-TOKEN": token}})
		case "/v1/sandboxes/" + id:
			_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "status": map[string]any{"state": "Running"}})
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(stub.Close)
	p, err := opensandbox.New(opensandbox.Options{Domain: strings.TrimPrefix(stub.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Wait)
	return p
}

// cutter is a proxy in front of the real execd that ends the command
// streams it is armed for after their first keep events, cleanly, as execd
// itself ends a stream once it takes its request's context for done. It
// reads the rest of execd's stream to its end (a connection dropped
// mid-stream would have execd pass SIGPIPE to its commands) and only then
// ends the one it answers.
type cutter struct {
	addr      string
	upstream  string
	mu        sync.Mutex
	cuts      []int
	commands  int
	transport *http.Transport
}

func newCutter(t *testing.T, upstream string) *cutter {
	// A connection of its own for each call.
	c := &cutter{upstream: upstream, transport: &http.Transport{DisableKeepAlives: true}}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		keep := -1
		if r.Method == http.MethodPost && r.URL.Path == "/command" {
			c.mu.Lock()
			c.commands++
			if len(c.cuts) > 0 {
				keep, c.cuts = c.cuts[0], c.cuts[1:]
			}
			c.mu.Unlock()
		}
		c.forward(t, w, r, keep)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(c.transport.CloseIdleConnections)
	c.addr = strings.TrimPrefix(srv.URL, "http://")
	return c
}

// forward passes a call on to execd and its answer back, a line at a time;
// of a command stream (keep >= 0), only the first keep events.
func (c *cutter) forward(t *testing.T, w http.ResponseWriter, r *http.Request, keep int) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The call goes on to its end whatever the client does, as the
	// provider's own would.
	req, err := http.NewRequestWithContext(context.Background(), r.Method, "http://"+c.upstream+r.URL.RequestURI(), bytes.NewReader(body))
	if err != nil {
		t.Error(err)
		return
	}
	req.Header = r.Header.Clone()
	res, err := c.transport.RoundTrip(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer res.Body.Close()
	cut := keep >= 0 && res.StatusCode == http.StatusOK
	if !cut {
		maps.Copy(w.Header(), res.Header)
		w.WriteHeader(res.StatusCode)
	}
	br := bufio.NewReader(res.Body)
	for sent := 0; !cut || sent < keep; {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 && (!cut || len(bytes.TrimSpace(line)) > 0) {
			if cut && sent == 0 {
				w.Header().Set("Content-Type", res.Header.Get("Content-Type"))
				w.WriteHeader(http.StatusOK)
			}
			if cut {
				line = append(line, '\n')
				sent++
			}
			_, _ = w.Write(line)
			w.(http.Flusher).Flush()
		}
		if err != nil {
			return
		}
	}
	// As execd, the stream ends when the command has: execd runs it to
	// its end before it ends the stream. Read to the end: a connection
	// dropped mid-stream would have execd pass SIGPIPE to its commands.
	_, _ = io.Copy(io.Discard, br)
}

// arm cuts the next command stream after keep events.
func (c *cutter) arm(keep int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cuts = append(c.cuts, keep)
}

// sent counts the commands that came through.
func (c *cutter) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.commands
}

// startExecd runs execd.sh start on port in dir; the execd it leaves is
// killed with its process group at the test's end (or the test binary's,
// killed mid-run). It returns the script's failure with its output.
func startExecd(t *testing.T, script, dir string, port int, token string) error {
	t.Helper()
	start := exec.Command(script, "start", dir, strconv.Itoa(port))
	start.Env = append(os.Environ(), "EXECD_TOKEN="+token)
	// A file, not a pipe: the shell that backgrounds execd keeps the
	// script's stdout open for as long as execd runs.
	log, err := os.Create(filepath.Join(dir, "start.log"))
	if err != nil {
		t.Fatal(err)
	}
	start.Stdout, start.Stderr = log, log
	// Its own process group, which execd joins: execd.sh's pid file names
	// the shell that started execd, not execd, so "stop" misses it.
	start.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = start.Run()
	log.Close()
	// execd outlives the script, and would outlive a test binary killed
	// mid-run (no cleanup then): a watcher kills its group either way.
	kill := exec.Command("/bin/sh", "-c", `kill -KILL -- "-$0" 2>/dev/null || :`, strconv.Itoa(start.Process.Pid))
	w, werr := diewith.OnExit(kill)
	if werr != nil {
		_ = syscall.Kill(-start.Process.Pid, syscall.SIGKILL)
		t.Fatal(werr)
	}
	t.Cleanup(func() {
		if err := w.Run(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		out, _ := os.ReadFile(log.Name())
		return fmt.Errorf("execd.sh start on port %d: %w\n%s", port, err, out)
	}
	return nil
}

// wire is what of a command's output execd's stream can carry: it sends
// each line without its ending, so "\r" and "\r\n" come back as "\n" and a
// last line without a newline gains one; its JSON makes bytes that are not
// UTF-8 U+FFFD.
func wire(printed string) string {
	var b strings.Builder
	for s := printed; s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		b.WriteRune(r) // utf8.RuneError for each byte that is not UTF-8
		s = s[n:]
	}
	out := strings.ReplaceAll(strings.ReplaceAll(b.String(), "\r\n", "\n"), "\r", "\n")
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

func runContract(t *testing.T, e execdUnderTest) {
	ctx := context.Background()
	t.Run("output", func(t *testing.T) {
		for _, tc := range []struct {
			name, command, stdout, stderr string
			exit                          int
		}{
			{"lines", `printf 'a\nb\n\nc\n'`, "a\nb\n\nc\n", "", 0},
			{"seq", "seq 1 3", "1\n2\n3\n", "", 0},
			{"leading empty lines", `printf '\n\nx\n'`, "\n\nx\n", "", 0},
			{"no final newline", `printf abc`, "abc", "", 0},
			{"carriage returns", `printf 'a\rb\r\nc\n'`, "a\rb\r\nc\n", "", 0},
			{"nothing", "true", "", "", 0},
			{"stderr and an exit status", `echo out; echo err >&2; exit 3`, "out\n", "err\n", 3},
			{"binary", `printf '\377\376\000z\n'`, "\xff\xfe\x00z\n", "", 0},
			{"unicode", `printf 'h\303\251llo \342\234\223\n'`, "héllo ✓\n", "", 0},
			{"exit 255", "exit 255", "", "", 255},
			{"command not found", "nosuchcommand-contract 2>/dev/null", "", "", 127},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got := run(t, e, provider.ExecRequest{Command: tc.command, Timeout: time.Minute})
				want := provider.ExecResult{Stdout: wire(tc.stdout), Stderr: wire(tc.stderr), ExitCode: tc.exit}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", tc.command, diff)
				}
			})
		}
	})
	t.Run("a line over a frame", func(t *testing.T) {
		got := run(t, e, provider.ExecRequest{Command: fmt.Sprintf(`head -c %d /dev/zero | tr '\000' a; echo; echo after`, e.frame+1<<18)})
		if !got.Truncated || got.Stdout != strings.Repeat("a", opensandbox.DefaultOutputCap) {
			t.Errorf("stdout %d bytes (truncated %v), want the cap's %d bytes of it, truncated", len(got.Stdout), got.Truncated, opensandbox.DefaultOutputCap)
		}
	})
	t.Run("output far past the cap", func(t *testing.T) {
		got := run(t, e, provider.ExecRequest{Command: fmt.Sprintf(`head -c %d /dev/zero | tr '\000' x | fold -w 4095; echo done >&2`, e.bulk)})
		line := strings.Repeat("x", 4095) + "\n"
		want := strings.Repeat(line, opensandbox.DefaultOutputCap/len(line)+1)[:opensandbox.DefaultOutputCap]
		if !got.Truncated || got.Stdout != want || got.Stderr != "done\n" || got.ExitCode != 0 {
			t.Errorf("got %d bytes of stdout (match %v), stderr %q, truncated %v, exit %d", len(got.Stdout), got.Stdout == want, got.Stderr, got.Truncated, got.ExitCode)
		}
	})
	t.Run("signals and timeouts", func(t *testing.T) {
		for _, tc := range []struct {
			name, command string
			timeout       time.Duration
			want          provider.ExecResult
		}{
			{"kills itself with SIGTERM", "echo bye; kill -TERM $$", time.Minute, provider.ExecResult{Stdout: "bye\n", ExitCode: 143}},
			{"kills itself with SIGKILL", "kill -KILL $$", time.Minute, provider.ExecResult{ExitCode: 137}},
			// The echo must run before the timeout: ten seconds leave a
			// loaded machine's process start a wide margin.
			{"killed by its timeout", "echo started; sleep 60", 10 * time.Second, provider.ExecResult{Stdout: "started\n", ExitCode: 137, TimedOut: true}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got := run(t, e, provider.ExecRequest{Command: tc.command, Timeout: tc.timeout})
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", tc.command, diff)
				}
			})
		}
	})
	t.Run("env", func(t *testing.T) {
		got := run(t, e, provider.ExecRequest{Command: `printf '%s|%s\n' "$A" "$B"`, Env: map[string]string{"A": "one two", "B": "$HOME"}})
		if got.Stdout != "one two|$HOME\n" {
			t.Errorf("stdout %q", got.Stdout)
		}
	})
	t.Run("cwd", func(t *testing.T) {
		if err := e.p.WriteFile(ctx, e.h, "sub dir/marker", []byte("here\n")); err != nil {
			t.Fatal(err)
		}
		for _, cwd := range []string{"sub dir", path.Join(e.workdir, "sub dir")} {
			if got := run(t, e, provider.ExecRequest{Command: "cat marker", Cwd: cwd}); got.Stdout != "here\n" {
				t.Errorf("cwd %q: %+v", cwd, got)
			}
		}
		if _, err := e.p.Exec(ctx, e.h, provider.ExecRequest{Command: "true", Cwd: "missing"}); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("a missing cwd: %v, want fs.ErrNotExist", err)
		}
		if _, err := e.p.Exec(ctx, e.h, provider.ExecRequest{Command: "true", Cwd: "sub dir/marker"}); !errors.Is(err, syscall.ENOTDIR) {
			t.Errorf("a cwd that is a file: %v, want ENOTDIR", err)
		}
		if _, err := e.p.Exec(ctx, e.h, provider.ExecRequest{Command: "true", Cwd: "$HOME"}); !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("a cwd execd would expand: %v, want ErrInvalidSpec", err)
		}
	})
	t.Run("files", func(t *testing.T) {
		big := bytes.Repeat([]byte("0123456789abcdef\x00\xff"), e.file/18)
		for name, data := range map[string][]byte{
			"plain.txt":            []byte("plain\n"),
			"with space.txt":       []byte("s"),
			"ünïcödé ✓.txt":        []byte("u"),
			"a/b/c/nested.txt":     []byte("n"),
			"price$.txt":           []byte("a dollar execd leaves alone"),
			"binary.bin":           {0, 1, 2, 0xff, '\r', '\n'},
			"empty":                {},
			"big.bin":              big,
			path.Join("abs", "x"):  []byte("x"),
			"dir/../dotdot.txt":    []byte("d"),
			"trailing-newline.txt": []byte("t\n\n"),
		} {
			if err := e.p.WriteFile(ctx, e.h, name, data); err != nil {
				t.Errorf("WriteFile(%q): %v", name, err)
				continue
			}
			got, err := e.p.ReadFile(ctx, e.h, path.Join(e.workdir, name))
			if err != nil || !bytes.Equal(got, data) {
				t.Errorf("ReadFile(%q) = %d bytes (equal %v), %v", name, len(got), bytes.Equal(got, data), err)
			}
		}
		// The command sees the same bytes.
		if got := run(t, e, provider.ExecRequest{Command: "cat 'ünïcödé ✓.txt' 'with space.txt' price\\$.txt"}); got.Stdout != "usa dollar execd leaves alone\n" {
			t.Errorf("cat = %+v", got)
		}
		for _, tc := range []struct {
			name string
			want error
		}{
			{"cost$HOME.txt", provider.ErrInvalidSpec},
			{"${HOME}", provider.ErrInvalidSpec},
			{"missing.txt", fs.ErrNotExist},
			{"plain.txt/under", syscall.ENOTDIR},
			{"a/b", syscall.EISDIR},
		} {
			if _, err := e.p.ReadFile(ctx, e.h, tc.name); !errors.Is(err, tc.want) {
				t.Errorf("ReadFile(%q) = %v, want %v", tc.name, err, tc.want)
			}
		}
		for _, tc := range []struct {
			name string
			want error
		}{
			{"cost$HOME.txt", provider.ErrInvalidSpec},
			{"plain.txt/under", syscall.ENOTDIR},
			{"a/b", syscall.EISDIR},
		} {
			err := e.p.WriteFile(ctx, e.h, tc.name, []byte("x"))
			if !errors.Is(err, tc.want) {
				t.Errorf("WriteFile(%q) = %v, want %v", tc.name, err, tc.want)
			}
			// A refused file names its path.
			var perr *fs.PathError
			if tc.want != provider.ErrInvalidSpec && (!errors.As(err, &perr) || !strings.HasSuffix(perr.Path, "/"+tc.name)) {
				t.Errorf("WriteFile(%q) = %v, want a path error naming the file", tc.name, err)
			}
		}
		if got := run(t, e, provider.ExecRequest{Command: "ls -a"}); strings.Contains(got.Stdout, "cost") {
			t.Errorf("a refused name left something behind: %q", got.Stdout)
		}
	})
	t.Run("concurrent commands", func(t *testing.T) {
		var wg sync.WaitGroup
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				res, err := e.p.Exec(ctx, e.h, provider.ExecRequest{Command: fmt.Sprintf("seq %d %d", i*100, i*100+99)})
				var want strings.Builder
				for n := i * 100; n < i*100+100; n++ {
					fmt.Fprintf(&want, "%d\n", n)
				}
				if err != nil || res.Stdout != want.String() {
					t.Errorf("command %d: %v, stdout %d bytes", i, err, len(res.Stdout))
				}
			}()
		}
		wg.Wait()
	})
	t.Run("a caller that hangs up", func(t *testing.T) {
		callerHangsUp(t, e)
	})
	t.Run("a stream that ends without its final event", func(t *testing.T) {
		streamCut(t, e)
	})
}

// streamCut: a command whose stream ends cleanly without its final event is
// never sent again; once its init event came (keep >= 1), Exec waits for it
// to end, through execd's status of it, and names its exit code; either way
// the answer is provider.ErrUnavailable, since how much of its output was
// lost cannot be told.
func streamCut(t *testing.T, e execdUnderTest) {
	for _, keep := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("after %d events", keep), func(t *testing.T) {
			p, h, sent := e.cut(t, keep)
			before := sent()
			name := fmt.Sprintf("cut-%d", keep)
			_, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "echo started; sleep 0.5; echo ran >> " + name + "; exit 3", Timeout: time.Minute})
			if !errors.Is(err, provider.ErrUnavailable) {
				t.Fatalf("Exec = %v, want ErrUnavailable", err)
			}
			if keep > 0 {
				if !strings.Contains(err.Error(), "exit code 3") {
					t.Errorf("Exec = %v, want it to name exit code 3", err)
				}
				// It had ended when Exec answered.
				if got, err := p.ReadFile(context.Background(), h, name); err != nil || string(got) != "ran\n" {
					t.Errorf("%s = %q, %v, want one run", name, got, err)
				}
			} else {
				waitFile(t, execdUnderTest{p: p, h: h}, name)
			}
			if n := sent() - before; n != 1 {
				t.Errorf("the command was sent %d times, want once", n)
			}
			// The next command's stream is whole.
			if got := run(t, execdUnderTest{p: p, h: h}, provider.ExecRequest{Command: "cat " + name}); got.Stdout != "ran\n" {
				t.Errorf("after the cut: %+v", got)
			}
		})
	}
	t.Run("a caller that goes away meanwhile", func(t *testing.T) {
		p, h, _ := e.cut(t, 1)
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := p.Exec(ctx, h, provider.ExecRequest{Timeout: 2 * time.Minute, Command: `echo $$ > cut-pid; while :; do sleep 0.05; done`})
			errc <- err
		}()
		eh := execdUnderTest{p: p, h: h}
		pid := strings.TrimSpace(string(waitFile(t, eh, "cut-pid")))
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("Exec = %v, want context.Canceled", err)
		}
		// It is interrupted, not left running (hangGuard is a bound).
		for deadline := time.Now().Add(hangGuard); ; time.Sleep(20 * time.Millisecond) {
			if res := run(t, eh, provider.ExecRequest{Command: "kill -0 " + pid + " 2>/dev/null"}); res.ExitCode != 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the command of a caller that went away still runs")
			}
		}
	})
}

// callerHangsUp: a caller that goes away mid-stream has its command
// interrupted, and a command of another caller running meanwhile is not
// touched (execd forwards the signals it gets, SIGPIPE included, to every
// running command).
func callerHangsUp(t *testing.T, e execdUnderTest) {
	ctx := context.Background()
	// The innocent command runs until a file tells it to stop, and reports
	// any signal it gets.
	innocent := make(chan provider.ExecResult, 1)
	go func() {
		res, err := e.p.Exec(ctx, e.h, provider.ExecRequest{Timeout: 2 * time.Minute,
			Command: `for s in HUP INT PIPE TERM USR1 USR2; do trap "echo got $s; exit 9" $s; done; echo > innocent-started; ` +
				`while [ ! -e stop-innocent ]; do sleep 0.05; done; echo survived`})
		if err != nil {
			res.Stderr = err.Error()
		}
		innocent <- res
	}()
	waitFile(t, e, "innocent-started")
	for round := range 3 {
		cctx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		pidFile := fmt.Sprintf("pid-%d", round)
		go func() {
			_, err := e.p.Exec(cctx, e.h, provider.ExecRequest{Timeout: 2 * time.Minute,
				Command: fmt.Sprintf(`echo $$ > %s; while :; do echo tick; sleep 0.05; done`, pidFile)})
			errc <- err
		}()
		pid := strings.TrimSpace(string(waitFile(t, e, pidFile)))
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Errorf("round %d: Exec = %v, want context.Canceled", round, err)
		}
		// The command was interrupted, not left running (hangGuard is a
		// bound, not a pace).
		for deadline := time.Now().Add(hangGuard); ; time.Sleep(20 * time.Millisecond) {
			res := run(t, e, provider.ExecRequest{Command: "kill -0 " + pid + " 2>/dev/null"})
			if res.ExitCode != 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the command of a caller that went away still runs", round)
			}
		}
	}
	if err := e.p.WriteFile(ctx, e.h, "stop-innocent", nil); err != nil {
		t.Fatal(err)
	}
	if got := <-innocent; got.Stdout != "survived\n" || got.ExitCode != 0 {
		t.Errorf("another caller's command was hit: %+v", got)
	}
}

func run(t *testing.T, e execdUnderTest, req provider.ExecRequest) provider.ExecResult {
	t.Helper()
	res, err := e.p.Exec(context.Background(), e.h, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Command, err)
	}
	return res
}

// waitFile waits (up to hangGuard: a bound, not a pace) for a file a
// command writes, and returns it.
func waitFile(t *testing.T, e execdUnderTest, name string) []byte {
	t.Helper()
	deadline := time.Now().Add(hangGuard)
	for {
		b, err := e.p.ReadFile(context.Background(), e.h, name)
		if err == nil && len(b) > 0 {
			return b
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %v", name, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
