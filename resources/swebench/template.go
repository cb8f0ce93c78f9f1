package swebench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sirupsen/logrus"
)

// Templates prepares, on the host, the image of a (repo, base commit) for the
// local provider: a clone of the configured repository with its work tree at
// the base commit (HEAD detached there), in its own directory under Root. A
// template is made once and then only read: the provider starts sandboxes
// from it (a copy, or an overlay whose lower layer it is), so a second sandbox
// of the same instance costs no clone. The clone keeps the whole history, as
// SWE-bench's images do; the scrub in each agent sandbox removes what the
// agent must not see. It is safe for concurrent use.
type Templates struct {
	root  string
	repos map[string]string
	// modules are the repositories fetched from the module proxy at their
	// base commit when not in repos (owner/name → module path).
	modules map[string]string
	proxy   moduleProxy

	locks keyedMutex // one per template being made or checked
}

// NewTemplates returns a store under root for the repositories in repos
// ("owner/name" → a git repository on the host).
func NewTemplates(root string, repos map[string]string) (*Templates, error) {
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("%w: template_dir %q: %v", ErrConfig, root, err)
	}
	rs := make(map[string]string, len(repos))
	for name, path := range repos {
		if !repoName.MatchString(name) {
			return nil, fmt.Errorf("%w: repos: %q is not owner/name", ErrConfig, name)
		}
		p, err := filepath.Abs(path)
		if err != nil {
			return nil, fmt.Errorf("%w: repos[%q]: %v", ErrConfig, name, err)
		}
		rs[name] = p
	}
	return &Templates{root: abs, repos: rs}, nil
}

// Has reports whether repo is configured, cloned or from the module proxy.
func (t *Templates) Has(repo string) bool {
	_, ok := t.repos[repo]
	_, mod := t.modules[repo]
	return ok || mod
}

// WithModules makes the repositories of modules (owner/name → module path)
// that repos does not name come from the module proxy at base (a URL);
// versions are the module versions of commits the proxy cannot resolve.
func (t *Templates) WithModules(modules map[string]string, base string, versions map[string]string) *Templates {
	t.modules, t.proxy = modules, newModuleProxy(base, versions)
	return t
}

// moduleSource is what a template made from the module proxy records
// beside itself (<template>.source.json).
type moduleSource struct {
	Module  string `json:"module"`
	Version string `json:"version"`
	// Commit is the row's base commit; Local the commit of the template's
	// own repository holding that source.
	Commit string `json:"commit"`
	Local  string `json:"local"`
}

// ensureFromModule is Ensure for a repository of the module proxy: the
// template is a git repository of one commit (Local) holding the module's
// zip at base.
func (t *Templates) ensureFromModule(ctx context.Context, repo, module, base string, log logrus.FieldLogger) (string, string, error) {
	dir := t.dir(repo, base)
	lock := t.locks.get(dir)
	lock.Lock()
	defer lock.Unlock()
	var src moduleSource
	made := func() bool {
		b, err := os.ReadFile(dir + ".source.json")
		if err != nil || json.Unmarshal(b, &src) != nil || src.Local == "" {
			return false
		}
		fi, err := os.Stat(dir)
		return err == nil && fi.IsDir()
	}
	if made() {
		return dir, src.Local, nil
	}
	began := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	// Across processes too: another server sharing template_dir may be
	// making the same template, and the replacing below would remove a
	// directory its sandboxes stand on.
	unlock, err := lockFile(dir + ".lock")
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	defer unlock()
	if made() {
		return dir, src.Local, nil
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(dir), ".tmp-"+base[:min(12, len(base))]+"-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(tmp)
	local, version, err := t.proxy.fetchModuleRepo(ctx, module, base, tmp)
	if err != nil {
		return "", "", err
	}
	_ = os.RemoveAll(dir)
	if err := os.Rename(tmp, dir); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := writeJSONFile(dir+".source.json", moduleSource{Module: module, Version: version, Commit: base, Local: local}); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	log.WithFields(logrus.Fields{"repo": repo, "base_commit": base, "module": module, "version": version, "local_commit": local,
		"dir": dir, "duration_ms": time.Since(began).Milliseconds()}).Info("swebench: template prepared from the module proxy")
	return dir, local, nil
}

// existing returns the template directory of (repo, base) if it is already
// made, without making it or reading the source: for a clone only when base
// is a full commit id (an abbreviation needs the source to resolve).
func (t *Templates) existing(repo, base string) (string, bool) {
	if !hexCommit.MatchString(base) {
		return "", false
	}
	base = strings.ToLower(base)
	dir := t.dir(repo, base)
	if _, cloned := t.repos[repo]; cloned {
		if len(base) != 40 && len(base) != 64 {
			return "", false
		}
	} else {
		var src moduleSource
		if b, err := os.ReadFile(dir + ".source.json"); err != nil || json.Unmarshal(b, &src) != nil || src.Local == "" {
			return "", false
		}
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return "", false
	}
	return dir, true
}

// Root is the directory the templates are kept in.
func (t *Templates) Root() string { return t.root }

// Ensure returns the template directory of (repo, base), making it if
// needed (and logging that to log), and the full id of the commit its
// repository holds the base at: the base commit's own for a clone, the
// template's one commit for a repository from the module proxy. base may
// be abbreviated.
func (t *Templates) Ensure(ctx context.Context, repo, base string, log logrus.FieldLogger) (dir, fullBase string, err error) {
	if !hexCommit.MatchString(base) {
		return "", "", fmt.Errorf("%w: base commit %q is not a commit id", ErrTemplate, base)
	}
	base = strings.ToLower(base)
	src, ok := t.repos[repo]
	if module, mod := t.modules[repo]; !ok && mod {
		return t.ensureFromModule(ctx, repo, module, base, log)
	}
	if !ok {
		return "", "", fmt.Errorf("%w: %q is not in swebench.repos", ErrUnknownRepo, repo)
	}
	if len(base) == 40 || len(base) == 64 {
		// A full id: an existing template is used without reading the
		// source at all.
		dir = t.dir(repo, base)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, base, nil
		}
	}
	out, err := hostGit(ctx, src, "rev-parse", "--verify", "-q", base+"^{commit}")
	if err != nil {
		return "", "", fmt.Errorf("%w: %s has no commit %s: %w", ErrTemplate, src, base, err)
	}
	fullBase = strings.TrimSpace(out)
	dir = t.dir(repo, fullBase)

	lock := t.locks.get(dir)
	lock.Lock()
	defer lock.Unlock()
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		return dir, fullBase, nil
	} else if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	began := time.Now()
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	tmp := filepath.Join(filepath.Dir(dir), ".tmp-"+fullBase[:12]+"-"+hex.EncodeToString(rnd[:]))
	defer os.RemoveAll(tmp) // a no-op once renamed
	if _, err := hostGit(ctx, "", "clone", "--quiet", "--no-hardlinks", "--no-checkout", src, tmp); err != nil {
		return "", "", fmt.Errorf("%w: clone %s: %w", ErrTemplate, src, err)
	}
	if _, err := hostGit(ctx, tmp, "-c", "advice.detachedHead=false", "checkout", "--quiet", "--detach", fullBase); err != nil {
		return "", "", fmt.Errorf("%w: check out %s: %w", ErrTemplate, fullBase, err)
	}
	head, err := hostGit(ctx, tmp, "rev-parse", "HEAD")
	if err != nil || strings.TrimSpace(head) != fullBase {
		return "", "", fmt.Errorf("%w: the clone's HEAD is %q, not %s (%v)", ErrTemplate, strings.TrimSpace(head), fullBase, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if fi, statErr := os.Stat(dir); statErr == nil && fi.IsDir() {
			return dir, fullBase, nil // another server sharing template_dir made it first
		}
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	log.WithFields(logrus.Fields{"repo": repo, "base_commit": fullBase, "dir": dir, "duration_ms": time.Since(began).Milliseconds()}).Info("swebench: template prepared")
	return dir, fullBase, nil
}

func (t *Templates) dir(repo, fullBase string) string {
	return filepath.Join(t.root, strings.ReplaceAll(repo, "/", "__"), fullBase)
}

// keyedMutex hands out one mutex per key. Its zero value is ready.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

func (k *keyedMutex) get(key string) *sync.Mutex {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.locks == nil {
		k.locks = map[string]*sync.Mutex{}
	}
	l, ok := k.locks[key]
	if !ok {
		l = &sync.Mutex{}
		k.locks[key] = l
	}
	return l
}

// hostGit runs git on the host (in dir when not empty) and returns stdout.
func hostGit(ctx context.Context, dir string, args ...string) (string, error) {
	return hostGitEnv(ctx, dir, nil, args...)
}

// hostGitEnv is hostGit with env added to the environment.
func hostGitEnv(ctx context.Context, dir string, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_TERMINAL_PROMPT=0", "GIT_CONFIG_COUNT=1",
		"GIT_CONFIG_KEY_0=safe.directory", "GIT_CONFIG_VALUE_0=*", "LC_ALL=C")
	cmd.Env = append(cmd.Env, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
