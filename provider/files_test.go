package provider_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/fake"
)

// opener is a fake whose OpenFile hands out a stream that reports a size
// and counts the bytes taken from it.
type opener struct {
	*fake.Provider
	size  int64
	body  string
	taken int
}

func (o *opener) Capabilities() provider.Capabilities {
	c := o.Provider.Capabilities()
	c.FileOpener = o
	return c
}

func (o *opener) OpenFile(context.Context, provider.Handle, string) (io.ReadCloser, int64, error) {
	return io.NopCloser(&counting{r: strings.NewReader(o.body), n: &o.taken}), o.size, nil
}

type counting struct {
	r io.Reader
	n *int
}

func (c *counting) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	*c.n += n
	return n, err
}

func TestReadFileAtMost(t *testing.T) {
	ctx := context.Background()
	fk := fake.New(fake.Options{Seed: 1})
	h, err := fk.Start(ctx, provider.Spec{Files: map[string]string{"f": "12345"}})
	if err != nil {
		t.Fatal(err)
	}
	// Without a FileOpener: ReadFile, then the size.
	if b, err := provider.ReadFileAtMost(ctx, fk, h, "f", 5); err != nil || string(b) != "12345" {
		t.Errorf("at the limit: %q, %v", b, err)
	}
	if _, err := provider.ReadFileAtMost(ctx, fk, h, "f", 4); !errors.Is(err, provider.ErrFileTooLarge) {
		t.Errorf("over the limit: %v, want ErrFileTooLarge", err)
	}
	// With one: a size over the limit is refused before any byte is read,
	// and a stream longer than its size is read only to the limit and one.
	o := &opener{Provider: fk, size: 100, body: strings.Repeat("x", 100)}
	if _, err := provider.ReadFileAtMost(ctx, o, h, "f", 10); !errors.Is(err, provider.ErrFileTooLarge) || o.taken != 0 {
		t.Errorf("announced over the limit: %v, %d bytes taken", err, o.taken)
	}
	o = &opener{Provider: fk, size: 3, body: strings.Repeat("x", 100)}
	if _, err := provider.ReadFileAtMost(ctx, o, h, "f", 10); !errors.Is(err, provider.ErrFileTooLarge) || o.taken != 11 {
		t.Errorf("a stream longer than it said: %v, %d bytes taken, want 11", err, o.taken)
	}
	o = &opener{Provider: fk, size: 3, body: "abc"}
	if b, err := provider.ReadFileAtMost(ctx, o, h, "f", 10); err != nil || string(b) != "abc" {
		t.Errorf("within the limit: %q, %v", b, err)
	}
}
