package metrics_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

func newMetrics(t *testing.T) (*metrics.Metrics, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	return m, reg
}

// opener is a fake that streams files and checks they are regular.
type opener struct{ *fake.Provider }

func (o opener) Capabilities() provider.Capabilities {
	c := o.Provider.Capabilities()
	c.FileOpener, c.RegularFiles, c.HostTools = o, true, true
	return c
}

func (o opener) OpenFile(ctx context.Context, h provider.Handle, path string) (io.ReadCloser, int64, error) {
	b, err := o.ReadFile(ctx, h, path)
	return io.NopCloser(strings.NewReader(string(b))), int64(len(b)), err
}

// TestProviderWrapperKeepsCapabilities: the wrapper has exactly the wrapped
// provider's capabilities, and a streamed read through it is counted as a
// read.
func TestProviderWrapperKeepsCapabilities(t *testing.T) {
	m, reg := newMetrics(t)
	for name, p := range map[string]provider.Provider{
		"fake":                   fake.New(fake.Options{}),
		"fake without snapshots": fake.NewWithoutSnapshots(fake.Options{}),
		"opener":                 opener{fake.New(fake.Options{})},
	} {
		if d := cmp.Diff(p.Capabilities().Flags(), m.Provider(p).Capabilities().Flags()); d != "" {
			t.Errorf("%s: wrapped capabilities (-want +got):\n%s", name, d)
		}
	}
	ctx := context.Background()
	o := opener{fake.New(fake.Options{Name: "opener"})}
	h, err := o.Start(ctx, provider.Spec{Files: map[string]string{"f": "x"}})
	if err != nil {
		t.Fatal(err)
	}
	if b, err := provider.ReadFileAtMost(ctx, m.Provider(o), h, "f", 10); err != nil || string(b) != "x" {
		t.Fatalf("streamed read: %q, %v", b, err)
	}
	if got := value(t, reg, "sandboxowner_provider_calls_total", map[string]string{"provider": "opener", "op": metrics.OpReadFile, "outcome": metrics.OutcomeOK}); got != 1 {
		t.Errorf("streamed reads counted: %v, want 1", got)
	}
	var none *metrics.Metrics
	p := fake.New(fake.Options{})
	if none.Provider(p) != provider.Provider(p) {
		t.Errorf("a nil Metrics wraps the provider")
	}
}

// TestProviderCallsCounted: each call is counted by op and outcome.
func TestProviderCallsCounted(t *testing.T) {
	m, reg := newMetrics(t)
	fk := fake.New(fake.Options{})
	p := m.Provider(fk)
	ctx := context.Background()
	h, err := p.Start(ctx, provider.Spec{Image: "img"})
	if err != nil {
		t.Fatal(err)
	}
	fk.FailNext(fake.OpExec, 1)
	if _, err := p.Exec(ctx, h, provider.ExecRequest{Command: "true"}); err == nil {
		t.Fatal("the injected exec failure did not fail")
	}
	if _, err := p.Capabilities().Snapshotter.Snapshot(ctx, h, "s"); err != nil {
		t.Fatal(err)
	}
	// A client's mistakes are refusals, not provider failures.
	if _, err := p.ReadFile(ctx, h, "../../etc/passwd"); !errors.Is(err, provider.ErrPathEscape) {
		t.Fatalf("read outside the sandbox: %v", err)
	}
	if _, err := p.ReadFile(ctx, h, "missing"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("read of a missing file: %v", err)
	}
	fk.FailNext(fake.OpReadFile, 1)
	if _, err := p.ReadFile(ctx, h, "missing"); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the injected read failure: %v", err)
	}
	if err := p.Stop(ctx, h); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		op, outcome string
		want        float64
	}{
		{metrics.OpStart, metrics.OutcomeOK, 1},
		{metrics.OpExec, metrics.OutcomeFailed, 1},
		{metrics.OpExec, metrics.OutcomeOK, 0},
		{metrics.OpSnapshot, metrics.OutcomeOK, 1},
		{metrics.OpStop, metrics.OutcomeOK, 1},
		{metrics.OpReadFile, metrics.OutcomeRefused, 2},
		{metrics.OpReadFile, metrics.OutcomeFailed, 1},
	} {
		if got := value(t, reg, "sandboxowner_provider_calls_total", map[string]string{"provider": "fake", "op": c.op, "outcome": c.outcome}); got != c.want {
			t.Errorf("%s %s: %v, want %v", c.op, c.outcome, got, c.want)
		}
	}
}

// value is a counter's value (0 when the series does not exist).
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	return series(t, reg, name, labels).GetCounter().GetValue()
}

// series is the first series of name whose labels are all in labels (nil
// when there is none; its getters then read 0).
func series(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if labels[l.GetName()] != l.GetValue() {
					continue next
				}
			}
			return m
		}
	}
	return nil
}

// TestBuildInfo: sandboxowner_build_info is 1 from the start, with the Go
// version the binary was built with.
func TestBuildInfo(t *testing.T) {
	_, reg := newMetrics(t)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range fams {
		if f.GetName() != "sandboxowner_build_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if m.GetGauge().GetValue() != 1 || labels["revision"] == "" || labels["version"] == "" || labels["modified"] == "" {
				t.Errorf("build_info %v = %v", labels, m.GetGauge().GetValue())
			}
			got = append(got, labels["go_version"])
		}
	}
	if len(got) != 1 || got[0] != runtime.Version() {
		t.Errorf("build_info series with go_version %v, want one with %s", got, runtime.Version())
	}
}

// TestCountersExistAtZeroFromTheStart: before anything happened, the
// seed, checkpoint and provider counters have their series at 0, so that a
// rate or an alert reads 0, not nothing.
func TestCountersExistAtZeroFromTheStart(t *testing.T) {
	m, reg := newMetrics(t)
	m.Provider(fake.New(fake.Options{}))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series := map[string]int{}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), "sandboxowner_") {
			continue // Go's and the process's own
		}
		for _, s := range f.GetMetric() {
			if s.GetCounter().GetValue() != 0 {
				t.Errorf("%s %v = %v before anything happened", f.GetName(), s.GetLabel(), s.GetCounter().GetValue())
			}
			series[f.GetName()]++
		}
	}
	for name, want := range map[string]int{
		"sandboxowner_seeds_total":                 3,      // ok, refused, failed
		"sandboxowner_checkpoint_operations_total": 5 * 3,  // prepare, commit, restore, release, retire
		"sandboxowner_provider_calls_total":        12 * 3, // every op of the one provider
	} {
		if series[name] != want {
			t.Errorf("%s: %d series at start, want %d", name, series[name], want)
		}
	}
	if value(t, reg, "sandboxowner_provider_calls_total", map[string]string{"provider": "fake", "op": metrics.OpReadFile, "outcome": metrics.OutcomeRefused}) != 0 {
		t.Error("a series at start is not 0")
	}
}

// histCount is a histogram series' sample count and sum.
func histCount(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) (uint64, float64) {
	t.Helper()
	h := series(t, reg, name, labels).GetHistogram()
	return h.GetSampleCount(), h.GetSampleSum()
}

// families are the names of reg's families.
func families(t *testing.T, reg *prometheus.Registry) map[string]int {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, f := range fams {
		out[f.GetName()] = len(f.GetMetric())
	}
	return out
}

// TestVerifiesCountedPerResourcesServer: rewards and resolutions per
// resources server: a masked verify counts only as masked, the others add
// their reward, and resolved ones are counted; every series is there at
// zero once the server's kind is known, and not before.
func TestVerifiesCountedPerResourcesServer(t *testing.T) {
	m, reg := newMetrics(t)
	if n := families(t, reg)["sandboxowner_verifies_total"]; n != 0 {
		t.Fatalf("verifies_total before ObserveVerifies: %d series", n)
	}
	if err := m.ObserveVerifies("swebench"); err != nil {
		t.Fatal(err)
	}
	got := families(t, reg)
	for name, want := range map[string]int{"sandboxowner_verifies_total": 3, "sandboxowner_rewards_total": 1, "sandboxowner_resolved_total": 1} {
		if got[name] != want {
			t.Errorf("%s: %d series at start, want %d", name, got[name], want)
		}
	}
	m.Verified("swebench", 1, true, false)
	m.Verified("swebench", 1, false, false) // a full reward the grader did not call resolved
	m.Verified("swebench", 0.5, false, false)
	m.Verified("swebench", 0, false, false)
	m.Verified("swebench", 1, true, true) // masked: says nothing of the model
	for _, c := range []struct {
		name    string
		outcome string
		want    float64
	}{
		{"sandboxowner_verifies_total", metrics.VerifyRewarded, 3},
		{"sandboxowner_verifies_total", metrics.VerifyUnrewarded, 1},
		{"sandboxowner_verifies_total", metrics.VerifyMasked, 1},
		{"sandboxowner_rewards_total", "", 2.5},
		{"sandboxowner_resolved_total", "", 1},
	} {
		labels := map[string]string{"resources": "swebench"}
		if c.outcome != "" {
			labels["outcome"] = c.outcome
		}
		if v := value(t, reg, c.name, labels); v != c.want {
			t.Errorf("%s %v = %v, want %v", c.name, labels, v, c.want)
		}
	}
}

// TestEnvironmentsAndValidationsCounted: a grading server's environment and
// validation families exist at zero from ObserveGradings, count by outcome
// and time each; a server that grades nothing exports none of them.
func TestEnvironmentsAndValidationsCounted(t *testing.T) {
	m, reg := newMetrics(t)
	for _, name := range []string{"sandboxowner_environments_total", "sandboxowner_validations_total", "sandboxowner_environment_duration_seconds", "sandboxowner_validation_duration_seconds"} {
		if _, ok := families(t, reg)[name]; ok {
			t.Errorf("%s exported by a server that grades nothing", name)
		}
	}
	if err := m.ObserveGradings(); err != nil {
		t.Fatal(err)
	}
	got := families(t, reg)
	if got["sandboxowner_environments_total"] != 3 || got["sandboxowner_validations_total"] != 3 {
		t.Errorf("series at start: environments %d, validations %d, want 3 each", got["sandboxowner_environments_total"], got["sandboxowner_validations_total"])
	}
	m.Environment(metrics.EnvironmentOK, 2*time.Second)
	m.Environment(metrics.EnvironmentFailed, time.Second)
	m.Validation(metrics.ValidationOK, 150*time.Second)
	m.Validation(metrics.ValidationOK, 30*time.Second)
	m.Validation(metrics.PreparationError, time.Second)
	for _, c := range []struct {
		name, outcome string
		want          float64
	}{
		{"sandboxowner_environments_total", metrics.EnvironmentOK, 1},
		{"sandboxowner_environments_total", metrics.EnvironmentFailed, 1},
		{"sandboxowner_environments_total", metrics.PreparationError, 0},
		{"sandboxowner_validations_total", metrics.ValidationOK, 2},
		{"sandboxowner_validations_total", metrics.ValidationRefused, 0},
		{"sandboxowner_validations_total", metrics.PreparationError, 1},
	} {
		if v := value(t, reg, c.name, map[string]string{"outcome": c.outcome}); v != c.want {
			t.Errorf("%s{outcome=%s} = %v, want %v", c.name, c.outcome, v, c.want)
		}
	}
	if n, sum := histCount(t, reg, "sandboxowner_validation_duration_seconds", map[string]string{"outcome": metrics.ValidationOK}); n != 2 || sum != 180 {
		t.Errorf("validation durations: %d summing %v s, want 2 summing 180", n, sum)
	}
	if n, sum := histCount(t, reg, "sandboxowner_environment_duration_seconds", map[string]string{"outcome": metrics.EnvironmentOK}); n != 1 || sum != 2 {
		t.Errorf("environment durations: %d summing %v s, want 1 summing 2", n, sum)
	}
}

// gaugeValue is a gauge's value (NaN when the family is absent).
func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return math.NaN()
}

// TestGaugesSayWhenTheirSourceFails: an index that cannot be read is -1
// snapshots and -1 pending deletes (visibly not a count), a provider whose
// backend does not answer is down; readable ones read as they are.
func TestGaugesSayWhenTheirSourceFails(t *testing.T) {
	for _, c := range []struct {
		err                      error
		snapshots, pending, upIs float64
	}{
		{nil, 4, 2, 1},
		{errors.New("unreadable"), -1, -1, 0},
	} {
		m, reg := newMetrics(t)
		err := m.Observe(metrics.Sources{
			Snapshots:      func() (int, error) { return 4, c.err },
			PendingDeletes: func() (int, error) { return 2, c.err },
			ProviderDown:   func() error { return c.err },
		})
		if err != nil {
			t.Fatal(err)
		}
		got := []float64{gaugeValue(t, reg, "sandboxowner_snapshots"), gaugeValue(t, reg, "sandboxowner_snapshot_deletes_pending"), gaugeValue(t, reg, "sandboxowner_provider_up")}
		if want := []float64{c.snapshots, c.pending, c.upIs}; !slices.Equal(got, want) {
			t.Errorf("source error %v: snapshots, pending, up = %v, want %v", c.err, got, want)
		}
	}
}

// TestRecordersOfANilMetricsRecordNothing: a server without metrics calls
// the same recorders on a nil *Metrics.
func TestRecordersOfANilMetricsRecordNothing(t *testing.T) {
	var m *metrics.Metrics
	m.Seed(metrics.OutcomeOK)
	m.HTTPRequest("/health", "200", time.Millisecond)
	m.CheckpointOp("commit", metrics.OutcomeOK, time.Millisecond)
	m.ProviderCall("fake", metrics.OpExec, metrics.OutcomeOK, time.Millisecond)
	m.Grading(time.Second)
	m.SnapshotPause(time.Millisecond)
	m.Environment(metrics.EnvironmentOK, time.Second)
	m.Validation(metrics.ValidationOK, time.Second)
	m.Verified("notes", 1, true, false)
	if m.ObserveGradings() != nil || m.ObserveVerifies("notes") != nil || m.Observe(metrics.Sources{}) != nil || m.Registry() != nil {
		t.Error("a nil Metrics registered something")
	}
}

// TestGradingsAreTimed: each grading is one observation of its duration.
func TestGradingsAreTimed(t *testing.T) {
	m, reg := newMetrics(t)
	if err := m.ObserveGradings(); err != nil {
		t.Fatal(err)
	}
	m.Grading(3 * time.Second)
	m.Grading(time.Second)
	if n, sum := histCount(t, reg, "sandboxowner_grading_duration_seconds", nil); n != 2 || sum != 4 {
		t.Errorf("gradings: %d summing %v s, want 2 summing 4", n, sum)
	}
}

// TestSnapshotPausesAreObserved: each snapshot's pause is one observation,
// in seconds, in the bucket it falls in: a commit's pauses are the
// histogram's growth over it.
func TestSnapshotPausesAreObserved(t *testing.T) {
	m, reg := newMetrics(t)
	m.SnapshotPause(2 * time.Millisecond)
	m.SnapshotPause(500 * time.Millisecond)
	if n, sum := histCount(t, reg, "sandboxowner_snapshot_pause_seconds", nil); n != 2 || sum != 0.502 {
		t.Errorf("pauses: %d summing %v s, want 2 summing 0.502", n, sum)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	under := map[float64]uint64{}
	for _, f := range fams {
		if f.GetName() == "sandboxowner_snapshot_pause_seconds" {
			for _, b := range f.GetMetric()[0].GetHistogram().GetBucket() {
				under[b.GetUpperBound()] = b.GetCumulativeCount()
			}
		}
	}
	if under[0.001] != 0 || under[0.002] != 1 || under[0.256] != 1 || under[0.512] != 2 {
		t.Errorf("cumulative counts by upper bound: %v", under)
	}
}
