package app_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	nethttp "net/http"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider/fake"
)

// startApp serves cfg in-process on any free port with the fake provider
// and stops it at the end of the test.
func startApp(t *testing.T, cfg app.Config) *app.App {
	t.Helper()
	cfg.Port = 0
	a, err := app.Start(context.Background(), cfg, app.Deps{Provider: fake.New(fake.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = a.Stop(ctx)
	})
	return a
}

// controlCall posts body to a control route with token and returns the
// status and body.
func controlCall(t *testing.T, addr, op, token, body string) (int, string) {
	t.Helper()
	r, err := send("POST", "http://"+addr+"/ng-control/v1/checkpoint/"+op, body, "Authorization", "bearer "+token)
	if err != nil {
		t.Fatal(err)
	}
	return r.status, r.body
}

func TestMaxDeadlineSecondsKey(t *testing.T) {
	t.Parallel()
	opts, err := app.ParseArgs([]string{"-checkpoint.enabled", "-checkpoint.control_auth_token=tok", "-checkpoint.state_dir", t.TempDir(), "-checkpoint.max_deadline_seconds", "60"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, opts.Config)
	ahead := func(d time.Duration) string {
		return fmt.Sprintf(`{"checkpoint_id":"ck1","deadline_ts":%d}`, time.Now().Add(d).Unix())
	}
	if code, body := controlCall(t, a.Addr().String(), "prepare", "tok", ahead(10*time.Minute)); code != 422 {
		t.Fatalf("prepare 10 minutes ahead with a 60 s limit: %d %s", code, body)
	}
	if code, body := controlCall(t, a.Addr().String(), "prepare", "tok", ahead(30*time.Second)); code != 200 {
		t.Fatalf("prepare 30 s ahead: %d %s", code, body)
	}
}

func TestHTTPKeysReachTheServer(t *testing.T) {
	t.Parallel()
	// A read timeout no loaded machine reaches before the server reads
	// the first connection's request.
	opts, err := app.ParseArgs([]string{"-http.max_conns_per_ip", "1", "-http.read_timeout", "1m"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := startApp(t, opts.Config).Addr().String()
	first, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	// A request answered proves the first connection is counted.
	fmt.Fprint(first, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(first)
	if resp, err := nethttp.ReadResponse(r, nil); err != nil || resp.StatusCode != 200 {
		t.Fatalf("first connection: %v %v", resp, err)
	}
	second, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	_ = second.SetReadDeadline(time.Now().Add(30 * time.Second))
	if resp, err := nethttp.ReadResponse(bufio.NewReader(second), nil); err != nil || resp.StatusCode != 429 {
		t.Fatalf("second connection with http.max_conns_per_ip 1: %v %v", resp, err)
	}
}

func TestMaxSessionsKey(t *testing.T) {
	t.Parallel()
	opts, err := app.ParseArgs([]string{"-max_sessions", "1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := startApp(t, opts.Config).Addr().String()
	if s, body, _ := post(t, addr, "/seed_session", "", "{}"); s != 200 {
		t.Fatalf("first seed: %d %s", s, body)
	}
	if s, body, _ := post(t, addr, "/seed_session", "", "{}"); s != 503 || !strings.Contains(body, "at_capacity") {
		t.Fatalf("second seed with max_sessions 1: %d %s", s, body)
	}
}
