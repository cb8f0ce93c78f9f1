package app

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/provider/opensandbox"
)

// DefaultProvider is the embedded default: what a server with no
// sandbox.provider runs on.
const DefaultProvider = "local"

// providerEnv is what a provider factory may use besides the config.
type providerEnv struct {
	log *logrus.Logger
	clk clock.Clock
	// templates are images the resources server needs (the notes server's
	// empty "notes" image), added where the config names none.
	templates map[string]string
	// hide are host paths sandboxes must never see (the config file).
	hide []string
	// serving: the provider is a server's, which owns its sandbox root
	// alone (the sweep's is not).
	serving bool
	// onPause hears how long each snapshot paused its sandbox (the local
	// provider's), for the metrics.
	onPause func(sandboxID string, paused time.Duration)
}

// providerFactory builds one provider from its options in the config.
type providerFactory func(cfg *Config, env providerEnv) (provider.Provider, error)

// providerRegistry maps sandbox.provider values to their factories. Adding a
// provider is one entry here and its options block in SandboxConfig.
func providerRegistry() map[string]providerFactory {
	return map[string]providerFactory{
		"fake":        newFakeProvider,
		"local":       newLocalProvider,
		"opensandbox": newOpenSandboxProvider,
	}
}

func newFakeProvider(cfg *Config, env providerEnv) (provider.Provider, error) {
	o := cfg.Sandbox.Fake
	return fake.New(fake.Options{Clock: env.clk, Seed: o.Seed, IDPrefix: o.IDPrefix}), nil
}

func newLocalProvider(cfg *Config, env providerEnv) (provider.Provider, error) {
	o := cfg.Sandbox.Local
	root := o.Root
	if root == "" {
		if cfg.Checkpoint.StateDir != "" {
			root = filepath.Join(cfg.Checkpoint.StateDir, "sandboxes")
		} else {
			root = filepath.Join(os.TempDir(), "sandboxowner-"+cfg.Name, "sandboxes")
		}
	}
	templates := map[string]string{}
	for k, v := range env.templates {
		templates[k] = v
	}
	for k, v := range o.Templates {
		templates[k] = v
	}
	hide := slices.Clone(env.hide)
	if cfg.Checkpoint.StateDir != "" {
		hide = append(hide, cfg.Checkpoint.StateDir)
	}
	if o.SnapshotDir != "" {
		hide = append(hide, o.SnapshotDir)
	}
	for i, h := range hide {
		if abs, err := filepath.Abs(h); err == nil {
			hide[i] = abs
		}
	}
	var maxExec time.Duration
	if o.MaxExecTimeout != "" {
		maxExec, _ = time.ParseDuration(o.MaxExecTimeout) // checked by Validate
	}
	p, err := local.New(local.Options{
		Root:           root,
		Templates:      templates,
		Isolation:      o.Isolation,
		Overlay:        o.Overlay,
		DefaultWorkdir: o.DefaultWorkdir,
		Caches:         o.Caches,
		UID:            o.UID,
		GID:            o.GID,
		UIDRange:       o.UIDRange,
		ROBinds:        o.ROBinds,
		Limits:         local.Limits{Pids: o.Limits.Pids, MemoryMB: o.Limits.MemoryMB, CPUs: o.Limits.CPUs, DiskMB: o.Limits.DiskMB, DiskInodes: o.Limits.DiskInodes},
		CPUWeightMax:   o.CPUWeightMax,
		MaxExecTimeout: maxExec,
		MaxFileBytes:   o.MaxFileBytes,
		Seccomp:        o.Seccomp,
		InitBinary:     o.InitBinary,
		Hide:           hide,
		SnapshotDir:    o.SnapshotDir,
		SnapshotDelay:  time.Duration(o.SnapshotDelayMS) * time.Millisecond,
		ForkDelay:      time.Duration(o.ForkDelayMS) * time.Millisecond,
		Exclusive:      env.serving,
		OnPause:        env.onPause,
		Clock:          env.clk,
		Logger:         env.log.WithField("provider", "local"),
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox.local (root %s): %w", root, err)
	}
	return p, nil
}

func newOpenSandboxProvider(cfg *Config, env providerEnv) (provider.Provider, error) {
	o := cfg.Sandbox.OpenSandbox
	key := o.APIKey
	if key == "" {
		key = os.Getenv(opensandbox.APIKeyEnv)
	}
	secs := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	p, err := opensandbox.New(opensandbox.Options{
		Domain:                 o.Domain,
		Protocol:               o.Protocol,
		APIKey:                 key,
		UseServerProxy:         o.UseServerProxy,
		TTL:                    time.Duration(o.TTLSeconds) * time.Second,
		Images:                 o.Images,
		CPU:                    o.Resources.CPU,
		Memory:                 o.Resources.Memory,
		RequestTimeout:         secs(o.RequestTimeoutSeconds),
		ReadyTimeout:           secs(o.ReadyTimeoutSeconds),
		MaxConcurrentSnapshots: o.MaxConcurrentSnapshots,
		// The server may not filter by metadata: list only this server's.
		ListLabels: map[string]string{owner.LabelOwner: cfg.Name},
		Clock:      env.clk,
		Logger:     env.log,
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox.opensandbox: %w", err)
	}
	return p, nil
}

// probeSnapshots asks a remote provider whether its runtime takes snapshots
// at all (one answers 501 only of a running sandbox), with a sandbox like a
// session's of res: the error a provider without them gave, which makes the
// owner restart_only, or nil. A probe that fails otherwise is logged and
// changes nothing: commits then say what is wrong.
func probeSnapshots(ctx context.Context, prov provider.Provider, res any, name string, log logrus.FieldLogger) error {
	pr, ok := prov.(interface {
		ProbeSnapshots(context.Context, provider.Spec) error
	})
	sp, ok2 := res.(interface{ ProbeSpec() provider.Spec })
	if !ok || !ok2 {
		return nil
	}
	spec := sp.ProbeSpec()
	// Labelled as this server's, so that a startup sweep reclaims what a
	// probe cut short left.
	spec.Metadata = map[string]string{owner.LabelOwner: name}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := pr.ProbeSnapshots(pctx, spec)
	switch {
	case errors.Is(err, provider.ErrUnsupported):
		return err
	case err != nil:
		log.Errorf("sandbox provider at startup: could not tell whether it takes snapshots: %v", err)
	}
	return nil
}

// withoutSnapshots hides a provider's optional capabilities, for a server
// that lends no sandboxes: its owner then runs restart_only, and the
// provider still serves sandboxes that are not session state (grading).
type withoutSnapshots struct{ provider.Provider }

// Capabilities: none of the provider's interfaces, only what it says of its
// sandboxes.
func (w withoutSnapshots) Capabilities() provider.Capabilities {
	c := w.Provider.Capabilities()
	return provider.Capabilities{RegularFiles: c.RegularFiles, HostTools: c.HostTools, HostMounts: c.HostMounts}
}

// hidden lists the non-empty paths.
func hidden(paths ...string) []string {
	var out []string
	for _, p := range paths {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

// seccompOf is the syscall filter of prov's sandboxed commands, for
// /health: the local provider says; others filter their own way.
func seccompOf(prov provider.Provider) string {
	return localReport(prov, func(l localReporter) string { return l.Seccomp() })
}

// limitsOf is what limits prov enforces on its sandboxes, for /health:
// the local provider says (only the limits it found enforced).
func limitsOf(prov provider.Provider) string {
	return localReport(prov, func(l localReporter) string { return l.LimitsInEffect() })
}

// localReporter is what the local provider says of its sandboxes.
type localReporter interface {
	Seccomp() string
	LimitsInEffect() string
}

// localReport is f of prov when it is the local provider, else "".
func localReport(prov provider.Provider, f func(localReporter) string) string {
	if l, ok := prov.(localReporter); ok {
		return f(l)
	}
	return ""
}

// isolationOf is how prov holds sandboxed commands, for /health: the
// local provider says ("container", "none", or "unavailable" where the
// kernel refuses containers); others hold them their own way.
func isolationOf(prov provider.Provider) string {
	if i, ok := prov.(interface{ Isolation() string }); ok {
		return i.Isolation()
	}
	return ""
}
