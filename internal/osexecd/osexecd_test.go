package osexecd

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/sandboxowner/owner/internal/freeport"
	"github.com/sandboxowner/owner/provider/opensandbox/opensandboxtest"
)

// A port found free may be taken by another process's bind before execd
// binds it (execd takes a port, not 0): here another test's server has the
// first port handed out. That execd exits saying so and is started again
// on the next port, which serves the execd's own /ping; before, Start
// pinged the other server for its minute and failed.
func TestAnExecdWhosePortWasTakenStartsOnAnother(t *testing.T) {
	bin, err := Build("../../../shared/opensandbox")
	if errors.Is(err, ErrNoExecd) {
		t.Skipf("no real execd here (CI has it): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	taken := httptest.NewServer(http.NotFoundHandler())
	defer taken.Close()
	var handed []int
	port := func() (int, error) {
		p, err := freeport.Loopback()
		if len(handed) == 0 {
			p = taken.Listener.Addr().(*net.TCPAddr).Port
		}
		handed = append(handed, p)
		return p, err
	}
	e, err := start(context.Background(), bin, t.TempDir(), "/sandbox", "tok", port)
	if errors.Is(err, ErrNoExecd) {
		t.Skipf("no real execd here (CI has it): %v", err)
	}
	if err != nil {
		t.Fatalf("start with the first port taken: %v (ports %v)", err, handed)
	}
	defer e.Stop()
	if len(handed) != 2 || e.Endpoint != "127.0.0.1:"+strconv.Itoa(handed[1]) {
		t.Fatalf("execd on %s after ports %v, want the second", e.Endpoint, handed)
	}
	req, _ := http.NewRequest(http.MethodGet, "http://"+e.Endpoint+"/ping", nil)
	req.Header.Set(opensandboxtest.ExecdTokenHeader, "tok")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/ping on %s: %d", e.Endpoint, resp.StatusCode)
	}
}
