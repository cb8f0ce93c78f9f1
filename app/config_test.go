package app_test

import (
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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
	t.Parallel()
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
  retention:
    grace_s: 30
http:
  read_timeout: 10s
  idle_timeout: 5m
sweep:
  retention:
    orphans: 2h
    templates: 30m
`)
	opts, err := app.ParseArgs([]string{"-config", file, "-port", "9001", "-checkpoint.state_dir", "/other", "-sandbox.local.templates", "x=/t/x", "-log-format", "json",
		"-http.max_conns", "100", "-http.idle_timeout", "2m", "-max_sessions", "0", "-session_idle_timeout", "90m", "-sweep.interval", "5m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := app.Config{
		Name: "notes-a", Resources: "notes", Host: "0.0.0.0", Port: 9001, NumWorkers: 1, SessionSecret: "a-secret-of-16-chars",
		Sandbox: app.SandboxConfig{Provider: "local", Local: app.LocalOptions{Root: "/srv/sandboxes", Templates: map[string]string{"notes": "", "x": "/t/x"}},
			OpenSandbox: app.Defaults().Sandbox.OpenSandbox, Pool: app.Defaults().Sandbox.Pool},
		Checkpoint: app.CheckpointConfig{Enabled: true, StateDir: "/other", ControlAuthToken: "tok", Parallelism: 8, OnStop: "none", LeaseGraceSeconds: 30, MaxDeadlineSeconds: 3600,
			Retention: app.RetentionConfig{FollowDirs: true, GraceS: 30, PeriodS: 60}},
		HTTP:        app.HTTPConfig{ReadTimeout: 10 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute, MaxConns: 100, MaxConnsPerIP: 2048},
		Sweep:       app.SweepConfig{Interval: 5 * time.Minute, Retention: app.SweepRetentionConfig{Orphans: 2 * time.Hour, PendingDeletes: app.DefaultSweepPendingDeletes, Templates: 30 * time.Minute}},
		MaxSessions: 0, SessionIdleTimeout: 90 * time.Minute,
	}
	if diff := cmp.Diff(want, opts.Config); diff != "" {
		t.Errorf("config (-want +got):\n%s", diff)
	}
	if opts.LogFormat != "json" {
		t.Errorf("log format %q", opts.LogFormat)
	}
}

func TestParseArgsDefaultsAndFlagsOnly(t *testing.T) {
	t.Parallel()
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
	if r := app.Defaults().Checkpoint.Retention; !cmp.Equal(app.RetentionConfig{FollowDirs: true, GraceS: 300, PeriodS: 60}, r) {
		t.Errorf("retention defaults %+v", r)
	}
	opts, err = app.ParseArgs([]string{"-checkpoint.enabled", "-checkpoint.control_auth_token=t", "-checkpoint.state_dir", "/s", "-checkpoint.lease_grace_seconds", "1.5", "-sandbox.fake.seed", "7",
		"-checkpoint.retention.follow_dirs=false", "-checkpoint.retention.grace_s", "2.5", "-checkpoint.retention.period_s", "10"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	ck := opts.Config.Checkpoint
	if !ck.Enabled || ck.ControlAuthToken != "t" || ck.LeaseGraceSeconds != 1.5 || opts.Config.Sandbox.Fake.Seed != 7 ||
		!cmp.Equal(app.RetentionConfig{GraceS: 2.5, PeriodS: 10}, ck.Retention) {
		t.Errorf("flags: %+v", opts.Config)
	}
}

func TestOpenSandboxKeys(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
sandbox:
  provider: opensandbox
  opensandbox:
    domain: osb.example:8080
    protocol: https
    api_key: from-file
    use_server_proxy: true
    ttl_s: 1800
    images: {notes: "registry.example/notes:1"}
    resources: {cpu: 500m, memory: 1Gi}
    request_timeout_s: 10
    ready_timeout_s: 120
    max_concurrent_snapshots: 4
    lend: direct
`)
	opts, err := app.ParseArgs([]string{"-config", file, "-sandbox.opensandbox.images", "swe=registry.example/swe:2", "-sandbox.opensandbox.ttl_s", "900"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := app.OpenSandboxOptions{
		Domain: "osb.example:8080", Protocol: "https", APIKey: "from-file", UseServerProxy: true, TTLSeconds: 900,
		Images:    map[string]string{"notes": "registry.example/notes:1", "swe": "registry.example/swe:2"},
		Resources: app.OpenSandboxResources{CPU: "500m", Memory: "1Gi"}, RequestTimeoutSeconds: 10, ReadyTimeoutSeconds: 120,
		MaxConcurrentSnapshots: 4, Lend: "direct",
	}
	if diff := cmp.Diff(want, opts.Config.Sandbox.OpenSandbox); diff != "" {
		t.Errorf("sandbox.opensandbox (-want +got):\n%s", diff)
	}
	if d := app.Defaults().Sandbox.OpenSandbox; d.TTLSeconds != 3600 || d.Protocol != "http" || d.Lend != "server" {
		t.Errorf("defaults %+v, want ttl_s 3600, http, lend server", d)
	}
}

// TestConfigErrorLines: each configuration error is one line naming the
// key by its dotted path, exactly as written here.
func TestConfigErrorLines(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		args []string
		file string
		want string // FILE stands for the file's path
	}{
		{name: "unknown key", file: "prot: 80\n", want: `config: FILE:1: unknown key "prot" (did you mean "port"?)`},
		{name: "unknown nested key", file: "sandbox:\n  provder: local\n", want: `config: FILE:2: unknown key "sandbox.provder" (did you mean "sandbox.provider"?)`},
		{name: "key at the wrong level", file: "name: x\nstate_dir: /x\n", want: `config: FILE:2: unknown key "state_dir" (did you mean "checkpoint.state_dir"?)`},
		{name: "unknown key, nothing near", file: "zzzzzzzz: 1\n", want: `config: FILE:1: unknown key "zzzzzzzz"`},
		{name: "wrong type", file: "port: eighty\n", want: `config: FILE:1: port: want an integer, got "eighty"`},
		{name: "wrong nested type", file: "checkpoint:\n  enabled: maybe\n", want: `config: FILE:2: checkpoint.enabled: want true or false, got "maybe"`},
		{name: "number wanted", file: "checkpoint:\n  lease_grace_seconds: soon\n", want: `config: FILE:2: checkpoint.lease_grace_seconds: want a number, got "soon"`},
		{name: "scalar for a block", file: "sandbox: local\n", want: `config: FILE:1: sandbox: want a mapping of keys, got "local"`},
		{name: "list for a map", file: "sandbox:\n  local:\n    templates: [a]\n", want: `config: FILE:3: sandbox.local.templates: want a mapping of key: string, got a list`},
		{name: "not a mapping", file: "- a\n", want: `config: FILE:1: the file must be a mapping of keys, not a list`},
		{name: "a key given twice", file: "port: 80\nname: x\nport: 81\n", want: `config: FILE:3: port is given twice (first on line 1)`},
		{name: "a nested key given twice", file: "checkpoint:\n  enabled: true\n  enabled: false\n", want: `config: FILE:3: checkpoint.enabled is given twice (first on line 2)`},
		{name: "a map key given twice", file: "sandbox:\n  local:\n    templates:\n      a: /x\n      a: /y\n",
			want: `config: FILE:5: sandbox.local.templates.a is given twice (first on line 4)`},
		{name: "flag of the wrong type", args: []string{"-port", "eighty"}, want: `config: flag -port: want an integer, got "eighty"`},
		{name: "unknown flag", args: []string{"-prot", "80"}, want: `config: flag -prot: unknown key "prot" (did you mean "port"?)`},
		{name: "unknown nested flag", args: []string{"-checkpoint.stat_dir", "x"}, want: `config: flag -checkpoint.stat_dir: unknown key "checkpoint.stat_dir" (did you mean "checkpoint.state_dir"?)`},
		{name: "bad map flag", args: []string{"-sandbox.local.templates", "novalue"}, want: `config: flag -sandbox.local.templates: want key=value, got "novalue"`},
		{name: "bad bool flag", args: []string{"-checkpoint.enabled=sure"}, want: `config: flag -checkpoint.enabled: want true or false, got "sure"`},
		{name: "checkpointing without a token", args: []string{"-checkpoint.enabled"}, want: `config: checkpoint.control_auth_token is required when checkpoint.enabled is true`},
		{name: "checkpointing without a state_dir", args: []string{"-checkpoint.enabled", "-checkpoint.control_auth_token", "t"},
			want: `config: checkpoint.state_dir is required with checkpoint.enabled: the sessions' sandboxes are exported into its index`},
		{name: "exporting with workers", args: []string{"-checkpoint.enabled", "-checkpoint.control_auth_token", "t", "-checkpoint.state_dir", "/s", "-num_workers", "4"},
			want: `config: num_workers: want 1, got 4 (this server runs in one process and serves all sessions concurrently; swebench.max_concurrent_gradings bounds the gradings)`},
		{name: "workers without checkpointing", args: []string{"-resources", "swebench", "-swebench.is_verifying_golden_patch", "-num_workers", "8"},
			want: `config: num_workers: want 1, got 8 (this server runs in one process and serves all sessions concurrently; swebench.max_concurrent_gradings bounds the gradings)`},
		{name: "bad port", args: []string{"-port", "70000"}, want: `config: port must be 0-65535, not 70000`},
		{name: "unknown resources", args: []string{"-resources", "weather"}, want: `config: resources must be one of notes, swebench, not "weather"`},
		{name: "unknown provider", args: []string{"-sandbox.provider", "docker"}, want: `config: sandbox.provider must be one of fake, local, opensandbox, not "docker"`},
		{name: "opensandbox without a domain", args: []string{"-sandbox.provider", "opensandbox"},
			want: `config: sandbox.opensandbox.domain (host:port of the lifecycle server) is required with sandbox.provider opensandbox`},
		{name: "opensandbox domain with a scheme", args: []string{"-sandbox.opensandbox.domain", "http://h:1"},
			want: `config: sandbox.opensandbox.domain must be host:port without a scheme, not "http://h:1"`},
		{name: "opensandbox protocol", args: []string{"-sandbox.opensandbox.protocol", "ftp"}, want: `config: sandbox.opensandbox.protocol must be http or https, not "ftp"`},
		{name: "opensandbox short ttl", args: []string{"-sandbox.opensandbox.ttl_s", "59"}, want: `config: sandbox.opensandbox.ttl_s must be at least 60 (the server's minimum), not 59`},
		{name: "opensandbox lend", args: []string{"-sandbox.opensandbox.lend", "proxy"}, want: `config: sandbox.opensandbox.lend must be server or direct, not "proxy"`},
		{name: "opensandbox snapshots", args: []string{"-sandbox.opensandbox.max_concurrent_snapshots", "-1"},
			want: `config: sandbox.opensandbox.max_concurrent_snapshots must not be negative, not -1`},
		{name: "bad on_stop", args: []string{"-checkpoint.on_stop", "pause"}, want: `config: checkpoint.on_stop must be kill or none, not "pause"`},
		{name: "negative retention grace", args: []string{"-checkpoint.retention.grace_s", "-1"}, want: `config: checkpoint.retention.grace_s must not be negative, not -1`},
		{name: "negative retention period", file: "checkpoint:\n  retention:\n    period_s: -5\n", want: `config: checkpoint.retention.period_s must be > 0 (0: the default, 60), not -5`},
		{name: "retention key misspelt", file: "checkpoint:\n  retention:\n    follow_dir: false\n", want: `config: FILE:3: unknown key "checkpoint.retention.follow_dir" (did you mean "checkpoint.retention.follow_dirs"?)`},
		{name: "zero grace", args: []string{"-checkpoint.lease_grace_seconds", "0"}, want: `config: checkpoint.lease_grace_seconds must be > 0, not 0`},
		{name: "short secret", args: []string{"-session_secret", "short"}, want: `config: session_secret must be at least 16 characters`},
		{name: "bad name", args: []string{"-name", "a b"}, want: `config: name "a b" must match ^[A-Za-z0-9][A-Za-z0-9._-]*$`},
		{name: "bad log format", args: []string{"-log-format", "xml"}, want: `config: -log-format: want text or json, got "xml"`},
		{name: "stray argument", args: []string{"-port", "1", "extra"}, want: `config: unexpected argument "extra" (commands come first: serve, swebench, sweep)`},
		{name: "missing file", args: []string{"-config", "/nonexistent.yaml"}, want: `config: open /nonexistent.yaml: no such file or directory`},
		{name: "duration flag", args: []string{"-http.read_timeout", "30"}, want: `config: flag -http.read_timeout: want a duration (30s, 5m, 6h), got "30"`},
		{name: "duration in the file", file: "http:\n  idle_timeout: soon\n", want: `config: FILE:2: http.idle_timeout: want a duration (30s, 5m, 6h), got "soon"`},
		{name: "negative timeout", args: []string{"-http.read_timeout", "-1s"}, want: `config: http.read_timeout must not be negative, not -1s`},
		{name: "negative sweep interval", args: []string{"-sweep.interval", "-1m"}, want: `config: sweep.interval must not be negative, not -1m0s`},
		{name: "negative sweep retention", args: []string{"-sweep.retention.pending_deletes", "-1s"}, want: `config: sweep.retention.pending_deletes must not be negative, not -1s`},
		{name: "negative pool size", args: []string{"-sandbox.pool.size", "-1"}, want: `config: sandbox.pool: size must not be negative (0: no pools), refill_concurrency must be at least 1 and max_idle not negative, not -1, 4, 10m0s`},
		{name: "no pool refills", args: []string{"-sandbox.pool.refill_concurrency", "0"}, want: `config: sandbox.pool: size must not be negative (0: no pools), refill_concurrency must be at least 1 and max_idle not negative, not 0, 0, 10m0s`},
		{name: "negative template retention", args: []string{"-sweep.retention.templates", "-1s"}, want: `config: sweep.retention.templates must not be negative, not -1s`},
		{name: "negative cpu weight", args: []string{"-sandbox.local.cpu_weight_max", "-1"}, want: `config: sandbox.local.cpu_weight_max must not be negative, not -1`},
		{name: "negative max_sessions", args: []string{"-max_sessions", "-1"}, want: `config: max_sessions must not be negative (0: no bound), not -1`},
		{name: "negative max deadline", args: []string{"-checkpoint.max_deadline_seconds", "-1"}, want: `config: checkpoint.max_deadline_seconds must be > 0 (0: the default, 3600), not -1`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			want := tc.want
			if tc.file != "" {
				path := writeFile(t, tc.file)
				args = append([]string{"-config", path}, args...)
				want = strings.ReplaceAll(want, "FILE", path)
			}
			_, err := app.ParseArgs(args, io.Discard)
			if !errors.Is(err, app.ErrConfig) {
				t.Fatalf("error %v, want a config error", err)
			}
			if diff := cmp.Diff(want, err.Error()); diff != "" {
				t.Errorf("error line (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHelp: -h names the commands, the binary's own flags, and every key
// with its default.
func TestHelp(t *testing.T) {
	t.Parallel()
	var out strings.Builder
	_, err := app.ParseArgs([]string{"-h"}, &out)
	if !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	lines := strings.Split(out.String(), "\n")
	find := func(prefix string) string {
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 0 && f[0] == prefix {
				return l
			}
		}
		t.Errorf("usage has no line for %s:\n%s", prefix, out.String())
		return ""
	}
	for _, cmd := range []string{"serve", "sweep"} {
		find(cmd)
	}
	for _, f := range []string{"-config", "-log-format", "-log-level"} {
		find(f)
	}
	for _, key := range app.Keys() {
		find("-" + key)
	}
	for key, def := range map[string]string{"-port": "(default 8080)", "-host": `(default "127.0.0.1")`, "-name": `(default "notes")`,
		"-checkpoint.parallelism": "(default 16)", "-checkpoint.lease_grace_seconds": "(default 600)", "-checkpoint.on_stop": `(default "kill")`} {
		if l := find(key); !strings.HasSuffix(l, def) {
			t.Errorf("%s: %q does not end with %s", key, l, def)
		}
	}
	if l := find("-checkpoint.state_dir"); strings.Contains(l, "(default") {
		t.Errorf("a key without a default shows one: %q", l)
	}
}

// TestEveryKeyIsDocumented: -h has a meaning for every key.
func TestEveryKeyIsDocumented(t *testing.T) {
	t.Parallel()
	for _, key := range app.Keys() {
		if app.KeyUsage(key) == "" {
			t.Errorf("key %s has no usage line", key)
		}
	}
}

func TestSWEBenchEnvironmentKeys(t *testing.T) {
	t.Parallel()
	file := writeFile(t, `
resources: swebench
swebench:
  env_setup:
    acme/widgets: ["pip install -e .", "pip install pytest"]
  env_setup_timeout: 900
  env_setup_env: {PIP_INDEX_URL: "http://127.0.0.1:3141/simple"}
  max_concurrent_gradings: 3
`)
	opts, err := app.ParseArgs([]string{"-config", file,
		"-swebench.env_setup", "acme/widgets=python -m compileall -q .", "-swebench.env_setup", "acme__widgets-7=make deps",
		"-swebench.validate=false", "-swebench.writable_caches", "gobuild", "-swebench.writable_caches", "cargo"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	sc := opts.Config.SWEBench
	wantSetup := map[string][]string{
		"acme/widgets":    {"pip install -e .", "pip install pytest", "python -m compileall -q ."},
		"acme__widgets-7": {"make deps"},
	}
	if d := cmp.Diff(wantSetup, sc.EnvSetup); d != "" {
		t.Errorf("env_setup (-want +got):\n%s", d)
	}
	if sc.Validate == nil || *sc.Validate || sc.EnvSetupTimeout != 900 || sc.MaxConcurrentGradings != 3 ||
		sc.EnvSetupEnv["PIP_INDEX_URL"] == "" || !cmp.Equal(sc.WritableCaches, []string{"gobuild", "cargo"}) {
		t.Errorf("swebench: %+v", sc)
	}
	opts, err = app.ParseArgs([]string{"-swebench.validate"}, io.Discard)
	if err != nil || opts.Config.SWEBench.Validate == nil || !*opts.Config.SWEBench.Validate {
		t.Errorf("-swebench.validate alone: %v, %+v", err, opts.Config.SWEBench.Validate)
	}
}
