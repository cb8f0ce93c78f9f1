package app_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"

	"github.com/sandboxowner/owner/app"
)

// startIsolated starts a server on the local provider with isolation
// (overlays off) on a loopback port, logging to log (nil: discarded); the
// caller stops it.
func startIsolated(t *testing.T, isolation string, log *logrus.Logger) (*app.App, error) {
	t.Helper()
	cfg := app.Defaults()
	cfg.Port = 0
	cfg.Sandbox.Local.Root = t.TempDir()
	cfg.Sandbox.Local.Isolation = isolation
	cfg.Sandbox.Local.Overlay = "off"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return app.Start(context.Background(), cfg, app.Deps{Listener: ln, Logger: log})
}

// /health says how sandboxed commands are held, and a server whose
// commands run unisolated says so in words at startup.
func TestHealthAndStartupSayTheIsolation(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"none", "container"} {
		t.Run(isolation, func(t *testing.T) {
			var logs bytes.Buffer
			log := logrus.New()
			log.SetOutput(&logs)
			a, err := startIsolated(t, isolation, log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = a.Stop(context.Background()) })
			status, body, err := fasthttp.Get(nil, "http://"+a.Addr().String()+"/health")
			if err != nil || status != 200 {
				t.Fatalf("health: %d %s %v", status, body, err)
			}
			var h struct {
				Isolation string `json:"isolation"`
				Seccomp   string `json:"seccomp"`
				Limits    string `json:"limits"`
			}
			wantSeccomp := map[string]string{"container": "default", "none": "off"}[isolation]
			if err := json.Unmarshal(body, &h); err != nil || h.Isolation != isolation || h.Seccomp != wantSeccomp {
				t.Errorf("health = %s, want isolation %q, seccomp %q", body, isolation, wantSeccomp)
			}
			if !strings.Contains(h.Limits, "rlimits") {
				t.Errorf("health = %s, want the limits in effect", body)
			}
			warned := strings.Contains(logs.String(), "agent commands run UNISOLATED")
			if warned != (isolation == "none") {
				t.Errorf("isolation %s: the unisolated warning said: %v\n%s", isolation, warned, logs.String())
			}
		})
	}
}

// Without bubblewrap on the PATH, every isolating mode (bwrap, kept for
// configurations that name it, included) makes containers of the server's
// own: isolation bwrap used to refuse to start, and auto to run sandboxes
// unisolated.
func TestIsolationNeedsNoBubblewrap(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	for _, isolation := range []string{"auto", "container", "bwrap"} {
		a, err := startIsolated(t, isolation, nil)
		if err != nil {
			t.Fatalf("isolation %s without bubblewrap: %v", isolation, err)
		}
		status, body, err := fasthttp.Get(nil, "http://"+a.Addr().String()+"/health")
		_ = a.Stop(context.Background())
		var h struct {
			Isolation string `json:"isolation"`
		}
		if err != nil || status != 200 || json.Unmarshal(body, &h) != nil || h.Isolation != "container" {
			t.Errorf("isolation %s without bubblewrap: health %d %s %v, want isolation container", isolation, status, body, err)
		}
	}
}
