package perf

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Summary is the start-up of one job in a few numbers. Every duration is an
// offset from t0 and is zero (printed as "-") if the phase never happened.
type Summary struct {
	Ranks int // the job size the summary was asked for

	AllStarted     time.Duration // last PhaseRankForked
	FirstFenceDone time.Duration // first PhaseFenceDone
	AllFinalized   time.Duration // when the Ranks-th distinct rank stamped PhaseFinalize
	Total          time.Duration // end of the last event

	Fences     int // fences completed: the most PhaseFenceDone stamps of any one rank
	Allgathers int // PhaseAllgatherDone stamps
	Forked     int // PhaseRankForked stamps
	Finalized  int // distinct ranks that stamped PhaseFinalize
	Exited     int // PhaseRankExit stamps
	Events     int // all events
}

// Summary computes the start-up summary of a job of ranks ranks: the
// command line's job, without the events of jobs its ranks spawned.
func (r *Recorder) Summary(ranks int) Summary {
	return summarize(slices.DeleteFunc(r.Events(), func(e Event) bool { return e.Job != 0 }), ranks)
}

// summarize is Summary over events sorted by At.
func summarize(evs []Event, ranks int) Summary {
	s := Summary{Ranks: ranks, Events: len(evs)}
	fences := make(map[int]int)
	finalized := make(map[int]bool)
	for _, e := range evs {
		s.Total = max(s.Total, e.End())
		if e.Kind != KindMark {
			continue
		}
		switch e.Name {
		case PhaseRankForked:
			s.Forked++
			s.AllStarted = max(s.AllStarted, e.At)
		case PhaseFenceDone:
			if s.FirstFenceDone == 0 {
				s.FirstFenceDone = e.At
			}
			fences[e.Rank]++
			s.Fences = max(s.Fences, fences[e.Rank])
		case PhaseAllgatherDone:
			s.Allgathers++
		case PhaseFinalize:
			if finalized[e.Rank] {
				continue
			}
			finalized[e.Rank] = true
			s.Finalized++
			if s.Finalized == ranks {
				s.AllFinalized = e.At
			}
		case PhaseRankExit:
			s.Exited++
		}
	}
	return s
}

// String is one short human line, for example
//
//	startup: 8 ranks forked in 3.12ms, first fence done at 9.8ms, all finalized at 14.2ms (2 fences), total 15.1ms
//
// with ", N allgathers" after the fences when there were any.
func (s Summary) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "startup: %d ranks forked in %s", s.Ranks, FormatDuration(s.AllStarted))
	if s.Forked != s.Ranks {
		fmt.Fprintf(&b, " (%d forked)", s.Forked)
	}
	fmt.Fprintf(&b, ", first fence done at %s, all finalized at %s (%d fence", FormatDuration(s.FirstFenceDone), FormatDuration(s.AllFinalized), s.Fences)
	if s.Fences != 1 {
		b.WriteByte('s')
	}
	if s.Allgathers > 0 {
		fmt.Fprintf(&b, ", %d allgather", s.Allgathers)
		if s.Allgathers != 1 {
			b.WriteByte('s')
		}
	}
	fmt.Fprintf(&b, "), total %s", FormatDuration(s.Total))
	return b.String()
}

// FormatDuration prints d rounded to three significant digits ("3.12ms",
// "14.2ms", "850µs"), or "-" for zero, which means "never happened".
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	abs := d
	if abs < 0 {
		abs = -abs
	}
	unit := time.Duration(1)
	for abs/unit >= 1000 && unit < time.Hour {
		unit *= 10
	}
	return d.Round(unit).String()
}
