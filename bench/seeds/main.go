// Command seeds measures a group of seeds of one task (GRPO's group: N
// rollouts of the same prompt) against one seed, and a warm pool's hit:
//
//	go run ./bench/seeds                       # N = 1, 8, 64; L = 200ms
//	go run ./bench/seeds -n 1,8 -l 50ms -out DIR
//	go run ./bench/seeds -kinds "local keyed" -n 64 -profile DIR  # CPU, block, mutex profiles and a trace
//
// Each cell seeds N sessions at once on a fresh owner and reports the time
// until the last one is seeded, beside one seed alone (the first row of its
// kind) and N times that. A seeded sandbox has run no command yet, and on
// the local provider its init starts at its first (a fork's too): for the
// local kinds the cell also reports the time until every seed's sandbox
// ran one (true, through Exec), which an agent's first tool call pays. The
// kinds:
//
//   - local notes: the notes setup (a token written) on the local provider,
//     no template: every seed starts a sandbox; the baseline.
//   - local keyed: a SWE-bench-like setup (a 200-file tree written, then
//     a second's wait, as a clone and build would take) declared a pure
//     function of the task: run once into a template, every seed a fork.
//   - opensandbox notes / keyed: the same on the OpenSandbox provider
//     against its fake server (in process, loopback HTTP), whose creates
//     and captures each take L.
//
// Goal: a group of 64 within 2x one seed, and a pool hit within 5 ms on the
// local provider. Results go to DIR/seeds.md (default
// $TMPDIR/sandboxowner-bench); tracked files are never written.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sandboxowner/owner/bench/internal/osbench"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
	"github.com/sandboxowner/owner/sandbox"
)

func main() { osbench.Main("bench/seeds", run) }

type row struct {
	kind  string
	n     int
	group time.Duration
	one   time.Duration
	// first and oneFirst: until every seed's sandbox ran its first
	// command (0: not measured, a provider whose fake runs no shell).
	first, oneFirst time.Duration
	// setups counts the setups run for the group.
	setups int64
}

func run() (err error) {
	sizes := flag.String("n", "1,8,64", "comma-separated group sizes")
	lat := flag.Duration("l", 200*time.Millisecond, "create and capture latency of the fake OpenSandbox server")
	out := flag.String("out", filepath.Join(os.TempDir(), "sandboxowner-bench"), "directory for seeds.md")
	hits := flag.Int("hits", 10, "pool hits measured")
	kinds := flag.String("kinds", "local notes,local keyed,opensandbox notes,opensandbox keyed", "comma-separated kinds to measure")
	prof := flag.String("profile", "", "directory for the run's CPU, block and mutex profiles and execution trace (none when empty)")
	flag.Parse()
	if *prof != "" {
		stop, err := osbench.Profile(*prof)
		if err != nil {
			return err
		}
		defer func() {
			if perr := stop(); perr != nil && err == nil {
				err = perr
			}
		}()
	}
	ns, err := osbench.Ints(*sizes)
	if err != nil {
		return err
	}
	ctx := context.Background()
	root, err := os.MkdirTemp("", "bench-seeds-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(root)
	lp, isolation, err := localProvider(filepath.Join(root, "local"))
	if err != nil {
		return err
	}
	// Before the root's removal: the sandbox directories it made ahead
	// keep their disks mounted until it closes.
	defer lp.Close()
	var rows []row
	for _, k := range []struct {
		name  string
		prov  func() (provider.Provider, func(), error)
		keyed bool
	}{
		{"local notes", func() (provider.Provider, func(), error) { return lp, func() {}, nil }, false},
		{"local keyed", func() (provider.Provider, func(), error) { return lp, func() {}, nil }, true},
		{"opensandbox notes", func() (provider.Provider, func(), error) { return osProvider(*lat) }, false},
		{"opensandbox keyed", func() (provider.Provider, func(), error) { return osProvider(*lat) }, true},
	} {
		if !slices.Contains(strings.Split(*kinds, ","), k.name) {
			continue
		}
		var one, oneFirst time.Duration
		for _, n := range append([]int{1}, ns...) {
			prov, done, err := k.prov()
			if err != nil {
				return err
			}
			r, err := group(ctx, prov, filepath.Join(root, "state"), k.keyed, n)
			done()
			if err != nil {
				return fmt.Errorf("%s, N=%d: %w", k.name, n, err)
			}
			if one == 0 {
				one, oneFirst = r.group, r.first // the first cell is one seed alone
				continue
			}
			r.kind, r.one, r.oneFirst = k.name, one, oneFirst
			fmt.Fprintf(os.Stderr, "%-18s N=%-3d group %9v  one %9v  ratio %.2fx  setups %d  first command run: group %9v  one %9v\n", r.kind, n, r.group.Round(time.Millisecond), one.Round(time.Millisecond), ratio(r.group, one), r.setups, r.first.Round(time.Millisecond), oneFirst.Round(time.Millisecond))
			rows = append(rows, r)
		}
	}
	poolHits, err := poolHit(ctx, lp, filepath.Join(root, "pool"), *hits)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "local keyed pool hits: %v\n", poolHits)
	md := markdown(rows, poolHits, *lat, isolation)
	fmt.Print(md)
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "seeds.md"), []byte(md), 0o644)
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

// localProvider is the local provider as the server makes it by default
// (containers where the kernel lets it), overlay snapshots.
func localProvider(root string) (*local.Provider, string, error) {
	opts := local.Options{Root: root, Templates: map[string]string{"notes": "", "swe": ""}, Logger: osbench.Quiet()}
	p, err := local.New(opts)
	if errors.Is(err, local.ErrIsolationUnavailable) {
		opts.Isolation = local.IsolationNone
		p, err = local.New(opts)
		return p, "none (no user namespaces here)", err
	}
	return p, "container", err
}

func osProvider(lat time.Duration) (provider.Provider, func(), error) {
	srv := opensandboxtest.NewServer(opensandboxtest.Options{CreateLatency: lat, SnapshotLatency: lat})
	p, err := opensandbox.New(opensandbox.Options{Domain: srv.Domain, PollInterval: 5 * time.Millisecond,
		MaxConcurrentCreates: 256, ListLabels: map[string]string{owner.LabelOwner: "bench"}, Logger: osbench.Quiet()})
	if err != nil {
		srv.Close()
		return nil, nil, err
	}
	return p, srv.Close, nil
}

func open(ctx context.Context, prov provider.Provider, dir string, pool owner.PoolConfig) (*owner.Owner, error) {
	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	return owner.New(ctx, owner.Config{Name: "bench", Provider: prov, Logger: osbench.Quiet(), DefaultTTL: time.Hour, Pool: pool,
		Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: dir}})
}

func notesSetup(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
	return json.RawMessage(`{"seed_token":"t"}`), p.WriteFile(ctx, sb.Handle, ".seed_token", []byte("t"))
}

// sweSetup stands for a SWE-bench task's setup: a tree written (the
// checkout) and a second's wait (the clone and build the tree stands for).
func sweSetup(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
	data := json.RawMessage(`{"instance_id":"bench__task-1"}`)
	if !p.Capabilities().HostTools {
		// The fake OpenSandbox server runs no shell: the tree is written
		// file by file (its creates and captures are what take time there).
		for i := range 20 {
			if err := p.WriteFile(ctx, sb.Handle, fmt.Sprintf("repo/f%d.go", i), []byte("package p\n")); err != nil {
				return nil, err
			}
		}
		return data, nil
	}
	res, err := p.Exec(ctx, sb.Handle, provider.ExecRequest{
		Command: `mkdir -p repo && cd repo && i=0; while [ $i -lt 200 ]; do echo "package p // $i" > f$i.go; i=$((i+1)); done; sleep 1`,
		Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = fmt.Errorf("setup exited %d: %s", res.ExitCode, res.Stderr)
	}
	return data, err
}

// group seeds n sessions of one task at once on a fresh owner.
func group(ctx context.Context, prov provider.Provider, dir string, keyed bool, n int) (row, error) {
	o, err := open(ctx, prov, dir, owner.PoolConfig{})
	if err != nil {
		return row{}, err
	}
	defer o.Close()
	runtime.GC()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	seeded := make([]time.Duration, n)
	first := prov.Capabilities().HostTools
	t0 := time.Now()
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sid := fmt.Sprintf("s-%03d", i)
			var sb sandbox.Sandbox
			var err error
			if keyed {
				sb, err = o.StartKeyedSessionSandbox(ctx, sid, "bench__task-1", provider.Spec{Image: "swe"}, sweSetup, "")
			} else {
				sb, err = o.StartSessionSandbox(ctx, sid, provider.Spec{Image: "notes"}, notesSetup, "")
			}
			seeded[i] = time.Since(t0)
			if err == nil && first {
				// The agent's first tool call: the sandbox's init starts.
				var res provider.ExecResult
				res, err = prov.Exec(ctx, sb.Handle, provider.ExecRequest{Command: "true", Timeout: time.Minute})
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("the first command exited %d: %s", res.ExitCode, res.Stderr)
				}
			}
			errs <- err
		}()
	}
	wg.Wait()
	took := time.Since(t0)
	close(errs)
	for err := range errs {
		if err != nil {
			return row{}, err
		}
	}
	setups := o.TemplateSetups()
	if !keyed {
		setups = int64(n) // each seed its own
	}
	r := row{n: n, group: slices.Max(seeded), setups: setups}
	if first {
		r.first = took
	}
	return r, nil
}

// poolHit measures keyed seeds that claim a fork their template's warm
// pool started: the pool is full before each.
func poolHit(ctx context.Context, prov provider.Provider, dir string, hits int) ([]time.Duration, error) {
	o, err := open(ctx, prov, dir, owner.PoolConfig{Size: 2, RefillConcurrency: 2})
	if err != nil {
		return nil, err
	}
	defer o.Close()
	seed := func(i int) (time.Duration, error) {
		t0 := time.Now()
		_, err := o.StartKeyedSessionSandbox(ctx, fmt.Sprintf("p-%03d", i), "bench__task-1", provider.Spec{Image: "swe"}, sweSetup, "")
		return time.Since(t0), err
	}
	if _, err := seed(0); err != nil {
		return nil, err
	}
	var out []time.Duration
	for i := 1; i <= hits; i++ {
		// The bench waits for the refill the claim began (no test here:
		// a poll is fine).
		for o.PoolStats().Ready < 2 {
			time.Sleep(time.Millisecond)
		}
		before := o.PoolStats().Hits
		d, err := seed(i)
		if err != nil {
			return nil, err
		}
		if o.PoolStats().Hits != before+1 {
			return nil, fmt.Errorf("seed %d missed the pool", i)
		}
		out = append(out, d)
	}
	return out, nil
}

func markdown(rows []row, hits []time.Duration, lat time.Duration, isolation string) string {
	var b strings.Builder
	b.WriteString("# A group of seeds of one task, and a warm pool's hit\n\n")
	fmt.Fprintf(&b, "`go run ./bench/seeds` on %s, %d CPUs, %s. Local provider: isolation %s, overlay snapshots. "+
		"OpenSandbox: its fake server in process, L = %v per create and per capture. "+
		"\"one\" is one seed alone on a fresh owner; a group is N seeds of the same task at once on a fresh owner; "+
		"notes has no template (each seed starts a sandbox and runs its setup), keyed runs its setup once into a template "+
		"that every seed forks. Goal: a group of 64 within 2× one seed. A seeded sandbox has run no command: on the local "+
		"provider its init starts at its first, which the last two columns add (every seed's sandbox ran `true`).\n\n",
		runtime.GOOS+"/"+runtime.GOARCH, runtime.NumCPU(), time.Now().UTC().Format("2006-01-02"), isolation, lat)
	b.WriteString("| kind | N | group | one | N × one | group / one | setups | group, first command run | / one's |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		firstCols := "— | —"
		if r.first > 0 && r.oneFirst > 0 {
			firstCols = fmt.Sprintf("%v | %.2f×", r.first.Round(time.Millisecond), ratio(r.first, r.oneFirst))
		}
		fmt.Fprintf(&b, "| %s | %d | %v | %v | %v | %.2f× | %d | %s |\n", r.kind, r.n, r.group.Round(time.Millisecond),
			r.one.Round(time.Millisecond), (time.Duration(r.n) * r.one).Round(time.Millisecond), ratio(r.group, r.one), r.setups, firstCols)
	}
	if len(hits) > 0 {
		s := slices.Clone(hits)
		slices.Sort(s)
		fmt.Fprintf(&b, "\nA keyed seed that claims a fork its template's warm pool started (local provider, %d hits): median %v, max %v (goal ≤ 5 ms).\n",
			len(s), s[len(s)/2].Round(10*time.Microsecond), s[len(s)-1].Round(10*time.Microsecond))
	}
	if la, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Fprintf(&b, "\nLoad average (1, 5, 15 min) when the run ended: %s.\n", strings.Join(strings.Fields(string(la))[:3], ", "))
	}
	return b.String()
}
