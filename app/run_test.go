package app_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/internal/servertest"
	"github.com/sandboxowner/owner/internal/testparallel"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/snapshotindex"
)

// TestMain lets the test binary be the server: the process-level tests run
// it again through servertest, so no separate build is needed.
func TestMain(m *testing.M) {
	servertest.ServeIfChild()
	// Most of these tests wait on servers, processes and sandboxes, not on
	// the CPU: at load 50 on 2 cores the package took 116 s one test at a
	// time, 75 s two at once, 60 s four at once.
	flag.Parse()
	testparallel.AtLeast(4)
	os.Exit(m.Run())
}

func post(t *testing.T, addr, path, cookie, body string) (int, string, string) {
	t.Helper()
	r, err := send("POST", "http://"+addr+path, body, "Cookie", cookie)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	set := ""
	for _, v := range r.header.Cookies() {
		c := fasthttp.AcquireCookie()
		_ = c.ParseBytes(v)
		set = string(c.Key()) + "=" + string(c.Value())
		fasthttp.ReleaseCookie(c)
	}
	return r.status, r.body, set
}

// answer is what one request sent with send got back.
type answer struct {
	status int
	body   string
	header fasthttp.ResponseHeader
}

// send sends one request to url with the headers given as name, value pairs
// (a pair with an empty value is not sent) and waits at most a minute for
// its answer. It does not fail the test, so that goroutines may call it.
func send(method, url, body string, header ...string) (*answer, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI(url)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(header); i += 2 {
		if header[i+1] != "" {
			req.Header.Set(header[i], header[i+1])
		}
	}
	req.SetBodyString(body)
	if err := fasthttp.DoTimeout(req, resp, time.Minute); err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	a := &answer{status: resp.StatusCode(), body: string(resp.Body())}
	resp.Header.CopyTo(&a.header)
	return a, nil
}

// TestStopDrainsAndClosesTheIndex: a request in flight when the server is
// told to stop is answered, and the index is closed cleanly (it opens
// again at once).
func TestStopDrainsAndClosesTheIndex(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fk := fake.New(fake.Options{})
	lg, hook := logtest.NewNullLogger()
	lg.SetLevel(logrus.DebugLevel)
	cfg := app.Defaults()
	cfg.Port = 0
	cfg.Checkpoint = app.CheckpointConfig{Enabled: true, StateDir: dir, ControlAuthToken: "tok", Parallelism: 4, OnStop: "kill", LeaseGraceSeconds: 600}
	a, err := app.Start(context.Background(), cfg, app.Deps{Logger: lg, Provider: fk})
	if err != nil {
		t.Fatal(err)
	}
	addr := a.Addr().String()
	found := false
	for _, e := range hook.AllEntries() {
		if strings.HasPrefix(e.Message, "serving notes") && e.Data["mode"] != nil && fmt.Sprint(e.Data["mode"]) == "exported" {
			found = true
		}
	}
	if !found {
		t.Error("startup did not log the mode in effect")
	}
	status, _, cookie := post(t, addr, "/ng-rollout/r1/seed_session", "", "{}")
	if status != 200 || cookie == "" {
		t.Fatalf("seed: %d %q", status, cookie)
	}
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fk.SetHook(func(c fake.Call) {
		if c.Op == fake.OpReadFile && c.Phase == fake.PhaseBegin {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
	})
	done := make(chan int)
	go func() {
		s, _, _ := post(t, addr, "/ng-rollout/r1/append_note", cookie, `{"line":"one"}`)
		done <- s
	}()
	<-entered
	stopped := make(chan error)
	go func() { stopped <- a.Stop(context.Background()) }()
	// The stop waits for the request in flight, which is answered.
	select {
	case err := <-stopped:
		t.Fatalf("stop returned (%v) with a request in flight", err)
	case s := <-done:
		t.Fatalf("the held request was answered (%d) before its release", s)
	default:
	}
	close(release)
	if s := <-done; s != 200 {
		t.Errorf("in-flight request got %d", s)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if c, err := net.Dial("tcp", addr); err == nil {
		c.Close()
		t.Error("the stopped server still accepts connections")
	}
	if n := len(fk.LiveSandboxIDs()); n != 0 {
		t.Errorf("%d sandboxes left after a clean stop", n)
	}
	idx, err := snapshotindex.Open(dir, snapshotindex.Options{})
	if err != nil {
		t.Fatalf("index after stop: %v", err)
	}
	_ = idx.Close()
}

// child runs the test binary as the server with args.
func child(t *testing.T, args ...string) (*exec.Cmd, *bufio.Scanner, *strings.Builder) {
	t.Helper()
	cmd := servertest.Command(nil, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, bufio.NewScanner(stderr), &out
}

func TestProcessSIGTERMIsClean(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cmd, lines, _ := child(t, "-port", "0", "-log-format", "json", "-checkpoint.enabled", "-checkpoint.state_dir", dir, "-checkpoint.control_auth_token", "tok")
	addr := ""
	var log []string
	for addr == "" && lines.Scan() {
		log = append(log, lines.Text())
		var e map[string]any
		if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
			t.Fatalf("log line is not JSON: %s", lines.Text())
		}
		if a, ok := e["addr"].(string); ok {
			addr = a
			if e["mode"] != "exported" || e["provider"] != "local" {
				t.Errorf("startup line %v", e)
			}
		}
	}
	if addr == "" {
		t.Fatalf("no startup line: %v", log)
	}
	if s, body, _ := post(t, addr, "/seed_session", "", "{}"); s != 200 {
		t.Fatalf("seed: %d %s", s, body)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	rest := make(chan []string)
	go func() {
		var l []string
		for lines.Scan() {
			l = append(l, lines.Text())
		}
		rest <- l
	}()
	err := cmd.Wait()
	tail := <-rest
	if err != nil {
		t.Fatalf("exit: %v; log %v", err, tail)
	}
	if !strings.Contains(strings.Join(tail, "\n"), "stopped cleanly") {
		t.Errorf("no clean stop in the log: %v", tail)
	}
}

// TestProcessBadConfigExits2WithOneLine: a configuration the server cannot
// use is one error line in the log format asked for, and exit status 2.
func TestProcessBadConfigExits2WithOneLine(t *testing.T) {
	t.Parallel()
	cases := []struct {
		args []string
		msg  string
	}{
		{[]string{"-port", "99999"}, "config: port must be 0-65535, not 99999"},
		{[]string{"-checkpoint.enabled"}, "config: checkpoint.control_auth_token is required when checkpoint.enabled is true"},
		{[]string{"no-such-command"}, `unknown command "no-such-command" (commands: serve, swebench, sweep)`},
		{[]string{"-prot", "80"}, `config: flag -prot: unknown key "prot" (did you mean "port"?)`},
	}
	for _, tc := range cases {
		for _, format := range []string{"text", "json"} {
			args := append(append([]string(nil), tc.args...), "-log-format", format)
			cmd, lines, _ := child(t, args...)
			var out []string
			for lines.Scan() {
				out = append(out, lines.Text())
			}
			err := cmd.Wait()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() != 2 {
				t.Errorf("%v: exit %v, want status 2", args, err)
			}
			if len(out) != 1 {
				t.Errorf("%v: stderr %q, want one line", args, out)
				continue
			}
			var got map[string]any
			if format == "json" {
				if err := json.Unmarshal([]byte(out[0]), &got); err != nil {
					t.Errorf("%v: %q is not JSON", args, out[0])
					continue
				}
			} else {
				// time=... level=error msg=<the message, unquoted, to the end>
				level, msg, ok := strings.Cut(out[0], " msg=")
				if !ok {
					t.Fatalf("%v: no msg in %q", args, out[0])
				}
				got = map[string]any{"msg": msg}
				if strings.HasSuffix(level, " level=error") {
					got["level"] = "error"
				}
			}
			if got["level"] != "error" || got["msg"] != tc.msg {
				t.Errorf("%v: level %v msg %q, want error %q", args, got["level"], got["msg"], tc.msg)
			}
		}
	}
}

// TestConfigRefusedBeforeAnythingIsCreated: what the owner would refuse
// (no state_dir to export into, several workers for an exporting server) is
// refused before the provider creates its root.
func TestConfigRefusedBeforeAnythingIsCreated(t *testing.T) {
	t.Parallel()
	for _, extra := range [][]string{
		{},
		{"-checkpoint.state_dir", "STATE", "-num_workers", "4"},
	} {
		dir := t.TempDir()
		root := filepath.Join(dir, "root")
		args := []string{"-port", "0", "-sandbox.local.root", root, "-checkpoint.enabled", "-checkpoint.control_auth_token", "t"}
		for _, a := range extra {
			args = append(args, strings.ReplaceAll(a, "STATE", filepath.Join(dir, "state")))
		}
		var stderr strings.Builder
		if code := app.Run(context.Background(), args, io.Discard, &stderr); code != 2 {
			t.Errorf("%v: exit %d (%s), want 2", extra, code, stderr.String())
		}
		for _, p := range []string{root, filepath.Join(dir, "state")} {
			if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%v: %s was created (%v) by a server whose configuration is refused", extra, p, err)
			}
		}
		if n := strings.Count(strings.TrimSpace(stderr.String()), "\n"); n != 0 {
			t.Errorf("%v: %d lines: %s", extra, n+1, stderr.String())
		}
	}
}

func TestRunHelpExits0(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	if code := app.Run(context.Background(), []string{"-h"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "usage: server") {
		t.Errorf("-h: %d %q", code, out.String())
	}
}
