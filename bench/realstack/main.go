// Command realstack measures commit and restore on the real OpenSandbox
// (../shared/opensandbox/stack.sh: the lifecycle server from source, the
// Docker runtime, execd in every sandbox) next to the ideal computed from
// the server's own times, and the exec of `true` through this server's
// sandbox API next to the same sent to execd directly; it writes
// bench/realstack.md:
//
//	go run ./bench/realstack                  # N = 1, 8, 32
//	go run ./bench/realstack -n 1,8 -execs 100
//
// Commit: N sessions are snapshotted, at most two captures at once (the
// server's own limit, which the provider keeps). Each snapshot's capture
// time is the server's: from its createdAt to the lastTransitionAt of
// Ready. The ideal is the shortest schedule of those captures on two
// workers (the longest, or half their sum, whichever is more).
//
// Restore: N forks (checkpoint.parallelism P at once). A fork is its create
// request (the server answers it Running: the work is inside the request),
// timed at the client's transport. Concurrent fork requests wait on each
// other inside the server, so the ideal is the server's span of fork work:
// from the first fork request sent to the last one answered. What a restore
// takes beyond it is the client's (waiting for execd, the fork's labels).
//
// Nothing here is asserted: it prints and writes the table.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/bench/internal/osbench"
	"github.com/sandboxowner/owner/internal/osstack"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
)

func main() { osbench.Main("bench/realstack", run) }

type row struct {
	op              string
	n               int
	measured, ideal time.Duration
	each            []time.Duration // the server's per-snapshot or per-fork times
}

func run() error {
	sizes := flag.String("n", "1,8,32", "comma-separated session counts")
	par := flag.Int("p", 16, "checkpoint.parallelism of the owner")
	execs := flag.Int("execs", 200, "execs of `true` each way")
	out := flag.String("out", "bench/realstack.md", "where the results go")
	flag.Parse()
	st, err := osstack.Up()
	if err != nil {
		return err
	}
	release, err := st.Shared()
	if err != nil {
		return err
	}
	defer release()
	ns, err := osbench.Ints(*sizes)
	if err != nil {
		return fmt.Errorf("-n: %w", err)
	}
	var rows []row
	for _, n := range ns {
		r, err := cell(st, n, *par)
		if err != nil {
			return fmt.Errorf("cell of %d sessions: %w", n, err)
		}
		for _, x := range r {
			fmt.Fprintf(os.Stderr, "%-7s N=%-3d %9v  ideal %9v  %.2fx\n", x.op, x.n, x.measured.Round(time.Millisecond), x.ideal.Round(time.Millisecond), ratio(x))
		}
		rows = append(rows, r...)
	}
	api, direct, err := execs2(st, *execs)
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	md := markdown(rows, *par, api, direct)
	fmt.Print(md)
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	return os.WriteFile(*out, []byte(md), 0o644)
}

func ratio(r row) float64 { return float64(r.measured) / float64(r.ideal) }

// forkTimer records how long each fork request (a create from a snapshot)
// took, at the client's transport.
type forkTimer struct {
	base  http.RoundTripper
	mu    sync.Mutex
	forks []time.Duration
	// first and last are when the first fork request was sent and the
	// last one answered.
	first, last time.Time
}

func (f *forkTimer) RoundTrip(req *http.Request) (*http.Response, error) {
	fork := req.Method == http.MethodPost && strings.HasSuffix(req.URL.Path, "/v1/sandboxes") && req.Body != nil
	if fork && req.GetBody != nil {
		b, _ := req.GetBody()
		raw, _ := io.ReadAll(b)
		fork = bytes.Contains(raw, []byte(`"snapshotId"`))
	}
	t0 := time.Now()
	res, err := f.base.RoundTrip(req)
	if fork && err == nil && res.StatusCode == http.StatusAccepted {
		f.mu.Lock()
		now := time.Now()
		f.forks = append(f.forks, now.Sub(t0))
		if f.first.IsZero() || t0.Before(f.first) {
			f.first = t0
		}
		f.last = now
		f.mu.Unlock()
	}
	return res, err
}

// cell seeds n sessions, commits them, abandons the owner (a crash), and
// restores them in a fresh owner; then deletes everything.
func cell(st osstack.Stack, n, par int) ([]row, error) {
	ctx := context.Background()
	lg := osbench.Quiet()
	name := fmt.Sprintf("bench%d%d", n, time.Now().UnixNano()%1e6)
	ft := &forkTimer{base: http.DefaultTransport}
	prov, err := opensandbox.New(opensandbox.Options{
		Domain: st.Domain, APIKey: st.APIKey, Memory: "256Mi", Logger: lg,
		ListLabels: map[string]string{owner.LabelOwner: name}, HTTPClient: &http.Client{Transport: ft},
	})
	if err != nil {
		return nil, err
	}
	defer cleanup(prov)
	dir, err := os.MkdirTemp("", "bench-realstack-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	open := osbench.Opener(ctx, name, prov, lg, dir, par)
	o, err := open()
	if err != nil {
		return nil, err
	}
	if err := osbench.Seed(ctx, o, n, 8, st.Image); err != nil {
		return nil, err
	}
	t0 := time.Now()
	if _, err := o.Commit(ctx, owner.CommitRequest{CheckpointID: "ck1"}); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	commit := time.Since(t0)
	captures, err := captureTimes(ctx, st, prov)
	if err != nil {
		return nil, err
	}
	o.Abandon()
	o2, err := open()
	if err != nil {
		return nil, err
	}
	defer o2.Close()
	ft.mu.Lock()
	ft.forks, ft.first, ft.last = nil, time.Time{}, time.Time{}
	ft.mu.Unlock()
	t0 = time.Now()
	if _, err := o2.Restore(ctx, owner.RestoreRequest{CheckpointID: "ck1"}); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	restore := time.Since(t0)
	ft.mu.Lock()
	forks, span := slices.Clone(ft.forks), ft.last.Sub(ft.first)
	ft.mu.Unlock()
	return []row{
		{op: "commit", n: n, measured: commit, ideal: makespan(captures, 2), each: captures},
		{op: "restore", n: n, measured: restore, ideal: span, each: forks},
	}, nil
}

// makespan is a lower bound of running jobs on k workers: the longest job,
// or their sum over k.
func makespan(jobs []time.Duration, k int) time.Duration {
	var sum, longest time.Duration
	for _, j := range jobs {
		sum += j
		longest = max(longest, j)
	}
	return max(longest, sum/time.Duration(max(k, 1)))
}

// captureTimes reads the server's own capture time of each of the run's
// snapshots: createdAt to the lastTransitionAt of Ready.
func captureTimes(ctx context.Context, st osstack.Stack, prov *opensandbox.Provider) ([]time.Duration, error) {
	snaps, err := prov.ListSnapshots(ctx)
	if err != nil {
		return nil, err
	}
	var out []time.Duration
	for _, s := range snaps {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, st.URL+"/v1/snapshots/"+s.ID, nil)
		req.Header.Set(opensandbox.APIKeyHeader, st.APIKey)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		var doc struct {
			CreatedAt time.Time `json:"createdAt"`
			Status    struct {
				State            string    `json:"state"`
				LastTransitionAt time.Time `json:"lastTransitionAt"`
			} `json:"status"`
		}
		err = json.NewDecoder(res.Body).Decode(&doc)
		res.Body.Close()
		if err != nil || doc.Status.State != "Ready" {
			return nil, fmt.Errorf("snapshot %s: %v %+v", s.ID, err, doc)
		}
		out = append(out, doc.Status.LastTransitionAt.Sub(doc.CreatedAt))
	}
	return out, nil
}

// cleanup deletes what the run left on the stack: sandboxes, then
// snapshots (a snapshot a fork stands on cannot go first).
func cleanup(p *opensandbox.Provider) {
	ctx := context.Background()
	if sbs, err := p.ListSandboxes(ctx); err == nil {
		for _, s := range sbs {
			_ = p.Stop(ctx, s.Handle)
		}
	}
	if snaps, err := p.ListSnapshots(ctx); err == nil {
		for _, s := range snaps {
			_ = p.DeleteSnapshot(ctx, s.ID)
		}
	}
}

// execs2 runs `true` k times through a notes server's sandbox API (on the
// stack) and k times straight at the sandbox's execd, and returns each
// way's latencies.
func execs2(st osstack.Stack, k int) (api, direct []time.Duration, err error) {
	ctx := context.Background()
	cfg := app.Defaults()
	cfg.Name = fmt.Sprintf("benchexec%d", time.Now().UnixNano()%1e6)
	cfg.SessionSecret = "a-secret-of-sixteen-plus"
	cfg.Sandbox.Provider = "opensandbox"
	cfg.Sandbox.OpenSandbox.Domain = st.Domain
	cfg.Sandbox.OpenSandbox.APIKey = st.APIKey
	cfg.Sandbox.OpenSandbox.Images = map[string]string{"notes": st.Image}
	cfg.Sandbox.OpenSandbox.Resources.Memory = "256Mi"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	lg := osbench.Quiet()
	a, err := app.Start(ctx, cfg, app.Deps{Listener: ln, Logger: lg})
	if err != nil {
		return nil, nil, err
	}
	defer a.Stop(ctx)
	base := "http://" + a.Addr().String()
	jar := &cookie{}
	if _, err := jar.post(base+"/ng-rollout/r1/seed_session", "", "{}"); err != nil {
		return nil, nil, err
	}
	body, err := jar.post(base+"/sandbox_access", "", "")
	if err != nil {
		return nil, nil, err
	}
	var acc struct {
		Connection struct {
			Descriptor struct {
				Endpoint  string `json:"endpoint"`
				Token     string `json:"token"`
				SandboxID string `json:"sandbox_id"`
			} `json:"descriptor"`
		} `json:"connection"`
	}
	if err := json.Unmarshal(body, &acc); err != nil {
		return nil, nil, fmt.Errorf("sandbox_access: %s", body)
	}
	d := acc.Connection.Descriptor
	lp, err := opensandbox.New(opensandbox.Options{Domain: st.Domain, APIKey: st.APIKey, Logger: lg})
	if err != nil {
		return nil, nil, err
	}
	ep, hdr, err := lp.Endpoint(ctx, provider.Handle{SandboxID: d.SandboxID, Provider: opensandbox.Name})
	if err != nil {
		return nil, nil, err
	}
	cl := &http.Client{Timeout: time.Minute}
	one := func(url, auth string, body string, h map[string]string) (time.Duration, error) {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", "Bearer "+auth)
		}
		for k, v := range h {
			req.Header.Set(k, v)
		}
		t0 := time.Now()
		res, err := cl.Do(req)
		if err != nil {
			return 0, err
		}
		// execd's stream: read until the command's end event, as a client
		// does (execd keeps the stream open about a second after it).
		sc := bufio.NewScanner(res.Body)
		ok := res.StatusCode == http.StatusOK
		for sc.Scan() {
			line := sc.Text()
			if strings.Contains(line, `"execution_complete"`) || strings.Contains(line, `"error"`) {
				break
			}
		}
		d := time.Since(t0)
		res.Body.Close()
		if !ok {
			return 0, fmt.Errorf("POST %s: %d", url, res.StatusCode)
		}
		return d, nil
	}
	for i := 0; i < k; i++ {
		t, err := one(d.Endpoint+"/exec", d.Token, `{"command":"true"}`, nil)
		if err != nil {
			return nil, nil, err
		}
		api = append(api, t)
		t, err = one(ep+"/command", "", `{"command":"true"}`, hdr)
		if err != nil {
			return nil, nil, err
		}
		direct = append(direct, t)
	}
	return api, direct, nil
}

// cookie is a one-cookie jar for the notes server's session cookie.
type cookie struct{ v string }

func (c *cookie) post(url, _ string, body string) ([]byte, error) {
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if c.v != "" {
		req.Header.Set("Cookie", c.v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	if sc := res.Header.Get("Set-Cookie"); sc != "" {
		c.v, _, _ = strings.Cut(sc, ";")
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: %d %s", url, res.StatusCode, b)
	}
	return b, nil
}

func pct(ds []time.Duration, p float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func markdown(rows []row, par int, api, direct []time.Duration) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Commit, restore and exec on the real OpenSandbox\n\n")
	fmt.Fprintf(&b, "`go run ./bench/realstack` on %s, %d CPUs, %s, against `../shared/opensandbox/stack.sh up` (the lifecycle server from "+
		"source, Docker runtime, overlay2, Debian sandboxes with execd). Commit: the ideal is the shortest schedule of the server's own "+
		"capture times (snapshot createdAt to Ready) on its two capture workers. Restore (P = %d): the server answers a fork Running, "+
		"so a fork is its request; concurrent fork requests wait on each other inside the server, and the ideal is the server's span "+
		"of fork work (first fork request sent to last answered); the rest is the client's (execd's first answer, the fork's labels).\n\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), par)
	b.WriteString("| op | N | measured | ideal | ratio | server's times: min / median / max |\n|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		each := "—"
		if len(r.each) > 0 {
			each = fmt.Sprintf("%v / %v / %v", pct(r.each, 0).Round(time.Millisecond), pct(r.each, 0.5).Round(time.Millisecond), pct(r.each, 1).Round(time.Millisecond))
		}
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %.2f× | %s |\n", r.op, r.n, r.measured.Round(time.Millisecond), r.ideal.Round(time.Millisecond), ratio(r), each)
	}
	fmt.Fprintf(&b, "\nExec of `true`, %d times each way, one at a time (to the command's end event):\n\n", len(api))
	b.WriteString("| path | median | p90 | p99 |\n|---|---:|---:|---:|\n")
	for _, x := range []struct {
		name string
		ds   []time.Duration
	}{{"this server's sandbox API (`POST /sandboxes/{id}/exec`, forwarding to execd)", api}, {"execd directly (`POST /command` at the sandbox's endpoint)", direct}} {
		fmt.Fprintf(&b, "| %s | %v | %v | %v |\n", x.name, pct(x.ds, 0.5).Round(10*time.Microsecond), pct(x.ds, 0.9).Round(10*time.Microsecond), pct(x.ds, 0.99).Round(10*time.Microsecond))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "\nLoad average (1, 5, 15 min) when the run ended: %s (other engineers' work shared the 2 cores).\n", strings.Join(strings.Fields(string(la))[:3], ", "))
	}
	return b.String()
}
