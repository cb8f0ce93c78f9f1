package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/metrics"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/records"
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
	reap, retainFrom, rest, err := sweepFlags(args)
	if err != nil {
		ErrorLine(stderr, LogFormatOf(args), "sweep: "+err.Error())
		return 2
	}
	if slices.Contains(rest, "-h") || slices.Contains(rest, "-help") || slices.Contains(rest, "--help") {
		fmt.Fprintln(stdout, "server sweep [-reap] [-retain-from DIR] [server flags]: report (and with -reap remove) the sandboxes and snapshots no checkpoint or tombstone accounts for; run it with the server stopped. With -retain-from, only what the checkpoint records under DIR name is kept (no index needed), as Gym's sweep does")
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
	if cfg.Checkpoint.StateDir == "" && retainFrom == "" {
		ErrorLine(stderr, opts.LogFormat, "sweep: checkpoint.state_dir is not set: there is no index to sweep against (or give -retain-from DIR)")
		return 2
	}
	log, err := NewLogger(stderr, opts.LogFormat, opts.LogLevel)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "sweep: "+err.Error())
		return 2
	}
	// Read what is kept before touching the provider: fail closed.
	swOpts := sweep.Options{Owner: cfg.Name, Reap: reap}
	kept := "the index accounts for"
	if retainFrom != "" {
		retained, err := records.RetainedUnder(retainFrom)
		if err != nil {
			fmt.Fprintf(stderr, "server sweep: %v; nothing was deleted\n", err)
			return 1
		}
		swOpts.Retained = &retained
		kept = fmt.Sprintf("the %d checkpoint records under %s name", retained.Participants, retainFrom)
	} else {
		idx, err := snapshotindex.Open(cfg.Checkpoint.StateDir, snapshotindex.Options{Logger: log.WithField("lib", "badger")})
		if err != nil {
			fmt.Fprintf(stderr, "server sweep: %v: cannot read the index in %s (is the server running?): %v\n", sweep.ErrIndexUnreadable, cfg.Checkpoint.StateDir, err)
			return 1
		}
		defer idx.Close()
		swOpts.Index = idx
	}
	var templates map[string]string
	if entry, ok := resourcesRegistry()[cfg.Resources]; ok {
		templates = entry.templates
	}
	prov, _, err := buildProvider(&cfg, Deps{}, providerEnv{log: log, clk: clock.Real{}, templates: templates})
	if err != nil {
		fmt.Fprintf(stderr, "server sweep: %v\n", err)
		return 2
	}
	if c, ok := prov.(io.Closer); ok {
		// The local provider's New makes cgroup parents under this
		// process's cgroup; its Close removes them, and what else it holds.
		defer func() {
			if err := c.Close(); err != nil {
				fmt.Fprintf(stderr, "server sweep: close the provider: %v\n", err)
			}
		}()
	}
	swOpts.Provider = prov
	rep, err := sweep.Run(ctx, swOpts)
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
	if len(rep.MadeAhead) > 0 {
		fmt.Fprintf(stdout, "removed %d sandbox directories made ahead that a stopped server left (%s)\n", len(rep.MadeAhead), strings.Join(rep.MadeAhead, ", "))
	}
	fmt.Fprintf(stdout, "keeping %d sandbox(es) and %d snapshot(s) %s; %d of other owners ignored\n", rep.KeptSandboxes, rep.KeptSnapshots, kept, rep.Foreign)
	for id, why := range rep.Failed {
		fmt.Fprintf(stderr, "server sweep: could not remove %s: %s\n", id, why)
	}
	if err != nil {
		fmt.Fprintf(stderr, "server sweep: %v\n", err)
		return 1
	}
	return 0
}

// sweepFlags takes the sweep's own flags out of args: -reap, and
// -retain-from DIR (or -retain-from=DIR, with one or two dashes).
func sweepFlags(args []string) (reap bool, retainFrom string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-reap" || a == "--reap":
			reap = true
		case a == "-retain-from" || a == "--retain-from":
			if i+1 >= len(args) || args[i+1] == "" {
				return false, "", nil, errors.New("-retain-from needs a directory")
			}
			i++
			retainFrom = args[i]
		case strings.HasPrefix(a, "-retain-from=") || strings.HasPrefix(a, "--retain-from="):
			retainFrom = a[strings.Index(a, "=")+1:]
			if retainFrom == "" {
				return false, "", nil, errors.New("-retain-from needs a directory")
			}
		default:
			rest = append(rest, a)
		}
	}
	return reap, retainFrom, rest, nil
}

// sweepLoop is the server's own sweep, or nil when it cannot run: without
// an index there is nothing to tell a checkpoint's snapshot from a leak by
// (why says so, for /health).
func sweepLoop(cfg *Config, prov provider.Provider, own *owner.Owner, clk clock.Clock, log *logrus.Logger, onPass func(sweep.Pass)) (loop *sweep.Loop, why string) {
	c := cfg.Sweep
	lc := sweep.LoopConfig{Owner: cfg.Name, Provider: prov, Index: own.Index(), Quiet: own.Quiet, Clock: clk, Interval: c.Interval,
		Retention:       sweep.Retention{Orphans: c.Retention.Orphans, PendingDeletes: c.Retention.PendingDeletes, Templates: c.Retention.Templates},
		ExpireTemplates: own.ExpireTemplates,
		Parallelism:     cfg.Checkpoint.Parallelism, Log: log.WithField("component", "sweep"), OnPass: onPass}
	switch {
	case c.Interval <= 0:
		why = "sweep.interval is 0"
	case own.Index() == nil:
		why = "no snapshot index (checkpointing off, or restart_only): nothing tells a checkpoint's snapshot from a leak"
	}
	if why != "" {
		lc.Interval = 0
	}
	return sweep.NewLoop(lc), why
}

// sweepHealth is /health's sweep.
func sweepHealth(l *sweep.Loop, off string) map[string]any {
	st := l.Status()
	h := map[string]any{
		"interval_s":  st.Interval.Seconds(),
		"retention_s": map[string]float64{"orphans": st.Retention.Orphans.Seconds(), "pending_deletes": st.Retention.PendingDeletes.Seconds(), "templates": st.Retention.Templates.Seconds()},
		"runs":        st.Runs,
	}
	if off != "" {
		h["off"] = off
	}
	if !st.LastRun.IsZero() {
		h["last_run"] = st.LastRun.UTC().Format(time.RFC3339Nano)
	}
	if st.LastError != "" {
		h["last_error"] = st.LastError
	}
	kinds := map[string]any{}
	for k, ks := range st.Kinds {
		kinds[k] = map[string]any{"found": ks.Found, "waiting": ks.Waiting, "deferred": ks.Deferred, "removed": ks.Removed, "failed": ks.Failed,
			"removed_total": ks.RemovedTotal, "failed_total": ks.FailedTotal}
	}
	h["kinds"] = kinds
	return h
}

// sweepCounts are the sweep's metrics.
func sweepCounts(l *sweep.Loop) metrics.SweepCounts {
	st := l.Status()
	c := metrics.SweepCounts{Runs: st.Runs, Removed: map[string]uint64{}, Failed: map[string]uint64{}, Found: map[string]int{}}
	for k, ks := range st.Kinds {
		c.Removed[k], c.Failed[k], c.Found[k] = ks.RemovedTotal, ks.FailedTotal, ks.Found
	}
	if !st.LastRun.IsZero() {
		c.LastRunSeconds = float64(st.LastRun.UnixNano()) / 1e9
	}
	return c
}
