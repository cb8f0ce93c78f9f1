package app

import (
	httpapi "github.com/sandboxowner/owner/http"
	"github.com/sandboxowner/owner/resources/notes"
)

// resourcesEntry builds one resources server.
type resourcesEntry struct {
	build func(cfg *Config) (httpapi.Resources, error)
	// templates are images the server's sandboxes start from, for
	// providers that need them declared (local).
	templates map[string]string
}

// resourcesRegistry maps the resources key to the servers this binary has.
func resourcesRegistry() map[string]resourcesEntry {
	return map[string]resourcesEntry{
		"notes": {
			build: func(cfg *Config) (httpapi.Resources, error) {
				return notes.New(notes.Options{Name: cfg.Name}), nil
			},
			templates: map[string]string{notes.Image: ""},
		},
	}
}
