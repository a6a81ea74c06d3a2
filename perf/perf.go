// Package perf records where the time of one job goes.
//
// Model: a Recorder belongs to one job. It is created when the launcher (or
// an agent) starts and fixes t0, the origin of every timestamp, on the
// monotonic clock. While the job runs, the launcher and the agent stamp
// phases on it: instant marks (a rank forked, its first PMI command, a fence
// done), spans (an interval seen by one rank, such as a fence from entry to
// release) and counters (messages, bytes). Every stamp is stored as an
// offset from t0, so wall-clock steps never distort the trace.
//
// Recording is cheap enough for hot paths: one mutex and one append, no
// allocation beyond amortised storage growth (one fixed-size chunk per 512
// events, never a copy of what is already recorded), no logging. All
// methods are safe for concurrent use, and all are no-ops (or return zero
// values) on a nil *Recorder, so "no recorder" needs no branches at call
// sites.
//
// A Recorder made with NewTracer also keeps what a trace needs and a
// report does not: per-request spans (Request), spans with an argument
// (SpanArg) and every change of a counter as a sample, so counters become
// tracks. Tracing is fixed at construction; callers ask Tracing before they
// read a clock for a trace-only stamp, so a job without --trace pays one
// branch per request and allocates nothing for it.
//
// Every stamp carries the node whose process recorded it (the Recorder's
// node; LauncherNode for pmirun's root in a multi-node job). At the end of
// a multi-node job each agent's events are sent to the root, which adds
// them with Merge, shifted by the clock offset estimated over the control
// link (ClockSample), so one trace shows the whole job.
//
// When the job is over the owner reads the stamps back: Events for a sorted
// copy, WriteChromeTrace for a trace that loads in Perfetto or
// chrome://tracing, Summary for the start-up numbers a human wants first.
// The Recorder keeps every stamp until it is dropped; it has no Close.
//
// The package also holds the small statistics helpers the benchmarks share
// (Median, Percentile, Describe, MarkdownTable).
package perf

import (
	"slices"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Phase names stamped by the agent and the launcher.
const (
	PhaseAgentReady = "agent ready"       // agent (rank -1) is serving
	PhaseRankForked = "rank forked"       // launcher started the rank's process
	PhaseFirstPMI   = "first PMI command" // agent read the rank's first command
	PhaseInit       = "PMI init"          // rank completed PMI init
	PhaseFenceEnter = "fence enter"       // rank entered a fence
	PhaseFenceDone  = "fence done"        // rank was released from a fence
	// PhaseAllgatherDone: an allgather completed (rank -1: one stamp per
	// allgather, by the agent of a one-node job or by the root; PMIx
	// fences travel as allgathers).
	PhaseAllgatherDone = "allgather done"
	PhaseFinalize      = "finalize"  // rank called PMI finalize
	PhaseRankExit      = "rank exit" // launcher reaped the rank's process
)

// LauncherNode is the node of stamps made by pmirun's root in a
// multi-node job (it has no ranks of its own).
const LauncherNode = -1

// AgentRank is the rank of stamps made by the agent or the launcher itself
// rather than on behalf of one rank. Any negative rank is treated the same.
const AgentRank = -1

// Kind says what an Event is.
type Kind uint8

// Event kinds.
const (
	KindMark Kind = iota // an instant
	KindSpan             // an interval of length Dur starting at At
	// KindCounter is a counter's value (Value) after a change at At
	// (tracers only).
	KindCounter
)

func (k Kind) String() string {
	switch k {
	case KindMark:
		return "mark"
	case KindSpan:
		return "span"
	case KindCounter:
		return "counter"
	}
	return "unknown"
}

// Event is one stamp. At is the offset from the recorder's t0 (negative if
// the stamp predates t0); Dur is zero for marks.
type Event struct {
	Kind Kind   `json:"k"`
	Name string `json:"n"`
	Node int    `json:"d"` // the node whose process stamped it; LauncherNode for the root
	// Job is the job of the run the event is of: 0 for the command
	// line's, Spec.Jobno for one its ranks spawned (set by Merge).
	Job  int           `json:"j,omitempty"`
	Rank int           `json:"r"` // AgentRank (-1) for the agent or launcher
	At   time.Duration `json:"t"`
	Dur  time.Duration `json:"u,omitempty"`
	// Wait, for a request span (Request), is how long of Dur the request
	// waited for other ranks or nodes before its answer was ready; the
	// rest is serving it (encoding and writing the reply).
	Wait time.Duration `json:"w,omitempty"`
	// Value is a counter sample's value (KindCounter) or a span's
	// argument (SpanArg: a rank forked, bytes compressed).
	Value int64 `json:"v,omitempty"`
	// Arg names Value in a span's trace arguments ("" = none).
	Arg string `json:"a,omitempty"`
}

// End is the offset of the end of the event (At for marks).
func (e Event) End() time.Duration { return e.At + e.Dur }

// chunkEvents is the capacity of one chunk of event storage. Events are
// stored in fixed-size chunks rather than one growing slice so that an
// append never copies (or makes the GC rescan) what is already recorded.
const chunkEvents = 512

// Recorder collects monotonic phase stamps for one job. Safe for concurrent
// use; cheap (a mutex and an append; no allocation beyond amortised storage
// growth; no logging). The zero value is not usable: call NewRecorder.
type Recorder struct {
	t0      time.Time // immutable after NewRecorder; carries the monotonic reading
	node    int       // immutable: stamped on every event
	tracing bool      // immutable: keep request spans and counter samples

	// t0Mono is t0 on CLOCK_MONOTONIC (0 if unknown), immutable: on one
	// machine it gives the true offset between two recorders, which
	// tests compare with the estimate (ClockSample).
	t0Mono int64

	mu sync.Mutex
	// guarded by mu
	chunks   [][]Event        // in arrival order, not time order; only the last chunk has room
	nevents  int              // events in all chunks
	counters map[string]int64 // name -> value
	nodes    []NodeInfo       // merged nodes, in Merge order
}

// NewRecorder returns a Recorder of node 0 whose t0 is now, for reports
// (no request spans, no counter samples).
func NewRecorder() *Recorder { return newRecorder(0, false) }

// NewTracer returns a Recorder of node whose t0 is now and that keeps
// what a trace needs: request spans, spans with arguments, counter
// samples (see Tracing).
func NewTracer(node int) *Recorder { return newRecorder(node, true) }

// NewRecorderFor is NewTracer(node) if trace, else a report-only
// Recorder of node.
func NewRecorderFor(node int, trace bool) *Recorder { return newRecorder(node, trace) }

func newRecorder(node int, trace bool) *Recorder {
	r := &Recorder{
		node:     node,
		tracing:  trace,
		chunks:   [][]Event{make([]Event, 0, chunkEvents)},
		counters: make(map[string]int64),
	}
	// t0 between two readings of CLOCK_MONOTONIC: their middle is t0 there
	// to within half their distance (a few hundred nanoseconds).
	m1, err := monotonicNanos()
	r.t0 = time.Now()
	m2, _ := monotonicNanos()
	if err == nil {
		r.t0Mono = m1 + (m2-m1)/2
	}
	return r
}

// Tracing reports whether r keeps trace-only stamps. Call sites test it
// before reading a clock for one.
func (r *Recorder) Tracing() bool { return r != nil && r.tracing }

// Node is the node r stamps on its events.
func (r *Recorder) Node() int {
	if r == nil {
		return 0
	}
	return r.node
}

// Since is the offset of now from t0 (the clock a ClockSample reads).
func (r *Recorder) Since() time.Duration {
	if r == nil {
		return 0
	}
	return time.Since(r.t0)
}

// MonoStart is t0 on CLOCK_MONOTONIC in nanoseconds, or 0 if unknown.
func (r *Recorder) MonoStart() int64 {
	if r == nil {
		return 0
	}
	return r.t0Mono
}

// Start returns t0, the origin of every timestamp.
func (r *Recorder) Start() time.Time {
	if r == nil {
		return time.Time{}
	}
	return r.t0
}

// Mark stamps an instant event named phase for rank at the current time.
// Use AgentRank (-1) for the agent or launcher.
func (r *Recorder) Mark(phase string, rank int) {
	if r == nil {
		return
	}
	r.MarkAt(phase, rank, time.Now())
}

// MarkAt stamps an instant event named phase for rank at t. t should come
// from time.Now in this process so that it carries a monotonic reading.
func (r *Recorder) MarkAt(phase string, rank int, t time.Time) {
	if r == nil {
		return
	}
	at := t.Sub(r.t0)
	r.mu.Lock()
	r.appendLocked(Event{Kind: KindMark, Name: phase, Node: r.node, Rank: rank, At: at})
	r.mu.Unlock()
}

// appendLocked stores e; r.mu must be held.
func (r *Recorder) appendLocked(e Event) {
	last := &r.chunks[len(r.chunks)-1]
	if len(*last) == cap(*last) {
		r.chunks = append(r.chunks, make([]Event, 0, chunkEvents))
		last = &r.chunks[len(r.chunks)-1]
	}
	*last = append(*last, e)
	r.nevents++
}

// Span records a duration event named name for rank from start to end
// (for example one fence as seen by one rank). An end before start is
// recorded as a zero-length span at start.
func (r *Recorder) Span(name string, rank int, start, end time.Time) {
	if r == nil {
		return
	}
	at, dur := start.Sub(r.t0), max(end.Sub(start), 0)
	r.mu.Lock()
	r.appendLocked(Event{Kind: KindSpan, Name: name, Node: r.node, Rank: rank, At: at, Dur: dur})
	r.mu.Unlock()
}

// Request records one PMI request of rank (a tracer's stamp; a no-op
// otherwise): read at start, its answer ready at answered (zero = in the
// same turn it was read), its reply written at end. The span's Wait is
// answered-start: the time it waited for other ranks or nodes.
func (r *Recorder) Request(name string, rank int, start, answered, end time.Time) {
	if !r.Tracing() {
		return
	}
	at, dur := start.Sub(r.t0), max(end.Sub(start), 0)
	var wait time.Duration
	if !answered.IsZero() {
		wait = min(max(answered.Sub(start), 0), dur)
	}
	r.mu.Lock()
	r.appendLocked(Event{Kind: KindSpan, Name: name, Node: r.node, Rank: rank, At: at, Dur: dur, Wait: wait})
	r.mu.Unlock()
}

// SpanArg is Span with one named argument (a tracer's stamp; a no-op
// otherwise), for example a fork's rank or a compression's bytes.
func (r *Recorder) SpanArg(name string, rank int, start, end time.Time, arg string, value int64) {
	if !r.Tracing() {
		return
	}
	at, dur := start.Sub(r.t0), max(end.Sub(start), 0)
	r.mu.Lock()
	r.appendLocked(Event{Kind: KindSpan, Name: name, Node: r.node, Rank: rank, At: at, Dur: dur, Arg: arg, Value: value})
	r.mu.Unlock()
}

// Add adds delta to the counter name (messages, bytes). Counters start at 0.
func (r *Recorder) Add(counter string, delta int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	v := r.counters[counter] + delta
	r.counters[counter] = v
	if r.tracing {
		r.appendLocked(Event{Kind: KindCounter, Name: counter, Node: r.node, Rank: AgentRank, At: time.Since(r.t0), Value: v})
	}
	r.mu.Unlock()
}

// Counter returns the current value of the counter name.
func (r *Recorder) Counter(name string) int64 {
	if r == nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counters[name]
}

// Counters returns a copy of every counter.
func (r *Recorder) Counters() map[string]int64 {
	out := make(map[string]int64)
	if r == nil {
		return out
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for k, v := range r.counters {
		out[k] = v
	}
	return out
}

// Events returns a copy of every event, sorted by At. Events stamped at the
// same offset keep the order in which they were recorded.
func (r *Recorder) Events() []Event {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	evs := make([]Event, 0, r.nevents)
	for _, c := range r.chunks {
		evs = append(evs, c...)
	}
	r.mu.Unlock()
	slices.SortStableFunc(evs, func(a, b Event) int {
		switch {
		case a.At < b.At:
			return -1
		case a.At > b.At:
			return 1
		}
		return 0
	})
	return evs
}

func monotonicNanos() (int64, error) { return sys.MonotonicNanos() }

// ClockSample is one estimate of the offset between two recorders' clocks,
// taken over a link: the far side sent its Since at Sent, this side read
// its own Since (Peer) when the probe arrived, and the far side got the
// answer at Received. The offset (this side minus the far side) lies in
// [Peer-Received, Peer-Sent]; Offset is the middle and Err half the width
// (half the round trip).
type ClockSample struct {
	Sent     time.Duration `json:"sent"`
	Peer     time.Duration `json:"peer"`
	Received time.Duration `json:"recv"`
}

// Offset is the estimated offset to add to the far side's stamps.
func (c ClockSample) Offset() time.Duration { return c.Peer - (c.Sent+c.Received)/2 }

// Err bounds the estimate's error: half the round trip.
func (c ClockSample) Err() time.Duration { return (c.Received - c.Sent + 1) / 2 }

// BestClock is the sample with the shortest round trip (the tightest
// bound), or the zero sample if no sample is sound.
func BestClock(samples []ClockSample) ClockSample {
	var best ClockSample
	found := false
	for _, s := range samples {
		if s.Received < s.Sent {
			continue
		}
		if !found || s.Received-s.Sent < best.Received-best.Sent {
			best, found = s, true
		}
	}
	return best
}

// NodeInfo describes a node whose events were merged into a recorder:
// node Node of job Job of the run (0: the command line's job; a job its
// ranks spawned has a process of its own in the trace for each of its
// nodes).
type NodeInfo struct {
	Node   int           `json:"node"`
	Job    int           `json:"job,omitempty"`
	Host   string        `json:"host,omitempty"`
	Offset time.Duration `json:"offset"`         // added to the node's stamps
	Err    time.Duration `json:"err"`            // bound of the offset's error
	Mono   int64         `json:"mono,omitempty"` // the node's t0 on CLOCK_MONOTONIC, 0 if unknown
	// Dropped counts the node's events that were not sent (a cap on the
	// size of the final report).
	Dropped int `json:"dropped,omitempty"`
	// True is the offset read from CLOCK_MONOTONIC when the node and the
	// merging recorder share it (one machine: network namespaces or
	// loopback agents), for checking the estimate; HasTrue says so.
	True    time.Duration `json:"true,omitempty"`
	HasTrue bool          `json:"has_true,omitempty"`
	// Local says the node's recorder was in the merging process (a job
	// spawned under the fork bootstrap): its Offset is exact, and the
	// trace gives no clock estimate for it.
	Local bool `json:"local,omitempty"`
	// Lost says the node's agent ended without sending its events (it
	// was killed, its host or link went): merged with none, the node
	// is in the trace all the same, its label saying so.
	Lost bool `json:"lost,omitempty"`
}

// Merge adds another node's events, recorded against that node's own t0,
// shifted by info.Offset onto r's clock, as events of info.Node and
// info.Job.
func (r *Recorder) Merge(info NodeInfo, evs []Event) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.nodes = append(r.nodes, info)
	for _, e := range evs {
		e.At += info.Offset
		e.Node, e.Job = info.Node, info.Job
		r.appendLocked(e)
	}
}

// Nodes returns the merged nodes' descriptions.
func (r *Recorder) Nodes() []NodeInfo {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.nodes)
}
