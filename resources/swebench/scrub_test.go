package swebench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/resources/swebench/grading"
)

func TestScrubLeavesTheFixUnreachable(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk)
	fixBlob := git(t, tk.dir, "rev-parse", tk.fix+":abs_test.go")
	seed := w.seed("s-scrub", tk.row("example__calc-1"))
	sb := *seed.SandboxHandle
	out := func(cmd string) string { return strings.TrimSpace(w.agentRun(sb, cmd)) }

	if got := out("git for-each-ref --format='%(refname)'"); got != "refs/heads/"+WorkBranch {
		t.Errorf("refs after the scrub: %q, want only the work branch", got)
	}
	if got := out("git symbolic-ref HEAD"); got != "refs/heads/"+WorkBranch {
		t.Errorf("HEAD is %q", got)
	}
	if got := out("git rev-parse HEAD"); got != tk.base {
		t.Errorf("HEAD at %s, want the base commit %s", got, tk.base)
	}
	if got := out("git log --all --reflog --format=%H"); got != tk.base {
		t.Errorf("commits reachable from any ref or reflog: %q, want only the base", got)
	}
	for _, obj := range []string{tk.fix, fixBlob} {
		if res := w.agentExec(sb, "git cat-file -e "+obj); res.ExitCode == 0 {
			t.Errorf("object %s of the fix is still in the repository", obj)
		}
	}
	for cmd, want := range map[string]string{
		"git tag -l":                 "",
		"git remote":                 "",
		"git notes list 2>/dev/null": "",
		"git stash list":             "",
		"git reflog --all":           "",
		"[ -e .git/logs ] && echo reflogs || true": "",
		"git log --all --grep=Abs -i":              "",
		"git status --porcelain":                   "",
		"git config user.email":                    "agent@nemo-gym.local",
		// No file in .git (refs, packed refs, logs, special heads)
		// names the fix.
		"grep -rl " + tk.fix + " .git || true": "",
	} {
		if got := out(cmd); got != want {
			t.Errorf("%s: %q, want %q", cmd, got, want)
		}
	}
	d, err := ParseSessionData(w.own.SessionData(context.Background(), "s-scrub"))
	if err != nil {
		t.Fatal(err)
	}
	if d.BaseCommit != tk.base || d.InstanceID != "example__calc-1" || d.Scrub.NonAncestor != 0 || d.Scrub.CommitsBefore < 2 || d.Scrub.CommitsAfter != 1 {
		t.Errorf("session data: %+v", d)
	}
	if d.PristineUntracked == nil || len(d.PristineUntracked) != 0 {
		t.Errorf("pristine untracked of a clean clone: %#v, want []", d.PristineUntracked)
	}
	// The template on the host keeps the history (the grading sandbox and
	// the next agent sandbox start from it); only the sandbox was scrubbed.
	tmplDir, _, err := w.srv.templates.Ensure(context.Background(), taskRepo, tk.base, w.log)
	if err != nil {
		t.Fatal(err)
	}
	if got := git(t, tmplDir, "cat-file", "-t", tk.fix); got != "commit" {
		t.Errorf("the template lost the fix commit: %q", got)
	}
}

// imageDir makes an image directory by hand: a clone of the task at rev,
// with extra untracked files.
func imageDir(t *testing.T, tk task, rev string, untracked map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "image")
	git(t, "", "clone", "-q", "--no-hardlinks", tk.dir, dir)
	git(t, dir, "-c", "advice.detachedHead=false", "checkout", "-q", "--detach", rev)
	writeFiles(t, dir, untracked)
	return dir
}

func TestPristineUntrackedFilesNeverEnterThePatch(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	// The image ships untracked files (build output, a local config), as
	// SWE-bench images do; the row names the image, the repo is not
	// configured.
	img := imageDir(t, tk, tk.base, map[string]string{"local.cfg": "shipped\n", "build/out.txt": "shipped\n"})
	w := newWorld(t, tk, imageRows())
	row := tk.row("example__calc-1")
	row["image"] = img
	seed := w.seed("s-pristine", row)
	d, _ := ParseSessionData(w.own.SessionData(context.Background(), "s-pristine"))
	if diff := cmp.Diff([]string{"build/", "local.cfg"}, d.PristineUntracked); diff != "" {
		t.Fatalf("pristine untracked (-want +got):\n%s", diff)
	}
	sb := *seed.SandboxHandle
	w.applyAsAgent(sb, tk.patch)
	// The agent edits the shipped files, adds its own, and commits
	// everything, shipped files included.
	w.agentRun(sb, "echo edited >> local.cfg && echo mine > build/new.txt && echo 'see calc.go' > NOTES.md && "+
		"git add -A && git commit -q -m work && echo more >> NOTES.md && echo scratch > scratch.txt")
	res := w.verify("s-pristine", row)
	wantResolved(t, res)
	var got []string
	for _, f := range grading.PatchFiles(*res.ModelPatch) {
		got = append(got, f.Path)
	}
	if diff := cmp.Diff([]string{"NOTES.md", "calc.go", "scratch.txt"}, got); diff != "" {
		t.Errorf("files in the model patch (-want +got):\n%s", diff)
	}
	// build/new.txt is new, but under a directory that was wholly untracked
	// at seed: like upstream, the whole directory is left out.
	if diff := cmp.Diff([]string{"build/new.txt", "build/out.txt", "local.cfg"}, res.PristineDropped); diff != "" {
		t.Errorf("sections dropped (-want +got):\n%s", diff)
	}
}

// A scrub that fails does not refuse the seed, as upstream's seed reports
// the failure and goes on; the session data says why no scrub ran.
func TestAFailingScrubIsReportedAndTheSeedGoesOn(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	notRepo := t.TempDir()
	writeFiles(t, notRepo, map[string]string{"calc.go": buggyCalc})
	cases := map[string]string{
		// The image's HEAD is the fix: the scrub refuses to make it the
		// work branch.
		"HEAD is not the base commit": imageDir(t, tk, tk.fix, nil),
		"no repository":               notRepo,
	}
	w := newWorld(t, tk, imageRows())
	for name, img := range cases {
		t.Run(name, func(t *testing.T) {
			row := tk.row("example__calc-1")
			row["image"] = img
			sid := "s-bad-scrub-" + strings.ReplaceAll(name, " ", "-")
			if _, err := w.srv.SeedSession(context.Background(), w.own, sid, mustJSON(t, row)); err != nil {
				t.Fatalf("seed: %v", err)
			}
			sb, ok := w.own.SessionSandbox(context.Background(), sid)
			if !ok {
				t.Fatal("the session holds no sandbox")
			}
			data, err := ParseSessionData(sb.Data)
			if err != nil || !strings.Contains(data.Scrub.Skipped, "scrub") {
				t.Errorf("session data %+v (%v): want the scrub's failure", data.Scrub, err)
			}
		})
	}
}

// apply_anti_cheating: false runs no scrub.
func TestAntiCheatingOffRunsNoScrub(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk, withConfig(func(c *Config) { c.ApplyAntiCheating, c.Validate = off(), off() }))
	if _, err := w.srv.SeedSession(context.Background(), w.own, "s-no-scrub", mustJSON(t, tk.row("example__calc-1"))); err != nil {
		t.Fatalf("seed: %v", err)
	}
	sb, _ := w.own.SessionSandbox(context.Background(), "s-no-scrub")
	data, err := ParseSessionData(sb.Data)
	if err != nil || data.Scrub.Skipped != "apply_anti_cheating is off" || data.Scrub.CommitsBefore != 0 {
		t.Errorf("session data %+v (%v): want no scrub", data.Scrub, err)
	}
}

// Without the scrub (turned off here; a scrub that refused the repository
// leaves it the same way) the template's branches are the image's, not the
// agent's: its main is at the fix commit, so a session that changed nothing
// would be graded as the fix committed (reward 1). Committed work counts
// from the work branch only.
func TestUnscrubbedCommittedWorkComesFromTheWorkBranchOnly(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	w := newWorld(t, tk, withConfig(func(c *Config) { c.ApplyAntiCheating = off() }))
	row := tk.row("example__calc-1")
	seed := w.seed("s-unscrubbed-idle", row)
	if got := w.agentRun(*seed.SandboxHandle, "git rev-parse main"); strings.TrimSpace(got) != tk.fix {
		t.Fatalf("the unscrubbed template's main is %q, want the fix %s (what this test is about)", got, tk.fix)
	}
	res := w.verify("s-unscrubbed-idle", row)
	wantUnresolved(t, res)
	if res.PatchSource != "none" || *res.ModelPatch != "" {
		t.Errorf("a session that changed nothing: patch_source %q, patch %q", res.PatchSource, *res.ModelPatch)
	}

	// The agent's own commits on the work branch still count.
	sb := *w.seed("s-unscrubbed-work", row).SandboxHandle
	w.agentRun(sb, "git checkout -q -b "+WorkBranch)
	w.applyAsAgent(sb, tk.patch)
	// No scrub set the agent's identity.
	w.agentRun(sb, "git -c user.name=a -c user.email=a@example.com commit -q -am fix && git checkout -q --detach "+tk.base)
	ex := w.extract("s-unscrubbed-work", true)
	if ex.Source != "committed" || ex.Commits != 1 || !strings.Contains(ex.Patch, "return -x") {
		t.Errorf("the work branch's commit: %+v\n%s", ex, ex.Patch)
	}
}

// Unscrubbed, an image that ships its own work branch holds commits that
// are the image's, not the agent's: at the fix here, so a session that
// changed nothing was graded as the fix committed (reward 1). Only the
// commits the agent added to it count.
func TestAnImagesOwnWorkBranchIsNotTheAgentsWork(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	img := imageDir(t, tk, tk.base, nil)
	git(t, img, "branch", WorkBranch, tk.fix)
	w := newWorld(t, tk, imageRows(), withConfig(func(c *Config) { c.ApplyAntiCheating = off() }))
	row := tk.row("example__calc-1")
	row["image"] = img
	w.seed("s-image-branch-idle", row)
	res := w.verify("s-image-branch-idle", row)
	wantUnresolved(t, res)
	if res.PatchSource != "none" || *res.ModelPatch != "" {
		t.Errorf("a session that changed nothing: patch_source %q, patch %q", res.PatchSource, *res.ModelPatch)
	}

	// The agent's commit on the image's work branch is its work; the
	// fix under it is not.
	sb := *w.seed("s-image-branch-work", row).SandboxHandle
	w.agentRun(sb, "git checkout -q "+WorkBranch+" && echo 'see calc.go' >> README.md && "+
		"git -c user.name=a -c user.email=a@example.com commit -q -am notes && git checkout -q --detach "+tk.base)
	res = w.verify("s-image-branch-work", row)
	wantUnresolved(t, res)
	if res.PatchSource != "committed" || res.PatchCommits != 1 || !strings.Contains(*res.ModelPatch, "+see calc.go") || strings.Contains(*res.ModelPatch, "calc.go b/calc.go") {
		t.Errorf("the agent's commit on the image's work branch: patch_source %q, %d commits, patch:\n%s", res.PatchSource, res.PatchCommits, *res.ModelPatch)
	}
}

// An unscrubbed image whose HEAD is not at the base commit: the work tree's
// diff against the base holds the image's own commits, which the grading
// sandbox (at the image's HEAD) already has. Graded, an agent's correct
// fix came out 0 (patch --fuzz took the image's commit for a reversed
// patch and undid the fix with it), and a session that changed nothing on
// an image at the fix was graded on the fix's diff. Nothing is graded: the
// sample is masked with the reason.
func TestAnImageWhoseHeadIsNotAtTheBaseIsNotGraded(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	ahead := imageDir(t, tk, tk.base, nil)
	writeFiles(t, ahead, map[string]string{"README.md": "calc\nthe image's own line\n"})
	git(t, ahead, "-c", "user.name=i", "-c", "user.email=i@example.com", "commit", "-q", "-am", "the image's own commit")
	for _, c := range []struct {
		name, image string
		scrub       bool
		agent       string
	}{
		{"scrub refused, the agent fixes", ahead, true, "git apply - <<'EOF'\n" + tk.patch + "EOF\n"},
		{"scrub off, image at the fix, nothing done", imageDir(t, tk, tk.fix, nil), false, "true"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newWorld(t, tk, imageRows(), withConfig(func(cfg *Config) {
				if !c.scrub {
					cfg.ApplyAntiCheating = off()
				}
			}))
			row := tk.row("example__calc-1")
			row["image"] = c.image
			sb := *w.seed("s-head-elsewhere", row).SandboxHandle
			w.agentRun(sb, c.agent)
			res := w.verify("s-head-elsewhere", row)
			if res.Reward != 0 || !res.MaskSample || res.FailureKind != FailureEnvironment || !strings.Contains(res.FailureReason, "not at the base commit") {
				t.Fatalf("want a masked sample, not graded; got:\n%s", describe(res))
			}
			if got := w.liveSandboxes(); len(got) != 0 {
				t.Errorf("sandboxes left: %v", got)
			}
		})
	}
}

func TestASecondSandboxOfAnInstanceDoesNotClone(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	// Validation off: what is tested is where the sandboxes come from, and
	// validating on a fresh template_dir compiles Go's standard library
	// from nothing inside a sandbox (minutes on a loaded machine).
	w := newWorld(t, tk, freshTemplates(), withConfig(func(c *Config) { c.Validate = off() }))
	a := w.seed("s-a", tk.row("example__calc-1"))
	entries, err := os.ReadDir(filepath.Join(w.cfg.TemplateDir, "example__calc"))
	if err != nil || len(entries) != 2 || entries[0].Name() != tk.base || entries[1].Name() != tk.base+".env" {
		t.Fatalf("templates after one seed: %v, %v", entries, err)
	}
	// The source repository goes away: a second sandbox of the instance
	// still starts, from the template, without a clone.
	if err := os.RemoveAll(tk.dir); err != nil {
		t.Fatal(err)
	}
	b := w.seed("s-b", tk.row("example__calc-1"))
	if *a.SandboxHandle == *b.SandboxHandle {
		t.Fatal("two sessions share a sandbox")
	}
	if got := strings.TrimSpace(w.agentRun(*b.SandboxHandle, "git rev-parse HEAD")); got != tk.base {
		t.Errorf("second sandbox at %s", got)
	}
}

func TestScrubRemovesEveryOtherWayToReachTheFix(t *testing.T) {
	t.Parallel()
	// An image whose repository keeps the fix reachable in every way git
	// has: a stash, a linked worktree, a replace ref, a remote-tracking
	// branch, a kept pack, packed refs, ORIG_HEAD and FETCH_HEAD.
	tk := newTask(t)
	img := imageDir(t, tk, tk.base, nil)
	git(t, img, "update-ref", "refs/remotes/origin/fix", tk.fix)
	git(t, img, "update-ref", "refs/replace/"+tk.base, tk.fix)
	git(t, img, "update-ref", "ORIG_HEAD", tk.fix)
	git(t, img, "worktree", "add", "-q", "--detach", filepath.Join(t.TempDir(), "wt"), tk.fix)
	writeFiles(t, img, map[string]string{"calc.go": fixedCalc})
	git(t, img, "stash", "-q")
	git(t, img, "pack-refs", "--all")
	git(t, img, "repack", "-a", "-d", "-q")
	packs, _ := filepath.Glob(filepath.Join(img, ".git", "objects", "pack", "*.pack"))
	for _, p := range packs {
		writeFiles(t, filepath.Dir(p), map[string]string{strings.TrimSuffix(filepath.Base(p), ".pack") + ".keep": ""})
	}
	writeFiles(t, filepath.Join(img, ".git"), map[string]string{"FETCH_HEAD": tk.fix + "\t\tbranch 'main' of somewhere\n"})

	w := newWorld(t, tk, imageRows())
	row := tk.row("example__calc-1")
	row["image"] = img
	seed := w.seed("s-every-way", row)
	sb := *seed.SandboxHandle
	if res := w.agentExec(sb, "git cat-file -e "+tk.fix); res.ExitCode == 0 {
		t.Error("the fix commit survived the scrub")
	}
	if got := strings.TrimSpace(w.agentRun(sb, "git log --all --reflog --format=%H; git stash list; git worktree list --porcelain | grep -c worktree")); got != tk.base+"\n1" {
		t.Errorf("after the scrub: %q, want the base commit and one worktree", got)
	}
	if got := strings.TrimSpace(w.agentRun(sb, "git show --no-patch --format=%s "+tk.base)); got != "Add calc" {
		t.Errorf("the base commit reads %q (a replace ref left?)", got)
	}
}
