// Command mutants measures how well each core package's own tests catch a
// wrong line: it runs gremlins (mutation testing) over one package at a time,
// discounts the mutants listed in equivalent.txt (mutants no caller can tell
// apart from the original), and prints per package the efficacy (killed /
// (killed + lived)), the mutator coverage ((killed + lived) / (killed + lived
// + not covered)) and every mutant that lived. It exits 1 when a package is
// below a threshold, 2 when it cannot measure.
//
//	go run ./scripts/mutants                       # the core packages
//	go run ./scripts/mutants control participant   # some of them
//	go run ./scripts/mutants -report owner         # print, never fail
//	go run ./scripts/mutants -keep /tmp/m sched    # keep gremlins' reports,
//	go run ./scripts/mutants -keep /tmp/m -rescore sched  # and score them again
//	go run ./scripts/mutants -schema -files commit.go owner  # without gremlins
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// corePackages are the packages measured when none is named.
var corePackages = []string{
	"control", "participant", "sched", "actors", "supervisor",
	"sweep", "sandboxapi", "snapshotindex", "http", "owner",
	"provider/local", "provider/opensandbox",
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("mutants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	efficacy := fs.Float64("efficacy", 90, "minimum efficacy, percent")
	coverage := fs.Float64("coverage", 90, "minimum mutator coverage, percent")
	report := fs.Bool("report", false, "print the figures but never fail on them")
	verbose := fs.Bool("v", false, "also list the mutants no test reaches")
	coefficient := fs.Int("timeout-coefficient", 60, "gremlins' timeout coefficient (its default counts compilation on a loaded 2-core machine as a hang)")
	workers := fs.Int("workers", 0, "gremlins' workers (0: one per core)")
	gremlins := fs.String("gremlins", "", "the gremlins binary (default: gremlins on PATH, else ~/go/bin/gremlins)")
	equivalent := fs.String("equivalent", "scripts/mutants/equivalent.txt", "the list of equivalent mutants")
	keep := fs.String("keep", "", "keep gremlins' JSON reports in this directory (<pkg>.json)")
	rescore := fs.Bool("rescore", false, "score the reports kept in -keep instead of running gremlins (after editing the list)")
	schema := fs.Bool("schema", false, "run the mutants without gremlins, in one test binary with the tests that reach each line (schema.go): about ten times faster")
	files := fs.String("files", "", "with -schema: the files to mutate, comma-separated (default: all of the package's)")
	maxTimeout := fs.Duration("max-timeout", 3*time.Minute, "with -schema: the most a mutant may run before it counts as timed out")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	pkgs := fs.Args()
	if len(pkgs) == 0 {
		pkgs = corePackages
	}
	ex, err := readExclusions(*equivalent)
	if err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}
	if *rescore && *keep == "" {
		fmt.Fprintln(stderr, "mutants: -rescore reads the reports of -keep")
		return 2
	}
	var bin string
	if !*rescore && !*schema {
		if bin, err = findGremlins(*gremlins); err != nil {
			fmt.Fprintln(stderr, "mutants:", err)
			return 2
		}
	}
	tmp := *keep
	if tmp == "" {
		if tmp, err = os.MkdirTemp("", "mutants-"); err != nil {
			fmt.Fprintln(stderr, "mutants:", err)
			return 2
		}
		defer os.RemoveAll(tmp)
	} else if err := os.MkdirAll(tmp, 0o755); err != nil {
		fmt.Fprintln(stderr, "mutants:", err)
		return 2
	}

	th := thresholds{efficacy: *efficacy, coverage: *coverage}
	var rows []row
	failed := false
	for _, pkg := range pkgs {
		pkg = strings.TrimSuffix(strings.TrimPrefix(pkg, "./"), "/")
		out := filepath.Join(tmp, strings.ReplaceAll(pkg, "/", "_")+".json")
		if !*rescore && *schema {
			if err := runSchema(pkg, *files, tmp, *maxTimeout, stderr).run(out); err != nil {
				fmt.Fprintf(stderr, "mutants: %v\n", err)
				return 2
			}
		} else if !*rescore {
			if err := unleash(bin, pkg, out, *coefficient, *workers, stderr); err != nil {
				fmt.Fprintf(stderr, "mutants: %v\n", err)
				return 2
			}
		}
		res, err := readResult(out)
		if err != nil {
			fmt.Fprintf(stderr, "mutants: %s: %v\n", pkg, err)
			return 2
		}
		r := score(pkg, res, ex, readLine, outsideBlocks, funcAt)
		rows = append(rows, r)
		printRow(stdout, r, th, *verbose)
		if !r.meets(th) {
			failed = true
		}
	}
	printTable(stdout, rows, th)
	for _, e := range ex.unused(rows) {
		fmt.Fprintf(stdout, "warning: %s matched no mutant (the line changed? remove or update it)\n", e.pos)
	}
	if failed && !*report {
		return 1
	}
	return 0
}

// unleash runs gremlins on one package, writing its JSON report to out.
func unleash(bin, pkg, out string, coefficient, workers int, stderr io.Writer) error {
	gargs := []string{"unleash", "--silent", "--timeout-coefficient", fmt.Sprint(coefficient), "-o", out}
	if workers > 0 {
		gargs = append(gargs, "--workers", fmt.Sprint(workers))
	}
	gargs = append(gargs, "./"+pkg)
	fmt.Fprintf(stderr, "== %s: %s %s\n", pkg, bin, strings.Join(gargs, " "))
	cmd := exec.Command(bin, gargs...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gremlins on %s: %w\n%s", pkg, err, log.Bytes())
	}
	return nil
}

func findGremlins(flagged string) (string, error) {
	if flagged != "" {
		return flagged, nil
	}
	if p, err := exec.LookPath("gremlins"); err == nil {
		return p, nil
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, "go", "bin", "gremlins")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("gremlins not found: go install github.com/go-gremlins/gremlins/cmd/gremlins@v0.6.0")
}

// result is the part of gremlins' -o JSON the script reads.
type result struct {
	Files []struct {
		FileName  string `json:"file_name"`
		Mutations []struct {
			Line   int    `json:"line"`
			Column int    `json:"column"`
			Type   string `json:"type"`
			Status string `json:"status"`
		} `json:"mutations"`
	} `json:"files"`
}

func readResult(path string) (result, error) {
	var res result
	b, err := os.ReadFile(path)
	if err != nil {
		return res, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("gremlins' report %s: %w", path, err)
	}
	return res, nil
}

// readLine returns line n (1-based) of a file, trimmed, or "" when there is
// none.
func readLine(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return ""
	}
	lines := strings.Split(string(b), "\n")
	if n < 1 || n > len(lines) {
		return ""
	}
	return strings.TrimSpace(lines[n-1])
}
