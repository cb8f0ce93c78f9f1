// Command execd checks what an agent gets through the sandbox API when the
// sandbox is OpenSandbox's real execd, next to what the command printed, and
// measures the exec latency of `true` through the sandbox API against the
// real execd and against the fake one:
//
//	go run ./bench/execd                  # builds execd from ../shared/opensandbox
//	go run ./bench/execd -n 500 -cases=false
//
// Each case's command runs once under bash here (what it printed) and once
// through POST /sandboxes/{id}/exec (what the agent got). A row is "same"
// when the bytes are equal, "wire" when they differ only by what execd's
// stream cannot carry (a "\r" that comes back "\n", a final newline added,
// bytes that are not UTF-8 become U+FFFD), and "MISMATCH" otherwise; exit
// code and timed_out are compared too. Nothing here is asserted: it prints.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/bench/internal/osbench"
	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sandboxapi"
)

// cases are the commands of the mismatch table.
var cases = []struct {
	name, command string
	timeout       time.Duration
}{
	{"lines", `printf 'a\nb\n\nc\n'`, 0},
	{"seq 1 3", "seq 1 3", 0},
	{"leading empty lines", `printf '\n\nx\n'`, 0},
	{"no final newline", "printf abc", 0},
	{"\\r and \\r\\n", `printf 'a\rb\r\nc\n'`, 0},
	{"nothing", "true", 0},
	{"stderr, exit 3", "echo out; echo err >&2; exit 3", 0},
	{"binary", `printf '\377\376\000z\n'`, 0},
	{"unicode", `printf 'h\303\251llo \342\234\223\n'`, 0},
	{"kills itself (SIGTERM)", "echo bye; kill -TERM $$", 0},
	{"kills itself (SIGTERM), timeout 60s", "echo bye; kill -TERM $$", time.Minute},
	{"kills itself (SIGKILL)", "kill -KILL $$", 0},
	{"timeout 1s", "echo started; sleep 30", time.Second},
	{"17 MB line", `head -c 17000000 /dev/zero | tr '\000' a; echo`, 0},
	{"many lines", "seq 1 20000", 0},
}

func main() {
	shared := flag.String("shared", "../shared/opensandbox", "the real OpenSandbox's sources (execd.sh)")
	bin := flag.String("execd", "", "a built execd binary (default: execd.sh builds one, a minute or more)")
	n := flag.Int("n", 200, "execs of `true` timed per execd")
	withCases := flag.Bool("cases", true, "print the mismatch table")
	flag.Parse()
	osbench.Main("bench/execd", func() error { return run(*shared, *bin, *n, *withCases) })
}

func run(shared, bin string, n int, withCases bool) error {
	dir, err := os.MkdirTemp("", "bench-execd-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if bin != "" {
		if bin, err = filepath.Abs(bin); err != nil {
			return err
		}
		if err := os.Symlink(bin, filepath.Join(dir, "execd")); err != nil {
			return err
		}
	}
	real, stop, err := startReal(shared, dir)
	if err != nil {
		return err
	}
	defer stop()
	fake, err := startFake()
	if err != nil {
		return err
	}
	if withCases {
		fmt.Println("| case | through the sandbox API (real execd) |")
		fmt.Println("|---|---|")
		for _, c := range cases {
			fmt.Printf("| %s | %s |\n", c.name, compare(real, c.command, c.timeout))
		}
		for _, f := range []struct{ name, path string }{
			{"write cost$HOME.txt", "cost$HOME.txt"},
			{"read a directory", "."},
			{"write under a regular file", "plain.txt/under"},
		} {
			fmt.Printf("| %s | %s |\n", f.name, real.file(f.path))
		}
		fmt.Printf("| another caller hangs up mid-stream: an unrelated command survives | %s |\n", hangUps(real, 5))
		fmt.Println()
	}
	for _, a := range []struct {
		name string
		api  *agentAPI
	}{{"real execd", real}, {"fake execd", fake}} {
		var times []time.Duration
		for range n {
			start := time.Now()
			res, err := a.api.exec("true", 0)
			if err != nil || res.ExitCode != 0 {
				return fmt.Errorf("%s: exec true: %+v %v", a.name, res, err)
			}
			times = append(times, time.Since(start))
		}
		slices.Sort(times)
		fmt.Printf("exec of `true` through the sandbox API, %s: median %v, p90 %v (n=%d)\n", a.name,
			times[len(times)/2].Round(10*time.Microsecond), times[len(times)*9/10].Round(10*time.Microsecond), n)
	}
	return nil
}

// compare runs command under bash here and through the API.
func compare(api *agentAPI, command string, timeout time.Duration) string {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, "bash", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	want := provider.ExecResult{Stdout: stdout.String(), Stderr: stderr.String()}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		want.ExitCode = 128 + int(ws.Signal())
	} else if err != nil {
		want.ExitCode = cmd.ProcessState.ExitCode()
	}
	want.TimedOut = ctx.Err() != nil
	got, err := api.exec(command, timeout)
	if err != nil {
		return "MISMATCH: " + err.Error()
	}
	// The cap on output is the provider's, not a mismatch.
	capOut := func(s string) string { return s[:min(len(s), opensandbox.DefaultOutputCap)] }
	var diffs []string
	verdict := "same"
	for _, f := range []struct{ name, want, got string }{{"stdout", want.Stdout, got.Stdout}, {"stderr", want.Stderr, got.Stderr}} {
		switch {
		case capOut(f.want) == f.got || len(f.want) > len(f.got) && got.Truncated && strings.HasPrefix(f.want, f.got):
		case capOut(wire(f.want)) == f.got || got.Truncated && strings.HasPrefix(wire(f.want), f.got):
			if verdict == "same" {
				verdict = "wire"
			}
		default:
			diffs = append(diffs, fmt.Sprintf("%s %s, want %s", f.name, short(f.got), short(f.want)))
		}
	}
	if got.ExitCode != want.ExitCode || got.TimedOut != want.TimedOut {
		diffs = append(diffs, fmt.Sprintf("exit %d timed_out %v, want %d %v", got.ExitCode, got.TimedOut, want.ExitCode, want.TimedOut))
	}
	if len(diffs) > 0 {
		return "MISMATCH: " + strings.Join(diffs, "; ")
	}
	return verdict
}

func short(s string) string {
	if len(s) > 24 {
		return fmt.Sprintf("%q…(%d bytes)", s[:24], len(s))
	}
	return strconv.Quote(s)
}

// wire is what execd's stream can carry of printed output.
func wire(printed string) string {
	var b strings.Builder
	for s := printed; s != ""; {
		r, n := utf8.DecodeRuneInString(s)
		b.WriteRune(r)
		s = s[n:]
	}
	out := strings.ReplaceAll(strings.ReplaceAll(b.String(), "\r\n", "\n"), "\r", "\n")
	if out != "" && !strings.HasSuffix(out, "\n") {
		out += "\n"
	}
	return out
}

// file writes (or, for ".", reads) path through the API and says what came
// of it.
func (a *agentAPI) file(path string) string {
	base := strings.TrimSuffix(a.url, "/exec") + "/files?path=" + url.QueryEscape(path)
	if path == "plain.txt/under" {
		a.call(http.MethodPut, strings.TrimSuffix(a.url, "/exec")+"/files?path=plain.txt", "x")
	}
	method := http.MethodPut
	if path == "." {
		method = http.MethodGet
	}
	start := time.Now()
	status, body := a.call(method, base, "data")
	out := fmt.Sprintf("%d %s in %v", status, short(body), time.Since(start).Round(time.Millisecond))
	if path == "cost$HOME.txt" {
		res, _ := a.exec("ls -R", 0)
		out += fmt.Sprintf("; ls -R: %q", res.Stdout)
	}
	return out
}

func (a *agentAPI) call(method, u, body string) (int, string) {
	req, _ := http.NewRequest(method, u, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// hangUps has a caller hang up on a streaming command while another
// command, trapping every signal, runs; it counts the rounds the other
// command came through.
func hangUps(a *agentAPI, rounds int) string {
	survived := 0
	for range rounds {
		innocent := make(chan provider.ExecResult, 1)
		go func() {
			res, _ := a.exec(`for s in HUP INT PIPE TERM; do trap "echo got $s; exit 9" $s; done; sleep 4; echo survived`, time.Minute)
			innocent <- res
		}()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		body, _ := json.Marshal(map[string]any{"command": "while :; do echo tick; sleep 0.01; done", "timeout_ms": 60000})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+a.token)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
		cancel()
		if res := <-innocent; res.Stdout == "survived\n" {
			survived++
		}
	}
	return fmt.Sprintf("%d of %d rounds", survived, rounds)
}

// agentAPI is the sandbox API over one sandbox, as an agent calls it.
type agentAPI struct {
	url, token string
}

func (a *agentAPI) exec(command string, timeout time.Duration) (provider.ExecResult, error) {
	body, _ := json.Marshal(map[string]any{"command": command, "timeout_ms": timeout.Milliseconds()})
	req, _ := http.NewRequest(http.MethodPost, a.url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+a.token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return provider.ExecResult{}, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return provider.ExecResult{}, fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	var res provider.ExecResult
	return res, json.Unmarshal(b, &res)
}

// serveAPI serves the sandbox API over p for the one sandbox h.
func serveAPI(p provider.Provider, h provider.Handle) (*agentAPI, error) {
	tokens, err := sandboxapi.NewTokens([]byte("bench-secret"), clock.Real{})
	if err != nil {
		return nil, err
	}
	handler := &sandboxapi.Handler{Provider: p, Tokens: tokens, Resolve: func(id string) (provider.Handle, sandbox.Fate) {
		if id != h.SandboxID {
			return provider.Handle{}, sandbox.FateUnknown
		}
		return h, sandbox.FateLive
	}}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go func() { _ = (&fasthttp.Server{Handler: handler.Serve, MaxRequestBodySize: 64 << 20}).Serve(l) }()
	return &agentAPI{url: "http://" + l.Addr().String() + sandboxapi.Prefix + h.SandboxID + "/exec",
		token: tokens.Mint(h.SandboxID, time.Now().Add(time.Hour))}, nil
}

// startReal builds and starts the real execd, and serves the API over a
// provider whose lifecycle server is a stub handing out its endpoint.
func startReal(shared, dir string) (*agentAPI, func(), error) {
	script, err := filepath.Abs(filepath.Join(shared, "execd.sh"))
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	const token = "bench-token"
	start := exec.Command(script, "start", dir, strconv.Itoa(port))
	start.Env = append(os.Environ(), "EXECD_TOKEN="+token)
	log, err := os.Create(filepath.Join(dir, "start.log"))
	if err != nil {
		return nil, nil, err
	}
	// A file, not a pipe (the script's background shell keeps its stdout),
	// and a process group of its own, which execd joins and which is what
	// is stopped (execd.sh's pid file names the shell, not execd).
	start.Stdout, start.Stderr = log, log
	start.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = start.Run()
	log.Close()
	stop := func() { _ = syscall.Kill(-start.Process.Pid, syscall.SIGKILL) }
	if err != nil {
		stop()
		out, _ := os.ReadFile(log.Name())
		return nil, nil, fmt.Errorf("execd.sh start: %v\n%s", err, out)
	}
	const id = "real"
	stub := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case fmt.Sprintf("/v1/sandboxes/%s/endpoints/%d", id, opensandbox.ExecdPort):
			_ = json.NewEncoder(w).Encode(map[string]any{"endpoint": fmt.Sprintf("127.0.0.1:%d", port),
				"headers": map[string]string{opensandboxtest.ExecdTokenHeader: token}})
		case "/v1/sandboxes/" + id:
			_ = json.NewEncoder(w).Encode(map[string]any{"id": id, "status": map[string]any{"state": "Running"}})
		default:
			http.NotFound(w, r)
		}
	}))
	p, err := opensandbox.New(opensandbox.Options{Domain: strings.TrimPrefix(stub.URL, "http://"), Logger: osbench.Quiet()})
	if err != nil {
		stop()
		return nil, nil, err
	}
	workdir := filepath.Join(dir, "sandbox")
	if err := os.Mkdir(workdir, 0o755); err != nil {
		stop()
		return nil, nil, err
	}
	desc, _ := json.Marshal(map[string]string{"sandbox_id": id, "workdir": workdir})
	api, err := serveAPI(p, provider.Handle{SandboxID: id, Provider: opensandbox.Name, Descriptor: desc})
	if err != nil {
		stop()
		return nil, nil, err
	}
	return api, func() { stop(); stub.Close() }, nil
}

// startFake starts the fake OpenSandbox server (in-memory sandboxes) and
// serves the API over a sandbox of it.
func startFake() (*agentAPI, error) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{APIKey: "k"})
	p, err := opensandbox.New(opensandbox.Options{Domain: srv.Domain, APIKey: "k", PollInterval: 5 * time.Millisecond, Logger: osbench.Quiet()})
	if err != nil {
		return nil, err
	}
	h, err := p.Start(context.Background(), provider.Spec{Image: "bench", TTLSeconds: 3600})
	if err != nil {
		return nil, err
	}
	return serveAPI(p, h)
}
