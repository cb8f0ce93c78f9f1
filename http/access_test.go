package http_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	httpapi "github.com/sandboxowner/owner/http"
)

// /sandbox_access's reply writes itself as json.Marshal would write it,
// whatever its descriptor holds (a lent sandbox's token and expiry, a
// direct one's headers, a null workdir, characters JSON escapes, a value of
// another type).
func TestAccessJSONAsMarshalWritesIt(t *testing.T) {
	for _, a := range []httpapi.Access{
		{},
		{Connection: httpapi.Connection{Kind: "direct", ProviderConfigRef: "sandbox", Descriptor: map[string]any{
			"sandbox_id": "sb-1", "workdir": nil, "endpoint": "http://127.0.0.1:8080/sandboxes/sb-1",
			"token": "v1.eyJ.sig", "token_expires_at": time.Unix(1_800_000_000, 0).UTC(),
		}}, Workdir: "/work"},
		{Connection: httpapi.Connection{Kind: "direct", ProviderConfigRef: "<ref>&", Descriptor: map[string]any{
			"sandbox_id": "sb\u2028\"2", "workdir": "/w", "endpoint": "http://execd", "headers": map[string]string{"X-Key": "k", "A": "b"},
			"extra": []any{1.5, "x"},
		}}, Workdir: "\xff"},
	} {
		want, err := json.Marshal(&a)
		if err != nil {
			t.Fatal(err)
		}
		got, err := a.AppendJSON(nil)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("(-json.Marshal +AppendJSON):\n%s", diff)
		}
	}
}
