package perf

import (
	"strings"
	"testing"
	"time"
)

// syntheticJob stamps a 4-rank job with two fences, rank 3 finalizing
// last, and a duplicate finalize from rank 0 that must not count twice.
func syntheticJob() *Recorder {
	r := NewRecorder()
	t0 := r.Start()
	at := func(us int) time.Time { return t0.Add(time.Duration(us) * time.Microsecond) }
	r.MarkAt(PhaseAgentReady, -1, at(100))
	for rank := range 4 {
		r.MarkAt(PhaseRankForked, rank, at(1000+500*rank)) // last at 2500µs
	}
	for fence := range 2 {
		for rank := range 4 {
			r.MarkAt(PhaseFenceEnter, rank, at(5000+4000*fence+10*rank))
			r.MarkAt(PhaseFenceDone, rank, at(7000+4000*fence+10*rank)) // first at 7000µs
		}
	}
	r.MarkAt(PhaseFinalize, 0, at(12000))
	r.MarkAt(PhaseFinalize, 0, at(12100)) // duplicate
	r.MarkAt(PhaseFinalize, 2, at(12200))
	r.MarkAt(PhaseFinalize, 1, at(12300))
	r.MarkAt(PhaseFinalize, 3, at(14200)) // the 4th distinct rank
	for rank := range 4 {
		r.MarkAt(PhaseRankExit, rank, at(15000+rank))
	}
	r.Span("teardown", -1, at(15000), at(16000)) // ends last
	return r
}

func TestSummarySynthetic(t *testing.T) {
	s := syntheticJob().Summary(4)
	want := Summary{
		Ranks:          4,
		AllStarted:     2500 * time.Microsecond,
		FirstFenceDone: 7000 * time.Microsecond,
		AllFinalized:   14200 * time.Microsecond,
		Total:          16000 * time.Microsecond,
		Fences:         2,
		Forked:         4,
		Finalized:      4,
		Exited:         4,
		Events:         1 + 4 + 16 + 5 + 4 + 1,
	}
	if s != want {
		t.Errorf("summary =\n%+v\nwant\n%+v", s, want)
	}
	const line = "startup: 4 ranks forked in 2.5ms, first fence done at 7ms, all finalized at 14.2ms (2 fences), total 16ms"
	if got := s.String(); got != line {
		t.Errorf("String() =\n%q\nwant\n%q", got, line)
	}
}

func TestSummaryTooFewFinalized(t *testing.T) {
	// Asked for 5 ranks, only 4 finalized: AllFinalized stays zero.
	s := syntheticJob().Summary(5)
	if s.AllFinalized != 0 || s.Finalized != 4 {
		t.Errorf("AllFinalized = %v, Finalized = %d; want 0, 4", s.AllFinalized, s.Finalized)
	}
	if got := s.String(); !strings.Contains(got, "5 ranks forked in 2.5ms (4 forked)") || !strings.Contains(got, "all finalized at -") {
		t.Errorf("String() = %q", got)
	}
}

func TestSummaryZeroPhases(t *testing.T) {
	r := NewRecorder()
	r.MarkAt(PhaseAgentReady, -1, r.Start().Add(time.Millisecond))
	s := r.Summary(8)
	if s.AllStarted != 0 || s.FirstFenceDone != 0 || s.AllFinalized != 0 || s.Fences != 0 {
		t.Errorf("summary of a job that never started = %+v", s)
	}
	const line = "startup: 8 ranks forked in - (0 forked), first fence done at -, all finalized at - (0 fences), total 1ms"
	if got := s.String(); got != line {
		t.Errorf("String() =\n%q\nwant\n%q", got, line)
	}
	if got := (Summary{Ranks: 1, Forked: 1, Fences: 1}).String(); !strings.Contains(got, "(1 fence)") || !strings.Contains(got, "total -") {
		t.Errorf("String() = %q", got)
	}
	r.MarkAt(PhaseAllgatherDone, -1, r.Start().Add(time.Millisecond))
	r.MarkAt(PhaseAllgatherDone, -1, r.Start().Add(time.Millisecond))
	if got := r.Summary(8).String(); !strings.Contains(got, "(0 fences, 2 allgathers)") {
		t.Errorf("String() with two allgathers = %q", got)
	}
}

func TestFormatDuration(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{0, "-"},
		{999, "999ns"},
		{1234, "1.23µs"},
		{3123400, "3.12ms"},
		{14249999, "14.2ms"},
		{850 * time.Microsecond, "850µs"},
		{5 * time.Second, "5s"},
		{-2500 * time.Microsecond, "-2.5ms"},
		{90 * time.Minute, "1h30m0s"},
	} {
		if got := FormatDuration(c.d); got != c.want {
			t.Errorf("FormatDuration(%d) = %q, want %q", int64(c.d), got, c.want)
		}
	}
}
