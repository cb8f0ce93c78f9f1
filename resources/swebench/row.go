package swebench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"

	"github.com/sandboxowner/owner/resources/swebench/grading"
)

// Errors callers branch on. Every error of this package wraps one of them (or
// an owner or provider sentinel).
var (
	// ErrInvalidRow: the row is not a usable SWE-bench row (HTTP 422).
	ErrInvalidRow = errors.New("swebench: invalid row")
	// ErrUnknownLogParser: the row names a log parser this package lacks.
	ErrUnknownLogParser = grading.ErrUnknownLogParser
	// ErrNoTestCommand: the row has no eval_script and the config names no
	// test command for its repository.
	ErrNoTestCommand = errors.New("swebench: no test command for the repository")
	// ErrUnknownRepo: on the local provider, the row's repository is not in
	// swebench.repos and the row names no image.
	ErrUnknownRepo = errors.New("swebench: repository not configured")
	// ErrTemplate: the template of a (repo, base commit) could not be
	// prepared.
	ErrTemplate = errors.New("swebench: template")
	// ErrScrub: the anti-cheat scrub failed; the seed is refused.
	ErrScrub = errors.New("swebench: anti-cheat scrub failed")
	// ErrExtract: the model patch could not be extracted.
	ErrExtract = errors.New("swebench: patch extraction failed")
	// ErrGrading: the grading sandbox could not be used (the provider
	// failed, not the patch or the tests).
	ErrGrading = errors.New("swebench: grading failed")
	// ErrSessionMismatch: the verify's row is not the seeded instance.
	ErrSessionMismatch = errors.New("swebench: verify row does not match the seeded instance")
	// ErrEnvironmentUnavailable: the instance's environment step or its
	// validation without a patch failed; it is neither lent nor graded
	// (HTTP 503).
	ErrEnvironmentUnavailable = errors.New("swebench: environment unavailable")
	// ErrEnvironmentPreparing: with while_preparing: refuse, the
	// instance's template, environment or validation is still being
	// prepared (HTTP 503 with Retry-After).
	ErrEnvironmentPreparing = errors.New("swebench: environment preparing")
	// ErrConfig: the swebench configuration is not usable.
	ErrConfig = errors.New("swebench: config")
	// ErrClosed: the server is stopping (Close) and starts no sandbox of
	// its own.
	ErrClosed = errors.New("swebench: server stopping")
)

// TestList is FAIL_TO_PASS or PASS_TO_PASS: a JSON list of test names, or
// (as SWE-bench's datasets ship them) a JSON string holding such a list.
// null and "" are the empty list.
type TestList []string

// UnmarshalJSON accepts a list of strings or a string encoding one.
func (l *TestList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*l = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		s = strings.TrimSpace(s)
		if s == "" {
			*l = nil
			return nil
		}
		b = []byte(s)
	}
	var names []string
	if err := json.Unmarshal(b, &names); err != nil {
		return fmt.Errorf("a test list must be a JSON list of strings or a string holding one: %w", err)
	}
	if len(names) == 0 {
		names = nil
	}
	*l = names
	return nil
}

// Row is one SWE-bench instance. Fields not listed are ignored.
type Row struct {
	InstanceID             string   `json:"instance_id"`
	Repo                   string   `json:"repo"`
	BaseCommit             string   `json:"base_commit"`
	Patch                  string   `json:"patch"`
	TestPatch              string   `json:"test_patch"`
	ProblemStatement       string   `json:"problem_statement,omitempty"`
	HintsText              string   `json:"hints_text,omitempty"`
	Version                string   `json:"version,omitempty"`
	EnvironmentSetupCommit string   `json:"environment_setup_commit,omitempty"`
	FailToPass             TestList `json:"FAIL_TO_PASS"`
	PassToPass             TestList `json:"PASS_TO_PASS"`
	// EvalScript, when present, is run as is (Multilingual rows carry it).
	EvalScript string `json:"eval_script,omitempty"`
	// LogParser names the parser of the test log (grading.ParseLog); empty means
	// every parser this package has.
	LogParser string `json:"log_parser,omitempty"`
	// Image is the sandbox image on providers other than local ("image", or
	// "image_name" as some exports call it).
	Image string `json:"image,omitempty"`
}

// rowJSON is Row as it arrives, with the aliases some exports use.
type rowJSON struct {
	Row
	ImageName string `json:"image_name"`
	// TaskData holds the row in a typed seed ({"task_data": {...}}).
	TaskData json.RawMessage `json:"task_data"`
}

var (
	hexCommit = regexp.MustCompile(`^[0-9a-fA-F]{7,64}$`)
	repoName  = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$`)
)

// ParseRow decodes one row: a dataset row, or a typed seed whose task_data is
// one. Unknown fields are ignored. The row is validated (Validate).
func ParseRow(data []byte) (Row, error) {
	var rj rowJSON
	if err := json.Unmarshal(data, &rj); err != nil {
		return Row{}, fmt.Errorf("%w: %v", ErrInvalidRow, err)
	}
	if rj.InstanceID == "" && len(rj.TaskData) > 0 && !bytes.Equal(bytes.TrimSpace(rj.TaskData), []byte("null")) {
		return ParseRow(rj.TaskData)
	}
	r := rj.Row
	if r.Image == "" {
		r.Image = rj.ImageName
	}
	r.BaseCommit = strings.ToLower(strings.TrimSpace(r.BaseCommit))
	if err := r.Validate(); err != nil {
		return Row{}, err
	}
	return r, nil
}

// Validate checks what grading needs: an instance id, a repository named
// owner/name, a hex base commit, a non-empty FAIL_TO_PASS, a known log
// parser, and a test patch or an eval script.
func (r Row) Validate() error {
	switch {
	case r.InstanceID == "":
		return fmt.Errorf("%w: no instance_id", ErrInvalidRow)
	case !repoName.MatchString(r.Repo):
		return fmt.Errorf("%w: %s: repo %q is not owner/name", ErrInvalidRow, r.InstanceID, r.Repo)
	case !hexCommit.MatchString(r.BaseCommit):
		return fmt.Errorf("%w: %s: base_commit %q is not a hex commit id", ErrInvalidRow, r.InstanceID, r.BaseCommit)
	case len(r.FailToPass) == 0:
		return fmt.Errorf("%w: %s: FAIL_TO_PASS is empty (every test would pass vacuously)", ErrInvalidRow, r.InstanceID)
	case r.EvalScript == "" && strings.TrimSpace(r.TestPatch) == "":
		return fmt.Errorf("%w: %s: neither eval_script nor test_patch", ErrInvalidRow, r.InstanceID)
	}
	if err := grading.CheckParser(r.LogParser); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrInvalidRow, r.InstanceID, err)
	}
	return nil
}

// ReadRows reads a JSONL file of rows; blank lines are skipped. A bad line is
// an error naming its line number.
func ReadRows(r io.Reader) ([]Row, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 256<<20)
	var rows []Row
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		row, err := ParseRow(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: read rows: %v", ErrInvalidRow, err)
	}
	return rows, nil
}

// At returns the row as it is graded in a template whose repository holds
// its base commit's source as commit local (one made from the module
// proxy): base_commit is local, and so is every mention of the full base
// commit in its eval script. A local commit that is the base is the row.
func (r Row) At(local string) Row {
	if local == "" || strings.HasPrefix(local, r.BaseCommit) {
		return r
	}
	out := r
	out.BaseCommit = local
	if len(r.BaseCommit) == 40 || len(r.BaseCommit) == 64 {
		out.EvalScript = strings.ReplaceAll(r.EvalScript, r.BaseCommit, local)
	}
	return out
}
