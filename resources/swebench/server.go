package swebench

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/internal/logs"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources/swebench/grading"
	"github.com/sandboxowner/owner/sandbox"
)

// maxSessionData keeps the session data under the owner's 64 KiB bound.
const maxSessionData = 60 << 10

// Failure kinds in a verify reply (failure_kind).
const (
	// FailureGrading: the grading sandbox could not be started or used; the
	// sample is masked (mask_sample), since the reward says nothing of the
	// agent.
	FailureGrading = "grading_error"
	// FailurePatchApply: no method applied the model patch.
	FailurePatchApply = "patch_apply_failed"
	// FailureEvalTimeout: the eval script outlived evaluation_timeout.
	FailureEvalTimeout = "evaluation_timeout"
	// FailureEnvironment: the instance's environment is unavailable (its
	// environment step failed, or its validation without a patch did); the
	// patch is not graded and the sample is masked.
	FailureEnvironment = "environment_error"
	// FailureNoTestResults: the eval log has no result for any listed test.
	// On a validated environment the patch broke the build (reward 0); on
	// an unvalidated one nobody knows whose fault it is (masked).
	FailureNoTestResults = "no_test_results"
)

// Patch sources (patch_source), besides Extraction's.
const PatchSourceGolden = "golden"

// Kind is the server type: the first half of its cookie name.
const Kind = "swebench"

// Deps are what a Server works with besides its config.
type Deps struct {
	// Name is the server's config name, in sandbox metadata and the cookie
	// ("swebench" when empty).
	Name string
	// Grader starts grading sandboxes; nil means the owner's
	// SharedProvider (the golden-patch instance's owner may have none).
	Grader provider.Provider
	// Logger receives structured logs (a discarding logger when nil).
	Logger logrus.FieldLogger
	// Clock times the preparations' progress (the wall clock when nil).
	Clock clock.Clock
	// Observer is told of the environments built and the validations run
	// (the metrics); none when nil.
	Observer Observer
}

// Server is the SWE-bench resources server. The owner holding the sessions'
// sandboxes is given per call (package http passes the request session's).
// It is safe for concurrent use.
type Server struct {
	cfg       Config
	name      string
	grader    provider.Provider
	templates *Templates // nil without repos
	log       logrus.FieldLogger
	// injected: log came from Deps; otherwise requests through package
	// http log to their session's logger.
	injected bool
	// slots bounds the eval sandboxes (gradings and validations).
	slots *slots
	// observer is told of environments built and validations run.
	observer Observer

	// progress tracks the preparations requests wait for.
	progress *tracker

	mu          sync.Mutex
	validations map[string]*Validation // by image and validation key
	locks       keyedMutex             // validations under way without a template
	// background are the preparations started for refused seeds
	// (while_preparing: refuse), by instance and grading inputs; prepared
	// are those that finished.
	background map[string]bool
	prepared   map[string]bool
	bg         sync.WaitGroup

	// base ends at Close: the background preparations run in it, and the
	// server's own sandboxes' work ends with it too (see startSandbox).
	base       context.Context
	cancelBase context.CancelFunc
	// closed (under mu) refuses new sandboxes of the server's own; work
	// counts those not yet stopped.
	closed bool
	work   sync.WaitGroup
}

// New checks cfg and returns a server.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, name: deps.Name, grader: deps.Grader, log: deps.Logger, injected: deps.Logger != nil,
		slots: newSlots(cfg.MaxConcurrentGradings), validations: map[string]*Validation{}}
	if s.name == "" {
		s.name = Kind
	}
	s.observer = deps.Observer
	if s.observer == nil {
		s.observer = noObserver{}
	}
	if s.log == nil {
		s.log = logs.Discard()
	}
	s.log = s.log.WithField("resources", Kind)
	clk := deps.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	s.progress = newTracker(clk, cfg.progressInterval(), s.log)
	s.background, s.prepared = map[string]bool{}, map[string]bool{}
	s.base, s.cancelBase = context.WithCancel(context.Background())
	if cfg.ShareCachesWithAgent {
		s.log.Warn("swebench: share_caches_with_agent has no effect: caches belong to their template, read-only or copied per sandbox")
	}
	if cfg.TemplateDir != "" {
		if s.templates, err = NewTemplates(cfg.TemplateDir, cfg.Repos); err != nil {
			return nil, err
		}
		s.templates.WithModules(cfg.Modules, cfg.ModuleProxy, cfg.ModuleVersions)
	}
	return s, nil
}

// StartupWarnings says what in the configuration will fail later rather
// than now, for the server to log once at startup: a repository whose
// configured path does not exist (its rows' seeds fail until it does).
func (s *Server) StartupWarnings() []string {
	var out []string
	for _, repo := range slices.Sorted(maps.Keys(s.cfg.Repos)) {
		path := s.cfg.Repos[repo]
		if _, err := os.Stat(path); err != nil {
			out = append(out, fmt.Sprintf("swebench.repos: %s: %s: %v; its rows cannot be seeded until it is there", repo, path, errors.Unwrap(err)))
		}
	}
	return out
}

// Config returns the configuration in effect (defaults filled).
func (s *Server) Config() Config { return s.cfg }

// Gradings returns the eval sandboxes (gradings and validations) running
// now and the verifies waiting for one (swebench.max_concurrent_gradings).
func (s *Server) Gradings() (running, waiting int) { return s.slots.counts() }

// Health is this server's part of /health: the gradings, and the
// instances whose template, environment or validation requests wait for.
func (s *Server) Health() map[string]any {
	running, waiting := s.Gradings()
	return map[string]any{"gradings": map[string]int{
		"running": running, "waiting": waiting, "max_concurrent": s.cfg.MaxConcurrentGradings,
	}, "preparing": s.Preparing()}
}

// Preparing lists the instances being prepared now, one entry each.
func (s *Server) Preparing() []Preparing { return s.progress.snapshot() }

// PreparingByPhase counts the instances being prepared in each phase
// (sandboxowner_environments_preparing).
func (s *Server) PreparingByPhase() map[string]int { return s.progress.byPhase() }

// LendsSandboxes reports whether sessions get a sandbox (/sandbox_access).
func (s *Server) LendsSandboxes() bool { return s.cfg.LendsSandboxes() }

// SessionData is what a session's setup records, next to its sandbox in a
// checkpoint: the base commit the patch is taken against and the files that
// were untracked before the agent started (they never enter the patch).
type SessionData struct {
	InstanceID        string      `json:"instance_id"`
	Repo              string      `json:"repo"`
	BaseCommit        string      `json:"base_commit"`
	Image             string      `json:"image"`
	PristineUntracked []string    `json:"pristine_untracked"`
	Scrub             ScrubReport `json:"scrub"`
	// SeedHead and SeedWorkBranch are, when the scrub did not run (its
	// report's Skipped), the commit HEAD was at and the work branch's tip
	// as the image had them ("" where there was none): the image's, not the
	// agent's.
	SeedHead       string `json:"seed_head,omitempty"`
	SeedWorkBranch string `json:"seed_work_branch,omitempty"`
}

// ParseSessionData decodes a session's data ({} decodes to the zero value).
func ParseSessionData(raw json.RawMessage) (SessionData, error) {
	var d SessionData
	if len(raw) == 0 {
		return d, nil
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return d, fmt.Errorf("swebench: session data: %w", err)
	}
	return d, nil
}

// SeedResult is the seed reply (upstream's legacy shape, plus what a
// restored session got).
type SeedResult struct {
	// SandboxHandle is the agent's sandbox id; null in the golden-patch
	// instance.
	SandboxHandle *string `json:"sandbox_handle"`
	Workdir       string  `json:"workdir,omitempty"`
	InstanceID    string  `json:"instance_id"`
	// Restored: the session's sandbox is a restore's fork (setup did not run
	// again).
	Restored      bool    `json:"restored,omitempty"`
	SeedTimeTaken float64 `json:"seed_time_taken"`
}

// gradingProvider is the provider grading sandboxes start on.
func (s *Server) gradingProvider(own *owner.Owner) (provider.Provider, error) {
	if s.grader != nil {
		return s.grader, nil
	}
	if p := own.SharedProvider(); p != nil {
		return p, nil
	}
	return nil, fmt.Errorf("%w: no provider to start grading sandboxes on", ErrConfig)
}

// SeedSession starts the session's sandbox for the row in body: the
// instance's image at workdir, scrubbed, its base commit and pristine
// untracked files recorded as session data. A session a restore rebuilt gets
// its fork; a repeated seed of the same instance gets the session's sandbox.
// The golden-patch instance starts nothing.
func (s *Server) SeedSession(ctx context.Context, own *owner.Owner, sessionID string, body []byte) (SeedResult, error) {
	return s.seed(ctx, own, sessionID, body, s.log)
}

func (s *Server) seed(ctx context.Context, own *owner.Owner, sessionID string, body []byte, log logrus.FieldLogger) (SeedResult, error) {
	began := time.Now()
	row, err := ParseRow(body)
	if err != nil {
		return SeedResult{}, err
	}
	if _, err := BuildEvalScript(row, s.cfg.testCommand(row), s.cfg.Workdir); err != nil {
		return SeedResult{}, err
	}
	res := SeedResult{InstanceID: row.InstanceID}
	log = log.WithFields(logrus.Fields{"session_id": sessionID, "instance_id": row.InstanceID})
	if !s.LendsSandboxes() {
		if strings.TrimSpace(row.Patch) == "" {
			return SeedResult{}, fmt.Errorf("%w: %s: the golden-patch instance needs the row's patch", ErrInvalidRow, row.InstanceID)
		}
		p, err := s.gradingProvider(own)
		if err != nil {
			return SeedResult{}, err
		}
		if _, err := s.ready(ctx, p, row, log); err != nil {
			return SeedResult{}, err
		}
		res.SeedTimeTaken = time.Since(began).Seconds()
		log.Info("swebench: seeded (golden patch, no sandbox)")
		return res, nil
	}
	p := own.SharedProvider()
	if p == nil {
		return SeedResult{}, fmt.Errorf("%w: the owner has no provider to lend sandboxes from (only the golden-patch instance lends none)", ErrConfig)
	}
	r, err := s.ready(ctx, p, row, log)
	if err != nil {
		return SeedResult{}, err
	}
	row = r.row
	key := "" // an unkeyed seed runs its own setup
	if s.cfg.ForkSeeds {
		key = row.InstanceID
	}
	spec, started, err := s.spec(p, r.image, row, roleAgent, r.env)
	if err != nil {
		return SeedResult{}, fmt.Errorf("swebench: seed %s: %w", row.InstanceID, err)
	}
	sb, err := own.StartKeyedSessionSandbox(ctx, sessionID, key, spec, s.setup(row, r.image, log), s.cfg.Workdir)
	started()
	if errors.Is(err, sandbox.ErrExists) {
		sb, err = own.RequireSessionSandbox(ctx, sessionID)
	}
	if err != nil {
		return SeedResult{}, fmt.Errorf("swebench: seed %s: %w", row.InstanceID, err)
	}
	if d, err := ParseSessionData(sb.Data); err == nil && d.InstanceID != "" && d.InstanceID != row.InstanceID {
		return SeedResult{}, fmt.Errorf("%w: the session holds %s, the seed names %s", ErrSessionMismatch, d.InstanceID, row.InstanceID)
	}
	id := sb.Handle.SandboxID
	res.SandboxHandle, res.Workdir, res.Restored = &id, sb.Workdir, sb.Restored
	res.SeedTimeTaken = time.Since(began).Seconds()
	log.WithFields(logrus.Fields{"sandbox_id": id, "restored": sb.Restored, "duration_ms": time.Since(began).Milliseconds()}).Info("swebench: seeded")
	return res, nil
}

// ready is prepare, with an unavailable instance as
// ErrEnvironmentUnavailable.
func (s *Server) ready(ctx context.Context, p provider.Provider, row Row, log logrus.FieldLogger) (readiness, error) {
	if s.cfg.refusesWhilePreparing() {
		if err := s.preparedOrStart(p, row, log); err != nil {
			return readiness{}, err
		}
	}
	r, err := s.prepare(ctx, p, row, log)
	if err != nil {
		return r, err
	}
	if reason, bad := r.unavailable(); bad {
		return r, fmt.Errorf("%w: %s: %s", ErrEnvironmentUnavailable, row.InstanceID, reason)
	}
	return r, nil
}

// setup is the agent sandbox's setup: the scrub, then the pristine list.
func (s *Server) setup(row Row, image string, log logrus.FieldLogger) sandbox.SetupFunc {
	return func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) (json.RawMessage, error) {
		rep := ScrubReport{Base: row.BaseCommit, Skipped: "apply_anti_cheating is off"}
		if s.cfg.applyAntiCheating() {
			r, err := Scrub(ctx, p, sb.Handle, row.BaseCommit, s.cfg.setupTimeout())
			if errors.Is(err, errScrubNotRun) {
				// Unlike a repository the scrub refused, a scrub that never
				// ran says nothing of the image, and the refs it would have
				// removed (the fix's commit among them) would be graded as
				// the agent's committed work: a slow machine would turn a
				// session that did nothing into a reward of 1. Refused.
				return nil, err
			}
			if err != nil {
				// As upstream's seed: the failure is reported and the
				// session goes on with the repository as the image has it.
				log.WithError(err).WithField("sandbox_id", sb.Handle.SandboxID).Warn("swebench: the anti-cheat scrub failed; the seed goes on without it")
				rep.Skipped = err.Error()
			} else {
				rep = r
			}
		}
		pristine, err := Untracked(ctx, p, sb.Handle, s.cfg.setupTimeout())
		if err != nil && rep.Skipped == "" {
			return nil, fmt.Errorf("%w: list the untracked files: %w", ErrScrub, err)
		}
		if err != nil {
			// No scrub ran (no repository, say): nothing to tell apart.
			log.WithError(err).Warn("swebench: the untracked files could not be listed")
		}
		if pristine == nil {
			pristine = []string{}
		}
		sd := SessionData{
			InstanceID: row.InstanceID, Repo: row.Repo, BaseCommit: rep.Base, Image: image,
			PristineUntracked: pristine, Scrub: rep,
		}
		if rep.Skipped != "" {
			// What the image's refs hold is the image's: verify must tell
			// it from the agent's work.
			if sd.SeedHead, sd.SeedWorkBranch, err = SeedPoint(ctx, p, sb.Handle, s.cfg.setupTimeout()); err != nil {
				return nil, fmt.Errorf("%w: read where the agent starts: %w", ErrScrub, err)
			}
		}
		data, err := json.Marshal(sd)
		if err != nil {
			return nil, fmt.Errorf("swebench: session data: %w", err)
		}
		if len(data) > maxSessionData {
			return nil, fmt.Errorf("%w: %d untracked entries before the agent started make %d bytes of session data (at most %d)", ErrScrub, len(pristine), len(data), maxSessionData)
		}
		log.WithFields(logrus.Fields{"sandbox_id": sb.Handle.SandboxID, "base_commit": rep.Base,
			"commits_before": rep.CommitsBefore, "commits_after": rep.CommitsAfter, "pristine_untracked": len(pristine)}).Info("swebench: scrubbed")
		return data, nil
	}
}

// image returns the image of row's sandboxes on p: on the local provider the
// template of (repo, base commit) when the repo is configured, with its
// environment (built on p if needed), else the row's image, else (other
// providers) SWE-bench's instance image name.
func (s *Server) image(ctx context.Context, p provider.Provider, row Row, pr *prep, log logrus.FieldLogger) (string, *Environment, error) {
	isLocal := p.Capabilities().HostTools
	if isLocal && s.templates != nil && s.templates.Has(row.Repo) {
		dir, full, err := s.templates.Ensure(ctx, row.Repo, row.BaseCommit, log)
		if err != nil {
			return "", nil, err
		}
		pr.phase(PhaseEnvironment)
		env, err := s.environment(ctx, p, row, dir, full, log)
		if err != nil {
			return "", nil, err
		}
		return env.Image, env, nil
	}
	if row.Image != "" {
		return row.Image, nil, nil
	}
	if isLocal {
		return "", nil, fmt.Errorf("%w: %s: add %q to swebench.repos (a git repository on this machine)", ErrUnknownRepo, row.InstanceID, row.Repo)
	}
	id := strings.ToLower(strings.ReplaceAll(row.InstanceID, "__", "_1776_"))
	return fmt.Sprintf("%s/sweb.eval.x86_64.%s:latest", s.cfg.ImageNamespace, id), nil, nil
}

// spec is the spec of a sandbox of row in role (roleAgent, roleGrading,
// roleValidation, roleEnv) started from image. Agent and grading sandboxes
// are built alike, as upstream's; on the local provider with a template
// (env), the template's caches are mounted as localMounts says, and every
// role but the environment step runs Go offline against them. The
// generations of the template's caches it mounts are pinned until done,
// which the caller calls once the sandbox started (or did not): then
// those nothing else stands on any more are deleted (collectCacheGens).
func (s *Server) spec(p provider.Provider, image string, row Row, role string, env *Environment) (_ provider.Spec, done func(), _ error) {
	done = func() {}
	sc := s.cfg.SandboxConfig
	md := map[string]string{}
	for k, v := range sc.Metadata {
		md[k] = v
	}
	id := row.InstanceID
	if len(id) > 63 {
		id = id[:63]
	}
	md["nemo_gym_agent"], md["instance_id"], md["swebench_role"] = s.name, id, role
	env0 := map[string]string{}
	network := sc.Network
	if p.Capabilities().HostTools {
		// The local provider's HOME is the work tree: tools that write
		// under HOME (go's caches, git's global config) would put files
		// into the patch. Its sandboxes see the host's tools (read-only
		// in a container), so they get the server's PATH.
		env0["HOME"] = "/tmp"
		if path := os.Getenv("PATH"); path != "" {
			env0["PATH"] = path
		}
		env0["GOTOOLCHAIN"] = s.cfg.goToolchain(row)
		env0["GOFLAGS"], env0["GOPROXY"] = "-mod=mod", "off"
	}
	var opts map[string]any
	if len(sc.ProviderOptions) > 0 {
		opts = make(map[string]any, len(sc.ProviderOptions))
		for k, v := range sc.ProviderOptions {
			opts[k] = v
		}
	}
	if p.Capabilities().HostTools && env != nil {
		if role != roleEnv && role != roleStdlib { // the template's, not a staging directory
			pinned, unpin, err := s.pinCaches(env, p.Capabilities().HostMounts)
			if err != nil {
				return provider.Spec{}, nil, fmt.Errorf("%w: %w", ErrTemplate, err)
			}
			done = func() {
				unpin()
				s.collectCacheGens(env, s.log)
			}
			env = pinned
		}
		mounts, vars := s.localMounts(env, role)
		for k, v := range vars {
			env0[k] = v
		}
		if opts == nil {
			opts = map[string]any{}
		}
		opts[local.MountsOption] = mounts
	}
	for k, v := range sc.Env {
		env0[k] = v
	}
	if role == roleEnv {
		// The one sandbox with the network: it downloads what the others
		// then read offline.
		network = true
		env0["GOFLAGS"] = "-mod=mod -modcacherw"
		delete(env0, "GOPROXY")
		for _, k := range goNetworkEnv {
			if v, ok := os.LookupEnv(k); ok {
				env0[k] = v
			}
		}
		for k, v := range s.cfg.EnvSetupEnv {
			env0[k] = v
		}
	}
	return provider.Spec{
		Image: image, Workdir: s.cfg.Workdir, Env: env0, Metadata: md,
		TTLSeconds: sc.TTLSeconds, ReadyTimeoutSeconds: sc.ReadyTimeoutSeconds,
		Resources: sc.Resources.provider(), Network: network, ProviderOptions: opts,
	}, done, nil
}

// stopSandbox stops a sandbox this server started for itself (environment
// step, validation, grading), even when ctx has ended.
// startSandbox starts a sandbox of spec for the server's own work (an
// environment step, a standard-library build, a validation, a grading). The
// context returned ends when ctx does or the server closes; stop, which the
// caller calls once its work is done, stops the sandbox and lets Close
// return. A closing server starts none: ErrClosed.
func (s *Server) startSandbox(ctx context.Context, p provider.Provider, spec provider.Spec, what string) (h provider.Handle, wctx context.Context, stop func(), err error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return provider.Handle{}, ctx, nil, ErrClosed
	}
	s.work.Add(1)
	s.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	unhook := context.AfterFunc(s.base, cancel)
	leave := func() {
		unhook()
		cancel()
		s.work.Done()
	}
	if h, err = p.Start(wctx, spec); err != nil {
		leave()
		return provider.Handle{}, ctx, nil, err
	}
	return h, wctx, func() {
		s.stopSandbox(wctx, p, h, what)
		leave()
	}, nil
}

// Close ends the server's own work at shutdown: the preparations, the
// validations and the gradings under way are cancelled and their sandboxes
// stopped, and none starts after. A local sandbox outlives its server, and
// one left mid-validation keeps its harvest directory mounted read-write
// for whoever removes the sandbox's directory (no generation is published
// from it). It returns once every such sandbox is stopped, or with ctx's
// error.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancelBase()
	stopped := make(chan struct{})
	go func() {
		s.work.Wait()
		close(stopped)
	}()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("swebench: close: sandboxes of the server's own still stopping: %w", ctx.Err())
	}
}

func (s *Server) stopSandbox(ctx context.Context, p provider.Provider, h provider.Handle, what string) {
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := p.Stop(stopCtx, h); err != nil {
		s.log.WithError(err).WithField("sandbox_id", h.SandboxID).Warn("swebench: could not stop the " + what + " sandbox")
	}
}

// VerifyResult is the verify reply: upstream's fields, the model patch's
// provenance, and the time each phase took (seconds).
type VerifyResult struct {
	Reward              float64              `json:"reward"`
	Resolved            bool                 `json:"resolved"`
	EvaluationCompleted bool                 `json:"evaluation_completed"`
	InstanceID          string               `json:"instance_id"`
	ModelPatch          *string              `json:"model_patch"`
	TestsStatus         *grading.TestsStatus `json:"tests_status"`
	// TestOutput is the marked test section of the eval log (the whole log
	// without markers; the apply log when the patch did not apply), cut to
	// test_output_cap around the middle.
	TestOutput          string `json:"test_output"`
	TestOutputTruncated bool   `json:"test_output_truncated,omitempty"`
	MaskSample          bool   `json:"mask_sample"`
	FailureKind         string `json:"failure_kind,omitempty"`
	FailureReason       string `json:"failure_reason,omitempty"`

	PatchSource      string   `json:"patch_source"`
	PatchTip         string   `json:"patch_tip,omitempty"`
	PatchCommits     int      `json:"patch_commits,omitempty"`
	WorktreeDirty    bool     `json:"worktree_dirty,omitempty"`
	PristineDropped  []string `json:"pristine_dropped,omitempty"`
	ModelPatchBytes  int      `json:"model_patch_bytes"`
	PatchApplied     bool     `json:"patch_applied"`
	PatchApplyMethod string   `json:"patch_apply_method,omitempty"`
	// ExcludedFiles are the model patch's files left out of the grading
	// (swebench.grading_guard): they kept their base content.
	ExcludedFiles []grading.Excluded `json:"excluded_files,omitempty"`
	// TestFraming is the rule the test results were read by
	// (grading.FramingMarked, grading.FramingUnmarked, grading.FramingLog).
	TestFraming string `json:"test_framing,omitempty"`

	PatchExtractionTimeTaken  float64 `json:"patch_extraction_time_taken"`
	EvalSandboxStartTimeTaken float64 `json:"eval_sandbox_start_time_taken"`
	PatchApplyTimeTaken       float64 `json:"patch_apply_time_taken"`
	EvalTimeTaken             float64 `json:"eval_time_taken"`
	// PatchVerificationTimeTaken is the whole grading: sandbox start, apply,
	// eval, stop.
	PatchVerificationTimeTaken float64 `json:"patch_verification_time_taken"`
	TotalTimeTaken             float64 `json:"total_time_taken"`
	// LogDir is the grading's directory under log_dir; it holds the model
	// patch, the test output and this report unless
	// clear_swebench_debug_logs (the default) keeps nothing.
	LogDir string `json:"log_dir"`
}

// VerifySession grades the session: the model patch (the row's own in the
// golden-patch instance) is extracted from the agent's sandbox, the session
// ends, and the patch is graded in a fresh sandbox of the same image. A
// session without a sandbox is sandbox.ErrNone (409), never a
// reward. Failures of the patch or the tests are a reward of 0 with a
// failure_kind; failures of the grading sandbox are a masked sample.
func (s *Server) VerifySession(ctx context.Context, own *owner.Owner, sessionID string, body []byte) (VerifyResult, error) {
	return s.verify(ctx, own, sessionID, body, s.log)
}

func (s *Server) verify(ctx context.Context, own *owner.Owner, sessionID string, body []byte, log logrus.FieldLogger) (VerifyResult, error) {
	began := time.Now()
	row, err := ParseRow(body)
	if err != nil {
		return VerifyResult{}, err
	}
	res := VerifyResult{InstanceID: row.InstanceID, LogDir: s.logDir(sessionID, row.InstanceID)}
	log = log.WithFields(logrus.Fields{"session_id": sessionID, "instance_id": row.InstanceID})
	p, perr := s.gradingProvider(own)
	var r readiness
	if perr == nil {
		if r, perr = s.prepare(ctx, p, row, log); perr == nil {
			row = r.row
		}
	}
	if reason, bad := r.unavailable(); bad && perr == nil {
		// Never graded: whatever the patch, this environment cannot say.
		if s.LendsSandboxes() {
			if err := own.EndSessionSandbox(ctx, sessionID); err != nil && !errors.Is(err, sandbox.ErrNone) {
				log.WithError(err).Warn("swebench: could not end the session of an unavailable instance")
			}
		}
		res.MaskSample, res.FailureKind, res.FailureReason = true, FailureEnvironment, reason
		res.TotalTimeTaken = time.Since(began).Seconds()
		log.WithField("reason", reason).Warn("swebench: verified nothing: the instance's environment is unavailable")
		s.keepLog(&res, log)
		return res, nil
	}
	var patch string
	if !s.LendsSandboxes() {
		patch, res.PatchSource = row.Patch, PatchSourceGolden
	} else {
		var grade bool
		if patch, grade, err = s.takePatch(ctx, own, sessionID, row, &res, log); err != nil {
			return VerifyResult{}, err
		}
		if !grade {
			res.TotalTimeTaken = time.Since(began).Seconds()
			log.WithField("reason", res.FailureReason).Warn("swebench: verified nothing: the agent's work cannot be told from the image's")
			s.keepLog(&res, log)
			return res, nil
		}
	}
	res.ModelPatch, res.ModelPatchBytes = &patch, len(patch)
	s.grade(ctx, p, r, perr, row, patch, &res, log)
	res.TotalTimeTaken = time.Since(began).Seconds()
	log.WithFields(logrus.Fields{
		"reward": res.Reward, "resolved": res.Resolved, "evaluation_completed": res.EvaluationCompleted,
		"failure_kind": res.FailureKind, "patch_source": res.PatchSource, "patch_bytes": res.ModelPatchBytes,
		"extract_s": res.PatchExtractionTimeTaken, "start_s": res.EvalSandboxStartTimeTaken,
		"apply_s": res.PatchApplyTimeTaken, "eval_s": res.EvalTimeTaken, "total_s": res.TotalTimeTaken,
	}).Info("swebench: verified")
	s.keepLog(&res, log)
	return res, nil
}

// logDir is where the grading of sessionID's instance keeps its files.
func (s *Server) logDir(sessionID, instanceID string) string {
	return filepath.Join(s.cfg.LogDir, "run_evaluation", pathSafe(sessionID), pathSafe(instanceID))
}

// pathSafe makes one path component of an id a client chose.
func pathSafe(id string) string {
	b := []byte(id)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			b[i] = '_'
		}
	}
	if s := string(b); s != "" && s != "." && s != ".." {
		return s
	}
	return "_"
}

// keepLog writes a graded verify's files under its log_dir when the
// configuration keeps them; a failure to write is logged, never the
// verify's.
func (s *Server) keepLog(res *VerifyResult, log logrus.FieldLogger) {
	if !s.cfg.keepLogs() || res.LogDir == "" {
		return
	}
	report, _ := json.MarshalIndent(res, "", " ")
	files := map[string][]byte{"report.json": report, "test_output.txt": []byte(res.TestOutput)}
	if res.ModelPatch != nil {
		files["patch.diff"] = []byte(*res.ModelPatch)
	}
	if err := os.MkdirAll(res.LogDir, 0o755); err != nil {
		log.WithError(err).Warn("swebench: could not keep the grading's log")
		return
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(res.LogDir, name), b, 0o644); err != nil {
			log.WithError(err).Warn("swebench: could not keep the grading's log")
			return
		}
	}
}

// takePatch extracts the model patch from the session's sandbox and ends the
// session. An extraction that fails gives an empty patch (as upstream's), with
// the reason in the reply. A session whose unscrubbed image had HEAD
// elsewhere than the base is not to be graded (grade false, res says why):
// the work tree's diff against the base holds the image's own commits, and
// the grading sandbox, at the image's HEAD, already has them.
func (s *Server) takePatch(ctx context.Context, own *owner.Owner, sessionID string, row Row, res *VerifyResult, log logrus.FieldLogger) (patch string, grade bool, err error) {
	sb, err := own.RequireSessionSandbox(ctx, sessionID)
	if err != nil {
		return "", false, fmt.Errorf("swebench: verify %s: %w", row.InstanceID, err)
	}
	data, err := ParseSessionData(sb.Data)
	if err != nil {
		return "", false, err
	}
	if data.InstanceID != "" && data.InstanceID != row.InstanceID {
		return "", false, fmt.Errorf("%w: the session holds %s, the verify names %s", ErrSessionMismatch, data.InstanceID, row.InstanceID)
	}
	base := data.BaseCommit
	if base == "" {
		log.Warn("swebench: the session has no session data; the patch is taken against the row's base commit and may include files the image shipped untracked")
		base = row.BaseCommit
	} else if !strings.HasPrefix(base, row.BaseCommit) {
		return "", false, fmt.Errorf("%w: the session's base commit is %s, the verify names %s", ErrSessionMismatch, base, row.BaseCommit)
	}
	if data.SeedHead != "" && !strings.HasPrefix(strings.ToLower(data.SeedHead), strings.ToLower(base)) {
		if err := own.EndSessionSandbox(ctx, sessionID); err != nil {
			log.WithError(err).Warn("swebench: could not end the session of an ungradable image")
		}
		res.MaskSample, res.FailureKind = true, FailureEnvironment
		res.FailureReason = fmt.Sprintf("the image's HEAD was at %s, not at the base commit %s, when the session started unscrubbed (%s): "+
			"its own commits cannot be told from the agent's work, so nothing was graded", data.SeedHead, base, data.Scrub.Skipped)
		return "", false, nil
	}
	workFrom := ""
	if data.Scrub.Skipped != "" {
		workFrom = cmp.Or(data.SeedWorkBranch, base)
	}
	t := time.Now()
	var ex Extraction
	var exErr error
	err = own.Do(ctx, sessionID, func(ctx context.Context, p provider.Provider, sb sandbox.Sandbox) error {
		ex, exErr = ExtractPatch(ctx, p, sb.Handle, base, data.PristineUntracked, workFrom, s.cfg.setupTimeout())
		return nil
	})
	res.PatchExtractionTimeTaken = time.Since(t).Seconds()
	// A lost sandbox is refused like a missing one: grading the empty patch
	// it would give scores an episode that cannot be read.
	if errors.Is(err, sandbox.ErrNone) || errors.Is(err, sandbox.ErrLost) {
		return "", false, fmt.Errorf("swebench: verify %s: %w", row.InstanceID, err)
	}
	if err != nil {
		exErr = err
	}
	if exErr != nil {
		log.WithError(exErr).Warn("swebench: patch extraction failed; grading an empty patch")
		ex = Extraction{Source: "none"}
		res.FailureReason = exErr.Error()
	}
	res.PatchSource, res.PatchTip, res.PatchCommits = ex.Source, ex.Tip, ex.Commits
	res.WorktreeDirty, res.PristineDropped = ex.WorktreeDirty, ex.Dropped
	if err := own.EndSessionSandbox(ctx, sessionID); err != nil {
		log.WithError(err).Warn("swebench: could not end the agent's session after extracting its patch")
	}
	return ex.Patch, true, nil
}

// grade runs patch against row in a fresh grading sandbox of r's image on p
// and fills res; prepErr is why p or r could not be had. The grading
// sandbox waits for a slot (max_concurrent_gradings) and is stopped on
// every path.
func (s *Server) grade(ctx context.Context, p provider.Provider, r readiness, prepErr error, row Row, patch string, res *VerifyResult, log logrus.FieldLogger) {
	began := time.Now()
	defer func() { res.PatchVerificationTimeTaken = time.Since(began).Seconds() }()
	infra := func(what string, err error) {
		res.MaskSample, res.FailureKind = true, FailureGrading
		res.FailureReason = joinReason(res.FailureReason, fmt.Errorf("%w: %s: %w", ErrGrading, what, err).Error())
		log.WithError(err).Warn("swebench: grading failed: " + what)
	}
	if prepErr != nil {
		infra("the instance's image", prepErr)
		return
	}
	release, err := s.slots.acquire(ctx)
	if err != nil {
		infra("wait for a grading slot", err)
		return
	}
	defer release()
	t := time.Now()
	spec, started, err := s.spec(p, r.image, row, roleGrading, r.env)
	if err != nil {
		infra("pin the template's caches", err)
		return
	}
	h, ctx, stop, err := s.startSandbox(ctx, p, spec, "grading")
	started()
	res.EvalSandboxStartTimeTaken = time.Since(t).Seconds()
	if err != nil {
		infra("start the grading sandbox", err)
		return
	}
	defer stop()

	tc, err := probeGo(ctx, p, h)
	if err != nil {
		infra("probe the repository's Go", err)
		return
	}
	framing := tc.framing(row.LogParser)
	res.TestFraming = framing
	kept, excluded := s.cfg.GradingGuard.Apply(patch, row.TestPatch, row.Patch)
	res.ExcludedFiles = excluded
	if len(excluded) > 0 {
		log.WithField("excluded", grading.ExcludedPaths(excluded)).Info("swebench: files outside the agent's remit left out of the grading")
	}
	t = time.Now()
	ar, err := ApplyPatch(ctx, p, h, kept, s.cfg.setupTimeout())
	res.PatchApplyTimeTaken = time.Since(t).Seconds()
	if err != nil {
		infra("apply the patch", err)
		return
	}
	res.PatchApplied, res.PatchApplyMethod = ar.Applied, ar.Method
	if !ar.Applied {
		res.FailureKind = FailurePatchApply
		res.FailureReason = joinReason(res.FailureReason, "no method applied the model patch (git apply, git apply --reject, patch --fuzz=5)")
		res.TestOutput, res.TestOutputTruncated = capOutput(ar.Log, s.cfg.TestOutputCap)
		return
	}
	var exits []string
	if !s.cfg.GradingGuard.AllowExitingInit {
		exits = grading.ExitingInits(kept, s.patchedGoFiles(ctx, p, h, kept, log))
	}

	script, err := s.evalScript(ctx, p, h, row)
	if err != nil {
		infra("build the eval script", err)
		return
	}
	t = time.Now()
	ev, err := RunEval(ctx, p, h, script, framing == grading.FramingMarked, s.cfg.evaluationTimeout())
	res.EvalTimeTaken = time.Since(t).Seconds()
	if err != nil {
		infra("run the eval script", err)
		return
	}
	section, ok := grading.TestSection(ev.Log)
	if !ok {
		section = ev.Log
	}
	res.TestOutput, res.TestOutputTruncated = capOutput(section, s.cfg.TestOutputCap)
	if ev.TimedOut {
		res.FailureKind = FailureEvalTimeout
		res.FailureReason = joinReason(res.FailureReason, fmt.Sprintf("the eval script ran past evaluation_timeout (%s)", s.cfg.evaluationTimeout()))
		return
	}
	if ev.Truncated {
		res.FailureReason = joinReason(res.FailureReason, "the eval output passed the provider's output cap and was cut")
	}
	outcome, err := ReadOutcome(row, framing, ev.Log)
	if err != nil { // Validate checked the name
		infra("parse the log", err)
		return
	}
	verdict := Decide(row, outcome, exits)
	res.TestsStatus = &verdict.Tests
	if verdict.Kind != "" {
		res.FailureKind = verdict.Kind
		res.FailureReason = joinReason(res.FailureReason, verdict.Reason)
		res.EvaluationCompleted = true
		log.WithField("reason", verdict.Reason).Warn("swebench: the grading saw tampering")
		return
	}
	statuses, resolved := outcome.Statuses, verdict.Resolved
	if !anyListed(row, statuses) {
		res.FailureKind = FailureNoTestResults
		res.FailureReason = joinReason(res.FailureReason, "the eval log has no result for any FAIL_TO_PASS or PASS_TO_PASS test")
		if !r.validated() {
			// Nobody checked that this environment runs the tests: the
			// failure may be the environment's, not the patch's.
			res.MaskSample = true
			res.FailureReason += " (the environment was not validated, so the sample is masked)"
		}
		return
	}
	res.EvaluationCompleted, res.Resolved = true, resolved
	if resolved {
		res.Reward = 1
	}
}

// patchedGoFiles reads, in the grading sandbox h once the patch is
// applied (before any code of it ran), the Go files the patch changes, for
// the static check of the lines it adds to them. A file that cannot be
// read (the patch applied with --reject left it out, say) is left out, and
// logged.
func (s *Server) patchedGoFiles(ctx context.Context, p provider.Provider, h provider.Handle, patch string, log logrus.FieldLogger) map[string]string {
	out := map[string]string{}
	for _, path := range grading.ChangedGoFiles(patch) {
		b, err := p.ReadFile(ctx, h, path)
		if err != nil {
			log.WithError(err).WithField("path", path).Warn("swebench: a Go file the patch changes could not be read for the static check")
			continue
		}
		out[path] = string(b)
	}
	return out
}

// evalScript is the row's eval script for the grading sandbox h. Where the
// provider runs commands in a host directory rather than at the workdir (the
// local provider unisolated), the workdir's path in the script is
// replaced by the directory commands actually run in.
func (s *Server) evalScript(ctx context.Context, p provider.Provider, h provider.Handle, row Row) (string, error) {
	res, err := run(ctx, p, h, "pwd -P", nil, time.Minute)
	if err != nil {
		return "", err
	}
	wd := strings.TrimSpace(res.Stdout)
	if res.ExitCode != 0 || wd == "" {
		wd = s.cfg.Workdir
	}
	script, err := BuildEvalScript(row, s.cfg.testCommand(row), wd)
	if err != nil {
		return "", err
	}
	if row.EvalScript != "" && wd != s.cfg.Workdir {
		script = strings.ReplaceAll(script, s.cfg.Workdir, wd)
	}
	return script, nil
}

// capOutput keeps at most max bytes of s: its head and its tail.
func capOutput(s string, max int) (string, bool) {
	if max <= 0 || len(s) <= max {
		return s, false
	}
	marker := fmt.Sprintf("\n…[%d bytes cut]…\n", len(s)-max)
	head := max / 2
	tail := max - head
	return strings.ToValidUTF8(s[:head], "") + marker + strings.ToValidUTF8(s[len(s)-tail:], ""), true
}

func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
