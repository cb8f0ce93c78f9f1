package provider

import (
	"context"
	"fmt"
	"io"
)

// FileOpener can hand out a sandbox's file as a stream,
// so that a caller holds only what it reads at a time, never the whole file.
type FileOpener interface {
	// OpenFile opens the regular file at path (as ReadFile names it) and
	// returns it with its size: the reader yields at most size bytes. The
	// caller closes it. A file over the provider's cap is ErrFileTooLarge.
	OpenFile(ctx context.Context, h Handle, path string) (io.ReadCloser, int64, error)
}

// ReadFileAtMost reads the file at path, refusing one larger than limit
// bytes with ErrFileTooLarge. Through p's FileOpener it reads at most
// limit+1 bytes whatever the file's size; otherwise it is ReadFile with the
// size checked after.
func ReadFileAtMost(ctx context.Context, p Provider, h Handle, path string, limit int64) ([]byte, error) {
	o := p.Capabilities().FileOpener
	if o == nil {
		b, err := p.ReadFile(ctx, h, path)
		if err == nil && int64(len(b)) > limit {
			return nil, fmt.Errorf("read %s: %d bytes, more than %d: %w", path, len(b), limit, ErrFileTooLarge)
		}
		return b, err
	}
	rc, size, err := o.OpenFile(ctx, h, path)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	if size > limit {
		return nil, fmt.Errorf("read %s: %d bytes, more than %d: %w", path, size, limit, ErrFileTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(rc, limit+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if int64(len(b)) > limit {
		return nil, fmt.Errorf("read %s: more than %d bytes: %w", path, limit, ErrFileTooLarge)
	}
	return b, nil
}
