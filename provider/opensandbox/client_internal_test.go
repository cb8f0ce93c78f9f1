package opensandbox

import (
	"net/http"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestAPIErrorReadsTheServersThreeShapes: {code, message}, FastAPI's 422
// {detail: [{loc, msg}]} and {detail: "..."}, execd's {error}, and a body
// that is none of them.
func TestAPIErrorReadsTheServersThreeShapes(t *testing.T) {
	for _, tc := range []struct {
		status int
		body   string
		want   APIError
	}{
		{409, `{"code":"SNAPSHOT::DELETE_CONFLICT","message":"in use"}`, APIError{Op: "op", Status: 409, Code: "SNAPSHOT::DELETE_CONFLICT", Message: "in use"}},
		{422, `{"detail":[{"type":"greater_than_equal","loc":["body","timeout"],"msg":"Input should be greater than or equal to 60"},{"loc":["query","pageSize"],"msg":"bad"}]}`,
			APIError{Op: "op", Status: 422, Message: "body.timeout: Input should be greater than or equal to 60; query.pageSize: bad"}},
		{404, `{"detail":"Not Found"}`, APIError{Op: "op", Status: 404, Message: "Not Found"}},
		{500, `{"error":"boom"}`, APIError{Op: "op", Status: 500, Message: "boom"}},
		{502, "<html>bad gateway</html>\n", APIError{Op: "op", Status: 502, Message: "<html>bad gateway</html>"}},
	} {
		got := (&response{status: tc.status, header: http.Header{}, body: []byte(tc.body)}).apiError("op")
		if diff := cmp.Diff(tc.want, *got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", tc.body, diff)
		}
	}
}
