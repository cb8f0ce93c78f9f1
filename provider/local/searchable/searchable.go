// Package searchable lets a sandbox's uid reach the host directories its
// sandbox binds: it adds the search bit (o+x) where that uid could not
// search a directory on the way, and nothing else. Its decisions are tested
// on a temporary directory in milliseconds, apart from the sandboxes that
// use them.
package searchable

import (
	"os"
	"path/filepath"
	"syscall"
)

// Make makes dir and each of its ancestors searchable (o+x) by the
// sandbox's uid, which its init runs as: it must reach the trees it binds.
// Only the search bit is added, never read or write; it returns the
// directories it changed.
func Make(dir string, uid, gid int) ([]string, error) {
	var changed []string
	p := filepath.Clean(dir)
	var chain []string
	for {
		chain = append(chain, p)
		if p == "/" {
			break
		}
		p = filepath.Dir(p)
	}
	for i := len(chain) - 1; i >= 0; i-- {
		d := chain[i]
		fi, err := os.Stat(d)
		if err != nil {
			return changed, err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			continue
		}
		m := fi.Mode().Perm()
		if m&0o001 != 0 || (int(st.Uid) == uid && m&0o100 != 0) || (int(st.Gid) == gid && m&0o010 != 0) {
			continue
		}
		if err := os.Chmod(d, fi.Mode().Perm()|0o001|fi.Mode()&(os.ModeSetgid|os.ModeSticky)); err != nil {
			return changed, err
		}
		changed = append(changed, d)
	}
	return changed, nil
}
