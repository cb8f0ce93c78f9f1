package app_test

import (
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/app"
)

// TestExamplesLoad: every configuration in examples/ (the ones the README
// uses) parses and validates, and says what its name promises.
func TestExamplesLoad(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	checks := map[string]func(c app.Config) bool{
		"notes.yaml": func(c app.Config) bool { return c.Resources == "notes" && !c.Checkpoint.Enabled },
		"notes-checkpoints.yaml": func(c app.Config) bool {
			return c.Resources == "notes" && c.Checkpoint.Enabled && c.Checkpoint.StateDir != ""
		},
		"swebench.yaml": func(c app.Config) bool {
			return c.Resources == "swebench" && !c.SWEBench.IsVerifyingGoldenPatch && c.Checkpoint.StateDir != "" && len(c.SWEBench.Repos) > 0
		},
		"notes-opensandbox.yaml": func(c app.Config) bool {
			return c.Resources == "notes" && c.Sandbox.Provider == "opensandbox" && c.Sandbox.OpenSandbox.Domain != "" && c.Checkpoint.Enabled
		},
		"opensandbox.yaml": func(c app.Config) bool {
			return c.Sandbox.Provider == "opensandbox" && c.Sandbox.OpenSandbox.Images["notes"] != "" && c.Sandbox.OpenSandbox.MaxConcurrentSnapshots == 2
		},
		"swebench-golden.yaml": func(c app.Config) bool {
			return c.Resources == "swebench" && c.SWEBench.IsVerifyingGoldenPatch && c.Checkpoint.StateDir == ""
		},
	}
	var names, want []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		t.Run(filepath.Base(f), func(t *testing.T) {
			opts, err := app.ParseArgs([]string{"-config", f}, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if check, ok := checks[filepath.Base(f)]; ok && !check(opts.Config) {
				t.Errorf("%s does not configure what its name says: %+v", f, opts.Config)
			}
		})
	}
	for n := range checks {
		want = append(want, n)
	}
	sort.Strings(want)
	for _, n := range names {
		if checks[n] == nil {
			want = append(want, n) // a new example: loaded above, no check of its own
		}
	}
	sort.Strings(want)
	if diff := cmp.Diff(want, names); diff != "" {
		t.Errorf("examples/ (-want +got):\n%s", diff)
	}
}

// TestREADMEConfigsAreTheExamples: a YAML block of README.md or docs/ that
// names a file of examples/ in its first line configures what that file does.
func TestREADMEConfigsAreTheExamples(t *testing.T) {
	t.Parallel()
	docs, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, doc := range append([]string{filepath.Join("..", "README.md")}, docs...) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, part := range strings.Split(string(b), "```yaml\n")[1:] {
			block, _, _ := strings.Cut(part, "```")
			first, _, _ := strings.Cut(block, "\n")
			name, ok := strings.CutPrefix(first, "# examples/")
			if !ok {
				continue
			}
			blocks++
			checkExampleBlock(t, filepath.Base(doc), name, block)
		}
	}
	if blocks < 3 {
		t.Errorf("%d blocks name an example, want the walk-through's, SWE-bench's and OpenSandbox's", blocks)
	}
}

func checkExampleBlock(t *testing.T, doc, name, block string) {
	t.Run(doc+"/"+name, func(t *testing.T) {
		readme := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(readme, []byte(block), 0o644); err != nil {
			t.Fatal(err)
		}
		want, err := app.ParseArgs([]string{"-config", filepath.Join("..", "examples", name)}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		got, err := app.ParseArgs([]string{"-config", readme}, io.Discard)
		if err != nil {
			t.Fatalf("%s's %s: %v", doc, name, err)
		}
		if diff := cmp.Diff(want.Config, got.Config); diff != "" {
			t.Errorf("%s's %s differs from the file (-file +doc):\n%s", doc, name, diff)
		}
	})
}

// TestExamplesWriteOnlyBesideThemselves: every directory an example names
// is relative (it starts cleanly in a scratch directory, as README runs
// it, and writes nothing under /srv or /var), and no two examples write
// the same directory (one's state would be another's leftovers).
func TestExamplesWriteOnlyBesideThemselves(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join("..", "examples", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	writers := map[string]string{} // directory -> example
	for _, f := range files {
		opts, err := app.ParseArgs([]string{"-config", f}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		c := opts.Config
		dirs := map[string]string{
			"checkpoint.state_dir":  c.Checkpoint.StateDir,
			"sandbox.local.root":    c.Sandbox.Local.Root,
			"swebench.template_dir": c.SWEBench.TemplateDir,
		}
		for repo, path := range c.SWEBench.Repos {
			dirs["swebench.repos."+repo] = path
		}
		for key, dir := range dirs {
			if dir == "" {
				continue
			}
			if filepath.IsAbs(dir) {
				t.Errorf("%s: %s is %s, outside the directory the example runs in", filepath.Base(f), key, dir)
			}
			if strings.HasPrefix(key, "swebench.repos.") || key == "swebench.template_dir" {
				continue // read, or made to be shared
			}
			if other, ok := writers[filepath.Clean(dir)]; ok {
				t.Errorf("%s and %s both write %s", other, filepath.Base(f), dir)
			}
			writers[filepath.Clean(dir)] = filepath.Base(f)
		}
	}
}
