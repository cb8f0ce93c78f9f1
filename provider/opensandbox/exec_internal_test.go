package opensandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/clock"
	"github.com/sandboxowner/owner/provider"
)

// bound is how long a test waits for something that must happen; it is a
// failure bound, never a pace.
const bound = 30 * time.Second

// scriptedExecd is a lifecycle stub and an execd whose POST /command runs
// command, for tests of how the client reads a stream.
func scriptedExecd(t *testing.T, opts Options, command func(w http.ResponseWriter, r *http.Request, send func(string)), interrupt func(id string)) (*Provider, provider.Handle) {
	t.Helper()
	var srv *httptest.Server
	srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method + " " + r.URL.Path {
		case fmt.Sprintf("GET /v1/sandboxes/sb/endpoints/%d", ExecdPort):
			_ = json.NewEncoder(w).Encode(map[string]any{"endpoint": strings.TrimPrefix(srv.URL, "http://") + "/execd"})
		case "GET /v1/sandboxes/sb":
			_ = json.NewEncoder(w).Encode(map[string]any{"id": "sb", "status": map[string]any{"state": "Running"}})
		case "POST /execd/command":
			w.Header().Set("Content-Type", "text/event-stream")
			flusher := w.(http.Flusher)
			command(w, r, func(frame string) {
				_, _ = w.Write([]byte(frame + "\n\n"))
				flusher.Flush()
			})
		case "DELETE /execd/command":
			interrupt(r.URL.Query().Get("id"))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	opts.Domain = strings.TrimPrefix(srv.URL, "http://")
	p, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return p, p.handle("sb", "/workspace")
}

// The answer comes at the final event: execd keeps the stream open a while
// after it (a second), and the client reads that in the background.
func TestExecAnswersAtTheFinalEvent(t *testing.T) {
	release := make(chan struct{})
	p, h := scriptedExecd(t, Options{}, func(w http.ResponseWriter, r *http.Request, send func(string)) {
		send(`{"type":"init","text":"c1"}`)
		send(`{"type":"stdout","text":"x"}`)
		send(`{"type":"execution_complete"}`)
		<-release // execd's grace, for as long as the test says
	}, func(string) {})
	done := make(chan provider.ExecResult, 1)
	go func() {
		res, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "echo x"})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case res := <-done:
		if diff := cmp.Diff(provider.ExecResult{Stdout: "x\n"}, res); diff != "" {
			t.Errorf("(-want +got):\n%s", diff)
		}
	case <-time.After(bound):
		t.Fatal("Exec waited for the stream to end after its final event")
	}
	close(release)
	p.Wait() // the background read ends with the stream
}

// A caller that goes away has its command interrupted through execd (with
// the id of the stream's init event), and the stream is read until execd
// ends it: a dropped connection would raise a SIGPIPE in execd, which it
// passes to every running command.
func TestExecInterruptsTheCommandOfACallerGone(t *testing.T) {
	streaming := make(chan struct{})
	interrupted := make(chan string, 1)
	outcome := make(chan string, 1)
	p, h := scriptedExecd(t, Options{}, func(w http.ResponseWriter, r *http.Request, send func(string)) {
		send(`{"type":"init","text":"cmd-7"}`)
		send(`{"type":"stdout","text":"tick"}`)
		close(streaming)
		select {
		case id := <-interrupted:
			send(`{"type":"error","error":{"ename":"CommandExecError","evalue":"-1","traceback":["signal: terminated"]}}`)
			outcome <- "interrupted " + id
		case <-r.Context().Done():
			outcome <- "the client dropped the stream before interrupting the command"
		}
	}, func(id string) { interrupted <- id })
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "while :; do echo tick; done"})
		errc <- err
	}()
	<-streaming
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Exec = %v, want context.Canceled", err)
	}
	select {
	case got := <-outcome:
		if got != "interrupted cmd-7" {
			t.Error(got)
		}
	case <-time.After(bound):
		t.Fatal("the command was neither interrupted nor its stream dropped")
	}
	p.Wait()
}

// An interrupt whose request fails (its connection dropped) is only
// logged: the stream is still read to its end, and nothing crashes.
func TestExecWhoseInterruptFailsReadsTheStreamToItsEnd(t *testing.T) {
	streaming, tried := make(chan struct{}), make(chan struct{})
	p, h := scriptedExecd(t, Options{}, func(w http.ResponseWriter, r *http.Request, send func(string)) {
		send(`{"type":"init","text":"cmd-8"}`)
		close(streaming)
		<-tried
		send(`{"type":"execution_complete"}`)
	}, func(string) {
		close(tried)
		panic(http.ErrAbortHandler) // the interrupt's connection drops unanswered
	})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := p.Exec(ctx, h, provider.ExecRequest{Command: "sleep 60"})
		errc <- err
	}()
	<-streaming
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Exec = %v, want context.Canceled", err)
	}
	waited := make(chan struct{})
	go func() { p.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-time.After(bound):
		t.Fatal("the stream was not read to its end after the failed interrupt")
	}
}

// execd reports a timeout and any killing signal alike (evalue -1): the
// command's deadline, on the provider's clock, tells them apart.
func TestExecTellsATimeoutFromASignal(t *testing.T) {
	clk := clock.NewManual(time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC))
	var advance atomic.Int64 // set before each command
	p, h := scriptedExecd(t, Options{Clock: clk}, func(w http.ResponseWriter, r *http.Request, send func(string)) {
		send(`{"type":"init","text":"c"}`)
		clk.Advance(time.Duration(advance.Load())) // the command ran this long
		send(`{"type":"error","error":{"ename":"CommandExecError","evalue":"-1","traceback":["signal: killed"]}}`)
	}, func(string) {})
	for _, tc := range []struct {
		timeout, ran time.Duration
		want         provider.ExecResult
	}{
		{timeout: time.Second, ran: 999 * time.Millisecond, want: provider.ExecResult{ExitCode: 137}},
		{timeout: time.Second, ran: time.Second, want: provider.ExecResult{ExitCode: 137, TimedOut: true}},
		// A command without a timeout never timed out, however long it ran.
		{ran: time.Second, want: provider.ExecResult{ExitCode: 137}},
	} {
		advance.Store(int64(tc.ran))
		got, err := p.Exec(context.Background(), h, provider.ExecRequest{Command: "sleep 60", Timeout: tc.timeout})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("killed after %v with a timeout of %v (-want +got):\n%s", tc.ran, tc.timeout, diff)
		}
	}
	p.Wait()
}
