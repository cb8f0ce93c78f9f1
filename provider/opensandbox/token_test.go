package opensandbox_test

// The execd access token: every sandbox is created with one of its own, its
// execd refuses calls without it, and the provider sends it on every call,
// also after a restart.

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
	"github.com/sandboxowner/owner/provider/opensandbox"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

const tokenLabel = "sandboxowner.io/execd-token"

// lastCreate is the body of the last create request the fake saw.
func lastCreate(t *testing.T, e *env) map[string]any {
	t.Helper()
	reqs := e.srv.Requests("POST /sandboxes")
	if len(reqs) == 0 {
		t.Fatal("no create request recorded")
	}
	var body map[string]any
	if err := json.Unmarshal(reqs[len(reqs)-1], &body); err != nil {
		t.Fatal(err)
	}
	return body
}

// createdToken is the execd token of the last create: the same in its env
// and its label, 128 random bits in hex.
func createdToken(t *testing.T, e *env) string {
	t.Helper()
	body := lastCreate(t, e)
	env, _ := body["env"].(map[string]any)
	md, _ := body["metadata"].(map[string]any)
	tok, _ := env["EXECD_ACCESS_TOKEN"].(string)
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(tok) || md[tokenLabel] != tok {
		t.Fatalf("create sent env %v and metadata %v: want the same 32 hex digits in EXECD_ACCESS_TOKEN and %s", env, md, tokenLabel)
	}
	return tok
}

// ping calls base's /ping with token ("" for none) and returns the status
// and body.
func ping(t *testing.T, base, token string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/ping", nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set(opensandbox.ExecdTokenHeader, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// execdRefusal is execd's answer to a call without its token.
const execdRefusal = `{"error":"Unauthorized: invalid or missing header X-EXECD-ACCESS-TOKEN"}`

func TestEachSandboxsExecdWantsItsOwnToken(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	ctx := context.Background()
	// The spec cannot choose the token.
	h := e.start(t, provider.Spec{Env: map[string]string{"EXECD_ACCESS_TOKEN": "chosen-by-the-spec", "E": "1"}})
	tok := createdToken(t, e)
	if env := lastCreate(t, e)["env"].(map[string]any); env["E"] != "1" {
		t.Errorf("create env %v lost the spec's E", env)
	}
	base, hdr, err := e.p.Endpoint(ctx, h)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{opensandbox.ExecdTokenHeader: tok}, hdr); diff != "" {
		t.Errorf("Endpoint's headers (-want +got):\n%s", diff)
	}
	for _, tc := range []struct {
		token, body string
		status      int
	}{{"", execdRefusal + "\n", 401}, {"chosen-by-the-spec", execdRefusal + "\n", 401}, {tok, "", 200}} {
		if st, body := ping(t, base, tc.token); st != tc.status || body != tc.body {
			t.Errorf("ping with token %q = %d %q, want %d %q", tc.token, st, body, tc.status, tc.body)
		}
	}
	if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" {
		t.Errorf("echo = %+v", got)
	}

	// Another sandbox, and a fork of the first, each have their own.
	h2 := e.start(t, provider.Spec{})
	tok2 := createdToken(t, e)
	sid, err := e.p.Snapshot(ctx, h, "s")
	if err != nil {
		t.Fatal(err)
	}
	f, err := e.p.Fork(ctx, provider.Spec{}, sid)
	if err != nil {
		t.Fatal(err)
	}
	ftok := createdToken(t, e)
	if tok2 == tok || ftok == tok || ftok == tok2 {
		t.Errorf("tokens %s, %s and the fork's %s are not all different", tok, tok2, ftok)
	}
	for _, other := range []provider.Handle{h2, f} {
		ob, _, err := e.p.Endpoint(ctx, other)
		if err != nil {
			t.Fatal(err)
		}
		if st, _ := ping(t, ob, tok); st != http.StatusUnauthorized {
			t.Errorf("%s's execd answers the first sandbox's token with %d, want 401", other.SandboxID, st)
		}
		if got := e.exec(t, other, "echo hi"); got.Stdout != "hi\n" {
			t.Errorf("echo in %s = %+v", other.SandboxID, got)
		}
	}

	// Nobody is shown the token label: not the listing, not a snapshot's
	// labels.
	list, err := e.p.ListSandboxes(ctx)
	if err != nil || len(list) != 3 {
		t.Fatalf("ListSandboxes = %d, %v", len(list), err)
	}
	for _, info := range list {
		if _, ok := info.Metadata[tokenLabel]; ok {
			t.Errorf("ListSandboxes shows %s's token label", info.Handle.SandboxID)
		}
	}
	snaps, err := e.p.ListSnapshots(ctx)
	if err != nil || len(snaps) != 1 {
		t.Fatalf("ListSnapshots = %+v, %v", snaps, err)
	}
	if _, ok := snaps[0].Metadata[tokenLabel]; ok {
		t.Errorf("the snapshot's labels carry the token: %v", snaps[0].Metadata)
	}
}

// A server started again knows the tokens of the sandboxes it adopts: it
// reads each from its label once.
func TestAProviderStartedAgainReadsTheTokenFromTheLabel(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	h := e.start(t, provider.Spec{Files: map[string]string{"notes.txt": "hello\n"}})
	again, err := opensandbox.New(e.popts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before := e.srv.Stats().Requests["GET /sandboxes/{id}"]
	if res, err := again.Exec(ctx, h, provider.ExecRequest{Command: "cat notes.txt"}); err != nil || res.Stdout != "hello\n" {
		t.Errorf("Exec after a restart = %+v, %v", res, err)
	}
	if b, err := again.ReadFile(ctx, h, "notes.txt"); err != nil || string(b) != "hello\n" {
		t.Errorf("ReadFile after a restart = %q, %v", b, err)
	}
	if n := e.srv.Stats().Requests["GET /sandboxes/{id}"] - before; n != 1 {
		t.Errorf("the restarted provider read the sandbox %d times, want once (its label)", n)
	}
}

// A sandbox made without a token (by a server before tokens) is reached
// without one.
func TestASandboxMadeWithoutATokenIsReachedWithoutOne(t *testing.T) {
	e := newEnv(t, opensandboxtest.Options{}, opensandbox.Options{})
	body := `{"image":{"uri":"x"},"entrypoint":["tail","-f","/dev/null"],"timeout":600,"resourceLimits":{"cpu":"1","memory":"1Gi"},"metadata":{}}`
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/v1/sandboxes", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(opensandbox.APIKeyHeader, key)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		ID string `json:"id"`
	}
	_ = json.NewDecoder(res.Body).Decode(&doc)
	res.Body.Close()
	e.clk.Advance(10 * e.popts.PollInterval)
	h := provider.Handle{SandboxID: doc.ID, Provider: opensandbox.Name}
	if got := e.exec(t, h, "echo hi"); got.Stdout != "hi\n" {
		t.Errorf("echo = %+v", got)
	}
}
