package harness

import "fmt"

// A figure measured on a noisy machine is only worth printing when the
// repetitions agree and the result is possible. These bounds decide when a
// cell is flagged instead.
const (
	// MaxSpread is the largest (slowest − fastest)/fastest over a cell's
	// repetitions whose median is still reported as a figure.
	MaxSpread = 0.5
	// MaxBareDrift is the largest change of the bare handler's throughput
	// between its run before and its run after the server's, for an HTTP
	// cell whose ratio is reported: a larger one means the machine changed
	// under the cell.
	MaxBareDrift = 0.25
	// MaxHTTPRatio is the largest server/bare throughput ratio taken as
	// real: the server does all the bare handler does and more.
	MaxHTTPRatio = 1.10
)

// Spread is (Worst − Best)/Best over the cell's repetitions (0 with one).
func (r CheckpointRow) Spread() float64 {
	if r.Reps < 2 || r.Best <= 0 {
		return 0
	}
	return float64(r.Worst-r.Best) / float64(r.Best)
}

// Flag says why the row's figures are not to be trusted ("" when they
// are): the cell failed, its repetitions disagree by more than MaxSpread,
// or it beat the ideal schedule, which no run can (the machine's noise or
// the index measurement went wrong).
func (r CheckpointRow) Flag() string {
	switch {
	case r.Err != "":
		return "failed: " + r.Err
	case r.Spread() > MaxSpread:
		return fmt.Sprintf("spread %.0f%% between reps", r.Spread()*100) + rerun(r.Reruns)
	case r.Ideal() > 0 && r.Ratio() < 1:
		return fmt.Sprintf("impossible: %.3f of the ideal", r.Ratio()) + rerun(r.Reruns)
	}
	return ""
}

// rerun says that a flag held when its cell was measured again.
func rerun(n int) string {
	if n == 0 {
		return ""
	}
	return ", again when rerun"
}

// Drift is how much the bare handler's throughput moved between its runs
// before and after the server's, relative to the first (0 without a second
// run).
func (r HTTPRow) Drift() float64 {
	a, b := r.Bare.RPS(), r.BareAfter.RPS()
	if a <= 0 || b <= 0 {
		return 0
	}
	d := (b - a) / a
	return max(d, -d)
}

// Flag says why the row's ratio is not to be trusted ("" when it is): the
// cell failed, the server answered errors, the machine changed under the
// cell (the bare handler's two runs disagree), or the server beat the bare
// handler.
func (r HTTPRow) Flag() string {
	switch {
	case r.Err != "":
		return "failed: " + r.Err
	case r.Server.Errors > 0:
		return fmt.Sprintf("%d errors (first: %.120s)", r.Server.Errors, r.Server.FirstError)
	case r.Drift() > MaxBareDrift:
		return fmt.Sprintf("bare moved %.0f%% during the cell", r.Drift()*100) + rerun(r.Reruns)
	case r.Ratio() > MaxHTTPRatio:
		return fmt.Sprintf("impossible: %.0f%% of bare", r.Ratio()*100) + rerun(r.Reruns)
	}
	return ""
}

// Noisy reports a cell flagged for the machine's noise (its bare runs
// disagree, or it beat bare), not for a failure or errors: one a second
// measure may clear.
func (r HTTPRow) Noisy() bool {
	return r.Err == "" && r.Server.Errors == 0 && r.Flag() != ""
}

// failedRow is a checkpoint cell that could not be measured.
func failedRow(base CheckpointRow, err error) CheckpointRow {
	base.Err = oneLine(err.Error())
	base.Load = LoadAverage()
	return base
}

// oneLine keeps an error readable in a table cell.
func oneLine(s string) string {
	out := make([]rune, 0, len(s))
	for _, c := range s {
		switch c {
		case '\n', '\r', '\t':
			c = ' '
		case '|':
			c = '/'
		}
		out = append(out, c)
	}
	if len(out) > 300 {
		out = append(out[:300], '…')
	}
	return string(out)
}
