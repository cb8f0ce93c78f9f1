package swebench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
)

// The standard library layer: Go's standard library compiled once per
// toolchain, kept under std_cache_dir (<dir>/<toolchain>/) and shared by
// every template of every repository. A new environment's build cache
// starts as a copy of it, so that no environment compiles the standard
// library again; without it every template's validation did, minutes on a
// loaded machine.
//
// The layer also holds what vet learns of those packages. go test vets the
// packages it tests, and vet needs the facts of every package they import,
// the standard library's too, which it derives from their sources: a fresh
// environment's first go test of even a one-file package vetted some 70
// standard-library packages (about 9 CPU-seconds, half a minute of a
// validation under load). go test keeps those facts in the build cache
// under a key of its own (its vet flags differ from go vet's), so the layer
// gets them the same way: go test -c of a package the script writes, which
// imports each of the standard-library packages it compiled.
//
// Who can write the layer decides whether sharing it is safe: Go trusts its
// build cache (an entry is looked up by the hash of its inputs and its
// output is not checked), so a writer could plant a compiled package that
// every later build links. Only a sandbox of role stdlib writes it, and it
// runs nothing but `go list` over the template's tree, `go build` of
// standard-library packages and `go test -c` of that written package (whose
// test binary goes to /dev/null, never run), with the server's GOFLAGS and
// the network off: no code of the repository, the agent or a test runs
// there. Agents,
// gradings and validations never see the layer; they see environment
// caches that are copies of it, and their own writable caches are copies
// again (localMounts).
//
// A layer compiles what a tree needs once: the server marks, beside the
// layer, each (tree, environment step) it compiled for (stdDoneKey), and
// another environment of that tree and step (another template_dir on the
// same std_cache_dir, another server's) copies the layer under a shared
// lock without starting a stdlib sandbox.

const (
	roleStdlib = "stdlib"
	// stdBuildCache is the environment variable of the cache the layer
	// fills.
	stdBuildCache = "GOCACHE"
)

// stdScript lists the standard-library packages the tree's packages and
// tests import, compiles them and vets them as go test does (nothing else):
// a layer grows with the union of what its templates needed.
const stdScript = `set -e
exec 2>&1
pkgs=$(go list -e -deps -test -f '{{if .Standard}}{{.ImportPath}}{{end}}' ./... 2>/dev/null | sort -u)
if [ -z "$pkgs" ]; then
	echo "no standard-library package to compile"
	exit 0
fi
printf 'compiling %s standard-library packages\n' "$(printf '%s\n' $pkgs | wc -l)"
# What compiled is kept when a package does not (a cgo one without a C
# compiler, say).
go build $pkgs || echo "go build exited $?"
# Vet's facts of the same packages, as go test derives them: a package
# importing each (internal ones cannot be imported; they are vetted as
# what the others import), built as a test and not run.
d=$(mktemp -d)
{
	echo 'package stdvet'
	for p in $pkgs; do
		case "$p" in internal/* | */internal/* | */internal | vendor/* | cmd/*) ;; *) printf 'import _ "%s"\n' "$p" ;; esac
	done
} >"$d/vet.go"
echo 'package stdvet' >"$d/vet_test.go"
echo 'module stdvet' >"$d/go.mod"
(cd "$d" && GOWORK=off go test -c -o /dev/null .) || echo "go test -c exited $?"
rm -rf "$d"
`

var unsafeKeyChars = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// stdCacheName is the build cache's name in Config.Caches, if it is
// writable ("" when there is none: no layer then).
func (c Config) stdCacheName() string {
	for name, env := range c.Caches {
		if env == stdBuildCache && c.writable(name) {
			return name
		}
	}
	return ""
}

// stdLayerKey names the layer of a toolchain: the pinned release, or the
// host's go for "local".
func stdLayerKey(ctx context.Context, toolchain string) string {
	if toolchain == "local" {
		out, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output()
		if v := strings.TrimSpace(string(out)); err == nil && v != "" {
			toolchain = "local-" + v
		}
	}
	return unsafeKeyChars.ReplaceAllString(toolchain, "_")
}

// seedStdLayer compiles into the toolchain's layer what the template's
// tree needs of the standard library (in a stdlib sandbox of the template,
// with the environment's other caches, from staging, read-only) and copies
// the layer into the new environment's build cache. It returns the layer's
// key; a failure is logged and leaves the environment as it was (the layer
// only saves time).
func (s *Server) seedStdLayer(ctx context.Context, p provider.Provider, row Row, image, staging string, env *Environment, log logrus.FieldLogger) {
	name := s.cfg.stdCacheName()
	if name == "" || s.cfg.StdCacheDir == "" {
		return
	}
	if fi, err := os.Stat(filepath.Join(image, "go.mod")); err != nil || !fi.Mode().IsRegular() {
		return
	}
	began := time.Now()
	key := stdLayerKey(ctx, s.cfg.goToolchain(row))
	layer := filepath.Join(s.cfg.StdCacheDir, key)
	log = log.WithFields(logrus.Fields{"std_layer": layer})
	fail := func(what string, err error) {
		log.WithError(err).Warn("swebench: the standard-library layer could not be used (" + what + "); the environment compiles it itself")
	}
	if err := os.MkdirAll(layer, 0o755); err != nil {
		fail("make its directory", err)
		return
	}
	// Another environment of the same tree and step already compiled what
	// it needs into the layer: copy the layer under a shared lock, beside
	// other such copies, without a sandbox of its own.
	done := filepath.Join(layer+stdDoneDir, stdDoneKey(env, s.cfg.goToolchain(row)))
	unlock, err := lockFileShared(layer + ".lock")
	if err != nil {
		fail("lock it", err)
		return
	}
	if _, err := os.Stat(done); err == nil {
		defer unlock()
		if err := copyStdLayer(ctx, layer, staging, name); err != nil {
			fail("copy it", err)
			return
		}
		env.StdLayer = key
		log.WithFields(logrus.Fields{"compiled": false, "duration_ms": time.Since(began).Milliseconds()}).Info("swebench: environment's build cache seeded with the standard library")
		return
	}
	unlock()
	if unlock, err = lockFile(layer + ".lock"); err != nil {
		fail("lock it", err)
		return
	}
	defer unlock()
	spec, _, err := s.spec(p, image, row, roleStdlib, &Environment{Dir: staging, stdDir: layer})
	if err != nil {
		fail("its sandbox's spec", err)
		return
	}
	h, wctx, stop, err := s.startSandbox(ctx, p, spec, "standard-library")
	if err != nil {
		fail("start its sandbox", err)
		return
	}
	res, err := run(wctx, p, h, stdScript, nil, s.cfg.envSetupTimeout())
	stop()
	switch {
	case err != nil:
		fail("run go build", err)
		return
	case res.TimedOut || res.ExitCode != 0:
		fail("go build", fmt.Errorf("exit %d (timed out: %v): %s", res.ExitCode, res.TimedOut, lastLines(res.Stdout+res.Stderr, 6)))
		return
	}
	compiled := time.Since(began)
	// Written by the server, beside the layer: no sandbox sees it. A mark
	// that outlives what it stands for (a layer trimmed or deleted) costs
	// a validation the compiling, never a wrong build.
	if err := os.MkdirAll(filepath.Dir(done), 0o755); err == nil {
		_ = os.WriteFile(done, nil, 0o644)
	}
	if err := copyStdLayer(ctx, layer, staging, name); err != nil {
		fail("copy it", err)
		return
	}
	env.StdLayer = key
	log.WithFields(logrus.Fields{"compiled": true, "compile_ms": compiled.Milliseconds(), "duration_ms": time.Since(began).Milliseconds(),
		"output": lastLines(res.Stdout, 1)}).Info("swebench: environment's build cache seeded with the standard library")
}

// stdDoneDir, beside a layer, holds a mark per tree and environment step
// whose standard-library packages the layer holds (stdDoneKey).
const stdDoneDir = ".compiled"

// stdDoneKey names what decides the packages stdScript compiles for an
// environment: the script, the repository at its commit, the step (which
// filled the module cache go list reads) and the toolchain.
func stdDoneKey(env *Environment, toolchain string) string {
	h := sha256.New()
	fmt.Fprintf(h, "script\x00%s\x00repo\x00%s\x00commit\x00%s\x00toolchain\x00%s\x00tree_changed\x00%v\x00", stdScript, env.Repo, env.BaseCommit, toolchain, env.TreeChanged)
	for _, c := range env.Commands {
		fmt.Fprintf(h, "cmd\x00%s\x00", c)
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// copyStdLayer copies layer into the staging environment's build cache.
func copyStdLayer(ctx context.Context, layer, staging, name string) error {
	cp := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", layer+"/.", filepath.Join(staging, envCaches, name)+"/")
	if out, err := cp.CombinedOutput(); err != nil {
		return fmt.Errorf("%w: %s", err, lastLines(string(out), 4))
	}
	return nil
}
