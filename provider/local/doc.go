// Package local is the local sandbox provider: real sandboxes on one
// machine, with no service to run. It is the server's embedded default
// provider and implements provider.Provider, provider.Snapshotter,
// provider.Leaser and provider.Lister.
//
// # Using it
//
//	p, err := local.New(local.Options{
//		Root:      filepath.Join(stateDir, "sandboxes"),
//		Templates: map[string]string{"notes": ""}, // image "notes" starts empty
//		Logger:    log,
//	})
//	go p.RunReaper(ctx, 5*time.Second) // makes lease expiry real
//	h, err := p.Start(ctx, provider.Spec{Image: "notes", Files: map[string]string{"notes": ""}, TTLSeconds: 600})
//	res, err := p.Exec(ctx, h, provider.ExecRequest{Command: "echo one >> notes"})
//
// New probes what the machine can do and logs, once, what is in effect
// (Isolation() and Overlay() report it too). With Isolation "auto" (the
// default) or "container" each sandbox is a container the server makes
// itself, with nothing installed: New starts a throwaway one to see that
// the kernel allows it. Where it does not (unprivileged user namespaces
// disabled, say), "container" makes New fail (ErrIsolationUnavailable) and
// "auto" makes a provider that reports Isolation "unavailable", says why
// (IsolationError, Unreachable) and starts no sandbox: nothing runs
// unisolated unless Isolation is "none". "bwrap", the name from when
// bubblewrap made the namespaces, is "container". Overlay "auto" (the
// default) makes sandboxes overlayfs mounts when the server can mount
// overlayfs (it must be root), copies otherwise; "on" fails New instead
// (ErrOverlayUnavailable), "off" always copies.
//
// # On disk
//
// Everything is under Options.Root, so a restarted server finds its
// sandboxes, their leases and their snapshots again:
//
//	sandboxes/<sb-id>/meta.json   id, spec (without files), workdir, lease, layers
//	sandboxes/<sb-id>/fs/         the tree (overlay mode: the merged mount)
//	sandboxes/<sb-id>/upper/      overlay mode: the sandbox's own layer
//	sandboxes/<sb-id>/work/       overlay mode: overlayfs's work directory
//	sandboxes/<sb-id>/disk.img    with a disk limit: the sandbox's filesystem image
//	sandboxes/<sb-id>/disk/       its mount, which holds upper/ and work/ (copy mode: fs/) and mounts/
//	disks/                        the formatted templates sandboxes' images are copied from
//	ready/<sb-id>/                with a disk limit: a directory made ahead, its disk mounted, that a start renames into sandboxes/
//	sandboxes/<sb-id>/.views/     idmapped mounts its own uid sees its tree, the root's layers, caches through
//	snapshots/<snap-id>/meta.json the source sandbox, its metadata, layers, deleted mark
//	snapshots/<snap-id>/layer/    the whole tree, or (overlay mode) the diff
//	trash/                        what a Stop or a collection is removing
//	empty/                        the lower layer of an empty image
//
// A metadata file is written last (atomically, by rename), so a directory
// without one is a start or snapshot that did not finish; Reap removes it.
// A Handle's Descriptor is JSON {"sandbox_id", "root", "workdir"}: the id is
// all a fresh process on the same root needs to stop the sandbox, which is
// how a restarted server stops the sandboxes a crashed one left. One server
// process owns a root at a time.
//
// # Images and files
//
// Spec.Image is a template name from Options.Templates (a directory, or ""
// for an empty tree), an absolute directory, or "" (empty); anything else is
// provider.ErrInvalidSpec. In copy mode the image is copied; in overlay mode
// it is the sandbox's lowest layer, read in place, so a template must not
// change while sandboxes or snapshots stand on it. Spec.Files are written at
// start. File paths, and ExecRequest.Cwd, are relative to the workdir or
// absolute under it; a path whose spelling (.., an absolute path elsewhere)
// or whose symlinks (checked by os.Root, so a command cannot race the
// check) leave the tree is an error wrapping provider.ErrPathEscape. A FIFO,
// device or directory where a file is expected is ErrNotRegular.
//
// # Commands
//
// Exec runs /bin/sh -c in its own process group with a small environment
// (PATH, HOME, LANG, the spec's env, the request's env, and SandboxIDEnv);
// names must be shell names. That environment is the command's only: the
// init starts with a fixed one. Isolated, a sandbox's user namespace maps
// its root to an unprivileged host uid and gid of its own, from
// Options.UIDRange (or Options.UID, GID, 65534 by default, with
// UIDRangeNone), with no supplementary groups, and is made as that uid
// (see startAs), so the kernel's per-user counts are the sandbox's own;
// commands run as that root
// with every capability dropped (bounding set included), no_new_privs, no
// further user namespaces, and the syscall filter of Options.Seccomp (see
// seccomp.Filter). Trees belong on disk to Options.UID and GID, the
// storage ids: an image is given to them (copy mode: as it is copied;
// overlay mode: by a metadata-only layer made once per template, under
// <Root>/images); a sandbox with a uid of its own sees its tree, caches
// and writable mounts through idmapped mounts that show the storage ids as
// its own (see makeViews). The command sees its
// tree at the workdir (Spec.Workdir, default /sandbox), a private /tmp,
// its own /proc and a minimal /dev, its caches and mounts, and read-only
// only /usr, /bin, /sbin, /lib*, /etc and Options.ROBinds, with
// Options.Hide and the provider's root masked where those hold them;
// /root, /home, /var, /srv, /run and the host's /tmp are never shown, nor
// the server's binary. There is no network but loopback unless
// Spec.Network. The init binds the tree by path as that uid, so New makes
// the root's ancestors searchable (o+x) for it. A workdir under a host
// directory that does not hold it (/usr/x) is ErrInvalidSpec there.
// Unisolated, commands run as the server does, with their cwd in the
// tree's host directory (pwd shows it), and may touch anything the server
// can.
//
// A sandbox is a container. Its first command starts its init (see
// sinit.RunSetup and sinit.Run): the server's own binary run again (or
// the separate init binary Options.InitBinary names, package sinit alone
// in a small binary), long-lived,
// held at its first instruction until it is in the sandbox's cgroups with
// its rlimits (startJoined) and, isolated, the sandbox's pid 1 in its own
// user, pid, mount, network, ipc, uts and cgroup namespaces, which builds
// the sandbox's root, pivots into it, drops every privilege and loads the
// filter before it runs a command; it is not dumpable, and holds no
// descriptor a command inherits. Every command is started by it with
// exactly the command's environment, in a process group of its own; what a command leaves running keeps running until the sandbox
// stops, which kills its cgroups (and every process still carrying its
// SandboxIDEnv). A command's group is killed on timeout (TimedOut, exit
// 137) and when ctx ends; its output goes to files in memory that the
// server reads once the shell exits, so `sleep 9 &` neither holds the call
// nor dies with it. A server killed mid-command leaves nothing isolated
// (the init, pid 1, dies with the server, and the whole sandbox with it);
// unisolated the init kills what it started once the server's end
// of its control socket closes, and the next server to use or stop the
// sandbox kills every process still carrying its SandboxIDEnv or still in
// its cgroups.
// Output beyond Options.OutputCap per stream is dropped and reported as
// Truncated. A command killed by signal N exits 128+N.
//
// # Limits
//
// Where the host lets the server make cgroups under its own (cgroup v1
// pids, memory, cpu, freezer; v2 where the server's cgroup has those, its
// processes moved into a leaf of it when the kernel asks: see delegateV2), each sandbox
// gets one with Options.Limits, which its init enters before it runs;
// every command also gets rlimits (no core files, 4096 open files, 256 MiB
// per file). The cgroups exist while the sandbox's init runs. New claims
// a limit only where a probe over a tiny one in a throwaway cgroup finds
// it holds (see probeMemory, probePids, probeCPU). New logs which limits are in effect. ExecRequest.Timeout is
// capped by Options.MaxExecTimeout.
//
// Isolated, where the server is root and loop devices and mkfs.ext4 are
// there, what a sandbox writes (overlay mode: its upper and work directories; copy
// mode: its tree; and its mounts' copies) is on an ext4 image of its own,
// Limits.DiskMB and DiskInodes big, sparse, loop-mounted at <sb>/disk:
// past it a write fails with ENOSPC and nothing else fills (see disks). New
// claims it only where a tiny full image refuses a write and a file.
//
// # Shared caches
//
// Spec.ProviderOptions[CachesOption] ("caches") maps cache names to paths in
// the sandbox: {"caches": {"gomod": "/caches/gomod"}}. A named cache is one
// host directory (Options.Caches[name], else <Root>/caches/<name>) shared
// read-write by every sandbox that names it, bind-mounted at its path in
// an isolated sandbox; unisolated, environment values naming the path are rewritten to
// the host directory. Caches are not part of the tree: snapshots do not copy
// them.
//
// Spec.ProviderOptions[MountsOption] ("mounts") shows host directories that
// belong to an image rather than to the provider: a list of {"host", "path",
// "mode"}, the mode "ro" (read-only), "rw", or "copy" (a writable copy of the
// sandbox's own, made at start and removed with it, so the host directory is
// only read). They are bound like caches and, like caches, not snapshotted.
//
// # Snapshots and forks
//
// Snapshot stops new commands and file calls, freezes every process of the
// sandbox (its freezer cgroup; where there is none, the running commands'
// process groups get SIGSTOP), copies, and thaws them: the copy is
// consistent, and the sandbox keeps running. The copy walks the tree with
// directory file descriptors and follows no symlink (see copyTree). In copy mode the whole tree is
// copied (reflinks where the filesystem has them, copy_file_range otherwise,
// several files at once; about what `cp -a` costs, see bench/). In overlay
// mode only the sandbox's own layer is copied, and a fork is a new overlay on
// the snapshot's layer and everything beneath it: it copies nothing, so it
// costs about a millisecond whatever the tree's size. A snapshot of a
// sandbox already standing on 24 layers is taken whole, so that chains stay
// short. DeleteSnapshot of a missing snapshot is success; a snapshot that a
// live sandbox or another snapshot still stands on is unlisted and
// unforkable at once and removed when the last of them goes.
//
// Snapshots, forks and leases survive a server crash (the page cache does).
// Options.Durable also makes them survive a machine crash, at the cost of a
// sync(2) per start and snapshot.
//
// # Leases
//
// A spec's TTLSeconds gives the sandbox an expiry; Renew moves it. A sandbox
// whose expiry has passed (by Options.Clock) is at once ErrSandboxNotFound to
// every call, and Reap (or RunReaper, every interval) deletes it. Reap also
// finishes what a crash left half done. Tests drive leases with a
// clock.Manual and call Reap directly.
package local
