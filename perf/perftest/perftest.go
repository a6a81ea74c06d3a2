// Package perftest checks Chrome trace files (the Trace Event Format's
// JSON object form, as perf.Recorder.WriteChromeTrace writes them) for
// tests: every event well-formed, timestamps in order on every track,
// slices nested on every track. It is imported by tests only.
package perftest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
)

// Event is one decoded trace event.
type Event struct {
	Name string         `json:"name"`
	Cat  string         `json:"cat"`
	Ph   string         `json:"ph"`
	Ts   float64        `json:"ts"`
	Dur  *float64       `json:"dur"`
	Pid  int            `json:"pid"`
	Tid  int            `json:"tid"`
	S    string         `json:"s"`
	Args map[string]any `json:"args"`
}

// End is Ts+Dur for a complete event, Ts otherwise.
func (e Event) End() float64 {
	if e.Dur == nil {
		return e.Ts
	}
	return e.Ts + *e.Dur
}

// Track is one thread of one process.
type Track struct{ Pid, Tid int }

// Trace is a checked trace.
type Trace struct {
	Events    []Event // every event but metadata, in file order
	Processes map[int]string
	Threads   map[Track]string
	Labels    map[int]map[string]any // process_labels args by pid
}

// On returns the events of one track, in file order.
func (t *Trace) On(pid, tid int) []Event {
	var out []Event
	for _, e := range t.Events {
		if e.Pid == pid && e.Tid == tid && e.Ph != "C" {
			out = append(out, e)
		}
	}
	return out
}

// Named returns the events named name, in file order.
func (t *Trace) Named(name string) []Event {
	var out []Event
	for _, e := range t.Events {
		if e.Name == name {
			out = append(out, e)
		}
	}
	return out
}

// slack is how far (in trace microseconds: a nanosecond) an end may pass
// the next start or the end of its parent: timestamps and durations are
// floats, and their sums round.
const slack = 1e-3

// Check decodes data and checks it against the Trace Event Format:
// a {"traceEvents": [...]} object; every event with a name, a known phase
// type, integer pid and tid and a finite timestamp; complete events ("X")
// with a duration >= 0; instants with scope g, p or t; counters with
// numeric arguments; metadata of a known kind with its argument; on every
// track (pid, tid) timestamps that never go back, slices that nest
// (a slice ends no later than the slice holding it), begin/end pairs
// that match; every track and process used named by metadata.
func Check(data []byte) (*Trace, error) {
	var raw struct {
		TraceEvents []json.RawMessage `json:"traceEvents"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("trace is not a JSON object: %w", err)
	}
	if raw.TraceEvents == nil {
		return nil, errors.New("trace has no traceEvents array")
	}
	t := &Trace{Processes: map[int]string{}, Threads: map[Track]string{}, Labels: map[int]map[string]any{}}
	last := map[Track]float64{}
	counterLast := map[string]float64{}
	open := map[Track][]Event{} // X slices open on each track, innermost last
	begun := map[Track][]string{}
	for i, rm := range raw.TraceEvents {
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(rm, &fields); err != nil {
			return nil, fmt.Errorf("event %d is not an object: %w", i, err)
		}
		for _, k := range []string{"name", "ph", "pid"} {
			if _, ok := fields[k]; !ok {
				return nil, fmt.Errorf("event %d (%s) has no %q", i, rm, k)
			}
		}
		var e Event
		if err := json.Unmarshal(rm, &e); err != nil {
			return nil, fmt.Errorf("event %d (%s): %w", i, rm, err)
		}
		if e.Name == "" {
			return nil, fmt.Errorf("event %d (%s): empty name", i, rm)
		}
		if math.IsNaN(e.Ts) || math.IsInf(e.Ts, 0) {
			return nil, fmt.Errorf("event %d (%s): bad ts", i, rm)
		}
		tr := Track{e.Pid, e.Tid}
		switch e.Ph {
		case "M":
			if e.Args == nil {
				return nil, fmt.Errorf("metadata event %d (%s) has no args", i, rm)
			}
			switch e.Name {
			case "process_name":
				name, ok := e.Args["name"].(string)
				if !ok || name == "" {
					return nil, fmt.Errorf("metadata event %d (%s): no name", i, rm)
				}
				t.Processes[e.Pid] = name
			case "thread_name":
				name, ok := e.Args["name"].(string)
				if !ok || name == "" {
					return nil, fmt.Errorf("metadata event %d (%s): no name", i, rm)
				}
				t.Threads[tr] = name
			case "process_sort_index", "thread_sort_index":
				if _, ok := e.Args["sort_index"].(float64); !ok {
					return nil, fmt.Errorf("metadata event %d (%s): no sort_index", i, rm)
				}
			case "process_labels":
				if _, ok := e.Args["labels"].(string); !ok {
					return nil, fmt.Errorf("metadata event %d (%s): no labels", i, rm)
				}
				t.Labels[e.Pid] = e.Args
			default:
				return nil, fmt.Errorf("metadata event %d (%s): unknown kind", i, rm)
			}
			continue
		case "C":
			if len(e.Args) == 0 {
				return nil, fmt.Errorf("counter event %d (%s) has no values", i, rm)
			}
			for k, v := range e.Args {
				if _, ok := v.(float64); !ok {
					return nil, fmt.Errorf("counter event %d (%s): %s is not a number", i, rm, k)
				}
			}
			key := fmt.Sprint(e.Pid, "/", e.Name)
			if p, ok := counterLast[key]; ok && e.Ts < p {
				return nil, fmt.Errorf("counter event %d (%s) at %v goes back from %v", i, rm, e.Ts, p)
			}
			counterLast[key] = e.Ts
			t.Events = append(t.Events, e)
			continue
		case "X", "i", "I", "B", "E":
		default:
			return nil, fmt.Errorf("event %d (%s): unknown phase type %q", i, rm, e.Ph)
		}
		if _, ok := fields["tid"]; !ok {
			return nil, fmt.Errorf("event %d (%s) has no tid", i, rm)
		}
		if _, ok := fields["ts"]; !ok {
			return nil, fmt.Errorf("event %d (%s) has no ts", i, rm)
		}
		if p, ok := last[tr]; ok && e.Ts < p {
			return nil, fmt.Errorf("event %d (%s) at %v goes back on track %v from %v", i, rm, e.Ts, tr, p)
		}
		last[tr] = e.Ts
		stack := open[tr]
		for len(stack) > 0 && stack[len(stack)-1].End() <= e.Ts+slack {
			stack = stack[:len(stack)-1]
		}
		switch e.Ph {
		case "X":
			if e.Dur == nil || *e.Dur < 0 || math.IsNaN(*e.Dur) {
				return nil, fmt.Errorf("complete event %d (%s): want dur >= 0", i, rm)
			}
			if n := len(stack); n > 0 && e.End() > stack[n-1].End()+slack {
				p := stack[n-1]
				return nil, fmt.Errorf("slice %q [%v, %v] on track %v overlaps the end of %q [%v, %v]",
					e.Name, e.Ts, e.End(), tr, p.Name, p.Ts, p.End())
			}
			stack = append(stack, e)
		case "i", "I":
			if e.S != "" && e.S != "g" && e.S != "p" && e.S != "t" {
				return nil, fmt.Errorf("instant event %d (%s): bad scope %q", i, rm, e.S)
			}
		case "B":
			begun[tr] = append(begun[tr], e.Name)
		case "E":
			b := begun[tr]
			if len(b) == 0 {
				return nil, fmt.Errorf("end event %d (%s) without a begin on track %v", i, rm, tr)
			}
			begun[tr] = b[:len(b)-1]
		}
		open[tr] = stack
		t.Events = append(t.Events, e)
	}
	for tr, b := range begun {
		if len(b) > 0 {
			return nil, fmt.Errorf("track %v: %d begin events never end", tr, len(b))
		}
	}
	for tr := range last {
		if _, ok := t.Threads[tr]; !ok {
			return nil, fmt.Errorf("track %v has no thread_name", tr)
		}
		if _, ok := t.Processes[tr.Pid]; !ok {
			return nil, fmt.Errorf("process %d has no process_name", tr.Pid)
		}
	}
	return t, nil
}
