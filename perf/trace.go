package perf

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"
)

// Chrome trace layout: the whole job is one process named TraceProcess;
// each rank is one thread with tid rank+1, and the agent or launcher is
// thread 0. See the Trace Event Format ("JSON Object Format").
const (
	TraceProcess = "pmirun"
	tracePID     = 1
)

// TraceTID is the Chrome trace thread id of rank: rank+1, or 0 for the
// agent or launcher (any negative rank).
func TraceTID(rank int) int {
	if rank < 0 {
		return 0
	}
	return rank + 1
}

// traceEvent is one entry of "traceEvents". Dur is a pointer so that a
// zero-length complete event still carries "dur".
type traceEvent struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat,omitempty"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur,omitempty"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	S    string         `json:"s,omitempty"`
	Args map[string]any `json:"args,omitempty"`
}

type traceFile struct {
	TraceEvents     []traceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit"`
}

// micros converts an offset from t0 to trace microseconds.
func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// WriteChromeTrace writes every event as Chrome trace JSON (the
// {"traceEvents": [...]} object form), which loads in Perfetto and
// chrome://tracing. Metadata comes first (process "pmirun", a thread_name
// "agent" or "rank N" per thread), then marks as thread-scoped instant
// events ("ph":"i","s":"t") and spans as complete events ("ph":"X") in time
// order, then each counter as one "ph":"C" event at the end of the trace.
// Timestamps are microseconds since t0.
func (r *Recorder) WriteChromeTrace(w io.Writer) error {
	evs := r.Events()
	counters := r.Counters()

	tids := []int{0}
	var end time.Duration
	for _, e := range evs {
		if t := TraceTID(e.Rank); !slices.Contains(tids, t) {
			tids = append(tids, t)
		}
		end = max(end, e.End())
	}
	slices.Sort(tids)

	out := make([]traceEvent, 0, 2+2*len(tids)+len(evs)+len(counters))
	out = append(out, traceEvent{
		Name: "process_name", Ph: "M", Pid: tracePID,
		Args: map[string]any{"name": TraceProcess},
	})
	for _, t := range tids {
		name := "agent"
		if t > 0 {
			name = "rank " + strconv.Itoa(t-1)
		}
		out = append(out,
			traceEvent{Name: "thread_name", Ph: "M", Pid: tracePID, Tid: t, Args: map[string]any{"name": name}},
			traceEvent{Name: "thread_sort_index", Ph: "M", Pid: tracePID, Tid: t, Args: map[string]any{"sort_index": t}},
		)
	}
	for _, e := range evs {
		te := traceEvent{Name: e.Name, Ts: micros(e.At), Pid: tracePID, Tid: TraceTID(e.Rank)}
		switch e.Kind {
		case KindSpan:
			d := micros(e.Dur)
			te.Cat, te.Ph, te.Dur = "span", "X", &d
		default:
			te.Cat, te.Ph, te.S = "phase", "i", "t"
		}
		out = append(out, te)
	}
	names := make([]string, 0, len(counters))
	for k := range counters {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		out = append(out, traceEvent{
			Name: k, Cat: "counter", Ph: "C", Ts: micros(end), Pid: tracePID,
			Args: map[string]any{"value": counters[k]},
		})
	}
	if err := json.NewEncoder(w).Encode(traceFile{TraceEvents: out, DisplayTimeUnit: "ms"}); err != nil {
		return fmt.Errorf("write chrome trace: %w", err)
	}
	return nil
}
