package harness

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Chart draws commit and restore time against sessions, log-log, one panel
// per operation and latency: for each parallelism the measured medians
// (solid) and the ideal schedule (dashed). It is a self-contained SVG.
func (r *Report) Chart() string {
	const (
		pw, ph                   = 440, 300 // panel
		left, right, top, bottom = 72, 16, 34, 46
		legendH                  = 34
	)
	ops := []struct {
		name string
		rows []CheckpointRow
	}{{OpCommit, r.Commit}, {OpRestore, r.Restore}}
	var lats []time.Duration
	var pars []int
	for _, row := range append(slices.Clone(r.Commit), r.Restore...) {
		if !slices.Contains(lats, row.Latency) {
			lats = append(lats, row.Latency)
		}
		if !slices.Contains(pars, row.Parallelism) {
			pars = append(pars, row.Parallelism)
		}
	}
	slices.Sort(pars)
	slices.SortFunc(lats, func(a, b time.Duration) int { return int(b - a) }) // largest first
	colors := []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"}

	const footH = 22
	w, h := pw*len(ops), legendH+ph*len(lats)+footH
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	// Legend.
	x := 12
	for i, p := range pars {
		c := colors[i%len(colors)]
		fmt.Fprintf(&b, `<line x1="%d" y1="16" x2="%d" y2="16" stroke="%s" stroke-width="2"/><text x="%d" y="20">P=%d</text>`+"\n", x, x+24, c, x+28, p)
		x += 80
	}
	fmt.Fprintf(&b, `<text x="%d" y="20">solid: measured (median) · dashed: ideal ⌈N/P⌉·L + index transaction alone · hollow: flagged</text>`+"\n", x+10)
	m := r.Machine
	fmt.Fprintf(&b, `<text x="12" y="%d" fill="#444">%s</text>`+"\n", h-8, xmlEscape(fmt.Sprintf("%s, %d cores, %s · %s · commit %s · load average %s → %s · go run ./bench (%s)",
		m.CPU, m.Cores, m.GoVersion, m.Date.Format("2006-01-02 15:04 UTC"), m.Commit, m.LoadStart, m.LoadEnd, r.Mode)))

	for li, lat := range lats {
		for oi, op := range ops {
			ox, oy := oi*pw, legendH+li*ph
			var rows []CheckpointRow
			for _, row := range op.rows {
				if row.Latency == lat && row.Measured > 0 {
					rows = append(rows, row)
				}
			}
			b.WriteString(panel(ox, oy, pw, ph, left, right, top, bottom, fmt.Sprintf("%s, L = %s", op.name, fmtDur(lat)), rows, pars, colors))
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// panel draws one log-log panel at (ox, oy).
func panel(ox, oy, pw, ph, left, right, top, bottom int, title string, rows []CheckpointRow, pars []int, colors []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `<text x="%d" y="%d" font-size="13" font-weight="bold">%s</text>`+"\n", ox+left, oy+top-12, title)
	if len(rows) == 0 {
		return b.String()
	}
	nlo, nhi := math.Inf(1), math.Inf(-1)
	tlo, thi := math.Inf(1), math.Inf(-1)
	for _, r := range rows {
		n := math.Log10(float64(r.Sessions))
		nlo, nhi = math.Min(nlo, n), math.Max(nhi, n)
		for _, d := range []time.Duration{r.Measured, r.Ideal()} {
			if d > 0 {
				t := math.Log10(d.Seconds())
				tlo, thi = math.Min(tlo, t), math.Max(thi, t)
			}
		}
	}
	nlo, nhi = math.Floor(nlo), math.Ceil(nhi)
	if nhi <= nlo {
		nhi = nlo + 1
	}
	tlo, thi = math.Floor(tlo), math.Ceil(thi)
	if thi <= tlo {
		thi = tlo + 1
	}
	x0, x1 := float64(ox+left), float64(ox+pw-right)
	y0, y1 := float64(oy+ph-bottom), float64(oy+top)
	px := func(n int) float64 { return x0 + (math.Log10(float64(n))-nlo)/(nhi-nlo)*(x1-x0) }
	py := func(d time.Duration) float64 { return y0 + (math.Log10(d.Seconds())-tlo)/(thi-tlo)*(y1-y0) }

	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", x0, y1, x1-x0, y0-y1)
	for e := nlo; e <= nhi; e++ {
		xx := x0 + (e-nlo)/(nhi-nlo)*(x1-x0)
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#eee"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
			xx, y1, xx, y0, xx, y0+14, countLabel(math.Pow(10, e)))
	}
	for e := tlo; e <= thi; e++ {
		yy := y0 + (e-tlo)/(thi-tlo)*(y1-y0)
		fmt.Fprintf(&b, `<line x1="%.0f" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			x0, yy, x1, yy, x0-4, yy+4, decadeLabel(e))
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">sessions N (log scale)</text>`+"\n", (x0+x1)/2, y0+32)
	fmt.Fprintf(&b, `<text x="%d" y="%.0f" text-anchor="middle" transform="rotate(-90 %d %.0f)">wall time of the operation (log scale)</text>`+"\n", ox+14, (y0+y1)/2, ox+14, (y0+y1)/2)
	for i, p := range pars {
		c := colors[i%len(colors)]
		var meas, ideal []string
		for _, r := range rows {
			if r.Parallelism != p {
				continue
			}
			pt := fmt.Sprintf("%.1f,%.1f", px(r.Sessions), py(r.Measured))
			meas = append(meas, pt)
			if r.Ideal() > 0 {
				ideal = append(ideal, fmt.Sprintf("%.1f,%.1f", px(r.Sessions), py(r.Ideal())))
			}
			xy := strings.Split(pt, ",")
			fill := c
			if r.Flag() != "" {
				fill = "white"
			}
			fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3" fill="%s" stroke="%s"/>`+"\n", xy[0], xy[1], fill, c)
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(meas, " "))
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5" stroke-dasharray="5,4" points="%s"/>`+"\n", c, strings.Join(ideal, " "))
	}
	return b.String()
}

// decadeLabel names 10^e seconds: 1µs … 100s.
func decadeLabel(e float64) string {
	units := []struct {
		exp  float64
		name string
	}{{0, "s"}, {-3, "ms"}, {-6, "µs"}, {-9, "ns"}}
	for _, u := range units {
		if e >= u.exp {
			return fmt.Sprintf("%.0f%s", math.Pow(10, e-u.exp), u.name)
		}
	}
	return fmt.Sprintf("1e%.0fs", e)
}

func countLabel(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.0fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// xmlEscape makes s safe as SVG text.
func xmlEscape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
