package swebench

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/sandboxowner/owner/provider"
)

// heldEvals is a provider whose eval scripts wait for the test: each says
// which instance it grades on entered, then waits for a value on release.
type heldEvals struct {
	provider.Provider
	entered chan string
	release chan struct{}

	mu     sync.Mutex
	starts []string // instance of each grading sandbox started, in order
	ids    map[string]string
}

func (p *heldEvals) Start(ctx context.Context, spec provider.Spec) (provider.Handle, error) {
	h, err := p.Provider.Start(ctx, spec)
	if err == nil && spec.Metadata["swebench_role"] == roleGrading {
		p.mu.Lock()
		p.starts = append(p.starts, spec.Metadata["instance_id"])
		p.ids[h.SandboxID] = spec.Metadata["instance_id"]
		p.mu.Unlock()
	}
	return h, err
}

func (p *heldEvals) Exec(ctx context.Context, h provider.Handle, req provider.ExecRequest) (provider.ExecResult, error) {
	if strings.Contains(req.Command, "/eval.sh") {
		p.mu.Lock()
		id := p.ids[h.SandboxID]
		p.mu.Unlock()
		p.entered <- id
		<-p.release
	}
	return p.Provider.Exec(ctx, h, req)
}

func (p *heldEvals) started() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.starts...)
}

func TestGradingsBeyondTheCapWaitInArrivalOrder(t *testing.T) {
	t.Parallel()
	tk := newTask(t)
	held := &heldEvals{entered: make(chan string), release: make(chan struct{}), ids: map[string]string{}}
	_, own, srv := newGolden(t, tk, func(c *Config, p *provider.Provider) {
		c.MaxConcurrentGradings, c.Validate = 1, off()
		held.Provider = *p
		*p = held
	})
	waiting := make(chan int, 3)
	srv.slots.onWait = func(n int) { waiting <- n }
	ids := []string{"example__calc-a", "example__calc-b", "example__calc-c"}
	results := make(chan VerifyResult, len(ids))
	verify := func(id string) {
		row := mustJSON(t, tk.row(id))
		if _, err := srv.SeedSession(context.Background(), own, id, row); err != nil {
			t.Error(err)
		}
		res, err := srv.VerifySession(context.Background(), own, id, row)
		if err != nil {
			t.Error(err)
		}
		results <- res
	}
	go verify(ids[0])
	if got := <-held.entered; got != ids[0] {
		t.Fatalf("first grading: %s", got)
	}
	go verify(ids[1])
	if n := <-waiting; n != 1 {
		t.Fatalf("%d waiting, want 1", n)
	}
	go verify(ids[2])
	if n := <-waiting; n != 2 {
		t.Fatalf("%d waiting, want 2", n)
	}
	if running, queued := srv.Gradings(); running != 1 || queued != 2 {
		t.Errorf("gradings: %d running, %d waiting; want 1 and 2", running, queued)
	}
	want := map[string]any{"gradings": map[string]int{"running": 1, "waiting": 2, "max_concurrent": 1}, "preparing": []Preparing{}}
	if d := cmp.Diff(want, srv.Health()); d != "" {
		t.Errorf("health (-want +got):\n%s", d)
	}
	if got := held.started(); !cmp.Equal(got, ids[:1]) {
		t.Errorf("grading sandboxes started while one grades: %v", got)
	}
	held.release <- struct{}{}
	if got := <-held.entered; got != ids[1] {
		t.Errorf("second grading: %s, want the first to have waited", got)
	}
	held.release <- struct{}{}
	if got := <-held.entered; got != ids[2] {
		t.Errorf("third grading: %s", got)
	}
	held.release <- struct{}{}
	for range ids {
		wantResolved(t, <-results)
	}
	if running, queued := srv.Gradings(); running != 0 || queued != 0 {
		t.Errorf("after the gradings: %d running, %d waiting", running, queued)
	}
	if got := held.started(); !cmp.Equal(got, ids) {
		t.Errorf("grading sandboxes started in order %v, want %v", got, ids)
	}
}

func TestAWaiterThatGivesUpLeavesTheQueue(t *testing.T) {
	s := newSlots(1)
	release, err := s.acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan int, 2)
	s.onWait = func(n int) { waiting <- n }
	ctx, cancel := context.WithCancel(context.Background())
	gaveUp := make(chan error, 1)
	go func() {
		_, err := s.acquire(ctx)
		gaveUp <- err
	}()
	<-waiting
	cancel()
	if err := <-gaveUp; err != context.Canceled {
		t.Errorf("a canceled waiter got %v", err)
	}
	if running, queued := s.counts(); running != 1 || queued != 0 {
		t.Errorf("%d running, %d waiting after a waiter gave up", running, queued)
	}
	got := make(chan func(), 1)
	go func() {
		r, _ := s.acquire(context.Background())
		got <- r
	}()
	<-waiting
	release()
	(<-got)()
	if running, queued := s.counts(); running != 0 || queued != 0 {
		t.Errorf("%d running, %d waiting at the end", running, queued)
	}
}
