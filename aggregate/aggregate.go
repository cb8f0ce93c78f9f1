// Package aggregate computes a resources server's /aggregate_metrics answer
// from verify responses, as NeMo Gym's reward profiler does: the responses
// are grouped by their task index, and for the reward and every other
// numeric field (bools count as 0 and 1, the response's usage counts are
// lifted to the top) it gives the mean, max, min, median and sample
// standard deviation over all responses and per task.
package aggregate

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sort"
)

// Keys of a verify response that are not metrics.
const (
	TaskIndexKey    = "_ng_task_index"
	RolloutIndexKey = "_ng_rollout_index"
)

// Request is the /aggregate_metrics body.
type Request struct {
	VerifyResponses []map[string]any `json:"verify_responses"`
}

// Metrics is the /aggregate_metrics answer.
type Metrics struct {
	// GroupLevelMetrics has one entry per task, by ascending task index,
	// each with its _ng_task_index.
	GroupLevelMetrics []map[string]any `json:"group_level_metrics"`
	// AgentMetrics are over all responses.
	AgentMetrics map[string]any `json:"agent_metrics"`
	// KeyMetrics are AgentMetrics' mean/ entries.
	KeyMetrics map[string]any `json:"key_metrics"`
}

// Compute aggregates verify responses. A task index that is not an
// integer is an error; a response without one is task 0.
func Compute(responses []map[string]any) (Metrics, error) {
	m := Metrics{GroupLevelMetrics: []map[string]any{}, AgentMetrics: map[string]any{}, KeyMetrics: map[string]any{}}
	if len(responses) == 0 {
		return m, nil
	}
	rows := make([]map[string]float64, len(responses))
	columns := map[string]bool{}
	groups := map[int64][]int{}
	for i, r := range responses {
		task, err := taskIndex(r[TaskIndexKey])
		if err != nil {
			return Metrics{}, fmt.Errorf("verify_responses[%d].%s: %w", i, TaskIndexKey, err)
		}
		groups[task] = append(groups[task], i)
		rows[i] = numericFields(r)
		for k := range rows[i] {
			columns[k] = true
		}
	}
	cols := make([]string, 0, len(columns))
	for c := range columns {
		cols = append(cols, c)
	}
	sort.Strings(cols)

	all := make([]int, len(rows))
	for i := range all {
		all[i] = i
	}
	m.AgentMetrics = describe(rows, all, cols)
	for k, v := range m.AgentMetrics {
		if len(k) > 5 && k[:5] == "mean/" {
			m.KeyMetrics[k] = v
		}
	}
	tasks := make([]int64, 0, len(groups))
	for t := range groups {
		tasks = append(tasks, t)
	}
	slices.Sort(tasks)
	for _, t := range tasks {
		g := describe(rows, groups[t], cols)
		g[TaskIndexKey] = t
		m.GroupLevelMetrics = append(m.GroupLevelMetrics, g)
	}
	return m, nil
}

func taskIndex(v any) (int64, error) {
	switch x := v.(type) {
	case nil:
		return 0, nil
	case float64:
		if x != math.Trunc(x) || math.IsInf(x, 0) {
			return 0, fmt.Errorf("want an integer, got %v", x)
		}
		return int64(x), nil
	case json.Number:
		n, err := x.Int64()
		if err != nil {
			return 0, fmt.Errorf("want an integer, got %s", x)
		}
		return n, nil
	}
	return 0, fmt.Errorf("want an integer, got %T", v)
}

// numericFields are a response's metric values: its numbers and bools, and
// those of response.usage (which win, as in Gym), without the indexes.
func numericFields(r map[string]any) map[string]float64 {
	out := map[string]float64{}
	add := func(m map[string]any) {
		for k, v := range m {
			if k == TaskIndexKey || k == RolloutIndexKey {
				continue
			}
			if f, ok := number(v); ok {
				out[k] = f
			} else {
				delete(out, k)
			}
		}
	}
	add(r)
	if resp, ok := r["response"].(map[string]any); ok {
		if usage, ok := resp["usage"].(map[string]any); ok {
			add(usage)
		}
	}
	return out
}

func number(v any) (float64, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return 1, true
		}
		return 0, true
	case float64:
		return x, !math.IsNaN(x)
	case json.Number:
		f, err := x.Float64()
		return f, err == nil && !math.IsNaN(f)
	}
	return 0, false
}

// describe gives the statistics of cols over the rows at idx, as "stat/col"
// keys; a column with no value in these rows has none. A standard deviation
// needs two values; when no column has one, a column with a value in every
// row gets 0 (a single rollout varies by nothing), as Gym does.
func describe(rows []map[string]float64, idx []int, cols []string) map[string]any {
	out := map[string]any{}
	stdSeen := false
	var complete []string
	for _, c := range cols {
		vals := make([]float64, 0, len(idx))
		for _, i := range idx {
			if v, ok := rows[i][c]; ok {
				vals = append(vals, v)
			}
		}
		if len(vals) == len(idx) {
			complete = append(complete, c)
		}
		if len(vals) == 0 {
			continue
		}
		slices.Sort(vals)
		sum := 0.0
		for _, v := range vals {
			sum += v
		}
		n := float64(len(vals))
		mean := sum / n
		median := vals[len(vals)/2]
		if len(vals)%2 == 0 {
			median = (vals[len(vals)/2-1] + vals[len(vals)/2]) / 2
		}
		out["mean/"+c] = mean
		out["max/"+c] = vals[len(vals)-1]
		out["min/"+c] = vals[0]
		out["median/"+c] = median
		if len(vals) >= 2 {
			ss := 0.0
			for _, v := range vals {
				ss += (v - mean) * (v - mean)
			}
			out["std/"+c] = math.Sqrt(ss / (n - 1))
			stdSeen = true
		}
	}
	if !stdSeen {
		for _, c := range complete {
			out["std/"+c] = 0.0
		}
	}
	return out
}
