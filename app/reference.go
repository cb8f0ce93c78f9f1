package app

import (
	"fmt"
	"strings"
)

// KeyDoc is one configuration key as -h and docs/configuration.md give it;
// both are made from Reference, so neither can name a key, type or default
// the other does not.
type KeyDoc struct {
	// Key is the dotted YAML path, which is also the flag's name.
	Key string
	// Type is the flag's value placeholder ("" for a boolean).
	Type string
	// Meaning is -h's one line.
	Meaning string
	// Default is the value in Defaults, worded ("" for the zero value).
	Default string
	// Details says more than -h has room for (the reference only).
	Details string
}

// Reference lists every configuration key in Config's order.
func Reference() []KeyDoc {
	help, more := keyUsage(), keyDetails()
	out := make([]KeyDoc, 0, len(help))
	for _, l := range leaves() {
		out = append(out, KeyDoc{Key: l.path, Type: flagType(l.typ), Meaning: help[l.path], Default: defaultOf(l), Details: more[l.path]})
	}
	return out
}

// machineDefaults words the defaults that depend on the machine the
// server runs on, for a reference that must read the same on every one.
func machineDefaults() map[string]string {
	return map[string]string{
		"max_sessions": fmt.Sprintf("memory / %d MiB, within %d–%d", MemoryPerSession>>20, MinMaxSessions, MaxMaxSessions),
	}
}

//go:generate go run ../scripts/configdoc -doc ../docs/configuration.md

// ReferenceMarkdown is the configuration reference's generated table
// (docs/configuration.md holds it between its markers; go run
// ./scripts/configdoc writes it there).
func ReferenceMarkdown() string {
	var b strings.Builder
	b.WriteString("| key | flag value | default | meaning |\n|---|---|---|---|\n")
	machine := machineDefaults()
	for _, k := range Reference() {
		def := k.Default
		if m, ok := machine[k.Key]; ok {
			def = m
		}
		if def != "" {
			def = "`" + def + "`"
			if _, ok := machine[k.Key]; ok {
				def = strings.Trim(def, "`")
			}
		}
		typ := k.Type
		if typ == "" {
			typ = "(boolean)"
		}
		// -h's words are plain text: a <placeholder> must not read as HTML.
		meaning := strings.NewReplacer("<", "&lt;", ">", "&gt;").Replace(k.Meaning)
		if k.Details != "" {
			meaning += ". " + k.Details
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", k.Key, typ, def, strings.ReplaceAll(meaning, "|", `\|`))
	}
	return b.String()
}

// keyDetails says more about the keys that need it than -h's one line.
func keyDetails() map[string]string {
	return map[string]string{
		"name":                                 "The cookie is `<kind>___<name>`; the server's sandboxes carry it as their `ng.owner` label",
		"host":                                 "`port: 0` listens on any free port, and the startup line names it",
		"num_workers":                          "Mirrors upstream's key; this server serves all sessions concurrently in its one process",
		"session_secret":                       "HMAC secret of cookies and sandbox tokens. Unset, it is generated once into `checkpoint.state_dir` (kept there owner-only, read back after a restart)",
		"sandbox.provider":                     "`opensandbox` is an OpenSandbox cluster ([opensandbox.md](opensandbox.md)); `fake` is in memory, for demos and tests",
		"sandbox.local.root":                   "One server per root: the server holds `<root>/server.lock` (flock) while it runs, and a second one on the root exits 2 with one line naming the process that holds it",
		"sandbox.local.templates":              "The default is `{notes: \"\"}` (an empty tree)",
		"sandbox.local.isolation":              "`auto` and `container`: where the kernel refuses containers, `auto` starts no sandbox and says why, `container` refuses to start ([security.md](security.md))",
		"sandbox.local.overlay":                "`on` is overlayfs (forks copy nothing); `off` copies",
		"sandbox.local.caches":                 "Named cache directories shared read-write into the sandboxes that name them",
		"sandbox.local.uid":                    "Each sandbox sees what this uid owns as its own (idmapped mounts); `0` means the default, never root",
		"sandbox.local.uid_range":              "Checked at startup against `/etc/passwd`, `/etc/group`, `/etc/subuid` and `/etc/subgid`; keyrings, inotify and fanotify counts and `RLIMIT_NPROC` are each sandbox's own ([security.md](security.md))",
		"sandbox.local.ro_binds":               "A toolchain in `/opt`, say; never under `/root`, `/home`, `/var`, `/srv`, `/run`, `/tmp`",
		"sandbox.local.limits.pids":            "Processes and threads",
		"sandbox.local.limits.memory_mb":       "No swap; past it the kernel kills one of the sandbox's processes",
		"sandbox.local.limits.disk_mb":         "Each sandbox's writable layer is an ext4 image of its own (sparse, loop-mounted): past it a write fails with `ENOSPC`, and the host's filesystem, the state directory and other sandboxes keep working. Isolated sandboxes only (unisolated commands write wherever the server can). Needs root, loop devices and `mkfs.ext4`; `/health` names it only where a probe at startup found it enforced ([security.md](security.md))",
		"sandbox.local.limits.disk_inodes":     "About: the filesystem rounds it up to fill its block groups. Past it, a new file fails with `ENOSPC`",
		"sandbox.local.max_exec_timeout":       "A longer `timeout_ms` is 422",
		"sandbox.local.seccomp":                "See the [security model](security.md)",
		"sandbox.local.cpu_weight_max":         "Each live sandbox weighs its `limits.cpus` (the host's CPUs with no limit), so that a sandbox using its whole limit competes with the server's other processes as that many busy processes would; without it every sandbox together weighed one process (cgroup v1 `cpu.shares` 1024, v2 `cpu.weight` 100) and in-sandbox work crawled on a loaded host. Idle sandboxes count too, hence the bound. `1` keeps them at one process's worth together. The kernel bounds it at 256 (v1) and 100 (v2)",
		"sandbox.local.init_binary":            "Built from the same sources as the server: at startup the server asks it for its protocol and refuses to start when it answers anything but its own (an older build, another program). It starts in about a third of the server's CPU time; unset, the server's own binary is the init and nothing needs building",
		"sandbox.local.max_file_bytes":         "64 MiB by default. A larger file is refused before it is read (`GET /files`: 413 `file_too_large`); reads are streamed",
		"sandbox.local.snapshot_dir":           "Such snapshots are whole trees (never layers over the machine's images) and many servers may share the directory, so that a server on another machine forks them. Unset, local checkpoints live and die with the machine: a restore elsewhere is 422 `invalid_checkpoint_state` naming the snapshots it cannot find ([many-owners.md](many-owners.md))",
		"sandbox.local.snapshot_delay_ms":      "For crash tests that kill the server mid-commit",
		"sandbox.local.fork_delay_ms":          "For crash tests that kill the server mid-restore",
		"sandbox.opensandbox.domain":           "No scheme",
		"sandbox.opensandbox.use_server_proxy": "Instead of the sandbox's endpoint",
		"sandbox.opensandbox.api_key":          "Sent as `OPEN-SANDBOX-API-KEY`",
		"sandbox.opensandbox.ttl_s":            "The owner renews a lease once a third of it has passed",
		"sandbox.opensandbox.images":           "`-sandbox.opensandbox.images notes=registry/notes:1`",
		"sandbox.opensandbox.resources.cpu":    "`resourceLimits` of sandboxes whose spec asks for none",
		"sandbox.opensandbox.ready_timeout_s":  "A create or fork, until the sandbox runs and execd answers `/ping`",
		"sandbox.opensandbox.lend":             "See Lending in [opensandbox.md](opensandbox.md)",
		"checkpoint.enabled":                   "The control plane is served under `/ng-control/v1/checkpoint/`",
		"checkpoint.state_dir":                 "The snapshot index (Badger)",
		"checkpoint.parallelism":               "Concurrent provider calls of a commit, restore or release",
		"checkpoint.on_stop":                   "What a commit with `\"stop\": true` does with the exported sandboxes",
		"checkpoint.lease_grace_seconds":       "An open checkpoint whose controller went silent resumes this long after its deadline",
		"checkpoint.max_deadline_seconds":      "A deadline years ahead would hold admission closed",
		"checkpoint.retention.follow_dirs":     "As a release that no longer keeps it would ([notes.md](notes.md)); `false` keeps every checkpoint until a release",
		"checkpoint.retention.grace_s":         "The two checks must be at least this far apart",
		"checkpoint.retention.period_s":        "A check is also made when a drop falls due",
		"max_sessions":                         "About 1,500 on 23.5 GiB. The 503 carries `Retry-After` and starts nothing; a restore is not bounded",
		"session_idle_timeout":                 "A request is a data route or a sandbox API call. The session's sandbox is stopped and its snapshots kept until their checkpoints are dropped (a release, or their checkpoint_dir gone); logged with its `session_id`",
		"http.write_timeout":                   "That is, taken by the client",
		"http.read_timeout":                    "Slower is 408 and the connection is closed",
		"http.max_conns_per_ip":                "Agents usually share the trainer's address",
	}
}

// The markers around the generated table in docs/configuration.md.
const (
	ReferenceBegin = "<!-- BEGIN GENERATED by go run ./scripts/configdoc from app.Reference: do not edit -->\n"
	ReferenceEnd   = "<!-- END GENERATED -->\n"
)

// SpliceReference returns doc with the text between its markers replaced
// by ReferenceMarkdown.
func SpliceReference(doc string) (string, error) {
	head, rest, ok := strings.Cut(doc, ReferenceBegin)
	if !ok {
		return "", fmt.Errorf("no line %q", strings.TrimSpace(ReferenceBegin))
	}
	_, tail, ok := strings.Cut(rest, ReferenceEnd)
	if !ok {
		return "", fmt.Errorf("no line %q after the first marker", strings.TrimSpace(ReferenceEnd))
	}
	return head + ReferenceBegin + ReferenceMarkdown() + ReferenceEnd + tail, nil
}
