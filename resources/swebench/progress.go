package swebench

import (
	"sort"
	"sync"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/sandboxowner/owner/clock"
)

// Phases of an instance's preparation (Preparing.Phase).
const (
	// PhaseTemplate: the repository is cloned at the base commit.
	PhaseTemplate = "template"
	// PhaseEnvironment: the template's environment step runs (or is
	// read from disk).
	PhaseEnvironment = "environment"
	// PhaseValidation: the eval script runs without a patch (or waits for
	// a grading slot to).
	PhaseValidation = "validation"
)

// DefaultProgressInterval is how often a preparation that is still under
// way logs its phase.
const DefaultProgressInterval = 10 * time.Second

// Preparing is an instance whose template, environment or validation a
// request is waiting for.
type Preparing struct {
	InstanceID string `json:"instance_id"`
	Repo       string `json:"repo"`
	Phase      string `json:"phase"`
	// ElapsedSeconds is since the preparation began; PhaseSeconds since
	// its phase did.
	ElapsedSeconds float64 `json:"elapsed_s"`
	PhaseSeconds   float64 `json:"phase_elapsed_s"`
	// Waiting counts the requests waiting for it.
	Waiting int `json:"waiting"`
}

// tracker keeps the preparations under way, for /health, the metrics and a
// log line every interval while one lasts.
type tracker struct {
	clk      clock.Clock
	interval time.Duration
	log      logrus.FieldLogger

	mu    sync.Mutex
	next  uint64
	items map[uint64]*prepItem
}

type prepItem struct {
	id                    uint64
	instance, repo, phase string
	began, phaseBegan     time.Time
	timer                 clock.Timer
	done                  bool
}

func newTracker(clk clock.Clock, interval time.Duration, log logrus.FieldLogger) *tracker {
	return &tracker{clk: clk, interval: interval, log: log, items: map[uint64]*prepItem{}}
}

// prep is one request's part in a preparation; its methods do nothing on a
// nil prep.
type prep struct {
	t   *tracker
	id  uint64
	log logrus.FieldLogger
}

// start records that a request waits for row's preparation, in phase.
func (t *tracker) start(row Row, phase string, log logrus.FieldLogger) *prep {
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	p := &prep{t: t, id: t.next, log: log}
	it := &prepItem{id: p.id, instance: row.InstanceID, repo: row.Repo, phase: phase, began: now, phaseBegan: now}
	t.items[p.id] = it
	it.timer = t.clk.AfterFunc(t.interval, func() { t.tick(p) })
	return p
}

// tick logs a preparation still under way and arms the next tick.
func (t *tracker) tick(p *prep) {
	now := t.clk.Now()
	t.mu.Lock()
	it, ok := t.items[p.id]
	if !ok || it.done {
		t.mu.Unlock()
		return
	}
	fields := logrus.Fields{"phase": it.phase, "elapsed_s": seconds1(now.Sub(it.began)), "phase_elapsed_s": seconds1(now.Sub(it.phaseBegan))}
	it.timer = t.clk.AfterFunc(t.interval, func() { t.tick(p) })
	t.mu.Unlock()
	p.log.WithFields(fields).Info("swebench: still preparing the instance")
}

// phase moves the preparation to another phase.
func (p *prep) phase(phase string) {
	if p == nil {
		return
	}
	now := p.t.clk.Now()
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	if it, ok := p.t.items[p.id]; ok && it.phase != phase {
		it.phase, it.phaseBegan = phase, now
	}
}

// done ends the request's wait.
func (p *prep) done() {
	if p == nil {
		return
	}
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	if it, ok := p.t.items[p.id]; ok {
		it.done = true
		it.timer.Stop()
		delete(p.t.items, p.id)
	}
}

// snapshot lists the preparations under way, one per instance (its oldest
// request's), by instance id.
func (t *tracker) snapshot() []Preparing {
	now := t.clk.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	groups := map[string][]*prepItem{}
	for _, it := range t.items {
		groups[it.instance] = append(groups[it.instance], it)
	}
	out := make([]Preparing, 0, len(groups))
	for _, its := range groups {
		oldest := its[0]
		for _, it := range its[1:] {
			if it.began.Before(oldest.began) || (it.began.Equal(oldest.began) && it.id < oldest.id) {
				oldest = it
			}
		}
		out = append(out, Preparing{InstanceID: oldest.instance, Repo: oldest.repo, Phase: oldest.phase,
			ElapsedSeconds: seconds1(now.Sub(oldest.began)), PhaseSeconds: seconds1(now.Sub(oldest.phaseBegan)), Waiting: len(its)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].InstanceID < out[j].InstanceID })
	return out
}

// byPhase counts the instances being prepared in each phase.
func (t *tracker) byPhase() map[string]int {
	out := map[string]int{PhaseTemplate: 0, PhaseEnvironment: 0, PhaseValidation: 0}
	for _, p := range t.snapshot() {
		out[p.Phase]++
	}
	return out
}

// seconds1 is d in seconds, to a tenth.
func seconds1(d time.Duration) float64 {
	return float64(d.Round(100*time.Millisecond)) / float64(time.Second)
}
