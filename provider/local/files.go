package local

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/sandboxowner/owner/provider"
)

// sandboxRel turns a path in the sandbox's view (relative to workdir, or
// absolute under it) into a slash path relative to the tree's top, refusing
// one that leaves the tree by its spelling. Symlinks are os.Root's to refuse.
func sandboxRel(workdir, p string) (string, error) {
	if p == "" {
		return "", fmt.Errorf("empty path: %w", provider.ErrPathEscape)
	}
	if strings.ContainsRune(p, 0) {
		return "", fmt.Errorf("path %q holds a NUL: %w", p, provider.ErrPathEscape)
	}
	if path.IsAbs(p) {
		c := path.Clean(p)
		switch {
		case c == workdir:
			return ".", nil
		case strings.HasPrefix(c, workdir+"/"):
			return c[len(workdir)+1:], nil
		default:
			return "", fmt.Errorf("path %q is outside the workdir %s: %w", p, workdir, provider.ErrPathEscape)
		}
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("path %q leaves the workdir: %w", p, provider.ErrPathEscape)
	}
	return c, nil
}

// rootErr classifies an os.Root error: a path that a symlink takes out of
// the tree becomes ErrPathEscape. os.Root does not export its error value,
// so its text is matched (a test pins it).
func rootErr(op, p string, err error) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if _, isPath := e.(*os.PathError); !isPath && e.Error() == "path escapes from parent" {
			return fmt.Errorf("local: %s %q: a symlink leads out of the sandbox: %w", op, p, provider.ErrPathEscape)
		}
	}
	return fmt.Errorf("local: %s %q: %w", op, p, err)
}

// writeFileIn writes data at rel inside the tree at fsDir, making parents;
// what it makes belongs to own (when not nil).
func writeFileIn(fsDir, rel string, data []byte, own *owner) error {
	root, err := os.OpenRoot(fsDir)
	if err != nil {
		return fmt.Errorf("local: open sandbox tree: %w", err)
	}
	defer root.Close()
	if rel == "." {
		return fmt.Errorf("local: write %q: the workdir itself is not a file: %w", rel, provider.ErrPathEscape)
	}
	if dir := path.Dir(rel); dir != "." {
		if err := root.MkdirAll(filepath.FromSlash(dir), 0o755); err != nil {
			return rootErr("write", rel, err)
		}
		if own != nil {
			for d := dir; d != "."; d = path.Dir(d) {
				if err := root.Lchown(filepath.FromSlash(d), own.uid, own.gid); err != nil {
					return rootErr("write", rel, err)
				}
			}
		}
	}
	// O_NONBLOCK: a FIFO a command left at the path must not hang the
	// server; anything but a regular file is refused once open.
	f, err := root.OpenFile(filepath.FromSlash(rel), os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NONBLOCK, 0o644)
	if err != nil {
		return rootErr("write", rel, err)
	}
	if err := checkRegular(f, rel); err != nil {
		f.Close()
		return err
	}
	if own != nil {
		if err := f.Chown(own.uid, own.gid); err != nil {
			f.Close()
			return fmt.Errorf("local: write %q: %w", rel, err)
		}
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("local: write %q: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("local: write %q: %w", rel, err)
	}
	return nil
}

// readFileIn reads the regular file at rel inside the tree at fsDir.
func readFileIn(fsDir, rel string) ([]byte, error) {
	root, err := os.OpenRoot(fsDir)
	if err != nil {
		return nil, fmt.Errorf("local: open sandbox tree: %w", err)
	}
	defer root.Close()
	f, err := root.OpenFile(filepath.FromSlash(rel), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, rootErr("read", rel, err)
	}
	defer f.Close()
	if err := checkRegular(f, rel); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("local: read %q: %w", rel, err)
	}
	return b, nil
}

func checkRegular(f *os.File, rel string) error {
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("local: stat %q: %w", rel, err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("local: %q is a %s: %w", rel, kindOf(fi.Mode()), ErrNotRegular)
	}
	return nil
}

func kindOf(m os.FileMode) string {
	switch {
	case m.IsDir():
		return "directory"
	case m&os.ModeNamedPipe != 0:
		return "FIFO"
	case m&os.ModeDevice != 0:
		return "device"
	case m&os.ModeSocket != 0:
		return "socket"
	}
	return "special file"
}

// writeFiles writes a spec's files, in sorted order so failures repeat.
func writeFiles(fsDir, workdir string, files map[string]string, own *owner) error {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		rel, err := sandboxRel(workdir, name)
		if err != nil {
			return fmt.Errorf("local: spec file: %w", err)
		}
		if err := writeFileIn(fsDir, rel, []byte(files[name]), own); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile writes data at p (relative to the workdir, or absolute under it),
// making parent directories. A path whose spelling or symlinks leave the tree
// is ErrPathEscape.
func (p *Provider) WriteFile(ctx context.Context, h provider.Handle, name string, data []byte) error {
	if err := ctxErr(ctx, "write file"); err != nil {
		return err
	}
	s, err := p.live(h, true)
	if err != nil {
		return err
	}
	rel, err := sandboxRel(s.meta.Workdir, name)
	if err != nil {
		return fmt.Errorf("local: write file: %w", err)
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := p.stillLive(s); err != nil {
		return err
	}
	return writeFileIn(s.fsDir(), rel, data, p.owner())
}

// ReadFile reads the file at p (relative to the workdir, or absolute under
// it). A path whose spelling or symlinks leave the tree is ErrPathEscape; a
// missing file is an error wrapping fs.ErrNotExist.
func (p *Provider) ReadFile(ctx context.Context, h provider.Handle, name string) ([]byte, error) {
	if err := ctxErr(ctx, "read file"); err != nil {
		return nil, err
	}
	s, err := p.live(h, true)
	if err != nil {
		return nil, err
	}
	rel, err := sandboxRel(s.meta.Workdir, name)
	if err != nil {
		return nil, fmt.Errorf("local: read file: %w", err)
	}
	s.gate.RLock()
	defer s.gate.RUnlock()
	if err := p.stillLive(s); err != nil {
		return nil, err
	}
	return readFileIn(s.fsDir(), rel)
}

// stillLive re-checks, under the gate, that a Stop did not win the race.
func (p *Provider) stillLive(s *sandbox) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return p.checkLiveLocked(s)
}
