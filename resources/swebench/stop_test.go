package swebench_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/local/localtest"
	"github.com/sandboxowner/owner/resources/swebench"
)

// evalBegins is a provider that tells when an eval script begins (in a
// validation sandbox: the server's own).
type evalBegins struct {
	provider.Provider
	began chan provider.Handle
}

func (e *evalBegins) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if strings.Contains(req.Command, "/eval.sh") {
		select {
		case e.began <- h:
		default:
		}
	}
	return e.Provider.Exec(ctx, h, req)
}

// A server stopped while a validation runs (a seed past its client's
// patience, the server's SIGTERM, its drain cut) stops the validation's
// sandbox before Stop returns. Local sandboxes outlive their server: one
// left running kept the template's environment (its build cache) mounted
// read-write, and the removal of the server's directories deleted through
// it.
func TestAServerStoppedMidValidationStopsItsSandbox(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	prov, err := local.New(local.Options{Root: t.TempDir(), InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = prov.Close() })
	seen := &evalBegins{Provider: prov, began: make(chan provider.Handle, 1)}
	cfg := app.Defaults()
	cfg.Name, cfg.Resources, cfg.Port = "swebench", "swebench", 0
	cfg.Sandbox.Provider = "local"
	cfg.SWEBench = swebench.Config{
		Repos:       map[string]string{tr.Repo: tr.Dir},
		TemplateDir: swebench.SharedTemplateDir(),
		// A validation that ends only when it is stopped. The row's eval
		// script is built from it (the original format) and its id is the
		// test's, so that no validation kept by another test stands in.
		TestCommands:  map[string]string{tr.Repo: "sleep 3600"},
		SandboxConfig: swebench.SandboxConfig{TTLSeconds: 3600},
	}
	a, err := app.Start(context.Background(), cfg, app.Deps{Provider: seen})
	if err != nil {
		t.Fatal(err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = a.Stop(context.Background())
		}
	})
	row := maps.Clone(tr.Row)
	row["instance_id"] = "example__calc-stop-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	body, err := json.Marshal(row)
	if err != nil {
		t.Fatal(err)
	}
	seeded := make(chan string, 1)
	go func() {
		resp, err := http.Post("http://"+a.Addr().String()+"/ng-rollout/r1/seed_session", "application/json", bytes.NewReader(body))
		if err != nil {
			seeded <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seeded <- resp.Status + " " + string(b)
	}()
	var h provider.Handle
	select {
	case h = <-seen.began:
	case r := <-seeded:
		t.Fatalf("the seed ended before its validation's eval began: %s", r)
	}
	// The drain is cut at once, as when SIGTERM's drain runs out: the
	// seed is still validating.
	cut, cancel := context.WithCancel(context.Background())
	cancel()
	stopped = true
	if err := a.Stop(cut); !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop with its drain cut: %v, want the drain's context.Canceled only", err)
	}
	live, err := prov.ListSandboxes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, sb := range live {
		if sb.Handle.SandboxID == h.SandboxID {
			t.Errorf("the validation sandbox %s still runs after Stop", h.SandboxID)
		}
	}
}

// What a killed server left running on its root (a sandbox, its mounts) is
// stopped by stopLeftSandboxes, which childConfig's cleanup runs before the
// root is removed.
func TestStopLeftSandboxesStopsWhatAKilledServerLeft(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	p, err := local.New(local.Options{Root: root, Exclusive: true, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	h, err := p.Start(context.Background(), provider.Spec{TTLSeconds: 3600})
	if err != nil {
		_ = p.Close()
		t.Fatal(err)
	}
	// The server's end: its provider lets go of the root, the sandbox runs on.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if len(localtest.MountsUnder(t, root)) == 0 {
		t.Fatalf("sandbox %s has no mount under its root to leave behind", h.SandboxID)
	}
	stopLeftSandboxes(t, root)
	if m := localtest.MountsUnder(t, root); len(m) != 0 {
		t.Errorf("mounted under the root after stopLeftSandboxes: %v", m)
	}
	q, err := local.New(local.Options{Root: root, InitBinary: localtest.InitBinary(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	if live, err := q.ListSandboxes(context.Background()); err != nil || len(live) != 0 {
		t.Errorf("sandboxes after stopLeftSandboxes: %v (%v), want none", live, err)
	}
}
