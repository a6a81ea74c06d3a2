package perf

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"time"
)

// Chrome trace layout (the Trace Event Format's "JSON Object Format"):
// every node is one process and every rank one thread of its node's
// process, so Perfetto shows one track per rank grouped by node, and one
// track for each node's agent:
//
//   - pid TracePID(node): 1 for pmirun's root (LauncherNode), node+2 for
//     node node; named "pmirun" and "node N" (with its host and, for a
//     merged node, its clock offset and the offset's error as a label);
//     the nodes of jobs the ranks spawned (Event.Job > 0) follow, one
//     process for each node of each such job, "job J node N"
//     (spawnedPIDs);
//   - tid TraceTID(rank): 0 for the agent (or the root), rank+1 for a rank.
//
// A rank's track holds its "fork" (the agent's fork and exec of it, a
// Span named SliceFork: ranks are forked several at once) and then
// nested duration slices: "rank N" for its whole life (forked to exit),
// inside it "exec" (forked to its first PMI request),
// "PMI" (first request read to last reply written) and "exit" (last reply
// to the process reaped); inside "PMI" one slice per request named after
// its command, and inside a request that had to wait for other ranks a
// "waiting" slice (the rest of the request is the agent serving it).
// Phase marks are instants on the same tracks; counters are counter
// tracks of their node's process.
const (
	TraceProcess = "pmirun"
	tracePID     = 1
)

// TracePID is the Chrome trace process id of node: 1 for the launcher
// (LauncherNode, any negative node), node+2 otherwise.
func TracePID(node int) int {
	if node < 0 {
		return tracePID
	}
	return node + 2
}

// TraceTID is the Chrome trace thread id of rank: rank+1, or 0 for the
// agent or launcher (any negative rank).
func TraceTID(rank int) int {
	if rank < 0 {
		return 0
	}
	return rank + 1
}

// Slice names and categories of the rank tracks (see the layout above).
const (
	SliceFork    = "fork" // a Span on a rank's track: its fork, before its life
	SliceExec    = "exec"
	SlicePMI     = "PMI"
	SliceExit    = "exit"
	SliceWaiting = "waiting"
	SliceFence   = "fence" // a shared-memory rank's fence, from its marks

	CatRank    = "rank"    // derived life slices
	CatRequest = "request" // PMI requests (Request)
	CatWait    = "wait"    // the waiting part of a request
	CatSpan    = "span"    // other spans (Span, SpanArg)
	CatPhase   = "phase"   // marks
	CatCounter = "counter" // counters
)

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

	end float64 // Ts+*Dur for complete events, while nesting
}

type traceFile struct {
	TraceEvents     []traceEvent `json:"traceEvents"`
	DisplayTimeUnit string       `json:"displayTimeUnit"`
}

// micros converts an offset from t0 to trace microseconds.
func micros(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

type track struct{ pid, tid int }

// WriteChromeTrace writes every event as Chrome trace JSON (the
// {"traceEvents": [...]} object form), which loads in Perfetto and
// chrome://tracing, in the layout described at TracePID. Metadata comes
// first (process and thread names and sort order), then every slice,
// instant and counter sample in time order (a parent slice before the
// slices it holds), then each counter that has no samples as one "C" event
// at the end of the trace. Timestamps are microseconds since t0. Slices
// on one track nest: a slice that would overlap the end of the one
// holding it (stamps taken on different goroutines) is cut at that end.
// Rank marks of the launcher are left out when other nodes' events were
// merged: the nodes' own stamps of the same phases are in the trace.
func (r *Recorder) WriteChromeTrace(w io.Writer) error {
	evs := r.Events()
	counters := r.Counters()
	nodes := r.Nodes()

	var end time.Duration
	tracks := map[track]bool{}
	procs := map[int]procKey{}
	spawned := spawnedPIDs(evs, nodes)
	sampled := map[string]bool{}
	var body []traceEvent
	type life struct {
		forked, exit, first, last time.Duration
		hasFork, hasExit, hasReq  bool
		spans                     bool            // request spans seen (text protocol or shared memory)
		enters, dones             []time.Duration // fence enter and done marks, in order
		fork                      int             // index in body of its fork slice, or -1
	}
	lives := map[track]*life{}
	lifeOf := func(t track) *life {
		l := lives[t]
		if l == nil {
			l = &life{fork: -1}
			lives[t] = l
		}
		return l
	}
	for _, e := range evs {
		if len(nodes) > 0 && e.Node < 0 && e.Rank >= 0 {
			continue
		}
		end = max(end, e.End())
		k := procKey{e.Job, e.Node}
		t := track{TracePID(e.Node), TraceTID(e.Rank)}
		if e.Job != 0 {
			t.pid = spawned[k]
		}
		procs[t.pid] = k
		te := traceEvent{Name: e.Name, Ts: micros(e.At), Pid: t.pid, Tid: t.tid}
		switch e.Kind {
		case KindCounter:
			sampled[e.Name] = true
			te.Cat, te.Ph, te.Tid = CatCounter, "C", 0
			te.Args = map[string]any{"value": e.Value}
			body = append(body, te)
			continue
		case KindSpan:
			tracks[t] = true
			d := micros(e.Dur)
			te.Cat, te.Ph, te.Dur = CatSpan, "X", &d
			if e.Arg != "" {
				te.Args = map[string]any{e.Arg: e.Value}
			}
			if e.Rank >= 0 && e.Name == SliceFork {
				te.Cat = CatRank
				lifeOf(t).fork = len(body)
				body = append(body, te)
				continue
			}
			if e.Rank >= 0 {
				l := lifeOf(t)
				l.spans = l.spans || e.Arg == ""
				if !l.hasReq || e.At < l.first {
					l.first = e.At
				}
				l.last = max(l.last, e.End())
				l.hasReq = true
			}
			if e.Wait > 0 || (e.Rank >= 0 && e.Arg == "") {
				te.Cat = CatRequest
			}
			body = append(body, te)
			if e.Wait > 0 {
				wd := micros(e.Wait)
				body = append(body, traceEvent{Name: SliceWaiting, Cat: CatWait, Ph: "X", Ts: te.Ts, Dur: &wd, Pid: t.pid, Tid: t.tid})
			}
		default:
			tracks[t] = true
			te.Cat, te.Ph, te.S = CatPhase, "i", "t"
			body = append(body, te)
			if e.Rank < 0 {
				continue
			}
			l := lifeOf(t)
			switch e.Name {
			case PhaseRankForked:
				l.forked, l.hasFork = e.At, true
			case PhaseRankExit:
				l.exit, l.hasExit = e.At, true
			case PhaseFirstPMI, PhaseInit, PhaseFenceEnter, PhaseFenceDone, PhaseFinalize:
				switch e.Name {
				case PhaseFenceEnter:
					l.enters = append(l.enters, e.At)
				case PhaseFenceDone:
					l.dones = append(l.dones, e.At)
				}
				if !l.hasReq || e.At < l.first {
					l.first = e.At
				}
				l.last = max(l.last, e.At)
				l.hasReq = true
			}
		}
	}
	for t, l := range lives {
		if l.hasFork && l.hasReq && l.first < l.forked {
			// The forker noticed the fork's end after the rank had
			// spoken (its thread ran late): the life starts no later
			// than its first request, and the fork ends there.
			l.forked = l.first
		}
		if l.fork >= 0 && l.hasFork {
			f := &body[l.fork]
			if d := micros(l.forked) - f.Ts; d < *f.Dur {
				d = max(d, 0)
				f.Dur = &d
			}
		}
		body = append(body, lifeSlices(t, l.forked, l.exit, l.first, l.last, l.hasFork, l.hasExit, l.hasReq)...)
		if !l.spans {
			// A rank without request spans (a recorder of marks
			// only) gets its fences from their marks: the k-th entered
			// to the k-th released (epochs complete in order), all of it
			// waiting for the other ranks.
			for i := range min(len(l.enters), len(l.dones)) {
				d := micros(max(l.dones[i]-l.enters[i], 0))
				body = append(body, traceEvent{Name: SliceFence, Cat: CatRequest, Ph: "X", Ts: micros(l.enters[i]), Dur: &d, Pid: t.pid, Tid: t.tid})
			}
		}
	}
	body = nest(body)
	for _, n := range nodes {
		// A merged node with no events still has its process and label.
		k := procKey{n.Job, n.Node}
		pid := cmp.Or(spawned[k], TracePID(n.Node))
		if _, ok := procs[pid]; !ok {
			procs[pid] = k
		}
	}

	out := make([]traceEvent, 0, 3*len(procs)+2*len(tracks)+len(body)+len(counters))
	out = append(out, metadata(procs, tracks, nodes, r.Node())...)
	out = append(out, body...)
	names := make([]string, 0, len(counters))
	for k := range counters {
		if !sampled[k] {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		out = append(out, traceEvent{
			Name: k, Cat: CatCounter, Ph: "C", Ts: micros(end), Pid: TracePID(r.Node()),
			Args: map[string]any{"value": counters[k]},
		})
	}
	if err := json.NewEncoder(w).Encode(traceFile{TraceEvents: out, DisplayTimeUnit: "ms"}); err != nil {
		return fmt.Errorf("write chrome trace: %w", err)
	}
	return nil
}

// lifeSlices are the derived slices of one rank's track: its whole life,
// and inside it exec, PMI and exit, from the marks and request spans
// seen (first request read, last reply written).
func lifeSlices(t track, forked, exit, first, last time.Duration, hasFork, hasExit, hasReq bool) []traceEvent {
	if !hasFork && !hasReq {
		return nil
	}
	start, stop := first, last
	if hasFork {
		start = forked
		if !hasReq {
			first, last = forked, forked
		}
	}
	if hasExit {
		stop = max(exit, last)
	}
	stop = max(stop, start)
	slice := func(name string, from, to time.Duration) traceEvent {
		d := micros(max(to-from, 0))
		return traceEvent{Name: name, Cat: CatRank, Ph: "X", Ts: micros(from), Dur: &d, Pid: t.pid, Tid: t.tid}
	}
	out := []traceEvent{slice("rank "+strconv.Itoa(t.tid-1), start, stop)}
	if hasFork && hasReq && first > forked {
		out = append(out, slice(SliceExec, forked, first))
	}
	if hasReq {
		out = append(out, slice(SlicePMI, first, last))
	}
	if hasExit && hasReq && exit > last {
		out = append(out, slice(SliceExit, last, exit))
	}
	return out
}

// nestSlack is a nanosecond in trace microseconds: float sums of
// timestamps and durations differ by less.
const nestSlack = 1e-3

// nest orders evs by time (a slice before those it holds: same start,
// longer first) and cuts every complete event at the end of the slice
// holding it on its track, so the slices of each track nest.
func nest(evs []traceEvent) []traceEvent {
	for i := range evs {
		if evs[i].Dur != nil {
			evs[i].end = evs[i].Ts + *evs[i].Dur
		}
	}
	slices.SortStableFunc(evs, func(a, b traceEvent) int {
		if c := cmp.Compare(a.Ts, b.Ts); c != 0 {
			return c
		}
		// At one instant: slices, longest first, then instants and samples.
		da, db := -1.0, -1.0
		if a.Dur != nil {
			da = *a.Dur
		}
		if b.Dur != nil {
			db = *b.Dur
		}
		if c := cmp.Compare(db, da); c != 0 {
			return c
		}
		// A rank's life slices hold the requests they coincide with.
		return cmp.Compare(rankFirst(a), rankFirst(b))
	})
	open := map[track][]float64{} // ends of the slices open on each track, innermost last
	for i := range evs {
		e := &evs[i]
		if e.Dur == nil {
			continue
		}
		t := track{e.Pid, e.Tid}
		stack := open[t]
		// Ends within a nanosecond of a start are the same instant:
		// microseconds as floats round.
		for len(stack) > 0 && stack[len(stack)-1] <= e.Ts+nestSlack {
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 0 && e.end > stack[len(stack)-1]+nestSlack {
			e.end = stack[len(stack)-1]
			d := e.end - e.Ts
			e.Dur = &d
		}
		open[t] = append(stack, e.end)
	}
	return evs
}

func rankFirst(e traceEvent) int {
	if e.Cat == CatRank {
		return 0
	}
	return 1
}

// lostLabel is the label of a node whose agent ended without sending its
// events (NodeInfo.Lost).
const lostLabel = "lost: no events (its agent ended without sending them)"

// procKey is a process of the trace: node node of job job of the run.
type procKey struct{ job, node int }

// spawnedPIDs numbers the processes of the nodes of spawned jobs (Job >
// 0), in job and node order, after every pid of the command line's job
// (TracePID: its node numbers and the launcher's keep their pids).
func spawnedPIDs(evs []Event, nodes []NodeInfo) map[procKey]int {
	next := tracePID + 1
	out := map[procKey]int{}
	add := func(k procKey) {
		if k.job == 0 {
			next = max(next, TracePID(k.node)+1)
		} else {
			out[k] = 0
		}
	}
	for _, e := range evs {
		add(procKey{e.Job, e.Node})
	}
	for _, n := range nodes {
		add(procKey{n.Job, n.Node})
	}
	keys := slices.SortedFunc(maps.Keys(out), func(a, b procKey) int {
		return cmp.Or(cmp.Compare(a.job, b.job), cmp.Compare(a.node, b.node))
	})
	for i, k := range keys {
		out[k] = next + i
	}
	return out
}

// metadata names and orders the processes (procs: pid to job and node)
// and threads used: "node N" for the command line's job, "job J node N"
// for the node of a job its ranks spawned.
func metadata(procs map[int]procKey, tracks map[track]bool, nodes []NodeInfo, self int) []traceEvent {
	info := map[procKey]NodeInfo{}
	for _, n := range nodes {
		info[procKey{n.Job, n.Node}] = n
	}
	if _, ok := procs[TracePID(self)]; !ok {
		procs[TracePID(self)] = procKey{node: self}
	}
	pids := slices.Sorted(maps.Keys(procs))
	var out []traceEvent
	for _, p := range pids {
		k := procs[p]
		n, merged := info[k]
		name := TraceProcess
		if p != tracePID {
			name = "node " + strconv.Itoa(k.node)
			if k.job != 0 {
				name = "job " + strconv.Itoa(k.job) + " " + name
			}
			if (p == TracePID(self) && !merged) || n.Local {
				name += " (in pmirun)"
			}
		}
		if merged && n.Host != "" {
			name += " " + n.Host
		}
		out = append(out,
			traceEvent{Name: "process_name", Ph: "M", Pid: p, Args: map[string]any{"name": name}},
			traceEvent{Name: "process_sort_index", Ph: "M", Pid: p, Args: map[string]any{"sort_index": p}},
		)
		if merged && n.Lost {
			out = append(out, traceEvent{Name: "process_labels", Ph: "M", Pid: p, Args: map[string]any{"labels": lostLabel}})
		}
		if merged && !n.Local && !n.Lost {
			label := fmt.Sprintf("clock %+.3fms ±%.3fms", float64(n.Offset)/1e6, float64(n.Err)/1e6)
			args := map[string]any{"clock_offset_us": micros(n.Offset), "clock_err_us": micros(n.Err)}
			if n.HasTrue {
				label += fmt.Sprintf(" (same clock: %+.3fms)", float64(n.True)/1e6)
				args["clock_true_us"] = micros(n.True)
			}
			if n.Dropped > 0 {
				label += fmt.Sprintf(", %d events dropped", n.Dropped)
			}
			args["labels"] = label
			out = append(out, traceEvent{Name: "process_labels", Ph: "M", Pid: p, Args: args})
		}
	}
	ts := slices.SortedFunc(maps.Keys(tracks), func(a, b track) int {
		if c := cmp.Compare(a.pid, b.pid); c != 0 {
			return c
		}
		return cmp.Compare(a.tid, b.tid)
	})
	for _, t := range ts {
		name := "agent"
		switch {
		case t.tid > 0:
			name = "rank " + strconv.Itoa(t.tid-1)
		case t.pid == tracePID:
			name = "root"
		}
		out = append(out,
			traceEvent{Name: "thread_name", Ph: "M", Pid: t.pid, Tid: t.tid, Args: map[string]any{"name": name}},
			traceEvent{Name: "thread_sort_index", Ph: "M", Pid: t.pid, Tid: t.tid, Args: map[string]any{"sort_index": t.tid}},
		)
	}
	return out
}
