// Package metrics is the server's Prometheus instrumentation: every family
// lives in one Metrics value on a registry of its own (never the default
// global one), which GET /metrics serves. Counters and histograms are
// recorded by the code that sees the event (the HTTP layer, a provider
// wrapper, the SWE-bench grader); gauges of state are read at scrape time
// from the functions given to Observe, so that they cannot drift from what
// they report.
package metrics

import (
	"errors"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every family.
const Namespace = "sandboxowner"

// Outcomes of a counted operation.
const (
	OutcomeOK = "ok"
	// OutcomeRefused: the request was refused (a 4xx: bad input, a
	// refusal by the protocol).
	OutcomeRefused = "refused"
	// OutcomeFailed: the server or a provider failed (a 5xx, an error).
	OutcomeFailed = "failed"
)

// Session states of the sessions gauge.
const (
	StateLive    = "live"
	StateInSetup = "in_setup"
	StateLost    = "lost"
)

// Metrics holds every family. The zero of *Metrics (nil) records nothing,
// so callers need no nil checks.
type Metrics struct {
	reg *prometheus.Registry

	seeds            *prometheus.CounterVec
	httpRequests     *prometheus.CounterVec
	httpDuration     *prometheus.HistogramVec
	checkpointOps    *prometheus.CounterVec
	checkpointDur    *prometheus.HistogramVec
	providerCalls    *prometheus.CounterVec
	providerDuration *prometheus.HistogramVec
	snapshotPause    prometheus.Histogram
	gradingDuration  prometheus.Histogram
	environments     *prometheus.CounterVec
	environmentDur   *prometheus.HistogramVec
	validations      *prometheus.CounterVec
	validationDur    *prometheus.HistogramVec
	verifies         *prometheus.CounterVec
	rewards          *prometheus.CounterVec
	resolved         *prometheus.CounterVec
}

// latencyBuckets span a fast request (100 µs) to a long commit or grading
// (about 30 min).
func latencyBuckets() []float64 { return prometheus.ExponentialBuckets(0.0001, 2.5, 18) }

// pauseBuckets span a pause no agent notices (250 µs) to one it does
// (about 8 s, a copy-mode snapshot of a large tree).
func pauseBuckets() []float64 { return prometheus.ExponentialBuckets(0.00025, 2, 16) }

// New registers every family, and the Go and process collectors, on reg.
func New(reg *prometheus.Registry) (*Metrics, error) {
	m := &Metrics{
		reg: reg,
		seeds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "seeds_total",
			Help: "Seeds answered, by outcome (ok, refused: a 4xx, failed: a 5xx).",
		}, []string{"outcome"}),
		httpRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "http_requests_total",
			Help: "HTTP requests answered, by route (the rollout prefix removed) and status code.",
		}, []string{"route", "code"}),
		httpDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route and status code.",
			Buckets: latencyBuckets(),
		}, []string{"route", "code"}),
		checkpointOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "checkpoint_operations_total",
			Help: "Checkpoint control operations, by op (prepare, commit, restore, release, retire) and outcome.",
		}, []string{"op", "outcome"}),
		checkpointDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "checkpoint_operation_duration_seconds",
			Help:    "Duration of checkpoint control operations, by op and outcome.",
			Buckets: latencyBuckets(),
		}, []string{"op", "outcome"}),
		providerCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "provider_calls_total",
			Help: "Sandbox provider calls, by provider, op and outcome (ok; refused: the caller's request was wrong; failed: the provider's failure).",
		}, []string{"provider", "op", "outcome"}),
		providerDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "provider_call_duration_seconds",
			Help:    "Duration of sandbox provider calls, by provider, op and outcome.",
			Buckets: latencyBuckets(),
		}, []string{"provider", "op", "outcome"}),
		snapshotPause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "snapshot_pause_seconds",
			Help:    "How long each snapshot held its sandbox paused (new commands and file calls waiting, running ones stopped), local provider: over one commit, that commit's distribution of pauses.",
			Buckets: pauseBuckets(),
		}),
		gradingDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "grading_duration_seconds",
			Help:    "SWE-bench gradings: from the patch taken to the grading sandbox stopped.",
			Buckets: latencyBuckets(),
		}),
		environments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "environments_total",
			Help: "SWE-bench environments this server built, by outcome (ok; failed: the environment step failed; error: it could not be built).",
		}, []string{"outcome"}),
		environmentDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "environment_duration_seconds",
			Help:    "Time to build a SWE-bench environment (its caches and its environment step), by outcome.",
			Buckets: latencyBuckets(),
		}, []string{"outcome"}),
		validations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "validations_total",
			Help: "SWE-bench validations this server ran, by outcome (available; unavailable: the instance is refused; error: it could not run).",
		}, []string{"outcome"}),
		validationDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: Namespace, Name: "validation_duration_seconds",
			Help:    "Time of a SWE-bench validation (the eval script without a patch), by outcome.",
			Buckets: latencyBuckets(),
		}, []string{"outcome"}),
		verifies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "verifies_total",
			Help: "Verifies graded, by resources server and outcome (rewarded: reward above 0; unrewarded: reward 0; masked: mask_sample, left out of training).",
		}, []string{"resources", "outcome"}),
		rewards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "rewards_total",
			Help: "Sum of the rewards (those above 0) of the verifies not masked, by resources server: over verifies_total{outcome!=\"masked\"}, the mean reward.",
		}, []string{"resources"}),
		resolved: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: Namespace, Name: "resolved_total",
			Help: "Verifies that resolved their task, by resources server: the reply's resolved (SWE-bench), else a full reward (1).",
		}, []string{"resources"}),
	}
	err := errors.Join(
		reg.Register(collectors.NewGoCollector()),
		reg.Register(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})),
		reg.Register(m.seeds), reg.Register(m.httpRequests), reg.Register(m.httpDuration),
		reg.Register(m.checkpointOps), reg.Register(m.checkpointDur),
		reg.Register(m.providerCalls), reg.Register(m.providerDuration),
		reg.Register(m.snapshotPause),
		reg.Register(buildInfo()),
	)
	if err != nil {
		return nil, err
	}
	// The counters' series exist at zero from the start, so that a rate
	// or an alert on them reads 0 rather than nothing before the first
	// event.
	for _, o := range outcomes() {
		m.seeds.WithLabelValues(o)
		for _, op := range checkpointOpNames() {
			m.checkpointOps.WithLabelValues(op, o)
		}
	}
	return m, nil
}

// outcomes are the outcome label's values.
func outcomes() []string { return []string{OutcomeOK, OutcomeRefused, OutcomeFailed} }

// checkpointOpNames are the op label's values of the checkpoint families
// (the control operations package http counts).
func checkpointOpNames() []string {
	return []string{"prepare", "commit", "restore", "release", "retire"}
}

// Label values of the environment and validation families (those package
// swebench reports).
const (
	EnvironmentOK     = "ok"
	EnvironmentFailed = "failed"
	ValidationOK      = "available"
	ValidationRefused = "unavailable"
	// PreparationError: an environment or validation that could not run.
	PreparationError = "error"
)

// Outcomes of a graded verify.
const (
	VerifyRewarded   = "rewarded"
	VerifyUnrewarded = "unrewarded"
	VerifyMasked     = "masked"
)

// ObserveGradings registers the grading, environment and validation
// families, for a resources server that grades in sandboxes (SWE-bench): a
// server that does not exports none of them. Their series exist at zero
// from then on.
func (m *Metrics) ObserveGradings() error {
	if m == nil {
		return nil
	}
	err := errors.Join(m.reg.Register(m.gradingDuration),
		m.reg.Register(m.environments), m.reg.Register(m.environmentDur),
		m.reg.Register(m.validations), m.reg.Register(m.validationDur))
	for _, o := range []string{EnvironmentOK, EnvironmentFailed, PreparationError} {
		m.environments.WithLabelValues(o)
	}
	for _, o := range []string{ValidationOK, ValidationRefused, PreparationError} {
		m.validations.WithLabelValues(o)
	}
	return err
}

// ObserveVerifies registers the verify families for a server of the given
// resources kind (notes, swebench), its series at zero.
func (m *Metrics) ObserveVerifies(resources string) error {
	if m == nil {
		return nil
	}
	err := errors.Join(m.reg.Register(m.verifies), m.reg.Register(m.rewards), m.reg.Register(m.resolved))
	for _, o := range []string{VerifyRewarded, VerifyUnrewarded, VerifyMasked} {
		m.verifies.WithLabelValues(resources, o)
	}
	m.rewards.WithLabelValues(resources)
	m.resolved.WithLabelValues(resources)
	return err
}

// Verified counts a graded verify: masked ones count only as masked (their
// reward says nothing of the model); the others add their reward, and
// resolved ones are counted as such.
func (m *Metrics) Verified(resources string, reward float64, resolved, masked bool) {
	if m == nil {
		return
	}
	switch {
	case masked:
		m.verifies.WithLabelValues(resources, VerifyMasked).Inc()
		return
	case reward > 0:
		m.verifies.WithLabelValues(resources, VerifyRewarded).Inc()
		m.rewards.WithLabelValues(resources).Add(reward)
	default:
		m.verifies.WithLabelValues(resources, VerifyUnrewarded).Inc()
	}
	if resolved {
		m.resolved.WithLabelValues(resources).Inc()
	}
}

// Environment records a SWE-bench environment built (swebench.Observer).
func (m *Metrics) Environment(outcome string, d time.Duration) {
	if m != nil {
		m.environments.WithLabelValues(outcome).Inc()
		m.environmentDur.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

// Validation records a SWE-bench validation run (swebench.Observer).
func (m *Metrics) Validation(outcome string, d time.Duration) {
	if m != nil {
		m.validations.WithLabelValues(outcome).Inc()
		m.validationDur.WithLabelValues(outcome).Observe(d.Seconds())
	}
}

// buildInfo is sandboxowner_build_info: 1, labelled with the binary's
// module version, its VCS revision (and whether the tree was modified)
// and the Go version, so that a dashboard says which build it watches.
func buildInfo() prometheus.Collector {
	version, revision, modified := "(devel)", "unknown", "false"
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				revision = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
	}
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Namespace: Namespace, Name: "build_info",
		Help: "Always 1: the build, by module version, VCS revision, whether its tree was modified, and Go version.",
	}, []string{"version", "revision", "modified", "go_version"})
	g.WithLabelValues(version, revision, modified, runtime.Version()).Set(1)
	return g
}

// Registry is the registry the families are on (nil for a nil Metrics).
func (m *Metrics) Registry() *prometheus.Registry {
	if m == nil {
		return nil
	}
	return m.reg
}

// SessionCounts are the sessions by state.
type SessionCounts struct {
	Live, InSetup, Lost int
}

// Sources are the state gauges' readers; a nil one's gauge is not
// registered (a server that does not checkpoint has no admission queue).
type Sources struct {
	// Sessions: sandboxowner_sessions{state}.
	Sessions func() SessionCounts
	// Snapshots: sandboxowner_snapshots, the snapshots the index references.
	Snapshots func() (int, error)
	// AdmissionWaiting: sandboxowner_admission_waiting, requests held at a
	// closed admission gate.
	AdmissionWaiting func() int
	// GradingsWaiting: sandboxowner_gradings_waiting, verifies waiting for
	// a grading slot (SWE-bench).
	GradingsWaiting func() int
	// PendingDeletes: sandboxowner_snapshot_deletes_pending, snapshots
	// tombstoned whose deletes have not happened yet (in use by a live
	// fork, or failed).
	PendingDeletes func() (int, error)
	// ProviderDown: sandboxowner_provider_up, 1 while it returns nil (the
	// provider's backend answers), else 0.
	ProviderDown func() error
	// CheckpointDrops: sandboxowner_checkpoint_drops_total{reason},
	// checkpoints dropped from the index by a release (release) or because
	// their checkpoint_dir was gone (dir_gone).
	CheckpointDrops func() map[string]uint64
	// UnreadableDirs: sandboxowner_checkpoint_dirs_unreadable_total{reason},
	// lookups of a checkpoint_dir that could not tell whether it was there
	// (nothing of its checkpoint is deleted).
	UnreadableDirs func() map[string]uint64
	// Preparing: sandboxowner_environments_preparing{phase}, instances
	// whose template, environment or validation requests wait for
	// (SWE-bench).
	Preparing func() map[string]int
	// Sweep: the families of the server's own sweep,
	// sandboxowner_sweep_runs_total{outcome},
	// sandboxowner_sweep_removed_total{kind},
	// sandboxowner_sweep_failed_total{kind}, sandboxowner_sweep_found{kind}
	// and sandboxowner_sweep_last_run_timestamp_seconds.
	Sweep func() SweepCounts
	// Pool: the warm pools' families, sandboxowner_pool_hits_total,
	// sandboxowner_pool_misses_total, sandboxowner_pool_expired_total,
	// sandboxowner_pool_start_failures_total and
	// sandboxowner_pool_sandboxes{state}.
	Pool func() PoolCounts
}

// PoolCounts are the warm pools' figures.
type PoolCounts struct {
	Hits, Misses, Expired, StartFailures uint64
	Ready, Starting                      int
}

// Pool sandbox states of sandboxowner_pool_sandboxes.
const (
	PoolReady    = "ready"
	PoolStarting = "starting"
)

// SweepCounts are the server's sweep's figures (package sweep's kinds and
// outcomes).
type SweepCounts struct {
	Runs           map[string]uint64
	Removed        map[string]uint64
	Failed         map[string]uint64
	Found          map[string]int
	LastRunSeconds float64
}

// Observe registers the state gauges.
func (m *Metrics) Observe(src Sources) error {
	if m == nil {
		return nil
	}
	var errs []error
	if src.Sessions != nil {
		errs = append(errs, m.reg.Register(sessionsCollector{
			desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sessions"),
				"Sessions by state: live (holding a sandbox), in_setup (starting one), lost (their sandbox gone behind the owner's back).",
				[]string{"state"}, nil),
			read: src.Sessions,
		}))
	}
	gauge := func(name, help string, read func() float64) {
		errs = append(errs, m.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: name, Help: help}, read)))
	}
	if src.Snapshots != nil {
		gauge("snapshots", "Snapshots the checkpoint index references.", func() float64 {
			n, err := src.Snapshots()
			if err != nil {
				return -1 // unreadable index: visibly not a count
			}
			return float64(n)
		})
	}
	if src.AdmissionWaiting != nil {
		gauge("admission_waiting", "Requests waiting at the admission gate while a checkpoint is open.", func() float64 { return float64(src.AdmissionWaiting()) })
	}
	if src.PendingDeletes != nil {
		gauge("snapshot_deletes_pending", "Snapshots whose deletes are pending: in use by a live fork, or failed; a later release, restart or the sweep deletes them.", func() float64 {
			n, err := src.PendingDeletes()
			if err != nil {
				return -1
			}
			return float64(n)
		})
	}
	if src.ProviderDown != nil {
		gauge("provider_up", "1 while the sandbox provider's backend answers, 0 while it cannot be reached.", func() float64 {
			if src.ProviderDown() != nil {
				return 0
			}
			return 1
		})
	}
	if src.GradingsWaiting != nil {
		gauge("gradings_waiting", "SWE-bench verifies waiting for a grading slot.", func() float64 { return float64(src.GradingsWaiting()) })
	}
	labelled := func(name, label, help string, read func() map[string]uint64) {
		errs = append(errs, m.reg.Register(byLabel[uint64]{
			desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", name), help, []string{label}, nil),
			kind: prometheus.CounterValue,
			read: read,
		}))
	}
	counters := func(name, help string, read func() map[string]uint64) { labelled(name, "reason", help, read) }
	if src.CheckpointDrops != nil {
		counters("checkpoint_drops_total", "Checkpoints dropped from the index, by reason: release (a release did not keep them), dir_gone (their checkpoint_dir was gone for the grace).", src.CheckpointDrops)
	}
	if src.UnreadableDirs != nil {
		counters("checkpoint_dirs_unreadable_total", "Lookups of a checkpoint_dir that could not say whether it was there (an I/O or permission error, a stale handle, a missing, unreadable or changed parent), by reason; nothing of their checkpoints is deleted.", src.UnreadableDirs)
	}
	if src.Preparing != nil {
		errs = append(errs, m.reg.Register(byLabel[int]{
			kind: prometheus.GaugeValue,
			desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "environments_preparing"),
				"SWE-bench instances being prepared, by phase: template, environment, validation.",
				[]string{"phase"}, nil),
			read: src.Preparing,
		}))
	}
	if src.Sweep != nil {
		labelled("sweep_runs_total", "outcome", "Passes of the server's own sweep, by outcome: ok, error (nothing is removed of a kind whose reads failed).", func() map[string]uint64 { return src.Sweep().Runs })
		labelled("sweep_removed_total", "kind", "What the server's own sweep removed, by kind: sandbox and snapshot (nothing accounted for them for sweep.retention.orphans), pending_delete (a tombstoned snapshot's delete retried), template (a template's snapshot deleted once it went unused for sweep.retention.templates).", func() map[string]uint64 { return src.Sweep().Removed })
		labelled("sweep_failed_total", "kind", "Removals the server's own sweep tried that failed, by kind; the next pass retries.", func() map[string]uint64 { return src.Sweep().Failed })
		errs = append(errs, m.reg.Register(byLabel[int]{
			kind: prometheus.GaugeValue,
			desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "sweep_found"),
				"What the last pass of the server's own sweep found, by kind: sandboxes and snapshots nothing accounted for (due or not), pending deletes, templates dropped as unused.",
				[]string{"kind"}, nil),
			read: func() map[string]int { return src.Sweep().Found },
		}))
		gauge("sweep_last_run_timestamp_seconds", "When the last pass of the server's own sweep began, in Unix seconds (0: none yet).", func() float64 { return src.Sweep().LastRunSeconds })
	}
	if src.Pool != nil {
		counter := func(name, help string, read func(PoolCounts) uint64) {
			errs = append(errs, m.reg.Register(prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help},
				func() float64 { return float64(read(src.Pool())) })))
		}
		counter("pool_hits_total", "Seeds that claimed a sandbox a warm pool had started (sandbox.pool).", func(c PoolCounts) uint64 { return c.Hits })
		counter("pool_misses_total", "Seeds that found their warm pool empty and started (or forked) a sandbox themselves; 0 hits and misses: no pools.", func(c PoolCounts) uint64 { return c.Misses })
		counter("pool_expired_total", "Pooled sandboxes stopped unclaimed: after sandbox.pool.max_idle, or when their lease could not be renewed.", func(c PoolCounts) uint64 { return c.Expired })
		counter("pool_start_failures_total", "Starts of the warm pools that failed (the pool refills at its next claim).", func(c PoolCounts) uint64 { return c.StartFailures })
		errs = append(errs, m.reg.Register(byLabel[int]{
			kind: prometheus.GaugeValue,
			desc: prometheus.NewDesc(prometheus.BuildFQName(Namespace, "", "pool_sandboxes"),
				"Sandboxes of the warm pools, by state: ready (started, waiting for a seed to claim them), starting.",
				[]string{"state"}, nil),
			read: func() map[string]int {
				c := src.Pool()
				return map[string]int{PoolReady: c.Ready, PoolStarting: c.Starting}
			},
		}))
	}
	return errors.Join(errs...)
}

// byLabel exports numbers kept elsewhere, one series per value of its one
// label.
type byLabel[N int | uint64] struct {
	desc *prometheus.Desc
	kind prometheus.ValueType
	read func() map[string]N
}

func (c byLabel[N]) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c byLabel[N]) Collect(ch chan<- prometheus.Metric) {
	for label, n := range c.read() {
		ch <- prometheus.MustNewConstMetric(c.desc, c.kind, float64(n), label)
	}
}

type sessionsCollector struct {
	desc *prometheus.Desc
	read func() SessionCounts
}

func (c sessionsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c sessionsCollector) Collect(ch chan<- prometheus.Metric) {
	n := c.read()
	for _, s := range []struct {
		state string
		v     int
	}{{StateLive, n.Live}, {StateInSetup, n.InSetup}, {StateLost, n.Lost}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(s.v), s.state)
	}
}

// Seed counts a seed's outcome.
func (m *Metrics) Seed(outcome string) {
	if m != nil {
		m.seeds.WithLabelValues(outcome).Inc()
	}
}

// HTTPRequest records an answered request.
func (m *Metrics) HTTPRequest(route, code string, d time.Duration) {
	if m != nil {
		m.httpRequests.WithLabelValues(route, code).Inc()
		m.httpDuration.WithLabelValues(route, code).Observe(d.Seconds())
	}
}

// CheckpointOp records a control operation.
func (m *Metrics) CheckpointOp(op, outcome string, d time.Duration) {
	if m != nil {
		m.checkpointOps.WithLabelValues(op, outcome).Inc()
		m.checkpointDur.WithLabelValues(op, outcome).Observe(d.Seconds())
	}
}

// ProviderCall records a provider call.
func (m *Metrics) ProviderCall(provider, op, outcome string, d time.Duration) {
	if m != nil {
		m.providerCalls.WithLabelValues(provider, op, outcome).Inc()
		m.providerDuration.WithLabelValues(provider, op, outcome).Observe(d.Seconds())
	}
}

// Grading records a SWE-bench grading's duration.
func (m *Metrics) Grading(d time.Duration) {
	if m != nil {
		m.gradingDuration.Observe(d.Seconds())
	}
}

// OutcomeOfStatus classifies an HTTP status.
func OutcomeOfStatus(status int) string {
	switch {
	case status < 400:
		return OutcomeOK
	case status < 500:
		return OutcomeRefused
	}
	return OutcomeFailed
}

// SnapshotPause records how long a snapshot held its sandbox paused.
func (m *Metrics) SnapshotPause(d time.Duration) {
	if m != nil {
		m.snapshotPause.Observe(d.Seconds())
	}
}
