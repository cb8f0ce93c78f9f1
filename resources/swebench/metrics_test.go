package swebench_test

import (
	"context"
	"math"
	"net"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttputil"

	"github.com/sandboxowner/owner/app"
	"github.com/sandboxowner/owner/resources/swebench"
)

// TestGradingIsInTheMetrics: a verify that grades is one observation of
// sandboxowner_grading_duration_seconds, the grading's own time.
func TestGradingIsInTheMetrics(t *testing.T) {
	t.Parallel()
	tr := swebench.NewTaskRepo(t)
	cfg := baseConfig(t, tr)
	cfg.SWEBench.IsVerifyingGoldenPatch = true
	reg := prometheus.NewRegistry()
	ln := fasthttputil.NewInmemoryListener()
	a, err := app.Start(context.Background(), cfg, app.Deps{Listener: ln, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop(context.Background()) })
	s := &server{t: t, a: a, cl: &fasthttp.Client{Dial: func(string) (net.Conn, error) { return ln.Dial() }}}
	if status, _, _ := s.post("/seed_session", tr.MultilingualRow); status != 200 {
		t.Fatalf("seed: %d", status)
	}
	status, res, _ := s.post("/verify", tr.MultilingualRow)
	if status != 200 || res["reward"] != 1.0 {
		t.Fatalf("verify: %d %v", status, res)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// The verify is counted for the swebench server: rewarded and resolved.
	want := map[string]float64{"sandboxowner_verifies_total/rewarded": 1, "sandboxowner_rewards_total/": 1, "sandboxowner_resolved_total/": 1}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["resources"] == "swebench" {
				got[f.GetName()+"/"+labels["outcome"]] = m.GetCounter().GetValue()
			}
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %v, want %v (all: %v)", k, got[k], v, got)
		}
	}
	waiting := false
	for _, f := range fams {
		if f.GetName() == "sandboxowner_gradings_waiting" {
			waiting = true
			if v := f.GetMetric()[0].GetGauge().GetValue(); v != 0 {
				t.Errorf("gradings waiting after the only verify: %v", v)
			}
		}
	}
	if !waiting {
		t.Error("no sandboxowner_gradings_waiting family")
	}
	for _, f := range fams {
		if f.GetName() != "sandboxowner_grading_duration_seconds" {
			continue
		}
		h := f.GetMetric()[0].GetHistogram()
		took := res["patch_verification_time_taken"].(float64)
		if h.GetSampleCount() != 1 || math.Abs(h.GetSampleSum()-took) > 1e-6 {
			t.Errorf("grading histogram: %d gradings summing %v s, want 1 of %v s", h.GetSampleCount(), h.GetSampleSum(), took)
		}
		return
	}
	t.Error("no sandboxowner_grading_duration_seconds family")
}
