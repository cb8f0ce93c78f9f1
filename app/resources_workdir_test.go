package app

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A notes seed on the local provider asked its sandbox for its workdir
// (`pwd`), which started the sandbox's init: most of a seed's time. The
// workdir the configuration gives is now passed along, so a seed runs no
// command; other providers are still asked.
func TestNotesSeedsKnowTheLocalWorkdir(t *testing.T) {
	t.Parallel()
	got := map[string]string{}
	for name, edit := range map[string]func(*Config){
		"default":      func(*Config) {},
		"local":        func(c *Config) { c.Sandbox.Provider = "local" },
		"local-custom": func(c *Config) { c.Sandbox.Provider = "local"; c.Sandbox.Local.DefaultWorkdir = "/work" },
		"fake":         func(c *Config) { c.Sandbox.Provider = "fake" },
	} {
		cfg := Defaults()
		edit(&cfg)
		got[name] = knownWorkdir(&cfg)
	}
	want := map[string]string{"default": "/sandbox", "local": "/sandbox", "local-custom": "/work", "fake": ""}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("workdirs (-want +got):\n%s", diff)
	}
}
