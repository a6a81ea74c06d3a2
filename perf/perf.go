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
)

// Phase names stamped by the agent and the launcher.
const (
	PhaseAgentReady = "agent ready"       // agent (rank -1) is serving
	PhaseRankForked = "rank forked"       // launcher started the rank's process
	PhaseFirstPMI   = "first PMI command" // agent read the rank's first command
	PhaseInit       = "PMI init"          // rank completed PMI init
	PhaseFenceEnter = "fence enter"       // rank entered a fence
	PhaseFenceDone  = "fence done"        // rank was released from a fence
	PhaseFinalize   = "finalize"          // rank called PMI finalize
	PhaseRankExit   = "rank exit"         // launcher reaped the rank's process
)

// AgentRank is the rank of stamps made by the agent or the launcher itself
// rather than on behalf of one rank. Any negative rank is treated the same.
const AgentRank = -1

// Kind says what an Event is.
type Kind uint8

// Event kinds.
const (
	KindMark Kind = iota // an instant
	KindSpan             // an interval of length Dur starting at At
)

func (k Kind) String() string {
	switch k {
	case KindMark:
		return "mark"
	case KindSpan:
		return "span"
	}
	return "unknown"
}

// Event is one stamp. At is the offset from the recorder's t0 (negative if
// the stamp predates t0); Dur is zero for marks.
type Event struct {
	Kind Kind
	Name string
	Rank int // AgentRank (-1) for the agent or launcher
	At   time.Duration
	Dur  time.Duration
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
	t0 time.Time // immutable after NewRecorder; carries the monotonic reading

	mu sync.Mutex
	// guarded by mu
	chunks   [][]Event        // in arrival order, not time order; only the last chunk has room
	nevents  int              // events in all chunks
	counters map[string]int64 // name -> value
}

// NewRecorder returns a Recorder whose t0 is now.
func NewRecorder() *Recorder {
	return &Recorder{
		t0:       time.Now(),
		chunks:   [][]Event{make([]Event, 0, chunkEvents)},
		counters: make(map[string]int64),
	}
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
	r.appendLocked(Event{Kind: KindMark, Name: phase, Rank: rank, At: at})
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
	r.appendLocked(Event{Kind: KindSpan, Name: name, Rank: rank, At: at, Dur: dur})
	r.mu.Unlock()
}

// Add adds delta to the counter name (messages, bytes). Counters start at 0.
func (r *Recorder) Add(counter string, delta int64) {
	if r == nil {
		return
	}
	r.mu.Lock()
	r.counters[counter] += delta
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
