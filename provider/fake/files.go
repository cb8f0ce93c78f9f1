package fake

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/sandboxowner/owner/provider"
)

// resolve turns name into a clean absolute path inside the sandbox, relative
// names taken from dir (itself clean and absolute). A ".." that would climb
// above "/" is an escape rather than being clamped as path.Clean would, so
// that the fake refuses what a real provider must refuse.
func resolve(dir, name string) (string, error) {
	if name == "" {
		return "", fmt.Errorf("fake: empty path")
	}
	full := name
	if !path.IsAbs(name) {
		full = dir + "/" + name
	}
	if path.Clean(full) == full {
		// Clean and absolute, so no ".." is left in it: what walk
		// returns, without its slices.
		return full, nil
	}
	return walk(full, name)
}

// walk resolves full, an absolute path, segment by segment; name is what
// an error names.
func walk(full, name string) (string, error) {
	var parts []string
	for _, seg := range strings.Split(full, "/") {
		switch seg {
		case "", ".":
		case "..":
			if len(parts) == 0 {
				return "", fmt.Errorf("fake: %q: %w", name, provider.ErrPathEscape)
			}
			parts = parts[:len(parts)-1]
		default:
			parts = append(parts, seg)
		}
	}
	return "/" + strings.Join(parts, "/"), nil
}

// The file map holds only files; a directory exists while a file is below it,
// and the workdir and "/" always exist.

func isDir(files map[string]string, workdir, dir string) bool {
	if dir == "/" || dir == workdir || strings.HasPrefix(workdir, dir+"/") {
		return true
	}
	prefix := dir + "/"
	for name := range files {
		if strings.HasPrefix(name, prefix) {
			return true
		}
	}
	return false
}

// children lists the names directly inside dir, sorted.
func children(files map[string]string, workdir, dir string) []string {
	prefix := strings.TrimSuffix(dir, "/") + "/"
	seen := map[string]bool{}
	add := func(name string) {
		if rest, ok := strings.CutPrefix(name, prefix); ok && rest != "" {
			first, _, _ := strings.Cut(rest, "/")
			seen[first] = true
		}
	}
	for name := range files {
		add(name)
	}
	add(workdir)
	names := make([]string, 0, len(seen))
	for name := range seen {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}
