package app_test

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/app"
)

func writeFile(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "server.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParseArgsLayers(t *testing.T) {
	file := writeFile(t, `
name: notes-a
resources: notes
host: 0.0.0.0
port: 9000
num_workers: 1
session_secret: a-secret-of-16-chars
sandbox:
  provider: local
  local:
    root: /srv/sandboxes
    templates: {notes: ""}
checkpoint:
  enabled: true
  state_dir: /srv/state
  control_auth_token: tok
  parallelism: 8
  on_stop: none
  lease_grace_seconds: 30
`)
	opts, err := app.ParseArgs([]string{"-config", file, "-port", "9001", "-checkpoint.state_dir", "/other", "-sandbox.local.templates", "x=/t/x", "-log-format", "json"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := app.Config{
		Name: "notes-a", Resources: "notes", Host: "0.0.0.0", Port: 9001, NumWorkers: 1, SessionSecret: "a-secret-of-16-chars",
		Sandbox:    app.SandboxConfig{Provider: "local", Local: app.LocalOptions{Root: "/srv/sandboxes", Templates: map[string]string{"notes": "", "x": "/t/x"}}},
		Checkpoint: app.CheckpointConfig{Enabled: true, StateDir: "/other", ControlAuthToken: "tok", Parallelism: 8, OnStop: "none", LeaseGraceSeconds: 30},
	}
	if diff := cmp.Diff(want, opts.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if opts.LogFormat != "json" {
		t.Errorf("log format %q", opts.LogFormat)
	}
}

func TestParseArgsDefaultsAndFlagsOnly(t *testing.T) {
	opts, err := app.ParseArgs(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(app.Defaults(), opts.Config); diff != "" {
		t.Errorf("defaults (-want +got):\n%s", diff)
	}
	if d := app.Defaults(); d.Host != "127.0.0.1" || d.Port != 8080 || d.Resources != "notes" {
		t.Errorf("defaults %+v", d)
	}
	opts, err = app.ParseArgs([]string{"-checkpoint.enabled", "-checkpoint.control_auth_token=t", "-checkpoint.lease_grace_seconds", "1.5", "-sandbox.fake.seed", "7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ck := opts.Config.Checkpoint
	if !ck.Enabled || ck.ControlAuthToken != "t" || ck.LeaseGraceSeconds != 1.5 || opts.Config.Sandbox.Fake.Seed != 7 {
		t.Errorf("flags: %+v", opts.Config)
	}
}

func TestBadConfigs(t *testing.T) {
	cases := []struct {
		name string
		args []string
		file string
		want string
	}{
		{name: "unknown key", file: "nmae: x\n", want: "nmae"},
		{name: "wrong type", file: "port: eighty\n", want: "line 1"},
		{name: "checkpointing without a token", args: []string{"-checkpoint.enabled"}, want: "control_auth_token"},
		{name: "bad port", args: []string{"-port", "70000"}, want: "port"},
		{name: "port not a number", args: []string{"-port", "x"}, want: "port"},
		{name: "unknown resources", args: []string{"-resources", "weather"}, want: "resources"},
		{name: "unknown provider", args: []string{"-sandbox.provider", "docker"}, want: "sandbox.provider"},
		{name: "bad on_stop", args: []string{"-checkpoint.on_stop", "pause"}, want: "on_stop"},
		{name: "zero grace", args: []string{"-checkpoint.lease_grace_seconds", "0"}, want: "lease_grace_seconds"},
		{name: "short secret", args: []string{"-session_secret", "short"}, want: "session_secret"},
		{name: "bad name", args: []string{"-name", "a b"}, want: "name"},
		{name: "unknown flag", args: []string{"-nope"}, want: "nope"},
		{name: "bad template flag", args: []string{"-sandbox.local.templates", "novalue"}, want: "key=value"},
		{name: "bad log format", args: []string{"-log-format", "xml"}, want: "log-format"},
		{name: "stray argument", args: []string{"-port", "1", "extra"}, want: "extra"},
		{name: "missing file", args: []string{"-config", "/nonexistent.yaml"}, want: "nonexistent"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if tc.file != "" {
				args = append([]string{"-config", writeFile(t, tc.file)}, args...)
			}
			_, err := app.ParseArgs(args, io.Discard)
			if !errors.Is(err, app.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want a config error naming %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error is more than one line: %q", err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out strings.Builder
	_, err := app.ParseArgs([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, key := range []string{"-checkpoint.state_dir", "-sandbox.provider", "-num_workers", "-log-format"} {
		if !strings.Contains(out.String(), key) {
			t.Errorf("usage does not name %s", key)
		}
	}
}
