// Package app is the server binary's logic, importable so that tests, the
// simulation and the process-level suite can start a server in-process
// (Start) or run the whole command line (Run) as cmd/server does.
//
//	server [-config FILE] [-log-format text|json] [-<key> value ...]
//	server serve ...        the same, by name
//
// Every configuration key is a flag named by its dotted path
// (-checkpoint.state_dir DIR, -sandbox.provider local); flags win over the
// file, the file over Defaults. A configuration that cannot be used is one
// line on stderr and exit status 2. SIGTERM (a cancelled context) drains the
// requests in flight, stops accepting, closes the owner (stopping its
// sandboxes; checkpoints keep their snapshots) and the snapshot index.
package app

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sirupsen/logrus"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/pprofhandler"

	"github.com/sandboxowner/owner/clock"
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/internal/timeouts"
	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/sandbox"
	"github.com/sandboxowner/owner/sweep"
)

// Deps replace parts of what Start builds from the config: for tests and the
// simulation.
type Deps struct {
	// Logger is the one logger, injected everywhere (nil discards logs).
	Logger *logrus.Logger
	// Provider replaces sandbox.provider.
	Provider provider.Provider
	// Clock replaces the wall clock (owner leases, control deadlines).
	Clock clock.Clock
	// Listener replaces host:port.
	Listener net.Listener
	// LeaseTick is the control plane's lease ticker (0: 1 s; < 0: none).
	LeaseTick time.Duration
	// ConfigFile is the file the config was read from: sandboxes never see
	// it.
	ConfigFile string
	// Registry receives the server's metrics (nil: a fresh one); GET
	// /metrics serves it.
	Registry *prometheus.Registry
	// AccessLog is -access-log: one log line per request.
	AccessLog bool
	// Pprof is -pprof: serve /debug/pprof/.
	Pprof bool
	// OnSweep, when set, is told of every pass of the server's own sweep
	// when it ends.
	OnSweep func(sweep.Pass)

	// beforeServe, when set, runs on the serving goroutine before Serve:
	// tests hold Serve back with it.
	beforeServe func()
}

// App is a running server.
type App struct {
	cfg    Config
	log    *logrus.Logger
	own    *owner.Owner
	srv    *httpapi.Server
	ln     net.Listener
	served chan error
	// stopReaper ends the local provider's lease reaper.
	stopReaper context.CancelFunc
	// closeProv closes the provider Start built (nil error otherwise).
	closeProv func() error
	// sweep is the server's own sweep; stopSweep ends its loop and waits.
	sweep     *sweep.Loop
	stopSweep func()
	// res is the resources server (resources.Closer: closed at Stop).
	res resources.Resources
}

// Start builds the provider, the owner and the HTTP server from cfg and
// serves. Errors of the configuration wrap ErrConfig.
func Start(ctx context.Context, cfg Config, deps Deps) (*App, error) {
	if err := cfg.validate(deps.Provider); err != nil {
		return nil, err
	}
	log := deps.Logger
	if log == nil {
		log = logrus.New()
		log.SetOutput(io.Discard)
	}
	clk := deps.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	reg := deps.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	met, err := metrics.New(reg)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	entry := resourcesRegistry()[cfg.Resources]
	res, err := entry.build(&cfg, met)
	if err != nil {
		return nil, fmt.Errorf("%w: resources %s: %w", ErrConfig, cfg.Resources, err)
	}
	if w, ok := res.(interface{ StartupWarnings() []string }); ok {
		for _, msg := range w.StartupWarnings() {
			log.Warn(msg)
		}
	}
	if err := met.ObserveVerifies(res.Kind()); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	sp, err := startProvider(ctx, &cfg, deps, entry, res, met, log, clk)
	if err != nil {
		return nil, err
	}
	own, err := startOwner(ctx, &cfg, deps, sp, res, log, clk)
	if err != nil {
		_ = sp.close()
		return nil, err
	}
	fail := func(err error) (*App, error) {
		_ = own.Close()
		_ = sp.close()
		return nil, err
	}
	secret, generated, err := httpapi.LoadSessionSecret(cfg.SessionSecret, cfg.Checkpoint.StateDir)
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrConfig, err))
	}
	lend, access, mounts, err := startLending(deps, sp, own, res, log, clk, secret)
	if err != nil {
		return fail(err)
	}
	if _, grades := res.(interface{ Gradings() (int, int) }); grades {
		if err := met.ObserveGradings(); err != nil {
			return fail(fmt.Errorf("metrics: %w", err))
		}
	}
	swept, sweepOff := sweepLoop(&cfg, sp.prov, own, clk, log, deps.OnSweep)
	srv, err := newServer(&cfg, deps, sp, own, res, met, log, clk, secret, access, mounts, func() map[string]any { return sweepHealth(swept, sweepOff) })
	if err != nil {
		return fail(fmt.Errorf("%w: %w", ErrConfig, err))
	}
	src := sources(own, srv, res)
	src.ProviderDown = sp.down
	src.Sweep = func() metrics.SweepCounts { return sweepCounts(swept) }
	src.Pool = func() metrics.PoolCounts {
		st := own.PoolStats()
		return metrics.PoolCounts{Hits: st.Hits, Misses: st.Misses, Expired: st.Expired, StartFailures: st.Failed, Ready: st.Ready, Starting: st.Starting}
	}
	if err := met.Observe(src); err != nil {
		return fail(fmt.Errorf("metrics: %w", err))
	}
	if lend != nil {
		lend.srv = srv
	}
	ln := deps.Listener
	if ln == nil {
		addr := net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port))
		if ln, err = net.Listen("tcp", addr); err != nil {
			return fail(fmt.Errorf("listen on %s: %w", addr, err))
		}
	}
	if lend != nil {
		lend.listening(ln.Addr())
	}
	reapCtx, stopReaper := context.WithCancel(context.Background())
	sp.reaper(reapCtx)
	sweepCtx, endSweep := context.WithCancel(context.Background())
	sweepDone := make(chan struct{})
	go func() { defer close(sweepDone); swept.Run(sweepCtx) }()
	a := &App{cfg: cfg, log: log, own: own, srv: srv, ln: ln, served: make(chan error, 1), stopReaper: stopReaper, closeProv: sp.close,
		sweep: swept, stopSweep: func() { endSweep(); <-sweepDone }, res: res}
	go func() {
		if deps.beforeServe != nil {
			deps.beforeServe()
		}
		a.served <- srv.Serve(ln)
	}()
	logServing(log, &cfg, sp, srv, ln.Addr(), generated)
	return a, nil
}

// startedProvider is the provider Start built, wrapped for the owner, and
// what it said of itself before it was wrapped.
type startedProvider struct {
	prov provider.Provider
	name string
	// down says whether a remote provider is unreachable now (nil when it
	// answers, or for a local one).
	down func() error
	// refused: why the provider refused a startup snapshot (nil if it took
	// one or none was tried).
	refused error
	// close closes a provider Start built (the local one then releases
	// its root's lock); a given one is the caller's.
	close      func() error
	defaultTTL time.Duration
	// For /health and the startup line, and direct lending's endpoints.
	isolation, seccomp, limits string
	direct                     endpointer
	reaper                     func(ctx context.Context)
}

// startProvider builds the configured provider (or takes the given one),
// probes it and its snapshots, and wraps it for the owner.
func startProvider(ctx context.Context, cfg *Config, deps Deps, entry resourcesEntry, res resources.Resources, met *metrics.Metrics, log *logrus.Logger, clk clock.Clock) (*startedProvider, error) {
	prov, provName, err := buildProvider(cfg, deps, providerEnv{log: log, clk: clk, templates: entry.templates, hide: hidden(deps.ConfigFile), serving: true,
		onPause: func(_ string, d time.Duration) { met.SnapshotPause(d) }})
	if err != nil {
		return nil, err
	}
	sp := &startedProvider{name: provName, down: func() error { return nil }, close: func() error { return nil }}
	// A remote provider that cannot be reached is said at once, in one
	// line naming it; the server serves anyway (/health reports it, seeds
	// answer 503 provider_unavailable until it answers).
	if r, ok := prov.(interface{ Unreachable() error }); ok {
		sp.down = r.Unreachable
	}
	reachable := true
	if pr, ok := prov.(interface{ Probe(context.Context) error }); ok {
		pctx, cancel := context.WithTimeout(ctx, timeouts.Probe)
		if err := pr.Probe(pctx); err != nil {
			log.Errorf("sandbox provider at startup: %v", err)
			reachable = false
		}
		cancel()
	}
	if reachable && cfg.Checkpoint.Enabled && res.LendsSandboxes() && !cfg.Sandbox.OpenSandbox.SkipSnapshotProbe {
		sp.refused = probeSnapshots(ctx, prov, res, cfg.Name, log)
	}
	if c, ok := prov.(io.Closer); ok && deps.Provider == nil {
		sp.close = c.Close
	}
	if d, ok := prov.(interface{ DefaultTTL() time.Duration }); ok {
		sp.defaultTTL = d.DefaultTTL()
	}
	// What only the provider built says (its isolation, filter and limits
	// for /health, its reaper, direct lending's endpoints) is read from it
	// here, before it is wrapped; everything after calls it through the
	// wrappers, which pass its Capabilities on.
	sp.isolation, sp.seccomp, sp.limits = isolationOf(prov), seccompOf(prov), limitsOf(prov)
	sp.direct, sp.reaper = lendDirect(cfg, prov), reaperOf(prov)
	if !res.LendsSandboxes() {
		prov = withoutSnapshots{prov}
	}
	sp.prov = met.Provider(prov)
	return sp, nil
}

// startOwner starts the owner over the started provider: its recovery
// runs here.
func startOwner(ctx context.Context, cfg *Config, deps Deps, sp *startedProvider, res resources.Resources, log *logrus.Logger, clk clock.Clock) (*owner.Owner, error) {
	renew := timeouts.RenewEvery
	ret := cfg.Checkpoint.Retention
	retEvery := seconds(cmp.Or(ret.PeriodS, DefaultRetentionPeriodS))
	if deps.Clock != nil {
		renew = 0 // logical time: the caller ticks the owner
		retEvery = 0
	}
	own, err := owner.New(ctx, owner.Config{
		Name:     cfg.Name,
		Provider: sp.prov,
		Checkpoint: owner.CheckpointConfig{
			Enabled:     cfg.Checkpoint.Enabled,
			StateDir:    cfg.Checkpoint.StateDir,
			Parallelism: cmp.Or(sandboxCheckpoint(cfg).Parallelism, cfg.Checkpoint.Parallelism),
			OnStop:      cmp.Or(sandboxCheckpoint(cfg).OnStop, cfg.Checkpoint.OnStop),
			Retention:   owner.RetentionConfig{FollowDirs: ret.FollowDirs, Grace: seconds(ret.GraceS), Every: retEvery},
		},
		NumWorkers:       cfg.NumWorkers,
		LendsNoSandboxes: !res.LendsSandboxes(),
		SnapshotsRefused: sp.refused,
		Clock:            clk,
		Logger:           log,
		RenewEvery:       renew,
		DefaultTTL:       sp.defaultTTL,
		MaxSessions:      cfg.MaxSessions,
		IdleTimeout:      cfg.SessionIdleTimeout,
		Pool:             owner.PoolConfig{Size: cfg.Sandbox.Pool.Size, MaxIdle: cfg.Sandbox.Pool.MaxIdle, RefillConcurrency: cfg.Sandbox.Pool.RefillConcurrency},
	})
	if errors.Is(err, owner.ErrConfig) {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if err != nil {
		return nil, fmt.Errorf("start the owner: %w", err)
	}
	return own, nil
}

// startLending makes the sandbox API and its tokens when the resources
// server lends sandboxes (nil otherwise), and the routes mounted beside the
// server's own.
func startLending(deps Deps, sp *startedProvider, own *owner.Owner, res resources.Resources, log *logrus.Logger, clk clock.Clock, secret []byte) (lend *lending, access func(*resources.Session, sandbox.Sandbox, map[string]any) error, mounts map[string]fasthttp.RequestHandler, err error) {
	if res.LendsSandboxes() {
		if lend, err = newLending(secret, sp.prov, own, clk, log, sp.direct); err != nil {
			return nil, nil, nil, fmt.Errorf("%w: sandbox access tokens: %w", ErrConfig, err)
		}
		access, mounts = lend.access, lend.mounts()
	}
	if deps.Pprof {
		if mounts == nil {
			mounts = map[string]fasthttp.RequestHandler{}
		}
		mounts[PprofPrefix] = pprofhandler.PprofHandler
	}
	return lend, access, mounts, nil
}

// newServer builds the HTTP server over the owner.
func newServer(cfg *Config, deps Deps, sp *startedProvider, own *owner.Owner, res resources.Resources, met *metrics.Metrics, log *logrus.Logger, clk clock.Clock, secret []byte, access func(*resources.Session, sandbox.Sandbox, map[string]any) error, mounts map[string]fasthttp.RequestHandler, sweep func() map[string]any) (*httpapi.Server, error) {
	var held func() (int, error)
	var retained func() owner.RetentionStatus
	if own.Index() != nil {
		held, retained = own.CheckpointsHeld, own.RetentionStatus
	}
	return httpapi.New(httpapi.Config{
		Owner:            own,
		Resources:        verifyObserved{res, met},
		Logger:           log,
		Clock:            clk,
		SessionSecret:    secret,
		ControlAuthToken: cfg.Checkpoint.ControlAuthToken,
		LeaseGrace:       time.Duration(cfg.Checkpoint.LeaseGraceSeconds * float64(time.Second)),
		MaxDeadline:      time.Duration(cfg.Checkpoint.MaxDeadlineSeconds * float64(time.Second)),
		ReadTimeout:      cfg.HTTP.ReadTimeout,
		WriteTimeout:     cfg.HTTP.WriteTimeout,
		IdleTimeout:      cfg.HTTP.IdleTimeout,
		MaxConns:         cfg.HTTP.MaxConns,
		MaxConnsPerIP:    cfg.HTTP.MaxConnsPerIP,
		LeaseTick:        deps.LeaseTick,
		Access:           access,
		Mounts:           mounts,
		Isolation:        sp.isolation,
		ProviderDown:     sp.down,
		PendingDeletes:   own.PendingDeletes,
		CheckpointsHeld:  held,
		Retention:        retained,
		Sweep:            sweep,
		Seccomp:          sp.seccomp,
		Limits:           sp.limits,
		Metrics:          met,
		AccessLog:        deps.AccessLog,
	})
}

// logServing says what the server serves, where, and on what.
func logServing(log *logrus.Logger, cfg *Config, sp *startedProvider, srv *httpapi.Server, addr net.Addr, generatedSecret bool) {
	secretFrom := "checkpoint.state_dir"
	switch {
	case cfg.SessionSecret != "":
		secretFrom = "config"
	case generatedSecret:
		secretFrom = "generated for this process (cookies do not survive a restart)"
	}
	log.WithFields(logrus.Fields{
		"addr":           addr.String(),
		"name":           cfg.Name,
		"resources":      cfg.Resources,
		"provider":       sp.name,
		"capabilities":   sp.prov.Capabilities().Flags(),
		"mode":           srv.Mode(),
		"checkpointing":  cfg.Checkpoint.Enabled,
		"state_dir":      cfg.Checkpoint.StateDir,
		"session_secret": secretFrom,
	}).Infof("serving %s on %s (checkpoint mode in effect: %s)", cfg.Resources, addr, srv.Mode())
}

// verifyObserved records what a resources server's verify replies say in
// the metrics: the reward, whether the task was resolved or the sample
// masked, and the grading's time (SWE-bench's GradingTime).
type verifyObserved struct {
	resources.Resources
	met *metrics.Metrics
}

func (g verifyObserved) Verify(ctx context.Context, sess *resources.Session, body []byte) (any, error) {
	rep, err := g.Resources.Verify(ctx, sess, body)
	if err != nil {
		return rep, err
	}
	if t, ok := rep.(interface{ GradingTime() time.Duration }); ok && t.GradingTime() > 0 {
		g.met.Grading(t.GradingTime())
	}
	if gr, ok := gradeOf(rep); ok {
		g.met.Verified(g.Kind(), gr.reward, gr.resolved, gr.masked)
	}
	return rep, err
}

// grade is what a verify reply says of the episode.
type grade struct {
	reward           float64
	resolved, masked bool
}

// gradeOf reads a verify reply's reward, resolved and mask_sample, as Gym
// reads them; a reply without a reward grades nothing. Without resolved, a
// full reward (1) resolves the task.
func gradeOf(reply any) (grade, bool) {
	b, err := json.Marshal(reply)
	if err != nil {
		return grade{}, false
	}
	var r struct {
		Reward     *float64 `json:"reward"`
		Resolved   *bool    `json:"resolved"`
		MaskSample bool     `json:"mask_sample"`
	}
	if json.Unmarshal(b, &r) != nil || r.Reward == nil {
		return grade{}, false
	}
	g := grade{reward: *r.Reward, masked: r.MaskSample, resolved: *r.Reward >= 1}
	if r.Resolved != nil {
		g.resolved = *r.Resolved
	}
	return g, true
}

// seconds is a configuration's seconds as a duration.
func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// PprofPrefix is where -pprof serves Go's profiles.
const PprofPrefix = "/debug/pprof/"

// sources are the state gauges' readers.
func sources(own *owner.Owner, srv *httpapi.Server, res resources.Resources) metrics.Sources {
	src := metrics.Sources{Sessions: func() metrics.SessionCounts {
		live, setup, lost := own.SessionCounts()
		return metrics.SessionCounts{Live: live, InSetup: setup, Lost: lost}
	}}
	if idx := own.Index(); idx != nil {
		src.Snapshots = func() (int, error) {
			refs, err := idx.ReferencedSnapshots()
			return len(refs), err
		}
		src.PendingDeletes = own.PendingDeletes
		src.CheckpointDrops = func() map[string]uint64 { return own.RetentionStatus().Drops }
		src.UnreadableDirs = func() map[string]uint64 { return own.RetentionStatus().UnreadableDirs }
	}
	if g := srv.Gate(); g != nil {
		src.AdmissionWaiting = g.Waiting
	}
	if gr, ok := res.(interface{ Gradings() (running, waiting int) }); ok {
		src.GradingsWaiting = func() int { _, w := gr.Gradings(); return w }
	}
	if pr, ok := res.(interface{ PreparingByPhase() map[string]int }); ok {
		src.Preparing = pr.PreparingByPhase
	}
	return src
}

func buildProvider(cfg *Config, deps Deps, env providerEnv) (provider.Provider, string, error) {
	if deps.Provider != nil {
		return deps.Provider, deps.Provider.Name() + " (given)", nil
	}
	name := cfg.Sandbox.Provider
	unset := name == ""
	if unset {
		name = DefaultProvider
	}
	p, err := providerRegistry()[name](cfg, env)
	if err != nil {
		return nil, "", fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if unset {
		// Said once the provider stands, so that a refusal is one line.
		env.log.Infof("sandbox.provider not set: using the embedded default, the %s provider (real sandboxes on this machine)", name)
	}
	return p, name, nil
}

// Addr is the address served.
func (a *App) Addr() net.Addr { return a.ln.Addr() }

// Owner is the server's owner.
func (a *App) Owner() *owner.Owner { return a.own }

// Sweep is the server's own sweep (its Once makes a pass now).
func (a *App) Sweep() *sweep.Loop { return a.sweep }

// Server is the HTTP server.
func (a *App) Server() *httpapi.Server { return a.srv }

// Stop drains the requests in flight (bounded by ctx), stops accepting,
// and closes the owner and its index.
func (a *App) Stop(ctx context.Context) error {
	serr := a.srv.Shutdown(ctx)
	// A Serve that had not begun when Shutdown ran would accept forever:
	// closing the listener ends it either way.
	_ = a.ln.Close()
	<-a.served
	// The requests still running were cut when the drain ended; the
	// resources server's own sandboxes (a validation a seed waited for)
	// are stopped before the process can end without them.
	var rerr error
	if c, ok := a.res.(resources.Closer); ok {
		rctx, cancel := context.WithTimeout(context.Background(), timeouts.CloseStops)
		rerr = c.Close(rctx)
		cancel()
	}
	a.stopReaper()
	// Before the owner closes: a pass holds its control turn.
	a.stopSweep()
	oerr := a.own.Close()
	perr := a.closeProv()
	if err := errors.Join(serr, rerr, oerr, perr); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	a.log.Info("stopped cleanly")
	return nil
}

// Abandon drops the server as a crash would, for tests that restart one in
// the same process: no sandbox is stopped and the index is left as it is;
// the listener closes and the provider lets go of its root, as the end of
// the process would. It returns once the state_dir and the root are free
// for the next server, with the index's and the provider's close errors.
func (a *App) Abandon() error {
	a.stopSweep()
	oerr := a.own.Abandon()
	ctx, cancel := context.WithTimeout(context.Background(), timeouts.Abandon)
	defer cancel()
	_ = a.srv.Shutdown(ctx)
	_ = a.ln.Close()
	<-a.served
	a.served <- nil
	a.stopReaper()
	return errors.Join(oerr, a.closeProv())
}

// command is one subcommand of the binary.
type command func(ctx context.Context, args []string, stdout, stderr io.Writer) int

// commands are the binary's subcommands; with none named, serve runs.
func commands() map[string]command {
	return map[string]command{"serve": serve, "sweep": sweepCommand, "swebench": swebenchCommand}
}

// ShutdownTimeout bounds the drain at SIGTERM.
const ShutdownTimeout = 60 * time.Second

// Run is the command line: it returns the exit status. ctx ending (SIGTERM
// in cmd/server) stops the server gracefully.
func Run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, ok := commands()[args[0]]
		if !ok {
			ErrorLine(stderr, LogFormatOf(args), fmt.Sprintf("unknown command %q (commands: %s)", args[0], strings.Join(slices.Sorted(maps.Keys(commands())), ", ")))
			return 2
		}
		return cmd(ctx, args[1:], stdout, stderr)
	}
	return serve(ctx, args, stdout, stderr)
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	opts, err := ParseArgs(args, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		ErrorLine(stderr, LogFormatOf(args), err.Error())
		return 2
	}
	log, err := NewLogger(stderr, opts.LogFormat, opts.LogLevel)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, err.Error())
		return 2
	}
	a, err := Start(ctx, opts.Config, Deps{Logger: log, ConfigFile: opts.ConfigFile, AccessLog: opts.AccessLog, Pprof: opts.Pprof})
	if errors.Is(err, ErrConfig) {
		ErrorLine(stderr, opts.LogFormat, err.Error())
		return 2
	}
	if err != nil {
		log.WithError(err).Error("server did not start")
		return 1
	}
	select {
	case <-ctx.Done():
	case err := <-a.served:
		// Serve returned on its own: the listener failed.
		a.served <- err
		log.WithError(err).Error("serving stopped")
	}
	log.Info("stopping: draining requests in flight")
	sctx, cancel := context.WithTimeout(context.Background(), ShutdownTimeout)
	defer cancel()
	if err := a.Stop(sctx); err != nil {
		log.WithError(err).Error("unclean stop")
		return 1
	}
	return 0
}

// ErrorLine writes an error that ends the command as one line in the log
// format asked for (logrus text, or JSON for "json").
func ErrorLine(w io.Writer, format, msg string) {
	log, err := NewLogger(w, format, "info")
	if err != nil || format != "json" {
		log, _ = NewLogger(w, "text", "info")
		// Unquoted, so that the keys and values the message names read as
		// written ("port", not \"port\"); the message is one line.
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true, DisableQuote: true})
	}
	log.Error(msg)
}

// NewLogger is the binary's logger on w: logrus text (coloured on a
// terminal) or JSON.
func NewLogger(w io.Writer, format, level string) (*logrus.Logger, error) {
	log := logrus.New()
	log.SetOutput(w)
	switch format {
	case "", "text":
		log.SetFormatter(&logrus.TextFormatter{FullTimestamp: true})
	case "json":
		log.SetFormatter(&logrus.JSONFormatter{})
	default:
		return nil, fmt.Errorf("%w: -log-format must be text or json, not %q", ErrConfig, format)
	}
	lv, err := logrus.ParseLevel(level)
	if err != nil {
		return nil, fmt.Errorf("%w: -log-level: %v", ErrConfig, err)
	}
	log.SetLevel(lv)
	return log, nil
}
