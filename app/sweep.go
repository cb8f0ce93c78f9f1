package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/snapshotindex"
	"github.com/sandboxowner/owner/sweep"
)

// sweepCommand is `server sweep [-reap] [-config FILE] [-<key> value ...]`:
// with the server stopped (its index is locked while it runs), it lists the
// provider's sandboxes and snapshots that no committed checkpoint or
// tombstone accounts for, and with -reap removes them. It reads the same
// configuration as the server, and refuses (exit 1, nothing deleted) when
// the index in checkpoint.state_dir cannot be read.
func sweepCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	reap := false
	var rest []string
	for _, a := range args {
		switch a {
		case "-reap", "--reap":
			reap = true
		default:
			rest = append(rest, a)
		}
	}
	if slices.Contains(rest, "-h") || slices.Contains(rest, "-help") || slices.Contains(rest, "--help") {
		fmt.Fprintln(stdout, "server sweep [-reap] [server flags]: report (and with -reap remove) the sandboxes and snapshots no checkpoint or tombstone accounts for; run it with the server stopped")
		fmt.Fprintln(stdout)
	}
	opts, err := ParseArgs(rest, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		ErrorLine(stderr, LogFormatOf(rest), "sweep: "+err.Error())
		return 2
	}
	cfg := opts.Config
	if cfg.Checkpoint.StateDir == "" {
		ErrorLine(stderr, opts.LogFormat, "sweep: checkpoint.state_dir is not set: there is no index to sweep against")
		return 2
	}
	log, err := NewLogger(stderr, opts.LogFormat, opts.LogLevel)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "sweep: "+err.Error())
		return 2
	}
	// Read the index before touching the provider: fail closed.
	idx, err := snapshotindex.Open(cfg.Checkpoint.StateDir, snapshotindex.Options{Logger: log.WithField("lib", "badger")})
	if err != nil {
		fmt.Fprintf(stderr, "server sweep: %v: cannot read the index in %s (is the server running?): %v\n", sweep.ErrIndexUnreadable, cfg.Checkpoint.StateDir, err)
		return 1
	}
	defer idx.Close()
	var templates map[string]string
	if entry, ok := resourcesRegistry()[cfg.Resources]; ok {
		templates = entry.templates
	}
	prov, _, err := buildProvider(&cfg, Deps{}, providerEnv{log: log, clk: clock.Real{}, templates: templates})
	if err != nil {
		fmt.Fprintf(stderr, "server sweep: %v\n", err)
		return 2
	}
	rep, err := sweep.Run(ctx, sweep.Options{Owner: cfg.Name, Provider: prov, Index: idx, Reap: reap})
	verb := "would stop"
	if reap {
		verb = "stopping"
	}
	for _, s := range rep.Sandboxes {
		fmt.Fprintf(stdout, "%s sandbox %s (session=%s, incarnation=%s, created=%s)\n", verb, s.Handle.SandboxID,
			s.Metadata["ng.session"], s.Metadata["ng.incarnation"], s.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
	}
	verb = "would delete"
	if reap {
		verb = "deleting"
	}
	for _, s := range rep.Snapshots {
		fmt.Fprintf(stdout, "%s snapshot %s (name=%s, sandbox=%s, created=%s)\n", verb, s.ID, s.Name, s.SandboxID, s.CreatedAt.Format("2006-01-02T15:04:05Z07:00"))
	}
	fmt.Fprintf(stdout, "keeping %d sandbox(es) and %d snapshot(s) the index accounts for; %d of other owners ignored\n", rep.KeptSandboxes, rep.KeptSnapshots, rep.Foreign)
	for id, why := range rep.Failed {
		fmt.Fprintf(stderr, "server sweep: could not remove %s: %s\n", id, why)
	}
	if err != nil {
		fmt.Fprintf(stderr, "server sweep: %v\n", err)
		return 1
	}
	return 0
}
