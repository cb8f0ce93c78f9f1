package swebench

import (
	"archive/zip"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"
	"unicode"
)

// DefaultModules are the module paths of SWE-bench Multilingual's Go
// repositories: a repository not cloned on this machine (not in
// swebench.repos) is fetched from the Go module proxy at its base commit.
func DefaultModules() map[string]string {
	return map[string]string{
		"caddyserver/caddy":     "github.com/caddyserver/caddy/v2",
		"hashicorp/terraform":   "github.com/hashicorp/terraform",
		"prometheus/prometheus": "github.com/prometheus/prometheus",
		"gohugoio/hugo":         "github.com/gohugoio/hugo",
		"gin-gonic/gin":         "github.com/gin-gonic/gin",
	}
}

// DefaultModuleProxy is the proxy source trees are fetched from when
// neither swebench.module_proxy nor the server's GOPROXY names one.
const DefaultModuleProxy = "https://proxy.golang.org"

// maxModuleZip bounds a module zip (the proxy's own limit is 500 MB).
const maxModuleZip = 500 << 20

// EscapeModulePath is the module proxy's case encoding of a module path:
// every upper-case letter becomes '!' and its lower-case form.
func EscapeModulePath(p string) string {
	var b strings.Builder
	for _, r := range p {
		if unicode.IsUpper(r) {
			b.WriteByte('!')
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}

// PseudoVersionFor returns the version of versions (a proxy's @v/list)
// that is a pseudo-version of commit (its last part is the commit's first
// 12 hex digits), or "".
func PseudoVersionFor(versions []string, commit string) string {
	commit = strings.ToLower(commit)
	if len(commit) < 12 {
		return ""
	}
	for _, v := range versions {
		v = strings.TrimSpace(v)
		i := strings.LastIndexByte(v, '-')
		if i < 0 || strings.Count(v, "-") < 2 {
			continue
		}
		if rev := v[i+1:]; len(rev) == 12 && strings.HasPrefix(commit, rev) {
			return v
		}
	}
	return ""
}

// proxyFirst is the first proxy of a GOPROXY list that is a URL.
func proxyFirst(list string) string {
	for _, p := range strings.FieldsFunc(list, func(r rune) bool { return r == ',' || r == '|' }) {
		if strings.HasPrefix(p, "https://") || strings.HasPrefix(p, "http://") {
			return strings.TrimRight(p, "/")
		}
	}
	return ""
}

// moduleProxy fetches module source trees.
type moduleProxy struct {
	base   string
	client *http.Client
	// versions are the configured versions of commits (module_versions).
	versions map[string]string
}

func (m moduleProxy) get(ctx context.Context, module, rest string, limit int64) ([]byte, error) {
	url := m.base + "/" + EscapeModulePath(module) + "/@v/" + rest
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := m.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(b[:min(len(b), 200)])))
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("GET %s: more than %d bytes", url, limit)
	}
	return b, nil
}

// version resolves commit to a version of module: a pseudo-version the
// proxy lists, else the proxy's answer for the commit itself.
func (m moduleProxy) version(ctx context.Context, module, commit string) (string, error) {
	for c, v := range m.versions {
		if len(c) >= 7 && len(commit) >= 7 && (strings.HasPrefix(c, commit) || strings.HasPrefix(commit, c)) {
			return m.checkedVersion(ctx, module, commit, v)
		}
	}
	if list, err := m.get(ctx, module, "list", 1<<20); err == nil {
		if v := PseudoVersionFor(strings.Split(string(list), "\n"), commit); v != "" {
			return v, nil
		}
	}
	b, err := m.get(ctx, module, commit+".info", 1<<20)
	if err != nil {
		return "", err
	}
	var info struct{ Version string }
	if err := json.Unmarshal(b, &info); err != nil || info.Version == "" {
		return "", fmt.Errorf("the proxy's answer for %s@%s is not a version: %q", module, commit, b)
	}
	return info.Version, nil
}

// checkedVersion is v, a version configured for commit, once the proxy
// knows it and the commit it reports for it (its origin, when it has one)
// is commit.
func (m moduleProxy) checkedVersion(ctx context.Context, module, commit, v string) (string, error) {
	b, err := m.get(ctx, module, v+".info", 1<<20)
	if err != nil {
		return "", err
	}
	var info struct {
		Version string
		Origin  struct{ Hash string }
	}
	if err := json.Unmarshal(b, &info); err != nil || info.Version != v {
		return "", fmt.Errorf("the proxy's answer for %s@%s is not that version: %q", module, v, b)
	}
	if h := strings.ToLower(info.Origin.Hash); h != "" && !strings.HasPrefix(h, commit) && !strings.HasPrefix(commit, h) {
		return "", fmt.Errorf("module_versions says %s@%s is commit %s; the proxy says it is %s", module, v, commit, h)
	}
	return v, nil
}

// extractModuleZip writes the files of a module zip (each under
// "<module>@<version>/") into dir.
func extractModuleZip(data []byte, prefix, dir string) error {
	zr, err := zip.NewReader(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		return err
	}
	for _, f := range zr.File {
		name, ok := strings.CutPrefix(f.Name, prefix)
		if !ok || name == "" || strings.HasSuffix(f.Name, "/") {
			continue
		}
		clean := path.Clean(name)
		if clean != name || strings.HasPrefix(clean, "../") || path.IsAbs(clean) || strings.HasPrefix(clean, ".git/") || clean == ".git" {
			return fmt.Errorf("module zip: unsafe path %q", f.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		rc, err := f.Open()
		if err != nil {
			return err
		}
		mode := os.FileMode(0o644)
		if f.Mode()&0o111 != 0 {
			mode = 0o755
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
		if err != nil {
			rc.Close()
			return err
		}
		_, err = io.Copy(out, io.LimitReader(rc, maxModuleZip))
		rc.Close()
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// fetchModuleRepo makes dir a git repository holding module at commit, as
// the proxy has it, in one commit, and returns that commit's id and the
// version fetched. The commit's author and dates are fixed, so the same
// source makes the same commit on every machine.
func (m moduleProxy) fetchModuleRepo(ctx context.Context, module, commit, dir string) (local, version string, err error) {
	version, err = m.version(ctx, module, commit)
	if err != nil {
		return "", "", fmt.Errorf("%w: resolve %s at %s on %s: %w", ErrTemplate, module, commit, m.base, err)
	}
	data, err := m.get(ctx, module, version+".zip", maxModuleZip)
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	if err := extractModuleZip(data, module+"@"+version+"/", dir); err != nil {
		return "", "", fmt.Errorf("%w: %s@%s: %w", ErrTemplate, module, version, err)
	}
	env := []string{"GIT_AUTHOR_NAME=swebench", "GIT_AUTHOR_EMAIL=swebench@localhost", "GIT_COMMITTER_NAME=swebench",
		"GIT_COMMITTER_EMAIL=swebench@localhost", "GIT_AUTHOR_DATE=2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2000-01-01T00:00:00Z"}
	for _, args := range [][]string{
		{"init", "-q", "-b", "main"},
		{"add", "-A", "-f"},
		{"-c", "commit.gpgsign=false", "commit", "-q", "--no-verify", "-m", fmt.Sprintf("%s@%s (commit %s)", module, version, commit)},
	} {
		if _, err := hostGitEnv(ctx, dir, env, args...); err != nil {
			return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
		}
	}
	out, err := hostGit(ctx, dir, "rev-parse", "HEAD")
	if err != nil {
		return "", "", fmt.Errorf("%w: %w", ErrTemplate, err)
	}
	return strings.TrimSpace(out), version, nil
}

// newModuleProxy is a client of base with a bound per request.
func newModuleProxy(base string, versions map[string]string) moduleProxy {
	return moduleProxy{base: strings.TrimRight(base, "/"), client: &http.Client{Timeout: 10 * time.Minute}, versions: versions}
}
