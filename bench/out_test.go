package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A run with no -out must leave the clone as it was: its results go
// outside the source tree, here bench/.
func TestDefaultOutIsOutsideTheTree(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	tree, err := filepath.Abs(filepath.Join(wd, ".."))
	if err != nil {
		t.Fatal(err)
	}
	out, err := filepath.Abs(defaultOut())
	if err != nil {
		t.Fatal(err)
	}
	if out == tree || strings.HasPrefix(out, tree+string(filepath.Separator)) {
		t.Errorf("results go to %s, inside the source tree %s", out, tree)
	}
}
