package swebench

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/sandboxowner/owner/provider"
)

// PrepareReport is what preparing one instance ahead of time gave.
type PrepareReport struct {
	InstanceID string `json:"instance_id"`
	// Environment is "ok", "failed" (its step failed), "image" (the row's
	// image, no template) or "error" (it could not be attempted).
	Environment string `json:"environment"`
	// Validation is "available", "unavailable", "off" or "-" (not run).
	Validation string  `json:"validation"`
	Seconds    float64 `json:"seconds"`
	Reason     string  `json:"reason,omitempty"`
}

// Ready reports whether the instance can be lent and graded.
func (r PrepareReport) Ready() bool {
	return r.Environment != "error" && r.Environment != "failed" && r.Validation != "unavailable"
}

// reportOf summarises a preparation.
func reportOf(id string, r readiness, err error, took time.Duration) PrepareReport {
	rep := PrepareReport{InstanceID: id, Environment: "image", Validation: "-", Seconds: seconds1(took)}
	switch {
	case err != nil:
		rep.Environment, rep.Reason = "error", err.Error()
		return rep
	case r.env != nil && !r.env.OK:
		rep.Environment, rep.Reason = "failed", r.env.Reason
		return rep
	case r.env != nil:
		rep.Environment = "ok"
	}
	switch {
	case r.validation == nil:
		rep.Validation = "off"
	case r.validation.Available:
		rep.Validation = "available"
	default:
		rep.Validation, rep.Reason = "unavailable", r.validation.Reason
	}
	return rep
}

// PrepareAll builds the template and environment of every row and
// validates it, as the first seed of each would, at most parallel at once
// (and the validations within max_concurrent_gradings). done, if not nil,
// is called after each instance, one call at a time. The reports are in
// the rows' order.
func (s *Server) PrepareAll(ctx context.Context, p provider.Provider, rows []Row, parallel int, done func(PrepareReport)) []PrepareReport {
	parallel = max(1, parallel)
	out := make([]PrepareReport, len(rows))
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, row := range rows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				out[i] = PrepareReport{InstanceID: row.InstanceID, Environment: "error", Validation: "-", Reason: ctx.Err().Error()}
				return
			}
			defer func() { <-sem }()
			began := time.Now()
			log := s.log.WithField("instance_id", row.InstanceID)
			r, err := s.prepare(ctx, p, row, log)
			rep := reportOf(row.InstanceID, r, err, time.Since(began))
			mu.Lock()
			out[i] = rep
			if done != nil {
				done(rep)
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// FormatPrepareTable is the table `server swebench prepare` prints.
func FormatPrepareTable(reps []PrepareReport) string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "INSTANCE\tENVIRONMENT\tVALIDATION\tSECONDS\tREASON")
	for _, r := range reps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%s\n", r.InstanceID, r.Environment, r.Validation, r.Seconds, oneLine(r.Reason, 160))
	}
	_ = tw.Flush()
	return b.String()
}

// ProgressBar draws n of total done in width cells: "[=====>    ] 3/10".
func ProgressBar(n, total, width int) string {
	if total <= 0 || width <= 0 {
		return fmt.Sprintf("%d/%d", n, total)
	}
	n = min(max(n, 0), total)
	filled := n * width / total
	bar := strings.Repeat("=", filled)
	if filled < width {
		bar += ">" + strings.Repeat(" ", width-filled-1)
	}
	return fmt.Sprintf("[%s] %d/%d", bar, n, total)
}

// oneLine makes s one line of at most n bytes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = strings.ToValidUTF8(s[:n], "") + "…"
	}
	return s
}
