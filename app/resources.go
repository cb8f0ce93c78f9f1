package app

import (
	"cmp"
	"errors"
	"os"
	"path/filepath"

	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/provider/local"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
	"github.com/sandboxowner/owner/resources/swebench"
)

// resourcesEntry builds one resources server.
type resourcesEntry struct {
	// build makes the server; met receives what it reports (SWE-bench's
	// environments and validations).
	build func(cfg *Config, met *metrics.Metrics) (resources.Resources, error)
	// templates are images the server's sandboxes start from, for
	// providers that need them declared (local).
	templates map[string]string
	// lends reports whether the configured server lends its sessions
	// sandboxes (then, with checkpointing on, it exports them).
	lends func(cfg *Config) bool
}

// resourcesRegistry maps the resources key to the servers this binary has.
func resourcesRegistry() map[string]resourcesEntry {
	return map[string]resourcesEntry{
		"notes": {
			build: func(cfg *Config, _ *metrics.Metrics) (resources.Resources, error) {
				return notes.New(notes.Options{Name: cfg.Name, Workdir: knownWorkdir(cfg)}), nil
			},
			templates: map[string]string{notes.Image: ""},
			lends:     func(*Config) bool { return true },
		},
		"swebench": {build: newSWEBench, lends: func(cfg *Config) bool { return cfg.SWEBench.LendsSandboxes() }},
	}
}

// knownWorkdir is the workdir of the sandboxes of a spec that names none,
// where the configuration says it (the local provider), else "": a seed
// that knows it asks the sandbox for none (no command, so no init, runs).
func knownWorkdir(cfg *Config) string {
	if cmp.Or(cfg.Sandbox.Provider, DefaultProvider) != "local" {
		return ""
	}
	return cmp.Or(cfg.Sandbox.Local.DefaultWorkdir, local.DefaultWorkdir)
}

// newSWEBench builds the SWE-bench server. Its sandboxes run git and the
// repositories' tests, which the fake provider cannot: it needs a real one
// (sandbox.provider: local on one machine).
func newSWEBench(cfg *Config, met *metrics.Metrics) (resources.Resources, error) {
	if p := cmp.Or(cfg.Sandbox.Provider, DefaultProvider); p == "fake" {
		return nil, errors.New("swebench needs a real sandbox provider (sandbox.provider: local), not the fake")
	}
	sc := cfg.SWEBench
	if sc.TemplateDir == "" {
		if cfg.Checkpoint.StateDir != "" {
			sc.TemplateDir = filepath.Join(cfg.Checkpoint.StateDir, "swebench-templates")
		} else {
			sc.TemplateDir = filepath.Join(os.TempDir(), "sandboxowner-"+cfg.Name, "swebench-templates")
		}
	}
	if sc.LogDir == "" {
		if cfg.Checkpoint.StateDir != "" {
			sc.LogDir = filepath.Join(cfg.Checkpoint.StateDir, "swebench-logs")
		} else {
			sc.LogDir = filepath.Join(os.TempDir(), "sandboxowner-"+cfg.Name, "swebench-logs")
		}
	}
	deps := swebench.Deps{Name: cfg.Name}
	if met != nil {
		deps.Observer = met
	}
	return swebench.New(sc, deps)
}

// sandboxCheckpoint is the resources server's own checkpointer settings
// (SWE-bench's sandbox_checkpoint, as upstream configures it), zero when it
// has none.
func sandboxCheckpoint(cfg *Config) swebench.SandboxCheckpoint {
	if cfg.Resources == "swebench" {
		return cfg.SWEBench.SandboxCheckpoint
	}
	return swebench.SandboxCheckpoint{}
}
