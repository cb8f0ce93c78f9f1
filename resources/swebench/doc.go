// Package swebench is the SWE-bench resources server on the owner base: one
// sandbox per agent session holding the task repository at its base commit,
// scrubbed so that the fix is unreachable, and a verify that extracts the
// agent's patch and grades it in a fresh sandbox exactly as SWE-bench does.
//
// # Rows
//
// Rows are SWE-bench's JSONL rows, the original format and the Multilingual
// one (ParseRow): FAIL_TO_PASS and PASS_TO_PASS are JSON lists or
// JSON-encoded strings of lists; eval_script, log_parser and image are used
// when present; every other field is ignored. Without eval_script the eval
// script is built from test_patch and the repository's test command
// (BuildEvalScript).
//
// # Seed
//
// On the local provider the image is the task repository checked out at
// base_commit, cloned once per (repo, base commit) from the git repository the
// config names for the repo (swebench.repos) into a template directory, so a
// second sandbox of the same instance costs the provider's copy or overlay,
// not a clone. On other providers the image is the row's image. The sandbox's
// setup runs the anti-cheat scrub (Scrub): only the work branch _nel_work at
// the base commit survives, every other ref, the reflogs and the remotes are
// removed and git gc --prune=now drops the fix commit. It records the base
// commit and the files already untracked as session data (SessionData). A
// scrub that could not run refuses the seed (the owner stops the sandbox);
// one that refused the repository is recorded (scrub.skipped) and the seed
// goes on, as upstream's.
//
// # Verify
//
// ExtractPatch diffs the agent's sandbox against the base commit (new
// untracked files and committed work included, the latter from the work
// branch only when no scrub ran; the files untracked at seed excluded); the
// agent's session ends; a grading sandbox starts from the same image;
// ApplyPatch tries git apply, git apply --reject and patch --fuzz=5;
// grading.Guard leaves out the patch's files outside the agent's remit (test files
// the test patch does not touch, vendor/, module replacements); RunEval runs
// the eval script with stdout and stderr merged in order under the
// evaluation timeout, its output reaching the server only through the
// command's pipe; ReadOutcome reads the section between the
// ">>>>> Start Test Output" and ">>>>> End Test Output" markers (the whole log
// when that section yields nothing): for a Go module only the test binary's
// own framing, marked by the toolchain, counts (grading.ParseGoTestFraming), for
// other rows the row's parser (grading.ParseLog); Decide applies SWE-bench's rule and
// grades 0 a patch that ends the test binary from an init or forges
// results. The grading sandbox is stopped on every path.
//
// # Golden-patch instance
//
// With is_verifying_golden_patch the server lends no sandbox: seed starts
// nothing and verify grades the row's own patch. Its owner should have no
// provider, or one without snapshots (the binary wraps it so), so that the
// mode in effect is restart_only and it runs with num_workers > 1 and no
// state_dir; grading sandboxes start on Deps.Grader or that provider.
//
// # Environments and validation
//
// On the local provider a template is ready only after its environment step
// ran (Server.environment): the commands of swebench.env_setup for the
// instance or its repository, else `go mod download` for a repository with
// a go.mod, run once per (repo, base commit, commands) in a sandbox of the
// template with the network on (the only sandbox that has it unless
// sandbox_config.network says otherwise), bounded by env_setup_timeout. It
// fills the template's caches (Config.Caches, mounted at /caches/<name>) and
// may change the work tree, which then becomes the image. Its result, failed
// or not, is kept beside the template (<template>.env/<key>/). Agent,
// validation and grading sandboxes run Go offline (GOFLAGS=-mod=mod,
// GOPROXY=off) against it: the module cache read-only, the writable caches
// (the build cache) a writable layer of each sandbox's own over the
// template's newest generation and the chain of generations under it (an
// overlay of them where the local provider mounts overlays, else a copy),
// so that nothing a sandbox writes reaches another,
// no layer changes under a sandbox standing on it, and a start copies
// nothing. A validation, which runs no model code, warms the build cache:
// what it added is published as the cache's next generation, a delta
// (cachegens.go). A new
// template's caches start as a copy of those of the newest environment of
// the same repository (seedCaches).
//
// Once per template and instance the eval script runs with no patch
// (validate.go): a PASS_TO_PASS test that does not pass, or no listed test
// in the log, makes the instance unavailable. Its seed answers 503
// environment_unavailable and starts nothing; its verify grades nothing and
// answers failure_kind environment_error with mask_sample. A grading whose
// log has no result for any listed test is no_test_results: reward 0 on a
// validated environment, masked on an unvalidated one.
//
// Eval sandboxes (gradings and validations) are bounded by
// max_concurrent_gradings; further ones wait in arrival order, counted in
// /health (Server.Gradings).
//
// # Serving
//
// Server implements package http's Resources (kind "swebench"): Seed and
// Verify call SeedSession and VerifySession with the request session's owner
// and map errors to statuses (422 invalid_row for rows that cannot be
// graded, 409 session_mismatch, 409 no_session_sandbox, 500 setup_failed for
// a failed scrub, 503 environment_unavailable). The binary selects it with
// resources: swebench and reads Config from the swebench block of its
// config file.
package swebench
