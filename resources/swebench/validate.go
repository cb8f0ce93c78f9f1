package swebench

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// Validation is what an instance's eval script did without a patch, in a
// fresh sandbox of its template: SWE-bench's check that the environment can
// grade the instance at all. It is kept with the template's environment
// (validations/), once per instance.
type Validation struct {
	InstanceID string `json:"instance_id"`
	// Key names the row's grading inputs (eval script, test lists, log
	// parser): a row that changes them is validated again.
	Key string `json:"key"`
	// Available is false when a PASS_TO_PASS test failed or no listed test
	// appeared in the log: the instance is neither lent nor graded.
	Available bool   `json:"available"`
	Reason    string `json:"reason,omitempty"`
	// PassToPassFailing are the PASS_TO_PASS tests that did not pass.
	PassToPassFailing []string `json:"pass_to_pass_failing,omitempty"`
	// FailToPassPassing are FAIL_TO_PASS tests that passed without the
	// fix (a warning: the row's lists may be wrong).
	FailToPassPassing []string  `json:"fail_to_pass_passing,omitempty"`
	Seconds           float64   `json:"seconds"`
	ValidatedAt       time.Time `json:"validated_at"`
	// LogFile is where the validation's test output is kept, beside its
	// verdict (a template's validations only).
	LogFile string `json:"log_file,omitempty"`
	// output is the eval script's output.
	output string
}

// readiness is what decides whether an instance can be lent and graded.
type readiness struct {
	image string
	env   *Environment // nil: the image is not a local template
	// row is the row as graded there (Row.At the template's commit).
	row Row
	// validation is nil when validation is off.
	validation *Validation
}

// unavailable returns why the instance cannot be lent or graded, if so.
func (r readiness) unavailable() (string, bool) {
	if r.env != nil && !r.env.OK {
		return "environment step failed: " + r.env.Reason, true
	}
	if r.validation != nil && !r.validation.Available {
		return "validation without a patch failed: " + r.validation.Reason, true
	}
	return "", false
}

// validated reports whether a validation vouched for the environment.
func (r readiness) validated() bool { return r.validation != nil && r.validation.Available }

// prepare makes row's image and environment on p and validates the
// instance (each once per template); an error means one of them could not
// be attempted (nothing is kept then), not that it failed.
func (s *Server) prepare(ctx context.Context, p provider.Provider, row Row, log logrus.FieldLogger) (readiness, error) {
	pr := s.progress.start(row, PhaseTemplate, log)
	defer pr.done()
	image, env, err := s.image(ctx, p, row, pr, log)
	if err != nil {
		return readiness{}, err
	}
	r := readiness{image: image, env: env, row: row}
	if env != nil {
		r.row = row.At(env.BaseCommit)
	}
	if _, bad := r.unavailable(); bad || !s.cfg.validates() {
		return r, nil
	}
	pr.phase(PhaseValidation)
	r.validation, err = s.validation(ctx, p, r.row, image, env, log)
	return r, err
}

// preparedOrStart returns nil once row's preparation has finished in this
// process or is found kept on disk (preparedOnDisk); until then it starts it in the background (once) and returns
// ErrEnvironmentPreparing at once.
func (s *Server) preparedOrStart(p provider.Provider, row Row, log logrus.FieldLogger) error {
	key := row.InstanceID + "\x00" + s.validationKey(row)
	s.mu.Lock()
	prepared, running := s.prepared[key], s.background[key]
	s.mu.Unlock()
	if !prepared && !running && s.preparedOnDisk(row) {
		prepared = true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if prepared {
		s.prepared[key] = true
	}
	if s.prepared[key] {
		return nil
	}
	if !s.background[key] {
		s.background[key] = true
		s.bg.Add(1)
		go func() {
			defer s.bg.Done()
			_, err := s.prepare(s.base, p, row, log)
			s.mu.Lock()
			delete(s.background, key)
			if err == nil {
				s.prepared[key] = true
			}
			s.mu.Unlock()
			if err != nil {
				log.WithError(err).Warn("swebench: preparing the instance in the background failed; the next seed tries again")
			}
		}()
	}
	return fmt.Errorf("%w: %s: its template, environment or validation is being prepared (see /health)", ErrEnvironmentPreparing, row.InstanceID)
}

var unsafeName = regexp.MustCompile(`[^A-Za-z0-9._-]+`)

// validationKey names row's grading inputs.
func (s *Server) validationKey(row Row) string {
	script, _ := BuildEvalScript(row, s.cfg.testCommand(row), s.cfg.Workdir)
	// "framing-1" names the grader's reading of logs: a validation made
	// under another is made again.
	b, _ := json.Marshal([]any{row.InstanceID, script, row.FailToPass, row.PassToPass, row.LogParser, "framing-1"})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// validationFile is where row's validation is kept beside env.
func (s *Server) validationFile(env *Environment, row Row) string {
	id := unsafeName.ReplaceAllString(row.InstanceID, "_")
	if len(id) > 100 {
		id = id[:100]
	}
	return filepath.Join(env.Dir, "validations", id+"-"+s.validationKey(row)+".json")
}

// preparedOnDisk reports whether row's template, environment and (when
// validating) validation are already kept on disk, by this server before a
// restart or by another sharing template_dir: preparing it then only reads
// them, and a refusing server has no reason to refuse.
func (s *Server) preparedOnDisk(row Row) bool {
	if s.templates == nil || !s.templates.Has(row.Repo) {
		return false
	}
	dir, ok := s.templates.existing(row.Repo, row.BaseCommit)
	if !ok {
		return false
	}
	cmds, _ := s.envCommands(row, dir)
	env, err := readEnvironment(filepath.Join(dir+".env", s.envKey(cmds, s.cfg.goToolchain(row))), dir)
	if err != nil {
		return false
	}
	if !env.OK || !s.cfg.validates() {
		return true
	}
	_, err = os.Stat(s.validationFile(env, row.At(env.BaseCommit)))
	return err == nil
}

// validation returns the instance's validation, running it if no server
// has yet for this template (env) or, without a template, this process for
// this image.
func (s *Server) validation(ctx context.Context, p provider.Provider, row Row, image string, env *Environment, log logrus.FieldLogger) (*Validation, error) {
	key := s.validationKey(row)
	memKey := image + "\x00" + key
	s.mu.Lock()
	v, ok := s.validations[memKey]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	var file string
	if env != nil {
		file = s.validationFile(env, row)
		if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
		unlock, err := lockFile(file + ".lock")
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
		defer unlock()
	} else {
		l := s.locks.get(memKey)
		l.Lock()
		defer l.Unlock()
	}
	s.mu.Lock()
	v, ok = s.validations[memKey]
	s.mu.Unlock()
	if ok {
		return v, nil
	}
	if file != "" {
		if b, err := os.ReadFile(file); err == nil {
			v = &Validation{}
			if err := json.Unmarshal(b, v); err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrTemplate, file, err)
			}
		}
	}
	if v == nil {
		var err error
		began := time.Now()
		if v, err = s.runValidation(ctx, p, row, image, env, log); err != nil {
			s.observer.Validation(OutcomeError, time.Since(began))
			return nil, err
		}
		if v.Available {
			s.observer.Validation(OutcomeAvailable, time.Since(began))
		} else {
			s.observer.Validation(OutcomeUnavailable, time.Since(began))
		}
		v.Key = key
		if file != "" {
			v.LogFile = strings.TrimSuffix(file, ".json") + ".log"
			if err := os.WriteFile(v.LogFile, []byte(v.output), 0o644); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
			}
			if !v.Available {
				v.Reason += " (test output: " + v.LogFile + ")"
			}
			if err := writeJSONFile(file, v); err != nil {
				return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
			}
		}
	}
	s.mu.Lock()
	s.validations[memKey] = v
	s.mu.Unlock()
	return v, nil
}

// runValidation runs row's eval script with no patch in a fresh sandbox of
// image and judges the log.
func (s *Server) runValidation(ctx context.Context, p provider.Provider, row Row, image string, env *Environment, log logrus.FieldLogger) (*Validation, error) {
	release, err := s.slots.acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: wait for a grading slot: %w", ErrGrading, err)
	}
	defer release()
	began := time.Now()
	if env != nil && p.Capabilities().HostTools {
		// Its own copy: the harvest directory is this validation's.
		e := *env
		if e.harvest, err = s.harvestDir(env); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrTemplate, err)
		}
		defer os.RemoveAll(e.harvest)
		env = &e
	}
	outer := ctx // the sandbox's ends with it
	spec, started, err := s.spec(p, image, row, roleValidation, env)
	if err != nil {
		return nil, fmt.Errorf("%w: start the validation sandbox: %w", ErrGrading, err)
	}
	h, ctx, stop, err := s.startSandbox(ctx, p, spec, "validation")
	started()
	if err != nil {
		return nil, fmt.Errorf("%w: start the validation sandbox: %w", ErrGrading, err)
	}
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()
	tc, err := probeGo(ctx, p, h)
	if err != nil {
		return nil, fmt.Errorf("%w: probe the repository's Go: %w", ErrGrading, err)
	}
	framing := tc.framing(row.LogParser)
	script, err := s.evalScript(ctx, p, h, row)
	if err != nil {
		return nil, fmt.Errorf("%w: build the eval script: %w", ErrGrading, err)
	}
	ev, err := RunEval(ctx, p, h, script, framing == grading.FramingMarked, s.cfg.evaluationTimeout())
	if err != nil {
		return nil, fmt.Errorf("%w: run the eval script: %w", ErrGrading, err)
	}
	v := &Validation{InstanceID: row.InstanceID, Available: true, output: ev.Log}
	if ev.TimedOut {
		v.Available, v.Reason = false, fmt.Sprintf("the eval script ran past evaluation_timeout (%s)", s.cfg.evaluationTimeout())
	} else {
		o, err := ReadOutcome(row, framing, ev.Log)
		if err != nil {
			return nil, err
		}
		judge(v, row, o.Statuses, ev.Log)
	}
	if env != nil && env.harvest != "" && !ev.TimedOut {
		// What the validation compiled warms the gradings after it: its
		// layer's new files, published once its sandbox is gone.
		herr := s.harvest(ctx, p, h)
		stop()
		stopped = true
		if herr != nil {
			log.WithError(herr).WithField("sandbox_id", h.SandboxID).Warn("swebench: what the validation added to the caches could not be read; gradings compile it again")
		} else {
			s.publishHarvest(outer, env, env.harvest, log)
		}
	}
	v.Seconds = time.Since(began).Seconds()
	v.ValidatedAt = time.Now().UTC()
	fields := logrus.Fields{"sandbox_id": h.SandboxID, "available": v.Available, "duration_ms": time.Since(began).Milliseconds()}
	if len(v.FailToPassPassing) > 0 {
		log.WithFields(fields).WithField("fail_to_pass_passing", v.FailToPassPassing).Warn("swebench: FAIL_TO_PASS tests already pass without the patch")
	}
	if v.Available {
		log.WithFields(fields).Info("swebench: instance validated")
	} else {
		log.WithFields(fields).WithField("reason", v.Reason).Warn("swebench: instance unavailable: validation without a patch failed")
	}
	return v, nil
}

// judge applies the validation rule to the statuses of a patchless run.
func judge(v *Validation, row Row, statuses grading.Statuses, log string) {
	if len(row.FailToPass)+len(row.PassToPass) == 0 {
		v.Available, v.Reason = false, "the row lists no FAIL_TO_PASS or PASS_TO_PASS test"
		return
	}
	if !anyListed(row, statuses) {
		v.Available = false
		v.Reason = "no FAIL_TO_PASS or PASS_TO_PASS test appears in the eval log (does it build here?): " + lastLines(log, 6)
		return
	}
	ts, _ := grading.Resolve(row.FailToPass, row.PassToPass, statuses)
	v.FailToPassPassing = ts.FailToPass.Success
	if len(ts.PassToPass.Failure) > 0 {
		v.PassToPassFailing = ts.PassToPass.Failure
		v.Available = false
		v.Reason = fmt.Sprintf("%d PASS_TO_PASS tests do not pass without the patch: %s", len(ts.PassToPass.Failure), strings.Join(firstN(ts.PassToPass.Failure, 10), ", "))
	}
}

// anyListed reports whether the log has a result for any listed test.
func anyListed(row Row, statuses grading.Statuses) bool {
	return grading.AnyListed(row.FailToPass, row.PassToPass, statuses)
}

func firstN(s []string, n int) []string { return grading.FirstN(s, n) }
