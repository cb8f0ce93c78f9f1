// Package cmdenv decides the environments of a sandbox's processes: its
// init's, fixed so that nothing a request sends changes how the sandbox
// starts, and each command's, where the spec's and the request's variables
// reach the command alone. Its decisions are tested in milliseconds, apart
// from the sandboxes that use them.
package cmdenv

import (
	"fmt"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/sandboxowner/owner/provider"
)

// BasePath is the PATH of every command before the spec's and request's
// env, and of the provider's own helpers.
const BasePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// IDVar is set in every process of a sandbox to the sandbox's id. The
// provider also uses it to find a sandbox's processes that outlived a
// crashed server, so a command that clears its environment escapes that
// sweep.
const IDVar = "LOCAL_SANDBOX_ID"

// nameRE is what a shell accepts as a variable name.
var nameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Check refuses (provider.ErrInvalidSpec) a variable a shell could not
// hold: a name outside [A-Za-z_][A-Za-z0-9_]* or a value with a NUL.
func Check(env map[string]string) error {
	for k, v := range env {
		if !nameRE.MatchString(k) {
			return fmt.Errorf("local: environment variable name %q (want [A-Za-z_][A-Za-z0-9_]*): %w", k, provider.ErrInvalidSpec)
		}
		if strings.ContainsRune(v, 0) {
			return fmt.Errorf("local: environment variable %s holds a NUL: %w", k, provider.ErrInvalidSpec)
		}
	}
	return nil
}

// Host is a sandbox's init's own environment: fixed, so that nothing in a
// request changes how the sandbox starts. id marks the process as the
// sandbox's.
func Host(id string) []string {
	return []string{"PATH=" + BasePath, "LANG=C.UTF-8", IDVar + "=" + id}
}

// Rewrite points a value naming From (a directory in the sandbox's view),
// or a path under it, at To (its directory on the host).
type Rewrite struct{ From, To string }

// Command is the environment of a command of the sandbox id, sorted by
// name: PATH, HOME and LANG, then the spec's env, then the request's, each
// over the one before; values under a rewrite's From point at its To; and
// IDVar, which neither env can change.
func Command(home string, spec, req map[string]string, rewrites []Rewrite, id string) []string {
	env := map[string]string{"PATH": BasePath, "HOME": home, "LANG": "C.UTF-8"}
	for k, v := range spec {
		env[k] = v
	}
	for k, v := range req {
		env[k] = v
	}
	for k, v := range env {
		for _, r := range rewrites {
			if v == r.From || strings.HasPrefix(v, r.From+"/") {
				env[k] = r.To + filepath.FromSlash(strings.TrimPrefix(v, r.From))
				break
			}
		}
	}
	env[IDVar] = id
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	list := make([]string, 0, len(keys))
	for _, k := range keys {
		list = append(list, k+"="+env[k])
	}
	return list
}
