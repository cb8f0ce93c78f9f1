package swebench

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseRowOriginalFormat(t *testing.T) {
	// SWE-bench's datasets ship the test lists as JSON-encoded strings, and
	// rows carry many fields this server does not use.
	line := `{"repo":"astropy/astropy","instance_id":"astropy__astropy-12907","base_commit":"D16BFE05A744909DE4B27F5875FE0D4ED41CE607",
	"patch":"diff --git a/x b/x\n","test_patch":"diff --git a/t b/t\n","problem_statement":"p","hints_text":"",
	"created_at":"2022-03-03T15:14:54Z","version":"4.3","FAIL_TO_PASS":"[\"t.py::test_a\", \"t.py::test_b\"]",
	"PASS_TO_PASS":"[]","environment_setup_commit":"298ccb478e6bf092953bca67a3d29dc6c35f6752",
	"responses_create_params":{"input":[]},"difficulty":"15 min - 1 hour"}`
	got, err := ParseRow([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Row{
		InstanceID: "astropy__astropy-12907", Repo: "astropy/astropy",
		BaseCommit: "d16bfe05a744909de4b27f5875fe0d4ed41ce607",
		Patch:      "diff --git a/x b/x\n", TestPatch: "diff --git a/t b/t\n", ProblemStatement: "p",
		Version: "4.3", EnvironmentSetupCommit: "298ccb478e6bf092953bca67a3d29dc6c35f6752",
		FailToPass: TestList{"t.py::test_a", "t.py::test_b"}, PassToPass: nil,
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("row (-want +got):\n%s", d)
	}
}

func TestParseRowMultilingualFormat(t *testing.T) {
	line := `{"repo":"caddyserver/caddy","instance_id":"caddyserver__caddy-5404","base_commit":"960150bb034dc9a549ee7289b1a4eb4abafeb30a",
	"patch":"p","test_patch":"","FAIL_TO_PASS":["TestA","TestA/sub"],"PASS_TO_PASS":["TestB"],
	"eval_script":"#!/bin/bash\necho hi\n","log_parser":"parse_log_gotest","image_name":"swebench/sweb.eval.x86_64.caddyserver_1776_caddy-5404:latest"}`
	got, err := ParseRow([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	want := Row{
		InstanceID: "caddyserver__caddy-5404", Repo: "caddyserver/caddy", BaseCommit: "960150bb034dc9a549ee7289b1a4eb4abafeb30a",
		Patch: "p", FailToPass: TestList{"TestA", "TestA/sub"}, PassToPass: TestList{"TestB"},
		EvalScript: "#!/bin/bash\necho hi\n", LogParser: "parse_log_gotest",
		Image: "swebench/sweb.eval.x86_64.caddyserver_1776_caddy-5404:latest",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("row (-want +got):\n%s", d)
	}
}

func TestParseRowTypedSeed(t *testing.T) {
	body := `{"resources_session_id":"s1","episode_id":"e","task_id":{"taskset":"x","task_id":"y"},
	"task_data":{"repo":"o/r","instance_id":"o__r-1","base_commit":"abcdef0","test_patch":"diff","FAIL_TO_PASS":"[\"T\"]"}}`
	got, err := ParseRow([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if got.InstanceID != "o__r-1" || got.Repo != "o/r" {
		t.Errorf("row from task_data = %+v", got)
	}
}

func TestParseRowRefusesUnusableRows(t *testing.T) {
	ok := map[string]string{
		"repo": `"o/r"`, "instance_id": `"o__r-1"`, "base_commit": `"abcdef0"`, "test_patch": `"diff"`,
		"FAIL_TO_PASS": `["T"]`,
	}
	build := func(over map[string]string) string {
		var parts []string
		for k, v := range ok {
			if nv, has := over[k]; has {
				v = nv
			}
			if v != "" {
				parts = append(parts, `"`+k+`":`+v)
			}
		}
		for k, v := range over {
			if _, has := ok[k]; !has {
				parts = append(parts, `"`+k+`":`+v)
			}
		}
		return "{" + strings.Join(parts, ",") + "}"
	}
	if _, err := ParseRow([]byte(build(nil))); err != nil {
		t.Fatalf("baseline row refused: %v", err)
	}
	cases := map[string]map[string]string{
		"no instance id":        {"instance_id": ""},
		"repo not owner/name":   {"repo": `"../etc"`},
		"base commit not hex":   {"base_commit": `"HEAD; rm -rf /"`},
		"empty FAIL_TO_PASS":    {"FAIL_TO_PASS": `"[]"`},
		"FAIL_TO_PASS not list": {"FAIL_TO_PASS": `"{\"a\":1}"`},
		"FAIL_TO_PASS a number": {"FAIL_TO_PASS": `3`},
		"no tests to run":       {"test_patch": ""},
		"unknown log parser":    {"log_parser": `"parse_log_cobol"`},
		"not JSON":              {"repo": `o/r`},
	}
	for name, over := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := ParseRow([]byte(build(over)))
			if !errors.Is(err, ErrInvalidRow) {
				t.Errorf("err = %v, want ErrInvalidRow", err)
			}
		})
	}
}

func TestReadRows(t *testing.T) {
	in := `{"repo":"o/r","instance_id":"a","base_commit":"abcdef0","test_patch":"d","FAIL_TO_PASS":["T"]}

{"repo":"o/r","instance_id":"b","base_commit":"abcdef1","eval_script":"e","FAIL_TO_PASS":"[\"T\"]"}
`
	rows, err := ReadRows(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, r := range rows {
		ids = append(ids, r.InstanceID)
	}
	if d := cmp.Diff([]string{"a", "b"}, ids); d != "" {
		t.Errorf("ids (-want +got):\n%s", d)
	}
	_, err = ReadRows(strings.NewReader(in + "{\"instance_id\":\"c\"}\n"))
	if !errors.Is(err, ErrInvalidRow) || !strings.Contains(err.Error(), "line 4") {
		t.Errorf("bad line: err = %v, want ErrInvalidRow naming line 4", err)
	}
}
