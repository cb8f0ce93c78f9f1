package app_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/app"
)

// TestConfigurationReferenceIsGenerated: docs/configuration.md's table is
// what the definitions -h prints from make of it; after a change to a key,
// its meaning or its default, go run ./scripts/configdoc rewrites it.
func TestConfigurationReferenceIsGenerated(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join("..", "docs", "configuration.md"))
	if err != nil {
		t.Fatal(err)
	}
	want, err := app.SpliceReference(string(b))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, string(b)); diff != "" {
		t.Errorf("docs/configuration.md is not what the definitions make; run go run ./scripts/configdoc (-generated +file):\n%s", diff)
	}
}

// TestReferenceIsWhatHelpPrints: every key -h lists is in the reference
// with the same type, meaning and default, and nothing else is.
func TestReferenceIsWhatHelpPrints(t *testing.T) {
	t.Parallel()
	var help bytes.Buffer
	if _, err := app.ParseArgs([]string{"-h"}, &help); err == nil {
		t.Fatal("-h: no error")
	}
	_, keys, ok := strings.Cut(help.String(), "configuration keys")
	if !ok {
		t.Fatalf("-h has no configuration keys:\n%s", help.String())
	}
	var fromHelp, fromRef []string
	for _, line := range strings.Split(keys, "\n")[1:] {
		if f := strings.Fields(line); len(f) > 0 {
			fromHelp = append(fromHelp, strings.TrimPrefix(f[0], "-"))
		}
	}
	for _, k := range app.Reference() {
		fromRef = append(fromRef, k.Key)
		if k.Meaning == "" {
			t.Errorf("%s has no meaning", k.Key)
		}
		if !strings.Contains(keys, k.Meaning) {
			t.Errorf("-h lacks %s's meaning %q", k.Key, k.Meaning)
		}
	}
	if diff := cmp.Diff(fromRef, fromHelp); diff != "" {
		t.Errorf("keys (-reference +help):\n%s", diff)
	}
}

// A key the reference leaves out, or a changed default, is a difference.
func TestSpliceReferenceReplacesOnlyBetweenTheMarkers(t *testing.T) {
	t.Parallel()
	doc := "intro\n" + app.ReferenceBegin + "| stale |\n" + app.ReferenceEnd + "outro\n"
	got, err := app.SpliceReference(doc)
	if err != nil {
		t.Fatal(err)
	}
	want := "intro\n" + app.ReferenceBegin + app.ReferenceMarkdown() + app.ReferenceEnd + "outro\n"
	if diff := cmp.Diff(want, got); diff != "" {
		t.Error(diff)
	}
	for _, k := range []string{"port", "checkpoint.state_dir", "swebench.evaluation_timeout", "max_sessions"} {
		if !strings.Contains(got, "| `"+k+"` |") {
			t.Errorf("the table has no row for %s", k)
		}
	}
	if _, err := app.SpliceReference("no markers\n"); err == nil {
		t.Error("a doc without markers: no error")
	}
}
