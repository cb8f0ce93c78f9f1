package swebench

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/local"
)

// Environment is a template's environment: what its environment step made,
// kept beside the template (<template>.env/<key>/) so that it is built once
// per (repo, base commit, step) and survives restarts.
type Environment struct {
	// Dir holds caches/<name> (the template's caches), tree/ (the work tree
	// as the step left it, when it changed it), env.json and env.log.
	Dir string `json:"-"`
	// Image is the directory sandboxes of the template start from: tree/,
	// or the template itself when the step did not touch the work tree.
	Image string `json:"-"`

	Repo       string   `json:"repo"`
	BaseCommit string   `json:"base_commit"`
	Commands   []string `json:"commands"`
	// Source says where the commands came from: "configured",
	// "default_go" or "none".
	Source      string `json:"source"`
	OK          bool   `json:"ok"`
	Reason      string `json:"reason,omitempty"`
	ExitCode    int    `json:"exit_code"`
	TimedOut    bool   `json:"timed_out,omitempty"`
	TreeChanged bool   `json:"tree_changed,omitempty"`
	// SeededFrom is the environment (of another base commit of the same
	// repository) whose caches this one's started as a copy of.
	SeededFrom string `json:"seeded_from,omitempty"`
	// StdLayer is the standard-library layer (stdlib.go) its build cache
	// was seeded with.
	StdLayer string    `json:"std_layer,omitempty"`
	Seconds  float64   `json:"seconds"`
	BuiltAt  time.Time `json:"built_at"`

	// stdDir is the layer a stdlib sandbox writes.
	stdDir string
	// harvest is the directory a validation copies what it added to the
	// writable caches into (harvestDir).
	harvest string
	// chains are, in a copy for one sandbox's start, its caches' chains
	// as pinned (pinCaches); nil: read from disk.
	chains map[string][]string
}

// Environment step sources.
const (
	EnvSourceConfigured = "configured"
	EnvSourceDefaultGo  = "default_go"
	EnvSourceNone       = "none"
)

// Where an environment's parts are, in its directory and in a sandbox.
const (
	envFile    = "env.json"
	envLog     = "env.log"
	envTree    = "tree"
	envCaches  = "caches"
	envOutPath = "/ng-env" // the environment directory in the step's sandbox
)

// goNetworkEnv are the server's variables passed on to an environment step,
// so that it downloads modules the way the server's own go would.
var goNetworkEnv = []string{"GOPROXY", "GOSUMDB", "GONOSUMDB", "GOPRIVATE", "GONOPROXY", "GOINSECURE"}

// envCommands returns the environment step of row whose template is
// cloneDir, and where it came from.
func (s *Server) envCommands(row Row, cloneDir string) ([]string, string) {
	if cmds, ok := s.cfg.envSetup(row); ok {
		return cmds, EnvSourceConfigured
	}
	if fi, err := os.Stat(filepath.Join(cloneDir, "go.mod")); err == nil && fi.Mode().IsRegular() {
		return DefaultGoEnvSetup, EnvSourceDefaultGo
	}
	return nil, EnvSourceNone
}

// envKey names an environment by what makes it: its commands, the caches it
// fills and the workdir it ran at.
func (s *Server) envKey(cmds []string, toolchain string) string {
	h := sha256.New()
	for _, c := range cmds {
		fmt.Fprintf(h, "cmd\x00%s\x00", c)
	}
	if toolchain != "local" {
		// The pinned toolchain is downloaded into the environment's
		// module cache by its step.
		fmt.Fprintf(h, "toolchain\x00%s\x00", toolchain)
	}
	for _, n := range slices.Sorted(maps.Keys(s.cfg.Caches)) {
		fmt.Fprintf(h, "cache\x00%s\x00%s\x00", n, s.cfg.Caches[n])
	}
	fmt.Fprintf(h, "workdir\x00%s", s.cfg.Workdir)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// environment returns the environment of row's template (cloneDir at
// fullBase), running its environment step on p first if no server has yet.
// A step that ran and failed is an Environment with OK false (kept, like a
// success: delete the directory to run it again); an error means the step
// could not be run at all, and nothing is kept.
func (s *Server) environment(ctx context.Context, p provider.Provider, row Row, cloneDir, fullBase string, log logrus.FieldLogger) (*Environment, error) {
	cmds, source := s.envCommands(row, cloneDir)
	key := s.envKey(cmds, s.cfg.goToolchain(row))
	parent := cloneDir + ".env"
	dir := filepath.Join(parent, key)
	if env, err := readEnvironment(dir, cloneDir); err == nil {
		return env, nil
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	unlock, err := lockFile(filepath.Join(parent, key+".lock"))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	defer unlock()
	if env, err := readEnvironment(dir, cloneDir); err == nil {
		return env, nil // built while this call waited for the lock
	}
	// From here on this server builds the environment: the observer is
	// told how that ended.
	built, made := time.Now(), (*Environment)(nil)
	defer func() {
		switch {
		case made == nil:
			s.observer.Environment(OutcomeError, time.Since(built))
		case made.OK:
			s.observer.Environment(OutcomeOK, time.Since(built))
		default:
			s.observer.Environment(OutcomeFailed, time.Since(built))
		}
	}()
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	staging := filepath.Join(parent, ".tmp-"+key+"-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(staging) // a no-op once renamed
	for name := range s.cfg.Caches {
		if err := os.MkdirAll(filepath.Join(staging, envCaches, name), 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
	}
	log = log.WithFields(logrus.Fields{"repo": row.Repo, "base_commit": fullBase, "env_key": key, "env_source": source})
	env := &Environment{Repo: row.Repo, BaseCommit: fullBase, Commands: cmds, Source: source, OK: true}
	if cmds == nil {
		env.Commands = []string{}
	}
	began := time.Now()
	if env.SeededFrom, err = s.seedCaches(ctx, cloneDir, staging); err != nil {
		return nil, err
	}
	if env.SeededFrom != "" {
		log.WithFields(logrus.Fields{"seeded_from": env.SeededFrom, "duration_ms": time.Since(began).Milliseconds()}).Info("swebench: environment caches seeded from another commit's")
	}
	var stepLog string
	if len(cmds) > 0 {
		log.WithField("commands", cmds).Info("swebench: environment step started")
		if stepLog, err = s.runEnvStep(ctx, p, row, cloneDir, staging, env); err != nil {
			return nil, err
		}
	}
	if env.OK {
		s.seedStdLayer(ctx, p, row, cloneDir, staging, env, log)
	}
	// Stamped here, unpublished, under the environment's lock: no sandbox
	// stands on these files yet.
	for _, name := range slices.Sorted(maps.Keys(s.cfg.Caches)) {
		if s.cfg.Caches[name] != stdBuildCache {
			continue
		}
		if err := stampBuildCache(filepath.Join(staging, envCaches, name)); err != nil {
			log.WithError(err).WithField("cache", name).Warn("swebench: the build cache's entries could not be stamped ahead")
		}
	}
	env.Seconds = time.Since(began).Seconds()
	env.BuiltAt = time.Now().UTC()
	if err := os.WriteFile(filepath.Join(staging, envLog), []byte(stepLog), 0o644); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := writeJSONFile(filepath.Join(staging, envFile), env); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := os.Rename(staging, dir); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	env.Dir, env.Image = dir, cloneDir
	if env.TreeChanged {
		env.Image = filepath.Join(dir, envTree)
	}
	fields := logrus.Fields{"ok": env.OK, "exit_code": env.ExitCode, "timed_out": env.TimedOut,
		"tree_changed": env.TreeChanged, "duration_ms": time.Since(began).Milliseconds(), "env_dir": dir}
	if env.OK {
		log.WithFields(fields).Info("swebench: environment ready")
	} else {
		log.WithFields(fields).WithField("reason", env.Reason).Warn("swebench: environment step failed; the template's instances are unavailable")
	}
	made = env
	return env, nil
}

// seedCaches fills a new environment's caches (in staging) with a copy of
// those of the newest good environment of the same repository at another
// base commit, so that its step downloads, and its validation compiles, only
// what changed: Go's caches are content-addressed, so what another commit
// left is never wrong, only possibly unused. Those caches were written only
// by environment steps and validations, which run no model code (agents and
// gradings write layers of their own). It returns the environment copied from, relative
// to the repository's templates ("" for none).
func (s *Server) seedCaches(ctx context.Context, cloneDir, staging string) (string, error) {
	repoDir := filepath.Dir(cloneDir)
	matches, _ := filepath.Glob(filepath.Join(repoDir, "*.env", "*", envFile))
	var best *Environment
	var bestDir string
	for _, m := range matches {
		dir := filepath.Dir(m)
		if filepath.Dir(dir) == cloneDir+".env" {
			continue // this template's own (another step)
		}
		env, err := readEnvironment(dir, "")
		if err != nil || !env.OK {
			continue
		}
		if best == nil || env.BuiltAt.After(best.BuiltAt) {
			best, bestDir = env, dir
		}
	}
	if best == nil {
		return "", nil
	}
	for name := range s.cfg.Caches {
		// The chain, its farthest layer first, each nearer one over it.
		chain := cacheChain(filepath.Join(bestDir, envCaches, name))
		for i := len(chain) - 1; i >= 0; i-- {
			src := chain[i]
			if fi, err := os.Stat(src); err != nil || !fi.IsDir() {
				continue
			}
			cmd := exec.CommandContext(ctx, "cp", "-a", "--reflink=auto", src+"/.", filepath.Join(staging, envCaches, name)+"/")
			if out, err := cmd.CombinedOutput(); err != nil {
				return "", fmt.Errorf("%w: seed the %s cache from %s: %w: %s", ErrTemplate, name, bestDir, err, lastLines(string(out), 4))
			}
		}
	}
	rel, _ := filepath.Rel(repoDir, bestDir)
	return rel, nil
}

// buildCacheStamp is the modification time stampBuildCache gives a build
// cache's files: far enough ahead that the go command never refreshes it.
func buildCacheStamp() time.Time { return time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC) }

// stampBuildCache gives every file of the Go build cache at dir the
// modification time buildCacheStamp(). The go command refreshes the mtime
// of an entry it uses once that is an hour old: in a sandbox that is a
// copy of the entry into its own layer, which the eval's purge (what
// changed since the eval began) then takes for a write of the eval's and
// deletes, so that a later go command of the same eval compiles it again.
// Stamped ahead before any sandbox stands on them (the environment's first
// generation, and what each later one adds), entries are never refreshed.
// Go's trim, which drops entries unused for days by their mtime, keeps them.
func stampBuildCache(dir string) error {
	return filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		return os.Chtimes(path, buildCacheStamp(), buildCacheStamp())
	})
}

// runEnvStep runs env's commands in a sandbox of the template with the
// network on and the staging directory's caches mounted read-write, and
// copies the work tree out when the step changed it. It fills env's
// outcome and returns the step's output.
func (s *Server) runEnvStep(ctx context.Context, p provider.Provider, row Row, cloneDir, staging string, env *Environment) (string, error) {
	spec, _, err := s.spec(p, cloneDir, row, roleEnv, &Environment{Dir: staging})
	if err != nil {
		return "", err
	}
	h, ctx, stop, err := s.startSandbox(ctx, p, spec, "environment step")
	if err != nil {
		return "", fmt.Errorf("%w: start the environment step's sandbox: %w", ErrTemplate, err)
	}
	defer stop()
	var script strings.Builder
	script.WriteString("set -e\nexec 2>&1\n")
	for _, c := range env.Commands {
		fmt.Fprintf(&script, "printf '%%s\\n' %s\n%s\n", shQuote("+ "+c), c)
	}
	res, err := run(ctx, p, h, script.String(), nil, s.cfg.envSetupTimeout())
	if err != nil {
		return "", fmt.Errorf("%w: run the environment step: %w", ErrTemplate, err)
	}
	out := res.Stdout + res.Stderr
	env.ExitCode, env.TimedOut = res.ExitCode, res.TimedOut
	switch {
	case res.TimedOut:
		env.OK, env.Reason = false, fmt.Sprintf("the environment step ran past env_setup_timeout (%s): %s", s.cfg.envSetupTimeout(), lastLines(out, 6))
	case res.ExitCode != 0:
		env.OK, env.Reason = false, fmt.Sprintf("the environment step exited %d: %s", res.ExitCode, lastLines(out, 6))
	}
	if !env.OK {
		return out, nil
	}
	// What the step left in the work tree (a virtualenv, node_modules, a
	// rewritten go.sum) is part of the environment: the template's
	// sandboxes then start from a copy of the tree as the step left it.
	st, err := run(ctx, p, h, "git status --porcelain --ignored --untracked-files=all | head -n 1", nil, s.cfg.setupTimeout())
	if err != nil || st.ExitCode != 0 {
		return "", fmt.Errorf("%w: inspect the work tree after the environment step: %v %s", ErrTemplate, err, st.Stderr)
	}
	if strings.TrimSpace(st.Stdout) != "" {
		cp, err := run(ctx, p, h, "cp -a . "+envOutPath+"/"+envTree, nil, s.cfg.setupTimeout())
		if err != nil || cp.ExitCode != 0 {
			return "", fmt.Errorf("%w: copy the work tree out of the environment step: %v %s", ErrTemplate, err, cp.Stderr)
		}
		env.TreeChanged = true
	}
	return out, nil
}

// readEnvironment reads a built environment.
func readEnvironment(dir, cloneDir string) (*Environment, error) {
	b, err := os.ReadFile(filepath.Join(dir, envFile))
	if err != nil {
		return nil, err
	}
	var env Environment
	if err := json.Unmarshal(b, &env); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrTemplate, filepath.Join(dir, envFile), err)
	}
	env.Dir, env.Image = dir, cloneDir
	if env.TreeChanged {
		env.Image = filepath.Join(dir, envTree)
	}
	return &env, nil
}

// Sandbox roles (the swebench_role label).
const (
	roleAgent      = "agent"
	roleGrading    = "grading"
	roleValidation = "validation"
	roleEnv        = "environment"
	// roleStdlib (stdlib.go) compiles the standard library.
)

// localMounts are the local provider's mounts of a template's caches for a
// sandbox of role: in the environment step every cache is read-write (env
// is then the environment being built, in its staging directory); every
// other sandbox gets the read-only caches read-only and a writable layer of
// its own over the newest generation of each writable one
// (local.MountOverlay: an overlay where the provider can mount one, else a
// copy), so that nothing one of them writes reaches another, no layer
// changes under a sandbox standing on it, and a start does not copy the
// template's build cache. A validation (which runs no model code) also gets
// its harvest directory read-write: what it adds to the caches is
// published from there as their next generation (cachegens.go).
func (s *Server) localMounts(env *Environment, role string) ([]local.Mount, map[string]string) {
	vars := map[string]string{}
	var mounts []local.Mount
	if role == roleEnv {
		mounts = append(mounts, local.Mount{Host: env.Dir, Path: envOutPath, Mode: local.MountReadWrite})
	}
	for _, name := range slices.Sorted(maps.Keys(s.cfg.Caches)) {
		at := CacheMountDir + "/" + name
		vars[s.cfg.Caches[name]] = at
		m := local.Mount{Host: env.cacheDir(name), Path: at, Mode: local.MountReadOnly}
		switch {
		case role == roleEnv:
			m.Mode = local.MountReadWrite
		case role == roleStdlib && s.cfg.Caches[name] == stdBuildCache:
			m.Host, m.Mode = env.stdDir, local.MountReadWrite
		case !s.cfg.writable(name):
			if lower := env.cacheChain(name)[1:]; len(lower) > 0 {
				// Generations of a cache once writable: only an
				// overlay stacks them (what the sandbox writes stays
				// in its own layer).
				m.Mode, m.Lower = local.MountOverlay, lower
			}
		default:
			m.Mode = local.MountOverlay
			m.Lower = env.cacheChain(name)[1:]
			if role == roleValidation && env.harvest != "" {
				mounts = append(mounts, local.Mount{Host: filepath.Join(env.harvest, name), Path: harvestMountPrefix + name, Mode: local.MountReadWrite})
			}
		}
		mounts = append(mounts, m)
	}
	return mounts, vars
}

// lockFile takes an exclusive lock on path (created if missing), held
// across processes, so that two servers sharing a template_dir build an
// environment or validate an instance once.
func lockFile(path string) (func(), error) { return flockFile(path, syscall.LOCK_EX) }

// lockFileShared takes a shared lock on path: readers of what an exclusive
// holder writes hold it together.
func lockFileShared(path string) (func(), error) { return flockFile(path, syscall.LOCK_SH) }

func flockFile(path string, how int) (func(), error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	for {
		err = syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// writeJSONFile writes v to path through a temporary file of its own (two
// processes may write the same path) and a rename.
func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := path + ".tmp-" + hex.EncodeToString(rnd[:])
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}
