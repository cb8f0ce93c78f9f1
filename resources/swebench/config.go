package swebench

import (
	"cmp"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// Defaults of zero Config fields.
const (
	DefaultWorkdir           = "/testbed"
	DefaultEvaluationTimeout = 1800 * time.Second
	DefaultSetupTimeout      = 600 * time.Second
	DefaultTestOutputCap     = 64 << 10
	DefaultImageNamespace    = "swebench"
	DefaultEnvSetupTimeout   = 1800 * time.Second
)

// DefaultGoEnvSetup is the environment step of a repository with a go.mod
// and no configured one: the modules its build needs, into the template's
// module cache.
var DefaultGoEnvSetup = []string{"go mod download"}

// Config is the swebench.* part of the server's configuration (upstream's
// SwebenchResourcesServerConfig, plus what the local provider needs).
type Config struct {
	// IsVerifyingGoldenPatch: the golden-patch instance lends no sandbox and
	// grades each row's own patch.
	IsVerifyingGoldenPatch bool `yaml:"is_verifying_golden_patch" json:"is_verifying_golden_patch"`
	// EvaluationTimeout bounds the eval script, in seconds (1800).
	EvaluationTimeout float64 `yaml:"evaluation_timeout" json:"evaluation_timeout"`
	// SetupTimeout bounds each of the scrub, the patch extraction and the
	// patch application, in seconds (600).
	SetupTimeout float64 `yaml:"setup_timeout" json:"setup_timeout"`
	// Repos maps "owner/name" to a git repository on this machine: on the
	// local provider, an instance's image is a clone of it at base_commit.
	Repos map[string]string `yaml:"repos" json:"repos"`
	// TemplateDir holds those clones, one per (repo, base commit). The
	// server binary defaults it to <data dir>/swebench-templates.
	TemplateDir string `yaml:"template_dir" json:"template_dir"`
	// TestCommands maps "owner/name" (or an instance_id, which wins: SWE-bench
	// Multilingual's commands are per instance) to the command that runs the
	// tests, for rows without eval_script (for a Go module, "go test -v
	// -count=1 ./..."); DefaultTestCommand is used for the rest.
	TestCommands       map[string]string `yaml:"test_commands" json:"test_commands"`
	DefaultTestCommand string            `yaml:"default_test_command" json:"default_test_command"`
	// Workdir is where the repository is in a sandbox ("/testbed").
	Workdir string `yaml:"workdir" json:"workdir"`
	// ImageNamespace names SWE-bench's instance images on other providers
	// for rows without an image: <ns>/sweb.eval.x86_64.<id>:latest.
	ImageNamespace string `yaml:"image_namespace" json:"image_namespace"`
	// TestOutputCap caps test_output in the verify reply, in bytes (64 KiB).
	TestOutputCap int `yaml:"test_output_cap" json:"test_output_cap"`
	// SandboxConfig is applied to the agent's and the grading sandboxes.
	SandboxConfig SandboxConfig `yaml:"sandbox_config" json:"sandbox_config"`
	// ForkSeeds seeds every session of an instance as a fork of the
	// instance's setup (the scrub, the pristine list) run once into a
	// template snapshot: the setup is a pure function of the instance id,
	// so a group of rollouts of one instance pays for it once.
	ForkSeeds bool `yaml:"fork_seeds" json:"fork_seeds"`
	// Caches are the local provider's named shared caches, cache name →
	// the environment variable that points at it (mounted at
	// CacheMountDir/<name>), so that module and build caches are reused
	// across sandboxes. nil means DefaultCaches (Go's module and build
	// caches); an empty map turns them off. Other providers ignore them.
	Caches map[string]string `yaml:"caches,omitempty" json:"caches,omitempty"`
	// WritableCaches are the caches (names in Caches) that commands must be
	// able to write, such as Go's build cache: every agent and grading
	// sandbox gets a copy of the template's of its own. The others (the
	// module cache) are mounted read-only. nil means ["gobuild"].
	WritableCaches []string `yaml:"writable_caches,omitempty" json:"writable_caches,omitempty"`
	// StdCacheDir holds Go's standard library compiled once per toolchain
	// and shared by every template: a new environment's build cache starts
	// as a copy of it. Only a sandbox that compiles nothing but the
	// standard library writes it; no agent, grading or validation sees it.
	// Default: <template_dir>/.gostd.
	StdCacheDir string `yaml:"std_cache_dir,omitempty" json:"std_cache_dir,omitempty"`
	// ShareCachesWithAgent is kept for old configs and has no effect: every
	// cache belongs to its template, read-only or copied per sandbox, so an
	// agent and a grading never share what either writes.
	ShareCachesWithAgent bool `yaml:"share_caches_with_agent" json:"share_caches_with_agent"`

	// EnvSetup maps "owner/name" or an instance_id (which wins) to the
	// shell commands of a template's environment step, run once per
	// template in a sandbox with the network on; a configured entry wins
	// over the default (DefaultGoEnvSetup for a repository with go.mod,
	// nothing otherwise). An empty list configures no step.
	EnvSetup map[string][]string `yaml:"env_setup,omitempty" json:"env_setup,omitempty"`
	// EnvSetupTimeout bounds the environment step, in seconds (1800).
	EnvSetupTimeout float64 `yaml:"env_setup_timeout" json:"env_setup_timeout"`
	// EnvSetupEnv is added to the environment step's environment only (a
	// GOPROXY, a package index); the server's own GOPROXY, GOSUMDB,
	// GONOSUMDB, GOPRIVATE, GONOPROXY and GOINSECURE are passed on first.
	EnvSetupEnv map[string]string `yaml:"env_setup_env,omitempty" json:"env_setup_env,omitempty"`
	// Validate runs each instance's eval script once per template without
	// a patch before lending it (nil means true): an instance whose
	// PASS_TO_PASS tests fail, or whose log shows none of its tests, is
	// unavailable.
	Validate *bool `yaml:"validate,omitempty" json:"validate,omitempty"`
	// Modules maps "owner/name" to a Go module path: a repository not in
	// Repos is fetched from the module proxy at its base commit (a
	// pseudo-version's zip made a git repository of one commit; the row's
	// base_commit then names that commit in the sandboxes). nil means
	// DefaultModules (SWE-bench Multilingual's Go repositories); an empty
	// map turns it off. Needs template_dir.
	Modules map[string]string `yaml:"modules,omitempty" json:"modules,omitempty"`
	// ModuleProxy is the proxy the sources come from (default: the first
	// URL of the server's GOPROXY, else https://proxy.golang.org).
	ModuleProxy string `yaml:"module_proxy,omitempty" json:"module_proxy,omitempty"`
	// ModuleVersions maps a base commit to the version of its module that
	// holds it, for a module proxy that does not resolve commits (a mirror
	// that serves only the versions it was given): the version's origin,
	// when the proxy reports one, must be that commit.
	ModuleVersions map[string]string `yaml:"module_versions,omitempty" json:"module_versions,omitempty"`
	// GoToolchains maps "owner/name" or an instance_id (which wins) to the
	// Go toolchain its sandboxes run (GOTOOLCHAIN, such as "go1.21.13"):
	// the environment step downloads it through the module proxy into the
	// template's module cache, where every other sandbox finds it offline.
	// Unlisted rows run the server's own go ("local").
	GoToolchains map[string]string `yaml:"go_toolchains,omitempty" json:"go_toolchains,omitempty"`
	// WhilePreparing is what a seed does while its instance's template,
	// environment step or validation is under way: "wait" (the default;
	// the wait shows in /health, the metrics and the log) or "refuse" (503
	// environment_preparing with Retry-After at once, the preparation going
	// on in the background).
	WhilePreparing string `yaml:"while_preparing,omitempty" json:"while_preparing,omitempty"`
	// ProgressInterval is how often a preparation under way logs its phase
	// and elapsed time, in seconds (10).
	ProgressInterval float64 `yaml:"progress_interval,omitempty" json:"progress_interval,omitempty"`
	// GradingGuard says which files of a model patch are outside the
	// agent's remit and keep their base content in the grading (test files
	// the test patch does not touch, vendor/, module replacements), and
	// whether a patch may end the test binary from an init.
	GradingGuard grading.Guard `yaml:"grading_guard" json:"grading_guard"`
	// ApplyAntiCheating runs the anti-cheat scrub at seed (nil means
	// true). A scrub that fails is logged and the seed goes on, as
	// upstream's does.
	ApplyAntiCheating *bool `yaml:"apply_anti_cheating,omitempty" json:"apply_anti_cheating,omitempty"`
	// ClearSwebenchDebugLogs: a verify keeps no files under its log_dir
	// (nil means true; the golden-patch instance always keeps them).
	ClearSwebenchDebugLogs *bool `yaml:"clear_swebench_debug_logs,omitempty" json:"clear_swebench_debug_logs,omitempty"`
	// LogDir is where a verify writes its grading's files, under
	// run_evaluation/<session>/<instance> (the model patch, the test
	// output, the report). The server binary defaults it beside the
	// templates.
	LogDir string `yaml:"log_dir" json:"log_dir"`
	// SandboxProvider names the top-level block that configures the
	// sandboxes: here always "sandbox" (accepted for upstream's configs).
	SandboxProvider string `yaml:"sandbox_provider,omitempty" json:"sandbox_provider,omitempty"`
	// SandboxCheckpoint is upstream's per-server checkpointer setting; set,
	// it wins over checkpoint.parallelism and checkpoint.on_stop.
	SandboxCheckpoint SandboxCheckpoint `yaml:"sandbox_checkpoint,omitempty" json:"sandbox_checkpoint,omitempty"`
	// MaxConcurrentGradings bounds the eval sandboxes (gradings and
	// validations) running at once; further ones wait in arrival order.
	// Zero means half the CPUs, at least 1.
	MaxConcurrentGradings int `yaml:"max_concurrent_gradings" json:"max_concurrent_gradings"`
}

// SandboxCheckpoint is upstream's sandbox_checkpoint block.
type SandboxCheckpoint struct {
	Parallelism int    `yaml:"parallelism,omitempty" json:"parallelism,omitempty"`
	OnStop      string `yaml:"on_stop,omitempty" json:"on_stop,omitempty"`
}

func (c Config) applyAntiCheating() bool { return c.ApplyAntiCheating == nil || *c.ApplyAntiCheating }

// keepLogs reports whether a verify keeps its files under log_dir.
func (c Config) keepLogs() bool {
	return c.IsVerifyingGoldenPatch || (c.ClearSwebenchDebugLogs != nil && !*c.ClearSwebenchDebugLogs)
}

// CacheMountDir is where the caches are in a local sandbox.
const CacheMountDir = "/caches"

// DefaultCaches are the caches of a config that names none: Go's module
// cache and build cache.
func DefaultCaches() map[string]string {
	return map[string]string{"gomod": "GOMODCACHE", "gobuild": "GOCACHE"}
}

// SandboxConfig is upstream's sandbox_config: what every sandbox of the server
// is started with.
type SandboxConfig struct {
	TTLSeconds          float64           `yaml:"ttl_s" json:"ttl_s"`
	ReadyTimeoutSeconds float64           `yaml:"ready_timeout_s" json:"ready_timeout_s"`
	Resources           Resources         `yaml:"resources" json:"resources"`
	Env                 map[string]string `yaml:"env" json:"env,omitempty"`
	Metadata            map[string]string `yaml:"metadata" json:"metadata,omitempty"`
	// Network lets commands reach the network (the local provider isolates
	// it otherwise): needed to download modules a cache does not hold.
	Network         bool           `yaml:"network" json:"network"`
	ProviderOptions map[string]any `yaml:"provider_options" json:"provider_options,omitempty"`
}

// Resources is provider.Resources with YAML keys.
type Resources struct {
	CPU       float64 `yaml:"cpu" json:"cpu,omitempty"`
	MemoryMiB int     `yaml:"memory_mib" json:"memory_mib,omitempty"`
	DiskGiB   int     `yaml:"disk_gib" json:"disk_gib,omitempty"`
	GPU       int     `yaml:"gpu" json:"gpu,omitempty"`
	GPUType   string  `yaml:"gpu_type" json:"gpu_type,omitempty"`
}

// LendsSandboxes reports whether sessions get a sandbox: false for the
// golden-patch instance, whose owner should then have no provider (so the
// mode in effect is restart_only) while grading uses one.
func (c Config) LendsSandboxes() bool { return !c.IsVerifyingGoldenPatch }

// withDefaults fills zero fields and checks the rest.
func (c Config) withDefaults() (Config, error) {
	if c.Workdir == "" {
		c.Workdir = DefaultWorkdir
	}
	if !path.IsAbs(c.Workdir) || path.Clean(c.Workdir) == "/" {
		return c, fmt.Errorf("%w: workdir %q must be an absolute path other than /", ErrConfig, c.Workdir)
	}
	c.Workdir = path.Clean(c.Workdir)
	if c.EvaluationTimeout < 0 || c.SetupTimeout < 0 || c.TestOutputCap < 0 {
		return c, fmt.Errorf("%w: negative evaluation_timeout, setup_timeout or test_output_cap", ErrConfig)
	}
	if c.ImageNamespace == "" {
		c.ImageNamespace = DefaultImageNamespace
	}
	if c.TestOutputCap == 0 {
		c.TestOutputCap = DefaultTestOutputCap
	}
	if c.Caches == nil {
		c.Caches = DefaultCaches()
	}
	if c.Modules == nil {
		c.Modules = DefaultModules()
	}
	if c.ModuleProxy == "" {
		c.ModuleProxy = cmp.Or(proxyFirst(os.Getenv("GOPROXY")), DefaultModuleProxy)
	}
	if c.WritableCaches == nil {
		c.WritableCaches = []string{"gobuild"}
	}
	if c.EnvSetupTimeout < 0 || c.MaxConcurrentGradings < 0 {
		return c, fmt.Errorf("%w: negative env_setup_timeout or max_concurrent_gradings", ErrConfig)
	}
	switch c.WhilePreparing {
	case "", WhilePreparingWait, WhilePreparingRefuse:
	default:
		return c, fmt.Errorf("%w: while_preparing %q (want %s or %s)", ErrConfig, c.WhilePreparing, WhilePreparingWait, WhilePreparingRefuse)
	}
	for k, v := range c.GoToolchains {
		if !goToolchainName.MatchString(v) {
			return c, fmt.Errorf("%w: go_toolchains[%q] = %q (want local or a release such as go1.21.13)", ErrConfig, k, v)
		}
	}
	if c.ProgressInterval < 0 {
		return c, fmt.Errorf("%w: negative progress_interval", ErrConfig)
	}
	if c.MaxConcurrentGradings == 0 {
		c.MaxConcurrentGradings = max(1, runtime.NumCPU()/2)
	}
	for k, env := range c.EnvSetupEnv {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(env, 0) {
			return c, fmt.Errorf("%w: env_setup_env: %q", ErrConfig, k)
		}
	}
	for name, env := range c.Caches {
		if !cacheName.MatchString(name) || env == "" || strings.ContainsAny(env, "=\x00") {
			return c, fmt.Errorf("%w: caches: %q → %q (want a name of letters, digits, '.' and '_', and an environment variable)", ErrConfig, name, env)
		}
	}
	if c.SandboxProvider != "" && c.SandboxProvider != "sandbox" {
		return c, fmt.Errorf("%w: sandbox_provider %q: the sandboxes are configured by the top-level sandbox block", ErrConfig, c.SandboxProvider)
	}
	if sc := c.SandboxCheckpoint; sc.Parallelism < 0 || (sc.OnStop != "" && sc.OnStop != "kill" && sc.OnStop != "none") {
		return c, fmt.Errorf("%w: sandbox_checkpoint: parallelism %d, on_stop %q (want ≥ 1, and kill or none)", ErrConfig, sc.Parallelism, sc.OnStop)
	}
	if c.LogDir == "" {
		c.LogDir = filepath.Join(os.TempDir(), "swebench-logs")
	}
	if c.StdCacheDir == "" && c.TemplateDir != "" {
		c.StdCacheDir = filepath.Join(c.TemplateDir, ".gostd")
	}
	if c.StdCacheDir != "" {
		abs, err := filepath.Abs(c.StdCacheDir)
		if err != nil {
			return c, fmt.Errorf("%w: std_cache_dir %q: %v", ErrConfig, c.StdCacheDir, err)
		}
		c.StdCacheDir = abs
	}
	if len(c.Repos) > 0 && c.TemplateDir == "" {
		return c, fmt.Errorf("%w: template_dir is required with repos", ErrConfig)
	}
	return c, nil
}

var goToolchainName = regexp.MustCompile(`^(local|go1\.[0-9]+(\.[0-9]+|rc[0-9]+)?)$`)

// goToolchain is the GOTOOLCHAIN of row's sandboxes.
func (c Config) goToolchain(r Row) string {
	if v, ok := c.GoToolchains[r.InstanceID]; ok {
		return v
	}
	if v, ok := c.GoToolchains[r.Repo]; ok {
		return v
	}
	return "local"
}

var cacheName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.]*$`)

func seconds(s float64, def time.Duration) time.Duration {
	if s <= 0 {
		return def
	}
	return time.Duration(s * float64(time.Second))
}

func (c Config) evaluationTimeout() time.Duration {
	return seconds(c.EvaluationTimeout, DefaultEvaluationTimeout)
}
func (c Config) setupTimeout() time.Duration { return seconds(c.SetupTimeout, DefaultSetupTimeout) }
func (c Config) envSetupTimeout() time.Duration {
	return seconds(c.EnvSetupTimeout, DefaultEnvSetupTimeout)
}

// The values of while_preparing.
const (
	WhilePreparingWait   = "wait"
	WhilePreparingRefuse = "refuse"
)

func (c Config) refusesWhilePreparing() bool { return c.WhilePreparing == WhilePreparingRefuse }

func (c Config) progressInterval() time.Duration {
	return seconds(c.ProgressInterval, DefaultProgressInterval)
}

// validates reports whether instances are validated before they are lent.
func (c Config) validates() bool { return c.Validate == nil || *c.Validate }

// writable reports whether the named cache is copied per sandbox.
func (c Config) writable(cache string) bool {
	for _, n := range c.WritableCaches {
		if n == cache {
			return true
		}
	}
	return false
}

// envSetup is the row's configured environment step (instance_id, then
// repo) and whether one is configured.
func (c Config) envSetup(r Row) ([]string, bool) {
	if cmds, ok := c.EnvSetup[r.InstanceID]; ok {
		return cmds, true
	}
	cmds, ok := c.EnvSetup[r.Repo]
	return cmds, ok
}

// testCommand is the row's test command: test_commands[instance_id], else
// test_commands[repo], else default_test_command.
func (c Config) testCommand(r Row) string {
	if cmd, ok := c.TestCommands[r.InstanceID]; ok {
		return cmd
	}
	if cmd, ok := c.TestCommands[r.Repo]; ok {
		return cmd
	}
	return c.DefaultTestCommand
}

func (r Resources) provider() *provider.Resources {
	if r == (Resources{}) {
		return nil
	}
	return &provider.Resources{CPU: r.CPU, MemoryMiB: r.MemoryMiB, DiskGiB: r.DiskGiB, GPU: r.GPU, GPUType: r.GPUType}
}
