package metrics_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandboxowner/owner/metrics"
)

// everyFamily is every sandboxowner_ family a server can register, each
// with a series: New, the optional families (gradings, verifies) and every
// state source, one event of each recorder.
func everyFamily(t *testing.T) []string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveGradings(); err != nil {
		t.Fatal(err)
	}
	if err := m.ObserveVerifies("notes"); err != nil {
		t.Fatal(err)
	}
	one := func() int { return 1 }
	err = m.Observe(metrics.Sources{
		Sessions:         func() metrics.SessionCounts { return metrics.SessionCounts{} },
		Snapshots:        func() (int, error) { return 1, nil },
		AdmissionWaiting: one,
		GradingsWaiting:  one,
		PendingDeletes:   func() (int, error) { return 1, nil },
		ProviderDown:     func() error { return nil },
		CheckpointDrops:  func() map[string]uint64 { return map[string]uint64{"release": 1} },
		UnreadableDirs:   func() map[string]uint64 { return map[string]uint64{"io_error": 1} },
		Preparing:        func() map[string]int { return map[string]int{"template": 1} },
		Sweep: func() metrics.SweepCounts {
			one := map[string]uint64{"sandbox": 1}
			return metrics.SweepCounts{Runs: map[string]uint64{"ok": 1}, Removed: one, Failed: one, Found: map[string]int{"sandbox": 1}, LastRunSeconds: 1}
		},
		Pool: func() metrics.PoolCounts { return metrics.PoolCounts{Hits: 1} },
	})
	if err != nil {
		t.Fatal(err)
	}
	m.HTTPRequest("/health", "200", time.Millisecond)
	m.CheckpointOp("commit", metrics.OutcomeOK, time.Millisecond)
	m.ProviderCall("fake", metrics.OpExec, metrics.OutcomeOK, time.Millisecond)
	m.Grading(time.Second)
	m.Environment(metrics.EnvironmentOK, time.Second)
	m.Validation(metrics.ValidationOK, time.Second)
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range fams {
		if strings.HasPrefix(f.GetName(), metrics.Namespace+"_") {
			names = append(names, f.GetName())
		}
	}
	return names
}

var familyName = regexp.MustCompile(`\bsandboxowner_[a-z_]+`)

// TestDashboardNamesRegisteredMetrics: every metric the Grafana dashboard
// in docs/ queries is one the server registers (a histogram by its
// _bucket, _sum or _count series), and it queries something of every
// family but Go's and the process's.
func TestDashboardNamesRegisteredMetrics(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("docs/grafana-dashboard.json: %v", err)
	}
	var exprs []string
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "expr" || k == "query") {
					exprs = append(exprs, s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(dash)
	registered := everyFamily(t)
	used := map[string]bool{}
	for _, e := range exprs {
		for _, name := range familyName.FindAllString(e, -1) {
			base := name
			if !slices.Contains(registered, name) {
				for _, suffix := range []string{"_bucket", "_sum", "_count"} {
					if b, ok := strings.CutSuffix(name, suffix); ok && slices.Contains(registered, b) {
						base = b
					}
				}
			}
			if !slices.Contains(registered, base) {
				t.Errorf("the dashboard queries %s, which no server registers: %s", name, e)
			}
			used[base] = true
		}
	}
	if len(exprs) == 0 {
		t.Fatal("the dashboard has no queries")
	}
	for _, name := range registered {
		if !used[name] {
			t.Errorf("the dashboard shows nothing of %s", name)
		}
	}
}

// TestMetricsReferenceListsEveryFamily: docs/metrics.md's table names
// exactly the families the server registers.
func TestMetricsReferenceListsEveryFamily(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "docs", "metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, line := range strings.Split(string(raw), "\n") {
		if name, ok := strings.CutPrefix(line, "| `sandboxowner_"); ok {
			name, _, _ = strings.Cut(name, "`")
			documented = append(documented, "sandboxowner_"+name)
		}
	}
	registered := everyFamily(t)
	slices.Sort(documented)
	slices.Sort(registered)
	if diff := cmp.Diff(registered, documented); diff != "" {
		t.Errorf("docs/metrics.md's families (-registered +documented):\n%s", diff)
	}
}
