package swebench

import (
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// ProxyCacheEnv names the directory where the real-repository tests keep
// what the module proxy served them of module versions; TestMain makes it
// (kept across runs of any source tree, unless the run is fresh).
const ProxyCacheEnv = "SWEBENCH_TEST_PROXY_CACHE"

// immutableProxyPath matches the module proxy's paths whose answer never
// changes: a module version's .info, .mod and .zip (a commit's .info
// resolves it to its pseudo-version once and for all). Lists and @latest
// are not among them.
var immutableProxyPath = regexp.MustCompile(`^/[A-Za-z0-9._~!/-]+/@v/[A-Za-z0-9._+-]+\.(info|mod|zip)$`)

// cachingProxy is a module proxy on loopback in front of upstream that
// keeps the immutable answers it forwarded in ProxyCacheEnv's directory:
// the real instances' toolchain and modules, over a hundred megabytes, are
// downloaded once per machine, not once per environment step of every run.
// Every other path (lists, the checksum database) is forwarded as is. It
// only saves downloads: the environment steps, the sources fetched from
// the proxy and the gradings run the same.
func cachingProxy(t testing.TB, upstream string) string {
	t.Helper()
	dir := os.Getenv(ProxyCacheEnv)
	if dir == "" {
		dir = t.TempDir()
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.EscapedPath()
		// No element of a module path or version starts with a dot.
		cacheable := r.Method == http.MethodGet && immutableProxyPath.MatchString(path) && !strings.Contains(path, "/.")
		file := filepath.Join(dir, filepath.FromSlash(path))
		if cacheable && serveFile(w, file) {
			return
		}
		req, err := http.NewRequestWithContext(r.Context(), r.Method, upstream+r.URL.RequestURI(), nil)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		if !cacheable || resp.StatusCode != http.StatusOK {
			for _, k := range []string{"Content-Type", "Content-Length"} {
				if v := resp.Header.Get(k); v != "" {
					w.Header().Set(k, v)
				}
			}
			w.WriteHeader(resp.StatusCode)
			_, _ = io.Copy(w, resp.Body)
			return
		}
		// Kept whole or not at all (a temporary file renamed), as another
		// test binary may be reading the same directory.
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		var rnd [6]byte
		_, _ = rand.Read(rnd[:])
		tmp := file + ".tmp-" + hex.EncodeToString(rnd[:])
		f, err := os.Create(tmp)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		_, err = io.Copy(f, resp.Body)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp, file)
		}
		if err != nil {
			_ = os.Remove(tmp)
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if !serveFile(w, file) {
			http.Error(w, "the kept answer went away", http.StatusInternalServerError)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// serveFile answers with the file's content, if it can be opened.
func serveFile(w http.ResponseWriter, file string) bool {
	f, err := os.Open(file)
	if err != nil {
		return false
	}
	defer f.Close()
	_, _ = io.Copy(w, f)
	return true
}
