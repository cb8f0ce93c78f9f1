package http_test

import (
	"context"
	"errors"
	"testing"

	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/owner"
	"github.com/sandboxowner/owner/provider/fake"
	"github.com/sandboxowner/owner/resources"
	"github.com/sandboxowner/owner/resources/notes"
)

// tools is the notes server with other tool routes.
type tools struct {
	*notes.Server
	routes map[string]resources.ToolFunc
}

func (t tools) Tools() map[string]resources.ToolFunc { return t.routes }

func TestNewRefusesBadConfigs(t *testing.T) {
	ctx := context.Background()
	own, err := owner.New(ctx, owner.Config{Name: "notes", Provider: fake.New(fake.Options{}), Checkpoint: owner.CheckpointConfig{Enabled: true, StateDir: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	defer own.Close()
	secret := []byte("0123456789abcdef")
	noop := func(context.Context, *resources.Session, []byte) (any, error) { return nil, nil }
	cases := map[string]httpapi.Config{
		"no control token": {Owner: own, Resources: notes.New(notes.Options{}), SessionSecret: secret},
		"short secret":     {Owner: own, Resources: notes.New(notes.Options{}), SessionSecret: []byte("x"), ControlAuthToken: "t"},
		"reserved tool":    {Owner: own, Resources: tools{notes.New(notes.Options{}), map[string]resources.ToolFunc{"/verify": noop}}, SessionSecret: secret, ControlAuthToken: "t"},
		"nested tool":      {Owner: own, Resources: tools{notes.New(notes.Options{}), map[string]resources.ToolFunc{"/a/b": noop}}, SessionSecret: secret, ControlAuthToken: "t"},
		"no owner":         {Resources: notes.New(notes.Options{}), SessionSecret: secret},
	}
	for name, cfg := range cases {
		if _, err := httpapi.New(cfg); !errors.Is(err, httpapi.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
}
