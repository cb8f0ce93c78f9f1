package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/resources/swebench"
)

// swebenchCommand is `server swebench prepare -dataset ROWS.jsonl
// [-parallel N] [-config FILE] [-<key> value ...]`: it builds the template
// and environment of every row of the dataset and validates it, as the
// first seed of each would, with a progress bar on stderr, then prints a
// table (instance, environment, validation, seconds, reason). It exits 1
// when an instance is not ready, 2 on bad arguments.
func swebenchCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	const usage = "server swebench prepare -dataset ROWS.jsonl [-parallel N] [server flags]: build and validate every instance of the dataset ahead of time"
	if len(args) == 0 || args[0] != "prepare" {
		fmt.Fprintln(stderr, "usage: "+usage)
		return 2
	}
	args = args[1:]
	var dataset string
	parallel := 0
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch a {
		case "-dataset", "--dataset", "-parallel", "--parallel":
			if i+1 >= len(args) {
				fmt.Fprintf(stderr, "server swebench prepare: %s needs a value\n", a)
				return 2
			}
			i++
			if a == "-dataset" || a == "--dataset" {
				dataset = args[i]
			} else if _, err := fmt.Sscan(args[i], &parallel); err != nil || parallel < 1 {
				fmt.Fprintf(stderr, "server swebench prepare: -parallel %q: want a positive number\n", args[i])
				return 2
			}
		case "-h", "-help", "--help":
			fmt.Fprintln(stdout, usage)
			fmt.Fprintln(stdout)
			rest = append(rest, a)
		default:
			rest = append(rest, a)
		}
	}
	opts, err := ParseArgs(rest, stdout)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		ErrorLine(stderr, LogFormatOf(rest), "swebench prepare: "+err.Error())
		return 2
	}
	if dataset == "" {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: -dataset ROWS.jsonl is required")
		return 2
	}
	cfg := opts.Config
	f, err := os.Open(dataset)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: "+err.Error())
		return 2
	}
	rows, err := swebench.ReadRows(f)
	f.Close()
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: "+dataset+": "+err.Error())
		return 2
	}
	log, err := NewLogger(stderr, opts.LogFormat, opts.LogLevel)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: "+err.Error())
		return 2
	}
	cfg.Resources = "swebench"
	res, err := newSWEBench(&cfg, nil)
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: "+err.Error())
		return 2
	}
	srv := res.(*swebench.Server)
	prov, _, err := buildProvider(&cfg, Deps{}, providerEnv{log: log, clk: clock.Real{}})
	if err != nil {
		ErrorLine(stderr, opts.LogFormat, "swebench prepare: "+err.Error())
		return 2
	}
	// The local provider keeps sandbox directories ready, their disks
	// mounted: closing it takes them down before the command exits.
	if c, ok := prov.(io.Closer); ok {
		defer c.Close()
	}
	if parallel == 0 {
		parallel = srv.Config().MaxConcurrentGradings
	}
	n := 0
	fmt.Fprintf(stderr, "%s\n", swebench.ProgressBar(0, len(rows), 30))
	reps := srv.PrepareAll(ctx, prov, rows, parallel, func(r swebench.PrepareReport) {
		n++
		fmt.Fprintf(stderr, "%s  %s: %s/%s (%.1f s)\n", swebench.ProgressBar(n, len(rows), 30), r.InstanceID, r.Environment, r.Validation, r.Seconds)
	})
	fmt.Fprint(stdout, swebench.FormatPrepareTable(reps))
	for _, r := range reps {
		if !r.Ready() {
			return 1
		}
	}
	return 0
}
