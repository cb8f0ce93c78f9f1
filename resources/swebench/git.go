package swebench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// WorkBranch is the one branch the scrub leaves (upstream's name).
const WorkBranch = "_nel_work"

// scratchDir is where this package keeps its files inside a sandbox: in the
// repository's git directory, so that they are never in the work tree, in
// git status, in a patch, or seen by the tests.
const scratchDir = ".git/ng-swebench"

// gitEnv is added to every command this package runs in a sandbox: git
// trusts the repository whoever owns it (configured through the environment,
// so nothing is written to a global config in $HOME, which may be the work
// tree), runs no fsmonitor hook, takes no optional locks (git status does not
// rewrite the index), never prompts and never pages.
func gitEnv() map[string]string {
	return map[string]string{
		"GIT_CONFIG_COUNT":    "2",
		"GIT_CONFIG_KEY_0":    "safe.directory",
		"GIT_CONFIG_VALUE_0":  "*",
		"GIT_CONFIG_KEY_1":    "core.fsmonitor",
		"GIT_CONFIG_VALUE_1":  "false",
		"GIT_OPTIONAL_LOCKS":  "0",
		"GIT_TERMINAL_PROMPT": "0",
		"GIT_PAGER":           "cat",
		"PAGER":               "cat",
		"LC_ALL":              "C",
	}
}

// run runs script in the sandbox's workdir with gitEnv (plus env).
func run(ctx context.Context, p provider.Provider, h provider.Handle, script string, env map[string]string, timeout time.Duration) (provider.ExecResult, error) {
	e := gitEnv()
	for k, v := range env {
		e[k] = v
	}
	res, err := p.Exec(ctx, h, provider.ExecRequest{Command: script, Env: e, Timeout: timeout})
	if err != nil {
		return res, fmt.Errorf("exec in %s: %w", h, err)
	}
	return res, nil
}

// ScrubReport is what the scrub's GIT_CLEANUP line says.
type ScrubReport struct {
	Base string `json:"base"`
	// CommitsBefore and CommitsAfter count the commits reachable from any
	// ref or reflog before and after.
	CommitsBefore int `json:"commits_before"`
	CommitsAfter  int `json:"commits_after"`
	// NonAncestor counts the commits left that are not ancestors of Base
	// (zero after a successful scrub).
	NonAncestor int     `json:"non_ancestor"`
	GCExit      int     `json:"gc_exit"`
	Objects     int     `json:"objects"`
	Seconds     float64 `json:"seconds"`
	// Skipped says why no scrub ran (turned off, or it failed).
	Skipped string `json:"skipped,omitempty"`
}

// scrubScript is the anti-cheat scrub (apply_anti_cheating). It runs in the workdir with
// $NG_BASE set to the commit HEAD must be at. Only refs/heads/_nel_work at the
// base survives; packed refs, special heads, every other ref, the reflogs,
// the remotes, other worktrees, alternates and keep files go, and gc prunes
// everything unreachable (the fix commit). Unlike upstream's, it fails (exit
// 3) instead of skipping when there is no repository or HEAD, and checks its
// own result.
const scrubScript = `set -u
exec 2>&1
fail() { echo "GIT_CLEANUP failed reason=$1"; exit 3; }
start=$(date +%s)
git rev-parse --is-inside-work-tree >/dev/null 2>&1 || fail no_git_repo
gd=$(git rev-parse --git-dir) || fail no_git_dir
[ "$gd" = .git ] && [ -d .git ] || fail git_dir_not_in_workdir
base=$(git rev-parse -q --verify 'HEAD^{commit}') || fail no_head
want=$(git rev-parse -q --verify "$NG_BASE^{commit}") || fail base_commit_missing
[ "$base" = "$want" ] || fail "head_${base}_is_not_base_${want}"
git reset -q --hard || fail reset
before=$(git rev-list --all --reflog 2>/dev/null | wc -l)
for r in $(git remote); do git remote remove "$r" >/dev/null 2>&1 || git config --remove-section "remote.$r" || fail "remove_remote_$r"; done
git update-ref --no-deref refs/heads/` + WorkBranch + ` "$base" || fail work_branch
git symbolic-ref HEAD refs/heads/` + WorkBranch + ` || fail symbolic_ref
rm -f "$gd/packed-refs" "$gd/ORIG_HEAD" "$gd/FETCH_HEAD" "$gd/MERGE_HEAD" "$gd/CHERRY_PICK_HEAD" "$gd/REVERT_HEAD" "$gd/AUTO_MERGE" "$gd"/BISECT_* "$gd/shallow"
find "$gd/refs" -type f ! -path "$gd/refs/heads/` + WorkBranch + `" -exec rm -f {} + || fail refs
rm -rf "$gd/refs/tags" "$gd/refs/remotes" "$gd/logs" "$gd/worktrees" "$gd/rebase-merge" "$gd/rebase-apply" || fail refs_dirs
mkdir -p "$gd/refs/tags"
find "$gd/refs" -mindepth 1 -type d -empty ! -path "$gd/refs/heads" ! -path "$gd/refs/tags" -delete 2>/dev/null
if [ -s "$gd/objects/info/alternates" ]; then git repack -a -d -q || fail repack_alternates; rm -f "$gd/objects/info/alternates"; fi
rm -f "$gd"/objects/pack/*.keep "$gd/objects/info/commit-graph"
rm -rf "$gd/objects/info/commit-graphs"
git reflog expire --expire=now --expire-unreachable=now --all || fail reflog_expire
git -c gc.reflogExpire=now -c gc.reflogExpireUnreachable=now -c gc.rerereResolved=now -c gc.rerereUnresolved=now -c gc.cruftPacks=false gc --prune=now --quiet
gc=$?
git prune --expire=now
after=$(git rev-list --all --reflog | wc -l)
nonanc=$(git rev-list --all --reflog --not "$base" | wc -l)
objects=$(git count-objects -v | awk '/^(count|in-pack):/ {n += $2} END {print n+0}')
refs=$(git for-each-ref --format='%(refname)')
[ "$refs" = refs/heads/` + WorkBranch + ` ] || fail "refs_left_$(echo $refs | tr ' ' ',')"
[ "$(git symbolic-ref HEAD)" = refs/heads/` + WorkBranch + ` ] || fail head_not_work_branch
echo "GIT_CLEANUP base=$base commits_before=$before commits_after=$after non_ancestor=$nonanc gc_exit=$gc objects=$objects seconds=$(( $(date +%s) - start ))"
[ "$gc" -eq 0 ] || fail gc
[ "$nonanc" -eq 0 ] || fail non_ancestor_commits_left
git config user.email agent@nemo-gym.local && git config user.name 'NeMo Gym Agent' || fail identity
`

// seedPointScript prints the commit HEAD is at and the work branch's tip
// (empty lines where there is none): where an unscrubbed sandbox's agent
// starts.
const seedPointScript = `h=$(git rev-parse -q --verify 'HEAD^{commit}' 2>/dev/null)
w=$(git rev-parse -q --verify 'refs/heads/` + WorkBranch + `^{commit}' 2>/dev/null)
printf '%s\n%s\n' "$h" "$w"`

// SeedPoint is where an unscrubbed sandbox's agent starts: the commit HEAD
// is at and the work branch's tip when the image has one ("" where there
// is none, as when there is no repository).
func SeedPoint(ctx context.Context, p provider.Provider, h provider.Handle, timeout time.Duration) (head, workBranch string, err error) {
	res, err := run(ctx, p, h, seedPointScript, nil, timeout)
	if err != nil {
		return "", "", err
	}
	if res.TimedOut {
		return "", "", fmt.Errorf("timed out: %s", lastLines(res.Stdout+res.Stderr, 4))
	}
	lines := strings.Split(res.Stdout, "\n")
	for len(lines) < 2 {
		lines = append(lines, "")
	}
	return strings.TrimSpace(lines[0]), strings.TrimSpace(lines[1]), nil
}

// errScrubNotRun: the scrub did not run to its end (the sandbox or the
// provider failed its command, or it timed out), as opposed to a scrub that
// ran and refused the repository.
var errScrubNotRun = errors.New("the scrub did not run")

// Scrub runs the anti-cheat scrub in the sandbox's workdir; HEAD must be at
// base (a commit id, possibly abbreviated). A failure wraps ErrScrub.
func Scrub(ctx context.Context, p provider.Provider, h provider.Handle, base string, timeout time.Duration) (ScrubReport, error) {
	if !hexCommit.MatchString(base) {
		return ScrubReport{}, fmt.Errorf("%w: base %q is not a commit id", ErrScrub, base)
	}
	res, err := run(ctx, p, h, scrubScript, map[string]string{"NG_BASE": base}, timeout)
	if err != nil {
		return ScrubReport{}, fmt.Errorf("%w: %w: %w", ErrScrub, errScrubNotRun, err)
	}
	out := res.Stdout + res.Stderr
	if res.TimedOut {
		return ScrubReport{}, fmt.Errorf("%w: %w: timed out: %s", ErrScrub, errScrubNotRun, lastLines(out, 8))
	}
	if res.ExitCode != 0 {
		return ScrubReport{}, fmt.Errorf("%w: exit %d (timed out: %v): %s", ErrScrub, res.ExitCode, res.TimedOut, lastLines(out, 8))
	}
	rep, ok := parseCleanup(out)
	if !ok {
		return ScrubReport{}, fmt.Errorf("%w: no GIT_CLEANUP line: %s", ErrScrub, lastLines(out, 8))
	}
	return rep, nil
}

func parseCleanup(out string) (ScrubReport, bool) {
	var rep ScrubReport
	for _, line := range strings.Split(out, "\n") {
		if !strings.HasPrefix(line, "GIT_CLEANUP base=") {
			continue
		}
		for _, kv := range strings.Fields(strings.TrimPrefix(line, "GIT_CLEANUP ")) {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "base":
				rep.Base = v
			case "commits_before":
				rep.CommitsBefore = n
			case "commits_after":
				rep.CommitsAfter = n
			case "non_ancestor":
				rep.NonAncestor = n
			case "gc_exit":
				rep.GCExit = n
			case "objects":
				rep.Objects = n
			case "seconds":
				rep.Seconds = float64(n)
			}
		}
		return rep, rep.Base != ""
	}
	return rep, false
}

// Untracked lists the files untracked in the sandbox's work tree now, not
// ignored, with wholly untracked directories as one "dir/" entry (git
// ls-files --others --exclude-standard --directory).
func Untracked(ctx context.Context, p provider.Provider, h provider.Handle, timeout time.Duration) ([]string, error) {
	res, err := run(ctx, p, h, "git ls-files -z --others --exclude-standard --directory", nil, timeout)
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 || res.Truncated {
		return nil, fmt.Errorf("git ls-files: exit %d (truncated: %v): %s", res.ExitCode, res.Truncated, lastLines(res.Stderr, 4))
	}
	return splitNUL(res.Stdout), nil
}

func splitNUL(s string) []string {
	var out []string
	for _, f := range strings.Split(s, "\x00") {
		if f != "" {
			out = append(out, f)
		}
	}
	sort.Strings(out)
	return out
}

// pristineSet answers whether a path was untracked at seed: listed itself, or
// under a listed "dir/" entry.
type pristineSet struct {
	files map[string]bool
	dirs  []string
}

func newPristineSet(entries []string) pristineSet {
	s := pristineSet{files: map[string]bool{}}
	for _, e := range entries {
		if strings.HasSuffix(e, "/") {
			s.dirs = append(s.dirs, e)
		} else {
			s.files[e] = true
		}
	}
	return s
}

func (s pristineSet) has(path string) bool {
	if s.files[path] {
		return true
	}
	for _, d := range s.dirs {
		if strings.HasPrefix(path, d) {
			return true
		}
	}
	return false
}

// Extraction is a model patch and where it came from.
type Extraction struct {
	Patch string `json:"-"`
	// Source is "worktree" (the work tree against the base: uncommitted and
	// committed work, new files included), "committed" (the work tree
	// showed nothing, so the most advanced local branch descending from the
	// base; when the scrub did not run, only the work branch's commits
	// past its start) or "none".
	Source string `json:"patch_source"`
	// Tip is the commit a committed patch was taken to.
	Tip string `json:"patch_tip,omitempty"`
	// Commits counts the commits on top of the base in the work tree's
	// HEAD (worktree) or the tip (committed).
	Commits       int  `json:"patch_commits"`
	WorktreeDirty bool `json:"worktree_dirty"`
	// Dropped are the paths whose sections were removed because they were
	// untracked at seed.
	Dropped []string `json:"pristine_dropped,omitempty"`
}

// extractScript writes the patch to $d/model.patch. A temporary index keeps
// the sandbox's own index untouched; the files in $d/add-list (NUL
// separated, literal paths) are added to it as intent-to-add, so that they
// appear as new files. Prefixes, renames, colour, external diff and textconv
// are pinned so that a repository config cannot change the patch's form.
const extractScript = `set -u
exec 2>&1
d=` + scratchDir + `
fail() { echo "NG_EXTRACT failed reason=$1"; exit 3; }
[ -d .git ] || fail no_git_dir
git cat-file -e "$NG_BASE^{commit}" 2>/dev/null || fail base_commit_missing
dirty=0
[ -n "$(git status --porcelain --untracked-files=all 2>/dev/null | head -n 1)" ] && dirty=1
idx="$d/index"
rm -f "$idx"
if [ -f .git/index ]; then cp .git/index "$idx" || fail copy_index; fi
export GIT_INDEX_FILE="$idx"
if [ -s "$d/add-list" ]; then
  GIT_LITERAL_PATHSPECS=1 git add -N --pathspec-from-file="$d/add-list" --pathspec-file-nul || fail intent_to_add
fi
diffopts="--binary --no-renames --no-ext-diff --no-textconv --no-color --no-relative --src-prefix=a/ --dst-prefix=b/"
git diff $diffopts "$NG_BASE" > "$d/model.patch" || fail diff_worktree
source=worktree
tip=
commits=$(git rev-list --count "$NG_BASE..HEAD" 2>/dev/null || echo 0)
if [ ! -s "$d/model.patch" ]; then
  source=none
  best=; bestn=0; from=$NG_BASE
  if [ -n "${NG_WORK_FROM:-}" ]; then
    from=$NG_WORK_FROM
    cands=$(git rev-parse -q --verify 'refs/heads/` + WorkBranch + `^{commit}')
  else
    cands="$(git rev-parse -q --verify 'HEAD^{commit}') $(git for-each-ref --format='%(objectname)' refs/heads)"
  fi
  for c in $cands; do
    git merge-base --is-ancestor "$from" "$c" 2>/dev/null || continue
    n=$(git rev-list --count "$from..$c")
    if [ "$n" -gt "$bestn" ]; then best=$c; bestn=$n; fi
  done
  if [ -n "$best" ]; then
    git diff $diffopts "$from" "$best" > "$d/model.patch" || fail diff_committed
    if [ -s "$d/model.patch" ]; then source=committed; tip=$best; commits=$bestn; fi
  fi
fi
echo "NG_EXTRACT source=$source tip=$tip commits=$commits dirty=$dirty"
`

// ExtractPatch captures the model patch in the agent's sandbox: the work tree
// against base, including committed work and new untracked files, excluding
// the files that were untracked at seed (pristine: git ls-files --others
// --directory entries, as Untracked returns). It leaves the sandbox's index
// as it was. workFrom is empty for a scrubbed sandbox. Unscrubbed (the
// seed's scrub was skipped or refused the repository), committed work is
// taken from the work branch only, and only its commits past workFrom (the
// base, or the work branch's tip at seed when the image shipped one): the
// image's other branches (a template's main at the fix, say) and the
// image's own work branch are not the agent's. A failure wraps ErrExtract.
func ExtractPatch(ctx context.Context, p provider.Provider, h provider.Handle, base string, pristine []string, workFrom string, timeout time.Duration) (Extraction, error) {
	if !hexCommit.MatchString(base) {
		return Extraction{}, fmt.Errorf("%w: base %q is not a commit id", ErrExtract, base)
	}
	set := newPristineSet(pristine)
	res, err := run(ctx, p, h, "[ -d .git ] || { echo 'no .git directory in the workdir' >&2; exit 3; }; rm -rf "+scratchDir+" && mkdir -p "+scratchDir+" && git ls-files -z --others --exclude-standard", nil, timeout)
	if err != nil {
		return Extraction{}, fmt.Errorf("%w: %w", ErrExtract, err)
	}
	if res.ExitCode != 0 || res.Truncated {
		return Extraction{}, fmt.Errorf("%w: list untracked files: exit %d (truncated: %v): %s", ErrExtract, res.ExitCode, res.Truncated, lastLines(res.Stderr, 4))
	}
	var add bytes.Buffer
	for _, f := range splitNUL(res.Stdout) {
		if !set.has(f) && !strings.HasPrefix(f, scratchDir+"/") {
			add.WriteString(f)
			add.WriteByte(0)
		}
	}
	defer func() {
		_, _ = run(context.WithoutCancel(ctx), p, h, "rm -rf "+scratchDir, nil, time.Minute)
	}()
	if err := p.WriteFile(ctx, h, scratchDir+"/add-list", add.Bytes()); err != nil {
		return Extraction{}, fmt.Errorf("%w: write the file list: %w", ErrExtract, err)
	}
	if workFrom != "" && !hexCommit.MatchString(workFrom) {
		return Extraction{}, fmt.Errorf("%w: work branch start %q is not a commit id", ErrExtract, workFrom)
	}
	env := map[string]string{"NG_BASE": base, "NG_WORK_FROM": workFrom}
	res, err = run(ctx, p, h, extractScript, env, timeout)
	if err != nil {
		return Extraction{}, fmt.Errorf("%w: %w", ErrExtract, err)
	}
	if res.ExitCode != 0 || res.TimedOut {
		return Extraction{}, fmt.Errorf("%w: exit %d (timed out: %v): %s", ErrExtract, res.ExitCode, res.TimedOut, lastLines(res.Stdout+res.Stderr, 8))
	}
	var ex Extraction
	for _, line := range strings.Split(res.Stdout, "\n") {
		if !strings.HasPrefix(line, "NG_EXTRACT source=") {
			continue
		}
		for _, kv := range strings.Fields(strings.TrimPrefix(line, "NG_EXTRACT ")) {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "source":
				ex.Source = v
			case "tip":
				ex.Tip = v
			case "commits":
				ex.Commits, _ = strconv.Atoi(v)
			case "dirty":
				ex.WorktreeDirty = v == "1"
			}
		}
	}
	if ex.Source == "" {
		return Extraction{}, fmt.Errorf("%w: no NG_EXTRACT line: %s", ErrExtract, lastLines(res.Stdout, 8))
	}
	b, err := p.ReadFile(ctx, h, scratchDir+"/model.patch")
	if err != nil {
		return Extraction{}, fmt.Errorf("%w: read the patch: %w", ErrExtract, err)
	}
	ex.Patch, ex.Dropped = dropSections(string(b), set)
	if strings.TrimSpace(ex.Patch) == "" {
		ex.Patch, ex.Source, ex.Tip = "", "none", ""
	}
	return ex, nil
}

// dropSections removes the diff sections of pristine paths.
func dropSections(patch string, set pristineSet) (string, []string) {
	var b strings.Builder
	var dropped []string
	for _, sec := range grading.SplitSections(patch) {
		if sec.Path != "" && (set.has(sec.Path) || (sec.OldPath != "" && set.has(sec.OldPath))) {
			dropped = append(dropped, sec.Path)
			continue
		}
		b.WriteString(sec.Text)
	}
	return b.String(), dropped
}

// ApplyResult says how a patch went in.
type ApplyResult struct {
	// Applied is false when every method failed.
	Applied bool `json:"patch_applied"`
	// Method is "git_apply", "git_apply_reject", "patch_fuzz", or "" (none
	// worked, or the patch was empty).
	Method string `json:"patch_apply_method,omitempty"`
	Log    string `json:"-"`
}

const applyScript = `exec 2>&1
P=` + scratchDir + `/patch.diff
echo "+ git apply --verbose"
if git apply --verbose "$P"; then echo NG_APPLIED=git_apply; exit 0; fi
echo "+ git apply --verbose --reject"
if git apply --verbose --reject "$P"; then echo NG_APPLIED=git_apply_reject; exit 0; fi
echo "+ patch --batch --fuzz=5 -p1 -i"
if patch --batch --fuzz=5 -p1 -i "$P"; then echo NG_APPLIED=patch_fuzz; exit 0; fi
echo NG_APPLIED=
exit 1
`

// ApplyPatch applies patch in the grading sandbox's workdir with SWE-bench's
// fallbacks: git apply, git apply --reject, patch --batch --fuzz=5 -p1. An
// empty patch applies trivially (Method ""). An error means the provider
// failed, not the patch.
func ApplyPatch(ctx context.Context, p provider.Provider, h provider.Handle, patch string, timeout time.Duration) (ApplyResult, error) {
	if strings.TrimSpace(patch) == "" {
		return ApplyResult{Applied: true}, nil
	}
	if !strings.HasSuffix(patch, "\n") {
		patch += "\n"
	}
	if err := p.WriteFile(ctx, h, scratchDir+"/patch.diff", []byte(patch)); err != nil {
		return ApplyResult{}, fmt.Errorf("write the patch: %w", err)
	}
	res, err := run(ctx, p, h, applyScript, nil, timeout)
	if err != nil {
		return ApplyResult{}, err
	}
	out := res.Stdout + res.Stderr
	ar := ApplyResult{Log: out}
	if res.ExitCode == 0 {
		for _, line := range strings.Split(out, "\n") {
			if m, ok := strings.CutPrefix(line, "NG_APPLIED="); ok && m != "" {
				ar.Applied, ar.Method = true, m
			}
		}
	}
	return ar, nil
}

// EvalResult is what the eval script did.
type EvalResult struct {
	// Log is stdout and stderr merged in the order they were written, as
	// the grader's pipe received them (evalFilter's cut applied).
	Log      string
	ExitCode int
	TimedOut bool
	// Truncated: the provider cut the output at its cap.
	Truncated bool
}

// evalFilter keeps, of the eval script's merged output, every line a log
// parser may read (marked Go test framing, lines that look like test
// results, the test-output markers) and, of the rest, the first and the last
// 256 KiB, each line at most 4 KiB: the whole output must fit the
// provider's output cap, since it reaches the grader through the command's
// pipe and nowhere else. Each line goes out in one write, as ng_relay's.
const evalFilter = `$NG_AWK -v H=262144 -v T=262144 '
function keep(l) {
  return substr(l, 1, 1) == "\026" || l ~ /^[ \t]*(=== RUN|--- (PASS|FAIL|SKIP): )/ || l ~ /^test .* \.\.\. / ||
    index(l, ">>>>> ") > 0 || l ~ /^(PASSED|FAILED|SKIPPED|ERROR|XFAIL) / || l ~ /::[^ ]* (PASSED|FAILED|SKIPPED|ERROR|XFAIL)/
}
BEGIN { ORS = "" }
keep($0) { print $0 "\n"; fflush(); next }
{
  if (length($0) > 4096) $0 = substr($0, 1, 4096) "[line cut by the grader]"
  l = length($0) + 1
  if (!cut && h + l <= H) { h += l; print $0 "\n"; fflush(); next }
  cut = 1; q[++hi] = $0; t += l
  while (t > T && lo < hi) { lo++; t -= length(q[lo]) + 1; delete q[lo]; dropped++ }
}
END {
  if (dropped) print "[the grader cut " dropped " lines of output here]\n"
  for (i = lo + 1; i <= hi; i++) print q[i] "\n"
}'`

// RunEval runs script with bash in the grading sandbox's workdir, its
// stdout and stderr merged in order through evalFilter into the command's
// stdout, which the grader holds: no file in the sandbox, which the code
// under test could replace, carries the log. It is killed after timeout.
// go test never answers from its test-result cache (GOFLAGS -count=1):
// code under test can write the build cache it would read, and a result
// planted there for a later go test would be printed as that run's, framing
// and all. The script's own go commands run through evalPrelude's go: no
// build reads what a test of the eval wrote in the build cache (a compiled
// package planted there), and no package of a go test is compiled after a
// test of it ran; on the local provider, what a test left running is killed
// before each go command and each test binary. With goExec (a toolchain that marks
// its framing), every test binary runs with -test.v=test2json (a go command
// the script does not run itself, through goExecWrapper as GOFLAGS -exec),
// so that it marks it. An error means the provider failed.
func RunEval(ctx context.Context, p provider.Provider, h provider.Handle, script string, goExec bool, timeout time.Duration) (EvalResult, error) {
	if err := p.WriteFile(ctx, h, scratchDir+"/eval.sh", []byte(script)); err != nil {
		return EvalResult{}, fmt.Errorf("write the eval script: %w", err)
	}
	var cmd strings.Builder
	cmd.WriteString(`export GOFLAGS="${GOFLAGS:+$GOFLAGS }-count=1"` + "\n")
	if goExec {
		if err := p.WriteFile(ctx, h, scratchDir+"/go-exec", []byte(goExecWrapper)); err != nil {
			return EvalResult{}, fmt.Errorf("write the go test wrapper: %w", err)
		}
		cmd.WriteString(`chmod +x ` + scratchDir + `/go-exec && export GOFLAGS="${GOFLAGS:+$GOFLAGS }-exec=$PWD/` + scratchDir + `/go-exec" || exit 3` + "\n")
	}
	if err := p.WriteFile(ctx, h, scratchDir+"/prelude.sh", []byte(evalPrelude)); err != nil {
		return EvalResult{}, fmt.Errorf("write the eval prelude: %w", err)
	}
	mark := ""
	if goExec {
		mark = "1"
	}
	// The local provider's init started the eval's command ($PPID there) and
	// adopts what its processes orphan: the prelude kills those between go
	// commands and test binaries. Elsewhere the parent may be a daemon with
	// children of its own (OpenSandbox's execd), so nothing is killed.
	reapFrom := ""
	if p.Capabilities().HostTools {
		reapFrom = "NG_INIT=$PPID "
	}
	// mawk reads a pipe a block at a time unless interactive: what a
	// script printed before its timeout killed it would be lost.
	cmd.WriteString(`NG_AWK=awk; awk -W version 2>/dev/null | grep -q mawk && NG_AWK="awk -W interactive"` + "\n")
	// bash reads the prelude and the whole eval script before running any
	// of it (evalPrelude); sh, where there is no bash, reads the script as
	// it goes, and its go is the go command's.
	cmd.WriteString(`{ if command -v bash >/dev/null 2>&1; then ` + reapFrom + `NG_AWK="$NG_AWK" NG_DIR="$PWD/` + scratchDir + `" NG_MARK=` + mark +
		` bash -c 'NG_PRELUDE=$(cat "$1") && eval "$NG_PRELUDE" && ng_script=$(cat "$2") && eval "$ng_script"' ng-eval ` + scratchDir + `/prelude.sh ` + scratchDir + `/eval.sh; ` +
		`else sh ` + scratchDir + `/eval.sh; fi; } 2>&1 </dev/null | ` + evalFilter + "\n")
	res, err := run(ctx, p, h, cmd.String(), nil, timeout)
	if err != nil {
		return EvalResult{}, err
	}
	return EvalResult{Log: res.Stdout + res.Stderr, ExitCode: res.ExitCode, TimedOut: res.TimedOut, Truncated: res.Truncated}, nil
}

// lastLines returns the last n lines of s, for error messages.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
