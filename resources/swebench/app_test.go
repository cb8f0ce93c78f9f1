package swebench_test

import (
	"context"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/sandboxowner/owner/app"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/resources/swebench"
)

// server is the binary's server (package app) in process, on an in-memory
// listener.
type server struct {
	t      *testing.T
	a      *app.App
	cl     *fasthttp.Client
	cookie string
}

func startApp(t *testing.T, cfg app.Config) *server {
	t.Helper()
	return startAppLogging(t, cfg, nil)
}

// startAppLogging is startApp logging to lg (nil: the app's default).
func startAppLogging(t *testing.T, cfg app.Config, lg *logrus.Logger) *server {
	t.Helper()
	for _, tool := range []string{"git", "go", "patch"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("SKIP: %s is not on the PATH", tool)
		}
	}
	ln := fasthttputil.NewInmemoryListener()
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Logger: lg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	return &server{t: t, a: a, cl: &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}}
}

func (s *server) post(path string, body any) (int, map[string]any, *fasthttp.ResponseHeader) {
	s.t.Helper()
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	req.SetRequestURI("http://server" + path)
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	if s.cookie != "" {
		req.Header.SetCookie(s.a.Server().CookieName(), s.cookie)
	}
	if body != nil {
		b, _ := json.Marshal(body)
		req.SetBody(b)
	}
	if err := s.cl.Do(req, resp); err != nil {
		s.t.Fatal(err)
	}
	ck := fasthttp.AcquireCookie()
	defer fasthttp.ReleaseCookie(ck)
	ck.SetKey(s.a.Server().CookieName())
	if resp.Header.Cookie(ck) {
		s.cookie = string(ck.Value())
	}
	var out map[string]any
	_ = json.Unmarshal(resp.Body(), &out)
	h := &fasthttp.ResponseHeader{}
	resp.Header.CopyTo(h)
	return resp.StatusCode(), out, h
}

func baseConfig(t *testing.T, tr swebench.TaskRepo) app.Config {
	cfg := app.Defaults()
	cfg.Name, cfg.Resources, cfg.Port = "swebench", "swebench", 0
	cfg.Sandbox.Provider = "local"
	cfg.Sandbox.Local.Root = t.TempDir()
	cfg.Sandbox.Local.InitBinary = localtest.InitBinary(t)
	cfg.SWEBench = swebench.Config{
		TemplateDir:  swebench.SharedTemplateDir(),
		StdCacheDir:  swebench.SharedStdCacheDir(),
		Repos:        map[string]string{tr.Repo: tr.Dir},
		TestCommands: map[string]string{tr.Repo: tr.TestCommand},
	}
	return cfg
}

func TestTheBinaryServesSWEBench(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := baseConfig(t, tr)
	cfg.Checkpoint.Enabled, cfg.Checkpoint.StateDir, cfg.Checkpoint.ControlAuthToken = true, t.TempDir(), "control-token"
	s := startApp(t, cfg)
	if s.a.Owner().Mode() != "exported" {
		t.Fatalf("mode %s, want exported", s.a.Owner().Mode())
	}
	status, seed, _ := s.post("/ng-rollout/r-1/seed_session", tr.Row)
	if status != 200 || seed["sandbox_handle"] == nil {
		t.Fatalf("seed: %d %v", status, seed)
	}
	status, access, _ := s.post(httpapi.RouteSandboxAccess, nil)
	if status != 200 || access["workdir"] != "/testbed" {
		t.Fatalf("sandbox_access: %d %v", status, access)
	}
	// No change by the agent: graded, unresolved.
	status, res, _ := s.post("/ng-rollout/r-1/verify", tr.Row)
	if status != 200 || res["reward"] != 0.0 || res["evaluation_completed"] != true || res["mask_sample"] != false {
		t.Fatalf("verify: %d %v", status, res)
	}
	if !strings.Contains(res["test_output"].(string), "--- FAIL: TestAbs/negative") {
		t.Errorf("test_output:\n%s", res["test_output"])
	}
}

func TestTheBinarysGoldenInstance(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := baseConfig(t, tr)
	cfg.SWEBench.IsVerifyingGoldenPatch = true
	cfg.Checkpoint.Enabled, cfg.Checkpoint.ControlAuthToken = true, "control-token" // no state_dir
	lg, hook := logtest.NewNullLogger()
	s := startAppLogging(t, cfg, lg)
	if s.a.Owner().Mode() != "restart_only" {
		t.Fatalf("mode %s, want restart_only", s.a.Owner().Mode())
	}
	// Its local provider can snapshot; the server lends no sandbox, and
	// says that, not that the provider cannot.
	var said []string
	for _, e := range hook.AllEntries() {
		if strings.Contains(e.Message, "snapshot") || strings.Contains(e.Message, "lends no sandboxes") {
			said = append(said, e.Message)
		}
	}
	if want := []string{"swebench: lends no sandboxes, so there is nothing to export: checkpoint mode restart_only"}; !slices.Equal(said, want) {
		t.Errorf("the startup log says %q, want %q", said, want)
	}
	status, _, h := s.post("/ng-rollout/r-1/seed_session", tr.MultilingualRow)
	if status != 200 || string(h.Peek(httpapi.HeaderRestart)) != "1" {
		t.Fatalf("golden seed: %d", status)
	}
	if status, _, _ := s.post(httpapi.RouteSandboxAccess, nil); status != 404 {
		t.Errorf("golden sandbox_access: %d, want 404", status)
	}
	status, res, _ := s.post("/ng-rollout/r-1/verify", tr.MultilingualRow)
	if status != 200 || res["reward"] != 1.0 || res["patch_source"] != "golden" {
		t.Fatalf("golden verify: %d %v", status, res)
	}
}

// A repository path that does not exist is said once at startup, not first
// found by a seed; the server still starts (the clone may come later).
func TestTheBinaryWarnsOfAMissingRepository(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := baseConfig(t, tr)
	missing := filepath.Join(t.TempDir(), "not-cloned-yet")
	cfg.SWEBench.Repos["example/missing"] = missing
	lg, hook := logtest.NewNullLogger()
	startAppLogging(t, cfg, lg)
	var warned []string
	for _, e := range hook.AllEntries() {
		if e.Level == logrus.WarnLevel && strings.Contains(e.Message, "swebench.repos") {
			warned = append(warned, e.Message)
		}
	}
	want := []string{"swebench.repos: example/missing: " + missing + ": no such file or directory; its rows cannot be seeded until it is there"}
	if !slices.Equal(warned, want) {
		t.Errorf("startup warnings %q, want %q", warned, want)
	}
}

func TestTheBinaryRefusesSWEBenchOnTheFake(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := baseConfig(t, tr)
	cfg.Sandbox.Provider = "fake"
	if _, err := app.Start(context.Background(), cfg, app.Deps{Listener: fasthttputil.NewInmemoryListener()}); err == nil || !strings.Contains(err.Error(), "real sandbox provider") {
		t.Errorf("start on the fake: %v", err)
	}
}
