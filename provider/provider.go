// Package provider is the sandbox provider interface that the owner and the
// resources servers are written against.
//
// A Provider starts, stops and runs commands in sandboxes. What else it can
// do it states as a value, its Capabilities, which callers ask instead of
// its type or name (so a wrapper, such as the metrics one, passes them on
// by returning them, wrapped or not, rather than by having the same
// methods):
//
//   - Snapshotter: take a snapshot a fork can start from, fork, delete.
//   - Leaser: move a sandbox's lease (an absolute expiry) forward.
//   - Lister: list sandboxes and snapshots, for the operator sweep and for
//     leak checks.
//   - FileOpener: hand out a file as a stream.
//   - RegularFiles: file calls refuse what is not a regular file.
//   - HostTools: sandboxes run on this machine and see its tools.
//
// Spec and Handle round-trip through JSON: a Handle written into the snapshot
// index by one process is enough for a fresh process to stop that sandbox.
//
// Every call takes a context; a provider must return when it ends. Errors that
// callers branch on are the sentinels below, wrapped with %w.
package provider

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors. Providers wrap them (fmt.Errorf("...: %w", ErrX)) so that
// callers can use errors.Is.
var (
	// ErrSandboxNotFound: the sandbox does not exist (never did, was
	// stopped, or its lease ran out).
	ErrSandboxNotFound = errors.New("provider: sandbox not found")
	// ErrSnapshotNotFound: the snapshot does not exist.
	ErrSnapshotNotFound = errors.New("provider: snapshot not found")
	// ErrUnsupported: the provider cannot do what was asked (a command the
	// fake does not understand, a capability it lacks).
	ErrUnsupported = errors.New("provider: unsupported")
	// ErrPathEscape: a file path leaves the sandbox.
	ErrPathEscape = errors.New("provider: path escapes the sandbox")
	// ErrInvalidSpec: the spec cannot be started (unknown image, bad option).
	ErrInvalidSpec = errors.New("provider: invalid spec")
	// ErrSnapshotInUse: the snapshot cannot be deleted yet because a live
	// sandbox was forked from it; deleting it again once that sandbox is
	// gone succeeds.
	ErrSnapshotInUse = errors.New("provider: snapshot in use by a fork")
	// ErrUnavailable: the provider's backend (a remote server) cannot be
	// reached; the call may succeed later.
	ErrUnavailable = errors.New("provider: unavailable")
	// ErrOutcomeLost, beside ErrUnavailable: a command was sent and may
	// have run (or did), but its outcome did not come back. Running it
	// again runs it twice.
	ErrOutcomeLost = errors.New("provider: the command's outcome was lost")
	// ErrInjected marks a failure injected by a fault-injecting provider, so
	// tests can tell it from a real one.
	ErrInjected = errors.New("provider: injected fault")
	// ErrFileTooLarge: a file is larger than the caller (or the provider's
	// cap) lets it read or write.
	ErrFileTooLarge = errors.New("provider: file too large")
	// ErrNotRegular: a file call met a directory, FIFO, device or socket
	// where a regular file was expected.
	ErrNotRegular = errors.New("provider: not a regular file")
)

// Resources are the compute a sandbox asks for. Providers that cannot enforce
// them ignore them.
type Resources struct {
	CPU       float64 `json:"cpu,omitempty"`
	MemoryMiB int     `json:"memory_mib,omitempty"`
	DiskGiB   int     `json:"disk_gib,omitempty"`
	GPU       int     `json:"gpu,omitempty"`
	GPUType   string  `json:"gpu_type,omitempty"`
}

// Spec describes a sandbox to start. Field names follow upstream's
// SandboxSpec so that records stay readable by both.
type Spec struct {
	// Image is what the sandbox starts from: a provider-specific reference
	// (an OCI image, a local template name or directory).
	Image string `json:"image,omitempty"`
	// Workdir is the directory commands run in; empty means the provider's
	// default.
	Workdir string `json:"workdir,omitempty"`
	// Env is added to every command's environment.
	Env map[string]string `json:"env,omitempty"`
	// Files are written into the sandbox at start: path -> contents.
	Files map[string]string `json:"files,omitempty"`
	// Metadata labels the sandbox (owner, session, checkpoint); Lister
	// returns it.
	Metadata map[string]string `json:"metadata,omitempty"`
	// TTLSeconds is the lease: a sandbox not renewed within it is deleted.
	// Zero means no lease.
	TTLSeconds float64 `json:"ttl_s,omitempty"`
	// ReadyTimeoutSeconds bounds how long Start waits for the sandbox.
	ReadyTimeoutSeconds float64 `json:"ready_timeout_s,omitempty"`
	// Resources the sandbox asks for.
	Resources *Resources `json:"resources,omitempty"`
	// Network asks for network access, where a provider isolates it.
	Network bool `json:"network,omitempty"`
	// Entrypoint, for providers that run one.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Ports the sandbox exposes.
	Ports []int `json:"ports,omitempty"`
	// ProviderOptions are passed through to the provider unchanged.
	ProviderOptions map[string]any `json:"provider_options,omitempty"`
}

// TTL returns the lease as a duration.
func (s Spec) TTL() time.Duration { return time.Duration(s.TTLSeconds * float64(time.Second)) }

// Handle names a running sandbox. It is plain data: a fresh process can
// unmarshal it and Stop the sandbox.
type Handle struct {
	SandboxID string `json:"sandbox_id"`
	// Provider is the Name() of the provider that made it.
	Provider string `json:"provider_name"`
	// Descriptor is provider-specific state a fresh process needs to reach
	// the sandbox again (for OpenSandbox: {"sandbox_id": id}).
	Descriptor json.RawMessage `json:"descriptor,omitempty"`
}

// String is for logs.
func (h Handle) String() string { return fmt.Sprintf("%s/%s", h.Provider, h.SandboxID) }

// Status of a sandbox, in upstream's vocabulary.
type Status string

// The states a sandbox reports.
const (
	StatusStarting Status = "starting"
	StatusRunning  Status = "running"
	StatusPaused   Status = "paused"
	StatusStopped  Status = "stopped"
	StatusError    Status = "error"
	StatusUnknown  Status = "unknown"
)

// ExecRequest is one command to run in a sandbox.
type ExecRequest struct {
	// Command is run by /bin/sh -c (providers with a shell).
	Command string
	// Cwd is relative to the workdir, or absolute inside the sandbox; empty
	// means the workdir.
	Cwd string
	// Env is added on top of the spec's env.
	Env map[string]string
	// Timeout kills the command; zero means the provider's default.
	Timeout time.Duration
}

// ExecResult is what a command did. A command that ran and failed is a
// result with a non-zero ExitCode, not an error; an error means the provider
// could not run it.
type ExecResult struct {
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	ExitCode int    `json:"exit_code"`
	// Truncated reports that stdout or stderr was cut at the provider's cap.
	Truncated bool `json:"truncated"`
	// TimedOut reports that the command was killed by its timeout.
	TimedOut bool `json:"timed_out,omitempty"`
}

// Provider is the core capability every sandbox backend has.
type Provider interface {
	// Name identifies the provider; records name it so that a restore on
	// another provider is refused.
	Name() string
	// Start returns only once the sandbox can run commands.
	Start(ctx context.Context, spec Spec) (Handle, error)
	// Stop ends the sandbox. A sandbox already gone is success.
	Stop(ctx context.Context, h Handle) error
	// Exec runs one command.
	Exec(ctx context.Context, h Handle, req ExecRequest) (ExecResult, error)
	// WriteFile writes a file inside the sandbox (relative to the workdir, or
	// absolute inside the sandbox), creating parent directories.
	WriteFile(ctx context.Context, h Handle, path string, data []byte) error
	// ReadFile reads a file inside the sandbox.
	ReadFile(ctx context.Context, h Handle, path string) ([]byte, error)
	// Status reports the sandbox's state; a missing sandbox is
	// ErrSandboxNotFound.
	Status(ctx context.Context, h Handle) (Status, error)
	// Capabilities is what else the provider can do. It is the same for
	// the provider's life.
	Capabilities() Capabilities
}

// Snapshotter is a provider that can snapshot a sandbox and fork new ones from
// the snapshot.
type Snapshotter interface {
	// Snapshot returns once a fork can be made from the snapshot. The
	// sandbox keeps running.
	Snapshot(ctx context.Context, h Handle, name string) (snapshotID string, err error)
	// Fork starts a new sandbox from a snapshot; spec supplies everything but
	// the filesystem (its Image and Files are ignored).
	Fork(ctx context.Context, spec Spec, snapshotID string) (Handle, error)
	// DeleteSnapshot deletes a snapshot. A missing snapshot is success.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
}

// Leaser is a provider whose sandboxes have leases (absolute expiry times)
// that the owner must renew.
type Leaser interface {
	// Renew moves the sandbox's expiry to expiresAt.
	Renew(ctx context.Context, h Handle, expiresAt time.Time) error
}

// StartsExpecter is told that about n more starts (or forks) will come
// soon and at once: seeds waiting for their template's build, each to fork
// it once it is built. It may make ahead, meanwhile, what each start would
// make on its own. A hint, told again for each seed that joins, and taken
// back by StartsCancelled for each told of that will not start (its seed
// cancelled or failed, or served by a warm pool): what was made for starts
// that never come is given back then, or after a bound of time the
// provider keeps, and never outlives the provider.
type StartsExpecter interface {
	ExpectStarts(n int)
	StartsCancelled(n int)
}

// SandboxInfo is one listed sandbox.
type SandboxInfo struct {
	Handle    Handle            `json:"handle"`
	Status    Status            `json:"status"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	// ExpiresAt is zero when the sandbox has no lease.
	ExpiresAt time.Time `json:"expires_at,omitempty"`
	// FromSnapshot is the snapshot the sandbox was forked from, if any.
	FromSnapshot string `json:"from_snapshot,omitempty"`
}

// SnapshotInfo is one listed snapshot.
type SnapshotInfo struct {
	ID        string            `json:"id"`
	Name      string            `json:"name,omitempty"`
	SandboxID string            `json:"sandbox_id"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
}

// Lister is a provider that can enumerate what it holds.
type Lister interface {
	ListSandboxes(ctx context.Context) ([]SandboxInfo, error)
	ListSnapshots(ctx context.Context) ([]SnapshotInfo, error)
}

// Capabilities is what a provider can do beyond Provider. A nil interface
// is a capability the provider lacks. A wrapper returns its inner
// provider's, each one it passes on wrapped or as it is, and leaves nil
// what it cannot pass on.
type Capabilities struct {
	// Snapshotter snapshots sandboxes and forks from the snapshots.
	Snapshotter Snapshotter
	// Leaser renews sandboxes' leases.
	Leaser Leaser
	// Lister lists sandboxes and snapshots.
	Lister Lister
	// FileOpener hands out files as streams (ReadFileAtMost uses it).
	FileOpener FileOpener
	// StartsExpecter is told of starts that will come soon.
	StartsExpecter StartsExpecter
	// RegularFiles: ReadFile, WriteFile and OpenFile refuse a path that is
	// a directory, FIFO, device or socket with ErrNotRegular rather than
	// reading or blocking on it.
	RegularFiles bool
	// HostTools: sandboxes run on this machine, see its tools (PATH) and
	// start from directories on it (Spec.Image names a directory or
	// template), so a caller sets their environment up from the host's.
	HostTools bool
	// HostMounts, where sandboxes mount host directories (the local
	// provider's mounts option), says where what stands on them is
	// recorded, so that a caller that deletes such directories can tell
	// which are in use, also by other servers on this machine (the local
	// provider: local.Users as JSON, which local.HostsInUse reads); empty:
	// nothing says.
	HostMounts string
}

// Flags is which capabilities c has, for logs and tests.
type Flags struct {
	Snapshot     bool `json:"snapshot"`
	Lease        bool `json:"lease"`
	List         bool `json:"list"`
	OpenFile     bool `json:"open_file"`
	RegularFiles bool `json:"regular_files"`
	HostTools    bool `json:"host_tools"`
}

// Flags is which capabilities c has.
func (c Capabilities) Flags() Flags {
	return Flags{Snapshot: c.Snapshotter != nil, Lease: c.Leaser != nil, List: c.Lister != nil,
		OpenFile: c.FileOpener != nil, RegularFiles: c.RegularFiles, HostTools: c.HostTools}
}

// StopAttempts is how often StopRetrying tries.
const StopAttempts = 3

// StopRetrying stops a sandbox that nothing else will stop if this fails (a
// failed setup's, a startup sweep's, a failed restore's forks, a superseded
// one), trying up to StopAttempts times while ctx lasts.
func StopRetrying(ctx context.Context, p Provider, h Handle) error {
	var err error
	for i := 0; i < StopAttempts; i++ {
		if err = p.Stop(ctx, h); err == nil || ctx.Err() != nil {
			return err
		}
	}
	return err
}
