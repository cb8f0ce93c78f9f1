package harness

import (
	"os"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/valyala/fasthttp"
)

// TestParseProcStatCPU: utime and stime are fields 14 and 15, counted after
// the command name's last parenthesis (a name may hold spaces and
// parentheses), in ticks of 10 ms.
func TestParseProcStatCPU(t *testing.T) {
	line := "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 9 0 100 1000 100\n"
	got, err := parseProcStatCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 3250 * time.Millisecond; got != want {
		t.Fatalf("cpu %v, want %v (250 + 75 ticks)", got, want)
	}
	for _, bad := range []string{"4242 no name 1 2", "4242 (x) S 1 2 3", "4242 (x) S 1 2 3 4 5 6 7 8 9 10 x 0"} {
		if _, err := parseProcStatCPU([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestLoadMeasuresCPU: a load run reads the CPU time the server's process
// and its own used in the window. The kernel counts CPU time in ticks
// (10 ms here), and a loaded machine may give the process less than one in
// a short window: the window doubles until the counts move, up to a
// bound that only a run that measures nothing reaches.
func TestLoadMeasuresCPU(t *testing.T) {
	bare, err := startBare(map[string]reply{stepAccess.path(): {status: 200, contentType: "application/json", body: []byte(`{"ok":true}`)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bare.Close() })
	sc := scenario{loop: []step{stepAccess}}
	for window := 400 * time.Millisecond; ; window *= 2 {
		res, err := runLoad(bare.Addr, sc, 4, 50*time.Millisecond, window, os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		if res.Iterations > 0 && res.ServerCPU > 0 && res.ClientCPU > 0 {
			return
		}
		if window >= 25*time.Second {
			t.Fatalf("iterations %d, server CPU %v, client CPU %v in %v: want all measured", res.Iterations, res.ServerCPU, res.ClientCPU, window)
		}
	}
}

// TestCPURatio: bare's CPU per iteration (server and load generator, mean
// of its two runs) over the owner's; 0 when a figure is missing.
func TestCPURatio(t *testing.T) {
	run := func(iters int64, server, client time.Duration) LoadResult {
		return LoadResult{Iterations: iters, Window: time.Second, ServerCPU: server, ClientCPU: client}
	}
	r := HTTPRow{
		Bare:      run(1000, 20*time.Millisecond, 20*time.Millisecond), // 40 µs an iteration
		BareAfter: run(1000, 30*time.Millisecond, 30*time.Millisecond), // 60 µs
		Server:    run(500, 40*time.Millisecond, 10*time.Millisecond),  // 100 µs
	}
	got := []float64{r.CPURatio()}
	r.BareAfter = LoadResult{}
	got = append(got, r.CPURatio())
	r.Server.ServerCPU = 0
	got = append(got, r.CPURatio())
	if d := cmp.Diff([]float64{0.5, 0.4, 0}, got); d != "" {
		t.Fatalf("CPU ratios (-want +got):\n%s", d)
	}
}

// TestASlowRouteStillGetsMeasured: when no request begun in the window has
// come back by its planned end (a loaded machine, a slow route), the
// window stretches to the first that does, instead of the cell counting
// nothing and failing; the rate is over the window it really had. Every
// request here takes longer than the whole planned window, so without the
// stretch nothing ever counts.
func TestASlowRouteStillGetsMeasured(t *testing.T) {
	const warmup, duration, slow = 10 * time.Millisecond, 50 * time.Millisecond, 200 * time.Millisecond
	srv, err := serve(func(ctx *fasthttp.RequestCtx) {
		time.Sleep(slow) // the route's own slowness, not a synchronisation
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"ok":true}`)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	res, err := runLoad(srv.Addr, scenario{loop: []step{stepAccess}}, 4, warmup, duration, os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if res.Iterations < 1 || res.Errors != 0 {
		t.Fatalf("%d iterations, %d errors (%s): want the first answers counted", res.Iterations, res.Errors, res.FirstError)
	}
	if res.Window < slow {
		t.Errorf("window %v: want it stretched to the first answer, at least %v", res.Window, slow)
	}
}
