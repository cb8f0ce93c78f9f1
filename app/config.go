package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sandboxowner/owner/provider/local"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources/swebench"
)

// ErrConfig: the configuration cannot be used. Run reports it in one line
// and exits with status 2.
var ErrConfig = errors.New("config")

// Config is the server's configuration: the YAML file's keys, each also a
// flag named by its dotted path (-checkpoint.state_dir).
type Config struct {
	// Name is the server's config name: the cookie's second half, the
	// instance in checkpoint status, the ng.owner label of its sandboxes.
	Name string `yaml:"name"`
	// Resources is the resources server to run ("notes").
	Resources     string           `yaml:"resources"`
	Host          string           `yaml:"host"`
	Port          int              `yaml:"port"`
	NumWorkers    int              `yaml:"num_workers"`
	SessionSecret string           `yaml:"session_secret"`
	Sandbox       SandboxConfig    `yaml:"sandbox"`
	Checkpoint    CheckpointConfig `yaml:"checkpoint"`
	HTTP          HTTPConfig       `yaml:"http"`
	Sweep         SweepConfig      `yaml:"sweep"`
	// MaxSessions bounds live sessions (0: no bound); a seed beyond it is
	// 503 at_capacity.
	MaxSessions int `yaml:"max_sessions"`
	// SessionIdleTimeout ends a session with no request for that long
	// (0: never).
	SessionIdleTimeout time.Duration `yaml:"session_idle_timeout"`
	// SWEBench configures resources: swebench (package resources/swebench).
	SWEBench swebench.Config `yaml:"swebench"`
}

// SandboxConfig selects the sandbox provider; each provider's options sit
// under its name.
type SandboxConfig struct {
	// Provider is "fake", "local" or "opensandbox"; empty is the embedded
	// default.
	Provider    string             `yaml:"provider"`
	Fake        FakeOptions        `yaml:"fake"`
	Local       LocalOptions       `yaml:"local"`
	OpenSandbox OpenSandboxOptions `yaml:"opensandbox"`
	// Pool keeps started sandboxes ready for seeds.
	Pool PoolOptions `yaml:"pool"`
}

// PoolOptions are sandbox.pool: warm pools of started sandboxes, one per
// template (a keyed seed's forks) or per spec (an unkeyed seed's).
type PoolOptions struct {
	// Size is how many sandboxes each pool keeps ready (0: no pools).
	Size int `yaml:"size"`
	// MaxIdle stops a pooled sandbox no seed claimed for that long (0:
	// never).
	MaxIdle time.Duration `yaml:"max_idle"`
	// RefillConcurrency bounds the pools' starts in flight.
	RefillConcurrency int `yaml:"refill_concurrency"`
}

// Defaults of sandbox.pool.
const (
	DefaultPoolMaxIdle           = 10 * time.Minute
	DefaultPoolRefillConcurrency = 4
)

// OpenSandboxOptions configure the OpenSandbox provider (package
// provider/opensandbox).
type OpenSandboxOptions struct {
	// Domain is host:port of the lifecycle server.
	Domain   string `yaml:"domain"`
	Protocol string `yaml:"protocol"`
	// APIKey is sent as OPEN-SANDBOX-API-KEY; empty reads
	// OPEN_SANDBOX_API_KEY.
	APIKey         string `yaml:"api_key"`
	UseServerProxy bool   `yaml:"use_server_proxy"`
	// TTLSeconds is every sandbox's lease, renewed by the owner.
	TTLSeconds int `yaml:"ttl_s"`
	// Images maps a spec's image name to an image URI.
	Images                 map[string]string    `yaml:"images"`
	Resources              OpenSandboxResources `yaml:"resources"`
	RequestTimeoutSeconds  float64              `yaml:"request_timeout_s"`
	ReadyTimeoutSeconds    float64              `yaml:"ready_timeout_s"`
	MaxConcurrentSnapshots int                  `yaml:"max_concurrent_snapshots"`
	// SkipSnapshotProbe: the runtime is known to take snapshots, so the
	// startup probe (a sandbox started, snapshotted and deleted, seconds
	// on a Docker runtime) is not run.
	SkipSnapshotProbe bool `yaml:"skip_snapshot_probe"`
	// Lend is what /sandbox_access hands agents: "server" (this server's
	// sandbox API) or "direct" (execd's endpoint and headers).
	Lend string `yaml:"lend"`
}

// OpenSandboxResources are the resourceLimits of sandboxes whose spec asks
// for none, in Kubernetes quantities ("500m", "2Gi").
type OpenSandboxResources struct {
	CPU    string `yaml:"cpu"`
	Memory string `yaml:"memory"`
}

// Lend modes of sandbox.opensandbox.lend.
const (
	LendServer = "server"
	LendDirect = "direct"
)

// FakeOptions configure the in-memory fake provider.
type FakeOptions struct {
	Seed     int64  `yaml:"seed"`
	IDPrefix string `yaml:"id_prefix"`
}

// LocalOptions configure the local provider (package provider/local).
type LocalOptions struct {
	Root           string            `yaml:"root"`
	Templates      map[string]string `yaml:"templates"`
	Isolation      string            `yaml:"isolation"`
	Overlay        string            `yaml:"overlay"`
	DefaultWorkdir string            `yaml:"default_workdir"`
	// Caches places named shared caches: name → host directory (default
	// <root>/caches/<name>).
	Caches map[string]string `yaml:"caches"`
	// UID and GID are the unprivileged host ids sandbox trees belong to on
	// disk, and that sandboxed commands run as with uid_range none (0
	// means the default, 65534; never root).
	UID int `yaml:"uid"`
	GID int `yaml:"gid"`
	// UIDRange is the block of host uids isolated sandboxes get one each
	// of ("FIRST-LAST"; "none": every sandbox runs as UID).
	UIDRange string `yaml:"uid_range"`
	// ROBinds are more host paths sandboxes see read-only (a toolchain).
	ROBinds []string `yaml:"ro_binds"`
	// Limits bound each sandbox through cgroups, where the host offers them.
	Limits LocalLimits `yaml:"limits"`
	// CPUWeightMax bounds the CPU weight of all sandboxes together
	// against the host's other processes, in busy processes' worth (0: the
	// default, local.DefaultCPUWeightMax).
	CPUWeightMax float64 `yaml:"cpu_weight_max"`
	// MaxExecTimeout caps a command's timeout_ms (a Go duration, "30m").
	MaxExecTimeout string `yaml:"max_exec_timeout"`
	// MaxFileBytes caps one file read or written through the sandbox API
	// or by a resources server (0: the default, 64 MiB).
	MaxFileBytes int64 `yaml:"max_file_bytes"`
	// Seccomp is the syscall filter of sandboxed commands: default, off,
	// or a file holding a compiled BPF program.
	Seccomp string `yaml:"seccomp"`
	// InitBinary is a separate init binary (cmd/sandbox-init) sandboxes'
	// inits run instead of the server's own ("": the server's own).
	InitBinary string `yaml:"init_binary"`
	// SnapshotDir is where snapshots go instead of <root>/snapshots: a
	// shared filesystem, so that a server on another machine restores them.
	SnapshotDir string `yaml:"snapshot_dir"`
	// SnapshotDelayMS and ForkDelayMS hold each snapshot and fork, for
	// crash tests that kill the server mid-commit or mid-restore.
	SnapshotDelayMS int `yaml:"snapshot_delay_ms"`
	ForkDelayMS     int `yaml:"fork_delay_ms"`
}

// LocalLimits are one sandbox's limits (0: the default; -1: none).
type LocalLimits struct {
	Pids     int     `yaml:"pids"`
	MemoryMB int     `yaml:"memory_mb"`
	CPUs     float64 `yaml:"cpus"`
	// DiskMB and DiskInodes size each sandbox's filesystem of its own.
	DiskMB     int `yaml:"disk_mb"`
	DiskInodes int `yaml:"disk_inodes"`
}

// CheckpointConfig is the checkpoint block.
type CheckpointConfig struct {
	Enabled           bool    `yaml:"enabled"`
	StateDir          string  `yaml:"state_dir"`
	ControlAuthToken  string  `yaml:"control_auth_token"`
	Parallelism       int     `yaml:"parallelism"`
	OnStop            string  `yaml:"on_stop"`
	LeaseGraceSeconds float64 `yaml:"lease_grace_seconds"`
	// MaxDeadlineSeconds bounds how far ahead a prepare's or a renew's
	// deadline_ts may be.
	MaxDeadlineSeconds float64 `yaml:"max_deadline_seconds"`
	// Retention follows the controller's deletion of checkpoint
	// directories.
	Retention RetentionConfig `yaml:"retention"`
}

// DefaultRetentionPeriodS is checkpoint.retention.period_s's default.
const DefaultRetentionPeriodS = 60

// RetentionConfig is checkpoint.retention.
type RetentionConfig struct {
	// FollowDirs drops a checkpoint whose checkpoint_dir is gone.
	FollowDirs bool `yaml:"follow_dirs"`
	// GraceS is how long a directory must be seen gone before its
	// checkpoint is dropped.
	GraceS float64 `yaml:"grace_s"`
	// PeriodS is how often the directories are checked (besides every
	// commit).
	PeriodS float64 `yaml:"period_s"`
}

// SweepConfig is the sweep block: the sweep a running server makes on a
// period (the same decisions as `server sweep -reap`, with what its
// sessions hold kept), and how long each kind waits before it is removed.
type SweepConfig struct {
	// Interval is the period (0: no sweep in the server).
	Interval  time.Duration        `yaml:"interval"`
	Retention SweepRetentionConfig `yaml:"retention"`
}

// SweepRetentionConfig is sweep.retention: a duration per kind.
type SweepRetentionConfig struct {
	// Orphans: how long a sandbox or snapshot of the server's must be seen
	// unaccounted for before it is removed.
	Orphans time.Duration `yaml:"orphans"`
	// PendingDeletes: how old a pending delete (a tombstoned snapshot) must
	// be before the sweep retries it.
	PendingDeletes time.Duration `yaml:"pending_deletes"`
	// Templates: how long a keyed setup's template may go unused before
	// the sweep drops it.
	Templates time.Duration `yaml:"templates"`
}

// Defaults of the sweep block.
const (
	DefaultSweepInterval       = 10 * time.Minute
	DefaultSweepOrphans        = time.Hour
	DefaultSweepPendingDeletes = 10 * time.Minute
	DefaultSweepTemplates      = time.Hour
)

// HTTPConfig is the http block: what one client may cost the server.
type HTTPConfig struct {
	// ReadTimeout bounds reading a request, headers and body (408 after).
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing a response to a client that reads slowly.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes a keep-alive connection with no request.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConns bounds the connections served at once (503 past it).
	MaxConns int `yaml:"max_conns"`
	// MaxConnsPerIP bounds one client address's connections (429 past it).
	MaxConnsPerIP int `yaml:"max_conns_per_ip"`
}

// Defaults is the configuration with no file and no flags: a notes server on
// 127.0.0.1:8080 on the embedded default provider, checkpointing off.
func Defaults() Config {
	return Config{
		Name:       "notes",
		Resources:  "notes",
		Host:       "127.0.0.1",
		Port:       8080,
		NumWorkers: 1,
		Sandbox: SandboxConfig{OpenSandbox: OpenSandboxOptions{
			Protocol: "http", TTLSeconds: 3600, Lend: LendServer,
		}, Pool: PoolOptions{MaxIdle: DefaultPoolMaxIdle, RefillConcurrency: DefaultPoolRefillConcurrency}},
		Checkpoint: CheckpointConfig{Parallelism: 16, OnStop: "kill", LeaseGraceSeconds: 600, MaxDeadlineSeconds: 3600,
			Retention: RetentionConfig{FollowDirs: true, GraceS: 300, PeriodS: DefaultRetentionPeriodS}},
		MaxSessions:        DefaultMaxSessions(),
		SessionIdleTimeout: DefaultSessionIdleTimeout,
		Sweep:              SweepConfig{Interval: DefaultSweepInterval, Retention: SweepRetentionConfig{Orphans: DefaultSweepOrphans, PendingDeletes: DefaultSweepPendingDeletes, Templates: DefaultSweepTemplates}},
		HTTP: HTTPConfig{
			ReadTimeout: httpapi.DefaultReadTimeout, WriteTimeout: httpapi.DefaultWriteTimeout, IdleTimeout: httpapi.DefaultIdleTimeout,
			MaxConns: httpapi.DefaultMaxConns, MaxConnsPerIP: httpapi.DefaultMaxConnsPerIP,
		},
	}
}

// keyUsage documents every key, for -h.
func keyUsage() map[string]string {
	return map[string]string{
		"name":                                         "the server's name (cookie, status instance, sandbox labels)",
		"resources":                                    "the resources server: notes or swebench",
		"host":                                         "address to listen on",
		"port":                                         "port to listen on (0: any free port)",
		"num_workers":                                  "worker processes: 1 (the server runs in one process; more is refused)",
		"session_secret":                               "secret for session cookies (default: generated into checkpoint.state_dir, else per process)",
		"sandbox.provider":                             "sandbox provider: fake, local or opensandbox (default: local, the embedded default)",
		"sandbox.fake.seed":                            "fake provider: seed of its latency and faults",
		"sandbox.fake.id_prefix":                       "fake provider: prefix of its ids",
		"sandbox.local.root":                           "local provider: directory of sandboxes and snapshots (default: <state_dir>/sandboxes)",
		"sandbox.local.templates":                      "local provider: image=directory (repeatable; an empty directory is an empty tree)",
		"sandbox.local.isolation":                      "local provider: auto or container (containers the server makes itself; bwrap is container), or none (unisolated) (default: auto)",
		"sandbox.local.overlay":                        "local provider: auto, on or off (default: auto)",
		"sandbox.local.default_workdir":                "local provider: workdir of specs that name none (default: /sandbox)",
		"sandbox.local.caches":                         "local provider: cache name=host directory of a named shared cache (repeatable; default <root>/caches/<name>)",
		"sandbox.local.uid":                            "local provider: host uid sandbox trees belong to on disk, and sandboxed commands run as with uid_range none (default: 65534; never root)",
		"sandbox.local.uid_range":                      "local provider: host uids isolated sandboxes get one each of, FIRST-LAST, or none (default: " + local.DefaultUIDRange + ")",
		"sandbox.local.gid":                            "local provider: host gid sandboxed commands run as (default: 65534)",
		"sandbox.local.ro_binds":                       "local provider: host path sandboxes see read-only besides /usr, /bin, /sbin, /lib*, /etc (repeatable)",
		"sandbox.local.limits.pids":                    "local provider: processes of one sandbox (default 1024; -1: no limit)",
		"sandbox.local.limits.memory_mb":               "local provider: memory of one sandbox, MiB (default 4096; -1: no limit)",
		"sandbox.local.limits.cpus":                    "local provider: CPUs of one sandbox (default 2; -1: no limit)",
		"sandbox.local.limits.disk_mb":                 "local provider: disk of one sandbox (its tree and its mounts' copies), MiB (default 10240; -1: no limit)",
		"sandbox.local.limits.disk_inodes":             "local provider: files, directories and links one sandbox may hold (default: one per 16 KiB of disk_mb)",
		"sandbox.local.max_exec_timeout":               "local provider: longest timeout a command may ask for (default 30m)",
		"sandbox.local.seccomp":                        "local provider: syscall filter of sandboxed commands: default, off, or a file holding a compiled BPF program (default: default)",
		"sandbox.local.cpu_weight_max":                 "local provider: most CPU weight all sandboxes together carry against the host's other processes, in busy processes' worth (default 64)",
		"sandbox.local.init_binary":                    "local provider: path of a sandbox-init binary (go build ./cmd/sandbox-init) each sandbox's init runs instead of the server's own binary (default: the server's own)",
		"sandbox.local.max_file_bytes":                 "local provider: largest file the server reads or writes in a sandbox, bytes (default 67108864)",
		"sandbox.local.snapshot_delay_ms":              "local provider: hold every snapshot this long (crash tests only)",
		"sandbox.local.snapshot_dir":                   "local provider: where snapshots go, on a filesystem every machine that may restore them mounts (NFS, Lustre); default <root>/snapshots, which lives and dies with the machine",
		"sandbox.local.fork_delay_ms":                  "local provider: hold every fork this long (crash tests only)",
		"sandbox.pool.size":                            "sandboxes each warm pool keeps started for seeds to claim, per template (a keyed seed's forks) or per spec (0: no pools)",
		"sandbox.pool.max_idle":                        "a pooled sandbox no seed claimed for this long is stopped, and its pool refills at the next claim, as 10m (0: never; a pooled sandbox's lease is renewed meanwhile)",
		"sandbox.pool.refill_concurrency":              "sandbox starts the warm pools make at once",
		"sandbox.opensandbox.domain":                   "opensandbox provider: host:port of the lifecycle server (required)",
		"sandbox.opensandbox.protocol":                 "opensandbox provider: http or https",
		"sandbox.opensandbox.api_key":                  "opensandbox provider: API key (default: $OPEN_SANDBOX_API_KEY)",
		"sandbox.opensandbox.use_server_proxy":         "opensandbox provider: reach execd through the server's proxy",
		"sandbox.opensandbox.ttl_s":                    "opensandbox provider: every sandbox's lease in seconds, renewed by the owner (at least 60)",
		"sandbox.opensandbox.images":                   "opensandbox provider: image name=image URI (repeatable; a name not listed is the URI)",
		"sandbox.opensandbox.resources.cpu":            "opensandbox provider: CPU limit of a sandbox (default 1)",
		"sandbox.opensandbox.resources.memory":         "opensandbox provider: memory limit of a sandbox (default 2Gi)",
		"sandbox.opensandbox.request_timeout_s":        "opensandbox provider: seconds one HTTP call may take (default 30)",
		"sandbox.opensandbox.ready_timeout_s":          "opensandbox provider: seconds a sandbox may take to run and answer (default 300)",
		"sandbox.opensandbox.max_concurrent_snapshots": "opensandbox provider: snapshots in flight; the rest queue (default 2, the server's capture limit)",
		"sandbox.opensandbox.lend":                     "opensandbox provider: what /sandbox_access hands agents: server (this server's sandbox API) or direct (execd)",
		"sandbox.opensandbox.skip_snapshot_probe":      "opensandbox provider: the runtime is known to take snapshots; skip the startup probe that starts, snapshots and deletes a sandbox",
		"checkpoint.enabled":                           "serve the checkpoint control plane",
		"checkpoint.state_dir":                         "directory of the snapshot index (required to export snapshots)",
		"checkpoint.control_auth_token":                "bearer token of the control plane (required when enabled)",
		"checkpoint.parallelism":                       "concurrent provider calls of a checkpoint operation",
		"checkpoint.on_stop":                           "what a commit with stop does with the sandboxes: kill or none",
		"checkpoint.lease_grace_seconds":               "seconds past deadline_ts before an open checkpoint resumes itself",
		"checkpoint.max_deadline_seconds":              "how far ahead (seconds) a prepare's or renew's deadline_ts may be; further is 422",
		"checkpoint.retention.follow_dirs":             "drop a committed checkpoint whose checkpoint_dir the controller deleted (its snapshots go as a release's)",
		"checkpoint.retention.grace_s":                 "seconds a checkpoint_dir must be seen gone (at two checks) before its checkpoint is dropped",
		"checkpoint.retention.period_s":                "seconds between checks of the checkpoint directories (every commit checks too)",
		"max_sessions":                                 "live sessions at most; a seed beyond is 503 at_capacity (0: no bound; default sized for this machine's memory)",
		"session_idle_timeout":                         "end a session with no request for this long, as 6h (0: never)",
		"sweep.interval":                               "period of the server's own sweep of sandboxes and snapshots nothing accounts for and of pending deletes, as 10m (0: none; `server sweep` still runs by hand)",
		"sweep.retention.orphans":                      "how long a sandbox or snapshot of this server's must be seen unaccounted for (no session, checkpoint or tombstone; at two sweeps at least) before the sweep removes it",
		"sweep.retention.pending_deletes":              "how old a pending delete (a snapshot tombstoned but not deleted: a fork stood on it, or its delete failed) must be before the sweep retries it",
		"sweep.retention.templates":                    "how long a template (a keyed setup's snapshot its task's seeds fork) may go unused before the sweep drops it",
		"http.read_timeout":                            "longest a request (headers and body) may take to arrive, as 30s or 2m; slower is 408 (0: the default)",
		"http.write_timeout":                           "longest a response may take to be written to the client (0: the default)",
		"http.idle_timeout":                            "a keep-alive connection with no request this long is closed (0: the default)",
		"http.max_conns":                               "connections served at once; one more is 503 and closed (0: the default)",
		"http.max_conns_per_ip":                        "connections of one client address; one more is 429 and closed (0: the default)",

		"swebench.is_verifying_golden_patch":           "swebench: grade each row's own patch and lend no sandbox",
		"swebench.evaluation_timeout":                  "swebench: seconds the eval script may run (default 1800)",
		"swebench.setup_timeout":                       "swebench: seconds for the scrub, patch extraction and patch application (default 600)",
		"swebench.repos":                               "swebench: owner/name=git repository on this machine (repeatable; the local provider's images)",
		"swebench.template_dir":                        "swebench: where each (repo, base commit) clone is kept (default: <state_dir>/swebench-templates)",
		"swebench.test_commands":                       "swebench: owner/name or instance_id=test command, for rows without eval_script (repeatable)",
		"swebench.default_test_command":                "swebench: test command of repos not in swebench.test_commands",
		"swebench.workdir":                             "swebench: the repository's path in a sandbox (default /testbed)",
		"swebench.image_namespace":                     "swebench: namespace of instance images on other providers (default swebench)",
		"swebench.fork_seeds":                          "swebench: run an instance's agent setup (scrub, pristine list) once into a template and seed every session of the instance as a fork of it (sweep.retention.templates drops it unused)",
		"swebench.test_output_cap":                     "swebench: bytes of test_output in a verify reply (default 65536)",
		"swebench.caches":                              "swebench: cache name=environment variable of a template's caches, at /caches/<name> (default gomod=GOMODCACHE, gobuild=GOCACHE)",
		"swebench.share_caches_with_agent":             "swebench: no effect (kept for old configs): caches belong to their template",
		"swebench.writable_caches":                     "swebench: caches every agent and grading sandbox gets a copy of (repeatable; default gobuild); the others are read-only",
		"swebench.std_cache_dir":                       "swebench: where Go's standard library is compiled and vetted once per toolchain, written only by a network-off sandbox that builds no code of the repository; a new environment's build cache starts as a copy (default: <template_dir>/.gostd)",
		"swebench.env_setup":                           "swebench: owner/name or instance_id=command of a template's environment step (repeatable, in order; default for a repo with go.mod: go mod download)",
		"swebench.env_setup_timeout":                   "swebench: seconds the environment step may run (default 1800)",
		"swebench.env_setup_env":                       "swebench: KEY=value in the environment step's environment only, e.g. GOPROXY (repeatable)",
		"swebench.validate":                            "swebench: run each instance's eval script once without a patch and refuse instances it shows broken (default true)",
		"swebench.max_concurrent_gradings":             "swebench: eval sandboxes at once; more verifies wait in order (default: CPUs/2, at least 1)",
		"swebench.modules":                             "swebench: owner/name=Go module path of a repository fetched from the module proxy at its base commit when not in swebench.repos (repeatable; default: SWE-bench Multilingual's Go repositories)",
		"swebench.module_proxy":                        "swebench: module proxy the sources come from (default: the first URL of GOPROXY, else https://proxy.golang.org)",
		"swebench.module_versions":                     "swebench: base commit=version of its module, for a proxy that does not resolve commits; the version's origin, when the proxy reports one, must be that commit (repeatable)",
		"swebench.go_toolchains":                       "swebench: owner/name or instance_id=Go toolchain its sandboxes run, as go1.21.13, downloaded by the environment step (repeatable; default local)",
		"swebench.while_preparing":                     "swebench: wait or refuse: a seed whose instance is being prepared waits, or is 503 environment_preparing with Retry-After at once (default wait)",
		"swebench.progress_interval":                   "swebench: seconds between the log lines of a preparation under way (default 10)",
		"swebench.grading_guard.keep_test_files":       "swebench: grade the model patch's changes to test files the test patch does not touch (default: they keep their base content)",
		"swebench.grading_guard.keep_vendor":           "swebench: grade the model patch's changes under vendor/ (default: left out)",
		"swebench.grading_guard.keep_module_changes":   "swebench: grade go.mod replace directives, protected-module changes and go.work files of the model patch (default: left out)",
		"swebench.grading_guard.protected_modules":     "swebench: module path whose go.mod requirement a model patch may not change (repeatable; default: common assertion libraries)",
		"swebench.grading_guard.paths":                 "swebench: path pattern (or directory/) whose changes in a model patch are left out of the grading (repeatable)",
		"swebench.grading_guard.allow_exiting_init":    "swebench: grade patches whose added files or lines end the test binary from an init or TestMain (default: reward 0)",
		"swebench.apply_anti_cheating":                 "swebench: run the anti-cheat scrub at seed (default true); a scrub that fails is logged and the seed goes on",
		"swebench.clear_swebench_debug_logs":           "swebench: keep no grading files under log_dir (default true; the golden-patch instance keeps them)",
		"swebench.log_dir":                             "swebench: where verifies keep their grading's files, run_evaluation/<session>/<instance> (default: <state_dir>/swebench-logs)",
		"swebench.sandbox_provider":                    "swebench: upstream's name of the sandbox block; only sandbox is accepted",
		"swebench.sandbox_checkpoint.parallelism":      "swebench: upstream's checkpointer parallelism; set, it wins over checkpoint.parallelism",
		"swebench.sandbox_checkpoint.on_stop":          "swebench: upstream's checkpointer on_stop (kill or none); set, it wins over checkpoint.on_stop",
		"swebench.sandbox_config.ttl_s":                "swebench: sandbox lease in seconds",
		"swebench.sandbox_config.ready_timeout_s":      "swebench: seconds a sandbox start may take",
		"swebench.sandbox_config.resources.cpu":        "swebench: CPUs a sandbox asks for",
		"swebench.sandbox_config.resources.memory_mib": "swebench: memory a sandbox asks for, MiB",
		"swebench.sandbox_config.resources.disk_gib":   "swebench: disk a sandbox asks for, GiB",
		"swebench.sandbox_config.resources.gpu":        "swebench: GPUs a sandbox asks for",
		"swebench.sandbox_config.resources.gpu_type":   "swebench: GPU type a sandbox asks for",
		"swebench.sandbox_config.env":                  "swebench: KEY=value in every sandbox command's environment (repeatable)",
		"swebench.sandbox_config.metadata":             "swebench: key=value sandbox labels (repeatable)",
		"swebench.sandbox_config.network":              "swebench: let sandbox commands reach the network (module downloads)",
		"swebench.sandbox_config.provider_options":     "swebench: key=value passed to the provider (repeatable)",
	}
}

// Options are a parsed command line.
type Options struct {
	Config Config
	// ConfigFile is -config ("" for none).
	ConfigFile string
	// LogFormat is "text" or "json".
	LogFormat string
	LogLevel  string
	// AccessLog is -access-log: one log line per request.
	AccessLog bool
	// Pprof is -pprof: serve Go's profiles under /debug/pprof/.
	Pprof bool
}

// leaf is one configuration key.
type leaf struct {
	path  string
	index []int
	typ   reflect.Type
}

// leaves lists Config's keys by their dotted YAML paths.
func leaves() []leaf {
	var out []leaf
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			idx := append(append([]int(nil), index...), i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, prefix+name+".", idx)
				continue
			}
			out = append(out, leaf{path: prefix + name, index: idx, typ: f.Type})
		}
	}
	walk(reflect.TypeOf(Config{}), "", nil)
	return out
}

// setLeaf parses s into the key's field of c.
func setLeaf(c *Config, l leaf, s string) error {
	v := reflect.ValueOf(c).Elem().FieldByIndex(l.index)
	bad := func() error { return fmt.Errorf("%s: want %s, got %q", l.path, wantOf(l.typ), s) }
	if l.typ == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return bad()
		}
		v.SetInt(int64(d))
		return nil
	}
	switch l.typ.Kind() {
	case reflect.String:
		v.SetString(s)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return bad()
		}
		v.SetInt(n)
	case reflect.Float64:
		f, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return bad()
		}
		v.SetFloat(f)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return bad()
		}
		v.SetBool(b)
	case reflect.Pointer:
		// An optional bool (unset keeps its default).
		if l.typ.Elem().Kind() != reflect.Bool {
			return fmt.Errorf("%s cannot be set by a flag", l.path)
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			return bad()
		}
		v.Set(reflect.ValueOf(&b))
	case reflect.Map:
		k, val, ok := strings.Cut(s, "=")
		if !ok || k == "" {
			return fmt.Errorf("%s: want key=value, got %q", l.path, s)
		}
		if v.IsNil() {
			v.Set(reflect.MakeMap(l.typ))
		}
		if l.typ.Elem().Kind() == reflect.Slice {
			// A list per key: each flag adds one entry to its key's list.
			list := v.MapIndex(reflect.ValueOf(k))
			if !list.IsValid() {
				list = reflect.MakeSlice(l.typ.Elem(), 0, 1)
			}
			v.SetMapIndex(reflect.ValueOf(k), reflect.Append(list, reflect.ValueOf(val)))
			break
		}
		v.SetMapIndex(reflect.ValueOf(k), reflect.ValueOf(val))
	case reflect.Slice:
		if l.typ.Elem().Kind() != reflect.String {
			return fmt.Errorf("%s cannot be set by a flag", l.path)
		}
		v.Set(reflect.Append(v, reflect.ValueOf(s)))
	default:
		return fmt.Errorf("%s cannot be set by a flag", l.path)
	}
	return nil
}

// flagValue records a key's flag values in order, to apply over the file.
type flagValue struct {
	l   leaf
	set *[]setting
	// bad keeps the first value refused, so that the error names the key
	// in our words rather than the flag package's.
	bad *error
}

type setting struct {
	l leaf
	v string
}

func (f flagValue) String() string { return "" }
func (f flagValue) Set(s string) error {
	var probe Config
	if err := setLeaf(&probe, f.l, s); err != nil {
		if *f.bad == nil {
			*f.bad = err
		}
		return err
	}
	*f.set = append(*f.set, setting{f.l, s})
	return nil
}
func (f flagValue) IsBoolFlag() bool {
	return f.l.typ.Kind() == reflect.Bool || (f.l.typ.Kind() == reflect.Pointer && f.l.typ.Elem().Kind() == reflect.Bool)
}

// ownFlags are the binary's flags that are not configuration keys: name,
// placeholder, meaning.
func ownFlags() [][3]string {
	return [][3]string{
		{"config", "FILE", "YAML configuration file"},
		{"log-format", "text|json", "log format, also of a configuration error's line (default text)"},
		{"log-level", "LEVEL", "debug, info, warn or error (default info)"},
		{"access-log", "", "log one line per request: method, route, status, duration (seconds), session_id"},
		{"pprof", "", "serve Go's profiles under /debug/pprof/ (on the server's own address: for trusted networks)"},
	}
}

// LogFormatOf is the -log-format an argument list asks for ("text" when it
// names none), read before the arguments are parsed so that an error in
// them is reported in that format too.
func LogFormatOf(args []string) string {
	format := "text"
	for i := 0; i < len(args); i++ {
		a := strings.TrimPrefix(strings.TrimPrefix(args[i], "-"), "-")
		if a == args[i] {
			continue
		}
		if v, ok := strings.CutPrefix(a, "log-format="); ok {
			format = v
		} else if a == "log-format" && i+1 < len(args) {
			format = args[i+1]
			i++
		}
	}
	return format
}

// ParseArgs parses the command line: -config FILE, -log-format, -log-level
// and one flag per configuration key. Flags win over the file, the file over
// the defaults. -h gives flag.ErrHelp (usage written to help).
func ParseArgs(args []string, helpOut io.Writer) (Options, error) {
	opts := Options{LogFormat: "text", LogLevel: "info"}
	fs := flag.NewFlagSet("server", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&opts.ConfigFile, "config", "", "")
	fs.StringVar(&opts.LogFormat, "log-format", opts.LogFormat, "")
	fs.StringVar(&opts.LogLevel, "log-level", opts.LogLevel, "")
	fs.BoolVar(&opts.AccessLog, "access-log", false, "")
	fs.BoolVar(&opts.Pprof, "pprof", false, "")
	var settings []setting
	var bad error
	for _, l := range leaves() {
		fs.Var(flagValue{l: l, set: &settings, bad: &bad}, l.path, "")
	}
	if err := fs.Parse(args); err != nil {
		switch {
		case errors.Is(err, flag.ErrHelp):
			writeUsage(helpOut, ownFlags())
			return opts, err
		case bad != nil:
			return opts, fmt.Errorf("%w: flag -%w", ErrConfig, bad)
		}
		if name, ok := strings.CutPrefix(err.Error(), "flag provided but not defined: -"); ok {
			return opts, fmt.Errorf("%w: flag -%s: %s", ErrConfig, name, unknownFlag(name))
		}
		return opts, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	if fs.NArg() > 0 {
		return opts, fmt.Errorf("%w: unexpected argument %q (commands come first: %s)", ErrConfig, fs.Arg(0), strings.Join(slices.Sorted(maps.Keys(commands())), ", "))
	}
	if opts.LogFormat != "text" && opts.LogFormat != "json" {
		return opts, fmt.Errorf("%w: -log-format: want text or json, got %q", ErrConfig, opts.LogFormat)
	}
	cfg := Defaults()
	if opts.ConfigFile != "" {
		if err := loadFile(&cfg, opts.ConfigFile); err != nil {
			return opts, err
		}
	}
	for _, s := range settings {
		if err := setLeaf(&cfg, s.l, s.v); err != nil {
			return opts, fmt.Errorf("%w: flag -%w", ErrConfig, err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return opts, err
	}
	opts.Config = cfg
	return opts, nil
}

// unknownFlag words an unknown flag as an unknown key, with the nearest one.
func unknownFlag(name string) string {
	name, _, _ = strings.Cut(name, "=")
	prefix := ""
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		prefix = name[:i]
	}
	siblings := map[string][]int{}
	for _, l := range leaves() {
		p, last := "", l.path
		if i := strings.LastIndexByte(l.path, '.'); i >= 0 {
			p, last = l.path[:i], l.path[i+1:]
		}
		if p == prefix {
			siblings[last] = nil
		}
	}
	if prefix == "" {
		for _, f := range ownFlags() {
			siblings[f[0]] = nil
		}
	}
	return unknownKey(name, siblings, prefix)
}

func loadFile(cfg *Config, path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		// A syntax error: yaml's message has the line.
		msg := strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", ";")), " ")
		return fmt.Errorf("%w: %s: %s", ErrConfig, path, msg)
	}
	if err := decodeNode(&doc, reflect.ValueOf(cfg).Elem(), ""); err != nil {
		return fmt.Errorf("%w: %s:%w", ErrConfig, path, err)
	}
	return nil
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]*$`)

// Validate checks what can be checked without starting anything.
func (c *Config) Validate() error { return c.validate(nil) }

// validate is Validate for a server on the given provider (nil: the one
// the configuration names).
func (c *Config) validate(given provider.Provider) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
	}
	if !namePattern.MatchString(c.Name) {
		return bad("name %q must match %s", c.Name, namePattern)
	}
	if _, ok := resourcesRegistry()[c.Resources]; !ok {
		return bad("resources must be one of %s, not %q", strings.Join(slices.Sorted(maps.Keys(resourcesRegistry())), ", "), c.Resources)
	}
	if c.Port < 0 || c.Port > 65535 {
		return bad("port must be 0-65535, not %d", c.Port)
	}
	if lo := c.Sandbox.Local; lo.UID < 0 || lo.GID < 0 {
		return bad("sandbox.local.uid and gid must not be negative")
	}
	if c.Sandbox.Local.MaxFileBytes < 0 {
		return bad("sandbox.local.max_file_bytes must not be negative")
	}
	if c.Sandbox.Local.CPUWeightMax < 0 {
		return bad("sandbox.local.cpu_weight_max must not be negative, not %g", c.Sandbox.Local.CPUWeightMax)
	}
	if t := c.Sandbox.Local.MaxExecTimeout; t != "" {
		if d, err := time.ParseDuration(t); err != nil || d <= 0 {
			return bad("sandbox.local.max_exec_timeout: want a positive duration such as 30m, got %q", t)
		}
	}
	if c.NumWorkers < 1 {
		return bad("num_workers must be at least 1, not %d", c.NumWorkers)
	}
	if c.NumWorkers > 1 {
		// Upstream starts that many worker processes; here nothing would,
		// and a silent 1 misleads whoever sized a machine by it.
		return bad("num_workers: want 1, got %d (this server runs in one process and serves all sessions concurrently; swebench.max_concurrent_gradings bounds the gradings)", c.NumWorkers)
	}
	if c.SessionSecret != "" && len(c.SessionSecret) < 16 {
		return bad("session_secret must be at least 16 characters")
	}
	if p := c.Sandbox.Provider; p != "" {
		if _, ok := providerRegistry()[p]; !ok {
			return bad("sandbox.provider must be one of %s, not %q", strings.Join(slices.Sorted(maps.Keys(providerRegistry())), ", "), p)
		}
	}
	if err := c.Sandbox.OpenSandbox.validate(c.Sandbox.Provider == "opensandbox"); err != nil {
		return bad("%v", err)
	}
	ck := c.Checkpoint
	if ck.Enabled && ck.ControlAuthToken == "" {
		return bad("checkpoint.control_auth_token is required when checkpoint.enabled is true")
	}
	if ck.LeaseGraceSeconds <= 0 {
		return bad("checkpoint.lease_grace_seconds must be > 0, not %v", ck.LeaseGraceSeconds)
	}
	if ck.Retention.GraceS < 0 {
		return bad("checkpoint.retention.grace_s must not be negative, not %v", ck.Retention.GraceS)
	}
	if ck.Retention.PeriodS < 0 {
		return bad("checkpoint.retention.period_s must be > 0 (0: the default, %v), not %v", DefaultRetentionPeriodS, ck.Retention.PeriodS)
	}
	if ck.MaxDeadlineSeconds < 0 {
		return bad("checkpoint.max_deadline_seconds must be > 0 (0: the default, 3600), not %v", ck.MaxDeadlineSeconds)
	}
	for _, d := range []struct {
		key string
		v   time.Duration
	}{{"http.read_timeout", c.HTTP.ReadTimeout}, {"http.write_timeout", c.HTTP.WriteTimeout}, {"http.idle_timeout", c.HTTP.IdleTimeout},
		{"sweep.interval", c.Sweep.Interval}, {"sweep.retention.orphans", c.Sweep.Retention.Orphans}, {"sweep.retention.pending_deletes", c.Sweep.Retention.PendingDeletes},
		{"sweep.retention.templates", c.Sweep.Retention.Templates}} {
		if d.v < 0 {
			return bad("%s must not be negative, not %v", d.key, d.v)
		}
	}
	if p := c.Sandbox.Pool; p.Size < 0 || p.RefillConcurrency < 1 || p.MaxIdle < 0 {
		return bad("sandbox.pool: size must not be negative (0: no pools), refill_concurrency must be at least 1 and max_idle not negative, not %d, %d, %v", p.Size, p.RefillConcurrency, p.MaxIdle)
	}
	if c.MaxSessions < 0 {
		return bad("max_sessions must not be negative (0: no bound), not %d", c.MaxSessions)
	}
	if c.SessionIdleTimeout < 0 {
		return bad("session_idle_timeout must not be negative (0: never), not %v", c.SessionIdleTimeout)
	}
	if c.HTTP.MaxConns < 0 || c.HTTP.MaxConnsPerIP < 0 {
		return bad("http.max_conns and http.max_conns_per_ip must not be negative")
	}
	if ck.OnStop != "kill" && ck.OnStop != "none" {
		return bad("checkpoint.on_stop must be kill or none, not %q", ck.OnStop)
	}
	if ck.Parallelism < 1 {
		return bad("checkpoint.parallelism must be at least 1, not %d", ck.Parallelism)
	}
	// What the owner would refuse once the provider exists, refused before
	// anything is created: every provider here can snapshot, so a server
	// that lends sandboxes with checkpointing on exports them.
	exports := given == nil || given.Capabilities().Snapshotter != nil
	if ck.Enabled && exports && resourcesRegistry()[c.Resources].lends(c) {
		if ck.StateDir == "" {
			return bad("checkpoint.state_dir is required with checkpoint.enabled: the sessions' sandboxes are exported into its index")
		}
	}
	return nil
}

// validate checks the opensandbox block; the domain only when the provider
// is selected.
func (o OpenSandboxOptions) validate(selected bool) error {
	switch {
	case selected && o.Domain == "":
		return errors.New("sandbox.opensandbox.domain (host:port of the lifecycle server) is required with sandbox.provider opensandbox")
	case strings.Contains(o.Domain, "://"):
		return fmt.Errorf("sandbox.opensandbox.domain must be host:port without a scheme, not %q", o.Domain)
	case o.Protocol != "http" && o.Protocol != "https":
		return fmt.Errorf("sandbox.opensandbox.protocol must be http or https, not %q", o.Protocol)
	case o.TTLSeconds < 60:
		return fmt.Errorf("sandbox.opensandbox.ttl_s must be at least 60 (the server's minimum), not %d", o.TTLSeconds)
	case o.RequestTimeoutSeconds < 0 || o.ReadyTimeoutSeconds < 0:
		return errors.New("sandbox.opensandbox.request_timeout_s and ready_timeout_s must not be negative")
	case o.MaxConcurrentSnapshots < 0:
		return fmt.Errorf("sandbox.opensandbox.max_concurrent_snapshots must not be negative, not %d", o.MaxConcurrentSnapshots)
	case o.Lend != LendServer && o.Lend != LendDirect:
		return fmt.Errorf("sandbox.opensandbox.lend must be %s or %s, not %q", LendServer, LendDirect, o.Lend)
	}
	return nil
}
