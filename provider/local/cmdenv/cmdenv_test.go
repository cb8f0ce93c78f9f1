package cmdenv

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// A command gets the base variables, the spec's over them and the
// request's over both, sorted; the sandbox's id, which neither may change;
// and a value under a cache's path points at its host directory.
func TestCommandLayersTheEnvironments(t *testing.T) {
	spec := map[string]string{"A": "spec", "B": "spec", "LANG": "en_US.UTF-8", IDVar: "forged by the spec"}
	req := map[string]string{"B": "req", "PATH": "/opt/bin", IDVar: "forged by the request",
		"GOCACHE": "/cache/go", "GOMOD": "/cache/go/mod", "NEAR": "/cache/gox", "OTHER": "/cached"}
	rewrites := []Rewrite{{From: "/cache/go", To: "/host/c1"}, {From: "/cache", To: "/host/c2"}}
	got := Command("/sandbox", spec, req, rewrites, "sb1")
	want := []string{
		"A=spec", "B=req",
		"GOCACHE=/host/c1", "GOMOD=/host/c1/mod",
		"HOME=/sandbox", "LANG=en_US.UTF-8",
		IDVar + "=sb1",
		"NEAR=/host/c2/gox", "OTHER=/cached", "PATH=/opt/bin",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Command (-want +got):\n%s", diff)
	}
	// Without env or rewrites: the base alone.
	want = []string{"HOME=/w", "LANG=C.UTF-8", IDVar + "=sb2", "PATH=" + BasePath}
	if diff := cmp.Diff(want, Command("/w", nil, nil, nil, "sb2")); diff != "" {
		t.Errorf("Command of no env (-want +got):\n%s", diff)
	}
}

// The init's environment is fixed: only the sandbox's id varies.
func TestHostIsFixed(t *testing.T) {
	want := []string{"PATH=" + BasePath, "LANG=C.UTF-8", IDVar + "=sb1"}
	if diff := cmp.Diff(want, Host("sb1")); diff != "" {
		t.Errorf("Host (-want +got):\n%s", diff)
	}
}

// A name a shell could not hold, or a value with a NUL, is an invalid spec.
func TestCheckRefusesWhatAShellCannotHold(t *testing.T) {
	got := map[string]bool{}
	for _, env := range []map[string]string{
		nil, {"A": "x"}, {"_a1": ""}, {"Z9_": "a b=c"},
		{"": "x"}, {"1A": "x"}, {"A-B": "x"}, {"A B": "x"}, {"A=": "x"}, {"Ä": "x"}, {"A\n": "x"},
		{"A": "x\x00y"}, {"A": "ok", "B": "\x00"},
	} {
		err := Check(env)
		if err != nil && !errors.Is(err, provider.ErrInvalidSpec) {
			t.Errorf("%q: %v, not an invalid spec", env, err)
		}
		for k, v := range env {
			got[k+"="+v] = err == nil
		}
		if env == nil {
			got["(none)"] = err == nil
		}
	}
	want := map[string]bool{
		"(none)": true, "A=x": true, "_a1=": true, "Z9_=a b=c": true,
		"=x": false, "1A=x": false, "A-B=x": false, "A B=x": false, "A==x": false, "Ä=x": false, "A\n=x": false,
		"A=x\x00y": false, "A=ok": false, "B=\x00": false,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("accepted (-want +got):\n%s", diff)
	}
}
