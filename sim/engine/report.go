package engine

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Summary adds up runs.
type Summary struct {
	Runs, Steps  int
	Armed, Fired map[Fault]int
	Violations   []Violation
	Elapsed      time.Duration
}

// NewSummary returns an empty summary.
func NewSummary() *Summary {
	return &Summary{Armed: map[Fault]int{}, Fired: map[Fault]int{}}
}

// Add counts one run.
func (s *Summary) Add(r Result) {
	s.Runs++
	s.Steps += r.Steps
	for k, v := range r.Armed {
		s.Armed[k] += v
	}
	for k, v := range r.Fired {
		s.Fired[k] += v
	}
	s.Violations = append(s.Violations, r.Violations...)
}

// ByInvariant counts the violations of each invariant.
func (s *Summary) ByInvariant() map[Invariant]int {
	out := map[Invariant]int{}
	for _, v := range s.Violations {
		out[v.Invariant]++
	}
	return out
}

// WriteTable prints the summary: runs, steps, faults by kind, violations by
// invariant, and each violation with the command that replays it.
func (s *Summary) WriteTable(w io.Writer, cfg Config, replay func(seed int64) string) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "runs\t%d\n", s.Runs)
	fmt.Fprintf(tw, "steps\t%d\n", s.Steps)
	fmt.Fprintf(tw, "sessions per run\t%d\n", cfg.Sessions)
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\trate\tarmed\tinjected\t")
	totalArmed, totalFired := 0, 0
	for _, k := range Kinds() {
		rate, on := cfg.Faults[k]
		rs := "off"
		if on {
			rs = fmt.Sprintf("%g", rate)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t\n", k, rs, s.Armed[k], s.Fired[k])
		totalArmed += s.Armed[k]
		totalFired += s.Fired[k]
	}
	fmt.Fprintf(tw, "total\t\t%d\t%d\t\n", totalArmed, totalFired)
	tw.Flush()

	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "invariant\tviolations\t")
	by := s.ByInvariant()
	for _, inv := range Invariants() {
		fmt.Fprintf(tw, "%s\t%d\t\n", inv, by[inv])
	}
	for _, inv := range keyedInvariants() {
		if cfg.Keyed || by[inv] > 0 {
			fmt.Fprintf(tw, "%s\t%d\t\n", inv, by[inv])
		}
	}
	fmt.Fprintf(tw, "total\t%d\t\n", len(s.Violations))
	tw.Flush()

	if len(s.Violations) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "violations (seed, step, invariant, what):")
	for _, v := range s.Violations {
		fmt.Fprintf(w, "  seed %d step %d  %s: %s\n", v.Seed, v.Step, v.Invariant, v.Detail)
		fmt.Fprintf(w, "    replay: %s\n", replay(v.Seed))
	}
}

// Progress draws a progress bar of runs on w (a terminal: redrawn in
// place; anything else: a line every tenth).
type Progress struct {
	mu         sync.Mutex
	w          io.Writer
	tty        bool
	total      int
	done       int
	violations int
	began      time.Time
	lastTenth  int
}

// NewProgress starts a progress bar of total runs.
func NewProgress(w io.Writer, tty bool, total int) *Progress {
	p := &Progress{w: w, tty: tty, total: total, began: time.Now()}
	p.draw()
	return p
}

// Done counts a finished run.
func (p *Progress) Done(r Result) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done++
	p.violations += len(r.Violations)
	p.draw()
}

// Finish ends the bar's line.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

func (p *Progress) draw() {
	if !p.tty {
		tenth := 0
		if p.total > 0 {
			tenth = p.done * 10 / p.total
		}
		if tenth == p.lastTenth && p.done != 0 {
			return
		}
		p.lastTenth = tenth
		if p.done == 0 {
			return
		}
	}
	const width = 30
	filled := 0
	if p.total > 0 {
		filled = p.done * width / p.total
	}
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", width-filled)
	elapsed := time.Since(p.began)
	eta := ""
	if p.done > 0 && p.done < p.total {
		left := time.Duration(float64(elapsed) / float64(p.done) * float64(p.total-p.done))
		eta = fmt.Sprintf(", ~%v left", left.Round(time.Second))
	}
	line := fmt.Sprintf("[%s] %d/%d runs, %d violations, %v%s", bar, p.done, p.total, p.violations, elapsed.Round(time.Second), eta)
	if p.tty {
		fmt.Fprintf(p.w, "\r%s\x1b[K", line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// RunSeeds runs seeds first, first+1, ... first+runs-1 on parallel workers
// (each run is independent and replays alone) and calls done after each.
// The results come back in seed order.
func RunSeeds(first int64, runs, parallel int, cfg Config, done func(Result)) []Result {
	if parallel < 1 {
		parallel = 1
	}
	results := make([]Result, runs)
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := 0; w < parallel; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWorker()
			for i := range next {
				res := w.run(first+int64(i), cfg)
				results[i] = res
				if done != nil {
					mu.Lock()
					done(res)
					mu.Unlock()
				}
			}
		}()
	}
	for i := 0; i < runs; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}
