package swebench

// goExecWrapper is given to go test as -exec (through GOFLAGS): it runs
// each test binary with -test.v=test2json, after the go command's own
// -test.v, so that the testing package marks its framing; any other program
// (go run's) runs as is. The eval script's own `go test` commands go through
// evalPrelude's go instead (make's and xargs' too, through the go first on
// PATH); this is for go commands it does not see (by an absolute path).
const goExecWrapper = `#!/bin/sh
case "$1" in
*.test) exec "$@" -test.v=test2json ;;
esac
exec "$@"
`

// goCollect is given to go test as -exec by evalPrelude's go: instead of
// running a test binary it keeps a copy, the directory go test would run it
// in and its arguments (NUL-separated), in a new numbered directory under
// $NG_COLLECT_DIR, and prints nothing.
const goCollect = `#!/bin/sh
n=0
while ! mkdir "$NG_COLLECT_DIR/$(printf %05d $n)" 2>/dev/null; do
	n=$((n + 1))
	[ $n -lt 100000 ] || exit 3
done
d=$NG_COLLECT_DIR/$(printf %05d $n)
cp "$1" "$d/test" || exit 3
shift
printf %s "$PWD" > "$d/dir" || exit 3
for a in "$@"; do printf "%s\0" "$a"; done > "$d/args" || exit 3
`

// evalPrelude is sourced by bash before the eval script, which bash then
// reads whole into memory and evals: a test cannot rewrite what the eval
// runs next (bash reads a script file as it goes). It defines go, a
// function that every `go` of the eval script runs through, so that no
// build of the eval reads what code under test wrote:
//
//   - Before any go command, it deletes from the build cache every file
//     changed since the eval began (by ctime, which no process of the
//     sandbox can set back; from the change time of a file made when it
//     began, ng_stamp): a compiled package or a test result planted by the
//     tests of an earlier command is never read; what the eval's own builds
//     wrote is rebuilt. The template's layer under the sandbox's own never
//     changes while a sandbox stands on it (cachegens.go), so what the
//     purge deletes is only ever the sandbox's own writes.
//
//   - go test builds every test binary of the command (with goCollect as
//     -exec: no test runs) before it runs any, then runs them one at a time
//     from their package directories, as go test would, each checked against
//     the SHA-256 it had when built: no package of the command is compiled
//     after a test of it ran, and no test binary runs that another replaced.
//     (A command with -c, -exec or -json goes to the go command as it is.)
//
//   - Before each go command and each test binary's check, ng_reap kills
//     every process a test left running (one outlives its binary): none
//     writes the build cache while a later command builds, nor swaps a
//     test binary between its check and its start.
//
//   - Each test binary's output passes through ng_relay, between lines that
//     say where it ran and how it exited (its status and the relay's): the
//     grader trusts a binary's results only when it ended as the testing
//     package ends one (grading.BinaryRun.Abnormal).
//
//   - The go first on PATH ($NG_DIR/bin/go, ng_restore) evals the prelude
//     and runs the same function: a go command that make or xargs runs is
//     one of the eval's too.
//
// The prelude's own text is NG_PRELUDE (for that go), NG_T0 set when it ran
// before in the eval (its values are then the exported NG_* ones).
// NG_DIR is the grader's scratch directory (absolute), NG_MARK non-empty
// when test binaries run with -test.v=test2json, NG_AWK the awk command that
// reads a pipe a line at a time, NG_INIT the pid of the process that started
// the eval's command (the sandbox's init, which adopts orphans).
const evalPrelude = `ng_dir=$NG_DIR
ng_mark=
[ -z "${NG_MARK-}" ] || ng_mark=-test.v=test2json
ng_awk=${NG_AWK:-awk}
ng_init=${NG_INIT-}
# ng_stamp prints when the eval began, as find's -newerct reads it: the
# change time of a file it makes (the clock the kernel stamps files with,
# which lags the system clock by up to a tick), less a nanosecond, so that
# the purge takes exactly what changed at or after it. Without GNU find's
# -printf, the second before the eval's (a purge of what was written then
# costs a rebuild, never a wrong build).
ng_stamp() {
	local f t s n
	if f=$(mktemp "$ng_dir/t0.XXXXXX" 2>/dev/null) && t=$(find "$f" -maxdepth 0 -printf '%C@' 2>/dev/null) &&
		s=${t%%.*} && n=${t#*.} && [[ $s =~ ^[0-9]+$ && $n =~ ^[0-9]{9} ]]; then
		rm -f "$f"
		n=$((10#${n:0:9} - 1))
		[ $n -ge 0 ] || { s=$((s - 1)); n=999999999; }
		printf '%s.%09d' "$s" "$n"
		return
	fi
	[ -z "$f" ] || rm -f "$f"
	echo $(($(date +%s) - 1))
}
if [ -z "${NG_T0-}" ]; then
	NG_T0=$(ng_stamp)
	NG_REAL_GO=$(command -v go 2>/dev/null) || NG_REAL_GO=
	NG_CACHE=
	[ -z "$NG_REAL_GO" ] || NG_CACHE=$("$NG_REAL_GO" env GOCACHE 2>/dev/null) || NG_CACHE=
	[ -z "$NG_REAL_GO" ] || [ -z "${NG_PRELUDE-}" ] || PATH=$ng_dir/bin:$PATH
	export NG_DIR NG_MARK NG_AWK NG_INIT NG_T0 NG_REAL_GO NG_CACHE NG_PRELUDE
fi
ng_t0=$NG_T0
ng_real_go=$NG_REAL_GO
ng_cache=$NG_CACHE
ng_collect_src='` + goCollect + `'

# ng_restore writes the go of $ng_dir/bin, first on PATH: what make, xargs
# or a script finds as go runs the prelude's go function too. It is written
# again after every go command's test binaries (and before every go
# command): their tests could have replaced it. Test binaries run with the
# PATH the eval had (a test's own go commands are its business, and the
# purge before each would cost them their builds).
ng_restore() {
	[ -n "${NG_PRELUDE-}" ] || return 0
	chmod u+rwx "$ng_dir" 2>/dev/null
	rm -rf "$ng_dir/bin" && mkdir "$ng_dir/bin" &&
		printf '#!%s\neval "$NG_PRELUDE"\ngo "$@"\n' "$BASH" > "$ng_dir/bin/go" && chmod 0755 "$ng_dir/bin/go"
}

ng_purge() {
	local c=${GOCACHE:-$ng_cache}
	[ -n "$c" ] && [ -d "$c" ] || return 0
	find "$c" -mindepth 1 ! -type d -newerct "@$ng_t0" -delete 2>/dev/null || :
}

# ng_reap kills what tests of the eval left running. A process whose parent
# dies is adopted by the sandbox's init, which started the eval's command
# ($ng_init, that command's parent): every process it adopted that is no
# ancestor of this shell (and not a zombie) is killed, scan after scan,
# until one finds none and no process vanished under it. It fails when 100
# scans did not get there (a process forking away faster than it is
# killed). Without an init to go by (another provider) it does nothing.
ng_reap() {
	[ -n "$ng_init" ] && [ -r "/proc/$ng_init/stat" ] || return 0
	local p line rest clean n
	local -A anc=()
	p=$BASHPID
	while [ -n "$p" ] && [ "$p" -gt 1 ] && [ -z "${anc[$p]-}" ]; do
		anc[$p]=1
		read -r line 2>/dev/null < "/proc/$p/stat" || break
		rest=${line##*) }
		p=${rest#* }
		p=${p%% *}
	done
	for ((n = 0; n < 100; n++)); do
		clean=1
		for p in /proc/[0-9]*; do
			p=${p#/proc/}
			[ -z "${anc[$p]-}" ] || continue
			if ! read -r line 2>/dev/null < "/proc/$p/stat"; then
				clean=0
				continue
			fi
			rest=${line##*) }
			case $rest in Z\ * | X\ *) continue ;; esac
			rest=${rest#* }
			[ "${rest%% *}" = "$ng_init" ] || continue
			kill -KILL "$p" 2>/dev/null
			clean=0
		done
		[ $clean = 0 ] || return 0
	done
	return 1
}

# ng_relay passes a test binary's output on, with a space before any line
# that starts with two ^V: the lines ng_test prints around each binary's run
# (grading.BinaryRunLine, BinaryExitLine) cannot come from the binary. Each
# line goes out in one write (print with ORS writes the record and the
# newline apart in an unbuffered mawk): a message the shell prints when the
# binary kills it lands between lines, never inside one.
ng_relay() {
	$ng_awk 'BEGIN { ORS = "" } { if (substr($0, 1, 2) == "\026\026") $0 = " " $0; print $0 "\n"; fflush() }'
}

# ng_unlisted passes on go test's output less its "ok" lines (ng_test prints
# each binary's own), a line a write, as ng_relay.
ng_unlisted() {
	$ng_awk 'BEGIN { ORS = "" } index($0, "ok  \t") != 1 { print $0 "\n"; fflush() }'
}

ng_sum() {
	command -v sha256sum >/dev/null 2>&1 || { echo unchecked; return; }
	local s
	s=$(sha256sum < "$1") || s=unreadable
	echo "${s%% *}"
}

# ng_collectable: go test's arguments (without "test") build test binaries
# that the go command would run itself.
ng_collectable() {
	local a
	for a in "$@"; do
		case "$a" in
		-args | --args) return 0 ;;
		-c | --c | -c=* | --c=* | -exec | --exec | -exec=* | --exec=* | -json | --json | -json=* | --json=*) return 1 ;;
		esac
	done
	return 0
}

ng_test() {
	local d t i n=0 off=0 rc=0 brc
	local -a bins=() dirs=() sums=() nargs=() args=() a st
	d=$(mktemp -d "$ng_dir/tests.XXXXXX") || { "$ng_real_go" test "$@"; return; }
	printf '%s' "$ng_collect_src" > "$ng_dir/collect" && chmod 0755 "$ng_dir/collect" || { rm -rf "$d"; return 3; }
	{ NG_COLLECT_DIR=$d "$ng_real_go" test -exec="$ng_dir/collect" "$@" 2>&1; echo $? > "$d/rc"; } | ng_unlisted
	brc=$(cat "$d/rc" 2>/dev/null) || brc=1
	for t in "$d"/[0-9]*; do
		[ -f "$t/test" ] || continue
		bins+=("$t/test")
		dirs+=("$(cat "$t/dir")")
		sums+=("$(ng_sum "$t/test")")
		mapfile -d '' -t a < "$t/args"
		nargs+=(${#a[@]})
		args+=("${a[@]}")
		n=$((n + 1))
	done
	for ((i = 0; i < n; i++)); do
		if ! ng_reap; then
			printf 'FAIL\t%s\t[what an earlier test left running could not be ended: not run]\n' "${dirs[i]}"
			rc=1
		elif [ "$(ng_sum "${bins[i]}")" != "${sums[i]}" ]; then
			printf 'FAIL\t%s\t[the test binary changed after it was built: not run]\n' "${dirs[i]}"
			rc=1
		else
			printf '\026\026ng-run\t%s\n' "${dirs[i]}"
			(cd "${dirs[i]}" && PWD=${dirs[i]} PATH=${PATH#"$ng_dir/bin:"} exec "${bins[i]}" "${args[@]:off:${nargs[i]}}" ${ng_mark:+"$ng_mark"}) < /dev/null 2>&1 | ng_relay
			st=("${PIPESTATUS[@]}")
			printf '\026\026ng-exit\t%s\t%s\n' "${st[0]}" "${st[1]-}"
			if [ "${st[0]}" = 0 ]; then
				printf 'ok  \t%s\n' "${dirs[i]}"
			else
				printf 'FAIL\t%s\t[exit status %d]\n' "${dirs[i]}" "${st[0]}"
				rc=1
			fi
		fi
		off=$((off + nargs[i]))
	done
	rm -rf "$d"
	[ $n = 0 ] || { ng_reap && ng_restore; } || rc=1
	[ "$brc" = 0 ] || rc=$brc
	return $rc
}

go() {
	{ local ng_x=${-//[^x]/}; set +x; } 2>/dev/null
	local ng_rc=0
	if [ -z "$ng_real_go" ]; then
		command go "$@" || ng_rc=$?
	elif ! ng_reap; then
		echo "go: what an earlier test left running could not be ended: not run" >&2
		ng_rc=1
	else
		ng_restore
		ng_purge
		if [ "${1-}" = test ] && ng_collectable "${@:2}"; then
			ng_test "${@:2}" || ng_rc=$?
		else
			"$ng_real_go" "$@" || ng_rc=$?
		fi
	fi
	{ [ -z "$ng_x" ] || set -x; } 2>/dev/null
	return $ng_rc
}

[ -z "$ng_real_go" ] || ng_restore
`
