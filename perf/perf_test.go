package perf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/perf/perftest"
)

func TestConcurrentMark(t *testing.T) {
	r := NewRecorder()
	const goroutines, per = 16, 500
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range per {
				r.Mark(PhaseInit, g)
				if i%10 == 0 {
					r.Add("messages", 1)
					now := time.Now()
					r.Span("fence", g, now, now.Add(time.Microsecond))
				}
			}
		})
	}
	// Readers run alongside the writers.
	wg.Go(func() {
		for range 20 {
			_ = r.Events()
			_ = r.Counter("messages")
			_ = r.Summary(goroutines)
		}
	})
	wg.Wait()

	evs := r.Events()
	wantSpans := goroutines * per / 10
	if got, want := len(evs), goroutines*per+wantSpans; got != want {
		t.Fatalf("got %d events, want %d", got, want)
	}
	perRank := make(map[int]int)
	for i, e := range evs {
		if i > 0 && e.At < evs[i-1].At {
			t.Fatalf("event %d at %v before event %d at %v", i, e.At, i-1, evs[i-1].At)
		}
		if e.Kind == KindMark {
			perRank[e.Rank]++
		}
	}
	for g := range goroutines {
		if perRank[g] != per {
			t.Errorf("rank %d: %d marks, want %d", g, perRank[g], per)
		}
	}
	if got := r.Counter("messages"); got != int64(wantSpans) {
		t.Errorf("messages counter = %d, want %d", got, wantSpans)
	}
}

func TestMarkAtOffsetsAndOrder(t *testing.T) {
	r := NewRecorder()
	t0 := r.Start()
	r.MarkAt("c", 2, t0.Add(30*time.Millisecond))
	r.MarkAt("a", 0, t0.Add(10*time.Millisecond))
	r.MarkAt("b1", 1, t0.Add(20*time.Millisecond))
	r.MarkAt("b2", 1, t0.Add(20*time.Millisecond)) // tie keeps arrival order
	r.Span("s", -1, t0.Add(5*time.Millisecond), t0.Add(7*time.Millisecond))
	r.Span("backwards", 0, t0.Add(9*time.Millisecond), t0.Add(8*time.Millisecond))

	got := r.Events()
	want := []Event{
		{Kind: KindSpan, Name: "s", Rank: -1, At: 5 * time.Millisecond, Dur: 2 * time.Millisecond},
		{Kind: KindSpan, Name: "backwards", Rank: 0, At: 9 * time.Millisecond},
		{Kind: KindMark, Name: "a", Rank: 0, At: 10 * time.Millisecond},
		{Kind: KindMark, Name: "b1", Rank: 1, At: 20 * time.Millisecond},
		{Kind: KindMark, Name: "b2", Rank: 1, At: 20 * time.Millisecond},
		{Kind: KindMark, Name: "c", Rank: 2, At: 30 * time.Millisecond},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("event %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	// Events is a copy.
	got[0].Name = "changed"
	if r.Events()[0].Name != "s" {
		t.Error("Events returned the recorder's own storage")
	}
}

func TestCounters(t *testing.T) {
	r := NewRecorder()
	if got := r.Counter("bytes"); got != 0 {
		t.Fatalf("fresh counter = %d, want 0", got)
	}
	r.Add("bytes", 100)
	r.Add("bytes", -30)
	r.Add("messages", 2)
	if got := r.Counter("bytes"); got != 70 {
		t.Errorf("bytes = %d, want 70", got)
	}
	c := r.Counters()
	c["bytes"] = 0
	if got := r.Counter("bytes"); got != 70 {
		t.Errorf("Counters returned the recorder's own map: bytes = %d", got)
	}
}

func TestNilRecorder(t *testing.T) {
	var r *Recorder
	r.Mark(PhaseInit, 0)
	r.MarkAt(PhaseInit, 0, time.Now())
	r.Span("x", 0, time.Now(), time.Now())
	r.Add("x", 1)
	if r.Counter("x") != 0 || r.Events() != nil || !r.Start().IsZero() {
		t.Error("nil recorder is not empty")
	}
	if s := r.Summary(4); s.Ranks != 4 || s.AllStarted != 0 || s.Events != 0 {
		t.Errorf("nil recorder summary = %+v", s)
	}
	var buf bytes.Buffer
	if err := r.WriteChromeTrace(&buf); err != nil {
		t.Fatal(err)
	}
	if !json.Valid(buf.Bytes()) {
		t.Errorf("nil recorder trace is not JSON: %s", buf.Bytes())
	}
}

// decodedTrace mirrors the Chrome trace object form loosely, so that the
// test checks the wire format rather than the package's own types.
type decodedTrace struct {
	TraceEvents []map[string]any `json:"traceEvents"`
}

func TestChromeTrace(t *testing.T) {
	r := NewRecorder()
	t0 := r.Start()
	ms := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }
	r.MarkAt(PhaseAgentReady, -1, ms(0.5))
	r.MarkAt(PhaseRankForked, 0, ms(1))
	r.MarkAt(PhaseRankForked, 1, ms(1.5))
	r.MarkAt(PhaseFenceEnter, 1, ms(3))
	r.Span("fence", 1, ms(3), ms(4.25))
	r.MarkAt(PhaseFenceDone, 0, ms(4.25))
	r.Add("messages", 12)
	r.Add("bytes", 4096)

	var buf bytes.Buffer
	if err := r.WriteChromeTrace(&buf); err != nil {
		t.Fatal(err)
	}
	if _, err := perftest.Check(buf.Bytes()); err != nil {
		t.Fatalf("trace fails the format check: %v\n%s", err, buf.String())
	}
	var tr decodedTrace
	dec := json.NewDecoder(&buf)
	dec.UseNumber()
	if err := dec.Decode(&tr); err != nil {
		t.Fatalf("decode trace: %v\n%s", err, buf.String())
	}
	num := func(ev map[string]any, k string) float64 {
		t.Helper()
		n, ok := ev[k].(json.Number)
		if !ok {
			t.Fatalf("event %v: %q is %T, want number", ev, k, ev[k])
		}
		f, err := n.Float64()
		if err != nil {
			t.Fatal(err)
		}
		return f
	}

	var meta, body, counters []map[string]any
	phase := 0 // 0 metadata, 1 events, 2 counters: each section in order
	for _, ev := range tr.TraceEvents {
		if num(ev, "pid") != 2 {
			t.Errorf("event %v: pid is not 2 (node 0)", ev)
		}
		var sec int
		switch ev["ph"] {
		case "M":
			sec, meta = 0, append(meta, ev)
		case "i", "X":
			sec, body = 1, append(body, ev)
		case "C":
			sec, counters = 2, append(counters, ev)
		default:
			t.Fatalf("unexpected phase type in %v", ev)
		}
		if sec < phase {
			t.Errorf("event %v out of section order", ev)
		}
		phase = sec
	}

	// Metadata: one process name, one thread name per thread used.
	threadNames := make(map[float64]string)
	for _, ev := range meta {
		args, _ := ev["args"].(map[string]any)
		switch ev["name"] {
		case "process_name":
			if args["name"] != "node 0 (in pmirun)" {
				t.Errorf("process_name = %v, want node 0 (in pmirun)", args["name"])
			}
		case "thread_name":
			threadNames[num(ev, "tid")], _ = args["name"].(string)
		}
	}
	wantThreads := map[float64]string{0: "agent", 1: "rank 0", 2: "rank 1"}
	if fmt.Sprint(threadNames) != fmt.Sprint(wantThreads) {
		t.Errorf("thread names = %v, want %v", threadNames, wantThreads)
	}

	// Body: time order (a slice before the slices it holds), tids,
	// instant vs complete events, microseconds, and each rank's derived
	// life: rank N (fork to last stamp), exec (fork to first PMI), PMI.
	type want struct {
		name string
		ph   string
		tid  float64
		ts   float64
		dur  float64
	}
	wants := []want{
		{PhaseAgentReady, "i", 0, 500, 0},
		{"rank 0", "X", 1, 1000, 3250},
		{SliceExec, "X", 1, 1000, 3250},
		{PhaseRankForked, "i", 1, 1000, 0},
		{"rank 1", "X", 2, 1500, 2750},
		{SliceExec, "X", 2, 1500, 1500},
		{PhaseRankForked, "i", 2, 1500, 0},
		{SlicePMI, "X", 2, 3000, 1250},
		{"fence", "X", 2, 3000, 1250},
		{PhaseFenceEnter, "i", 2, 3000, 0},
		{SlicePMI, "X", 1, 4250, 0},
		{PhaseFenceDone, "i", 1, 4250, 0},
	}
	if len(body) != len(wants) {
		t.Fatalf("got %d events, want %d: %v", len(body), len(wants), body)
	}
	for i, w := range wants {
		ev := body[i]
		if ev["name"] != w.name || ev["ph"] != w.ph || num(ev, "tid") != w.tid || num(ev, "ts") != w.ts {
			t.Errorf("event %d = %v, want %+v", i, ev, w)
		}
		switch w.ph {
		case "i":
			if ev["s"] != "t" {
				t.Errorf("instant event %v: scope %v, want t", ev, ev["s"])
			}
			if _, ok := ev["dur"]; ok {
				t.Errorf("instant event %v has dur", ev)
			}
		case "X":
			if num(ev, "dur") != w.dur {
				t.Errorf("complete event %v: dur want %v", ev, w.dur)
			}
		}
	}

	// Counters without samples (a report-only recorder): sorted by name,
	// at the end of the trace, with the value.
	if len(counters) != 2 {
		t.Fatalf("got %d counter events, want 2: %v", len(counters), counters)
	}
	for i, w := range []struct {
		name  string
		value float64
	}{{"bytes", 4096}, {"messages", 12}} {
		ev := counters[i]
		args, _ := ev["args"].(map[string]any)
		if ev["name"] != w.name || args == nil {
			t.Errorf("counter %d = %v, want %s", i, ev, w.name)
			continue
		}
		if v, _ := args["value"].(json.Number).Float64(); v != w.value {
			t.Errorf("counter %s = %v, want %v", w.name, args["value"], w.value)
		}
		if num(ev, "ts") != 4250 {
			t.Errorf("counter %s at ts %v, want 4250 (end of trace)", w.name, ev["ts"])
		}
	}
}

func TestChromeTraceZeroLengthSpanKeepsDur(t *testing.T) {
	r := NewRecorder()
	now := time.Now()
	r.Span("empty", 3, now, now)
	var buf bytes.Buffer
	if err := r.WriteChromeTrace(&buf); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), `"ph":"X"`) || !strings.Contains(buf.String(), `"dur":0`) {
		t.Errorf("zero-length span lost its dur: %s", buf.String())
	}
}

type failWriter struct{}

var errDiskFull = errors.New("disk full")

func (failWriter) Write([]byte) (int, error) { return 0, errDiskFull }

func TestChromeTraceWriteError(t *testing.T) {
	r := NewRecorder()
	r.Mark(PhaseInit, 0)
	err := r.WriteChromeTrace(failWriter{})
	if !errors.Is(err, errDiskFull) {
		t.Fatalf("err = %v, want wrapping %v", err, errDiskFull)
	}
}

func BenchmarkMark(b *testing.B) {
	r := NewRecorder()
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		r.Mark(PhaseFenceDone, i&127)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/mark")
}

func BenchmarkMarkParallel(b *testing.B) {
	r := NewRecorder()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r.Mark(PhaseFenceDone, 1)
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/mark")
}

func BenchmarkWriteChromeTrace(b *testing.B) {
	r := NewRecorder()
	const ranks, perRank = 128, 8
	for rank := range ranks {
		for range perRank {
			r.Mark(PhaseInit, rank)
		}
	}
	var buf bytes.Buffer
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if err := r.WriteChromeTrace(&buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*ranks*perRank), "ns/event")
	b.ReportMetric(float64(buf.Len())/float64(ranks*perRank), "bytes/event")
}

func TestMarkDoesNotAllocate(t *testing.T) {
	r := NewRecorder()
	r.Add("messages", 0)
	allocs := testing.AllocsPerRun(100, func() {
		r.Mark(PhaseFenceDone, 7)
		r.Add("messages", 1)
	})
	if allocs != 0 {
		t.Errorf("Mark+Add allocate %v times per call", allocs)
	}
}

// A rank's fork is a slice of its own track before its life, not a
// request; a rank whose first request came before its forker noticed the
// fork's end (the forker's thread ran late) has its life start at that
// request and its fork end there.
func TestChromeTraceForks(t *testing.T) {
	r := NewRecorderFor(0, true)
	t0 := r.Start()
	ms := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }
	// Rank 0: forked 1-2 ms, first request at 3 ms.
	r.Span(SliceFork, 0, ms(1), ms(2))
	r.MarkAt(PhaseRankForked, 0, ms(2))
	r.Request("get", 0, ms(3), ms(3), ms(3.5))
	// Rank 1: forked from 1.2 ms, its end noticed at 5 ms, first request
	// at 4 ms.
	r.Span(SliceFork, 1, ms(1.2), ms(5))
	r.MarkAt(PhaseRankForked, 1, ms(5))
	r.Request("get", 1, ms(4), ms(4), ms(6))
	var buf bytes.Buffer
	if err := r.WriteChromeTrace(&buf); err != nil {
		t.Fatal(err)
	}
	tr, err := perftest.Check(buf.Bytes())
	if err != nil {
		t.Fatalf("trace fails the format check: %v\n%s", err, buf.String())
	}
	want := map[string][2]float64{ // rank's fork, life and PMI: start and end (µs)
		"0 fork": {1000, 2000}, "0 rank 0": {2000, 3500}, "0 PMI": {3000, 3500},
		"1 fork": {1200, 4000}, "1 rank 1": {4000, 6000}, "1 PMI": {4000, 6000},
	}
	got := 0
	for rank := range 2 {
		for _, e := range tr.On(TracePID(0), TraceTID(rank)) {
			w, ok := want[strconv.Itoa(rank)+" "+e.Name]
			if e.Ph != "X" || !ok {
				continue
			}
			got++
			if math.Abs(e.Ts-w[0]) > 1 || math.Abs(e.End()-w[1]) > 1 {
				t.Errorf("rank %d: %s [%v, %v], want %v", rank, e.Name, e.Ts, e.End(), w)
			}
			if e.Name == SliceFork && e.Cat != CatRank {
				t.Errorf("rank %d: fork slice of category %q, want %q", rank, e.Cat, CatRank)
			}
		}
	}
	if got != len(want) {
		t.Errorf("%d of the %d slices found\n%s", got, len(want), buf.String())
	}
}
