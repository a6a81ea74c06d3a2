package perf

import (
	"bytes"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/perf/perftest"
)

// A tracer's requests become slices on their rank's track, with the
// waiting part inside, inside the rank's PMI slice, inside its life; a
// reply written after the rank was reaped (stamps from two goroutines) is
// cut at the end of the life; counters become sampled tracks; a merged
// node's events land on its own process, shifted by its clock offset.
func TestTracerTrace(t *testing.T) {
	r := NewTracer(0)
	t0 := r.Start()
	ms := func(n float64) time.Time { return t0.Add(time.Duration(n * float64(time.Millisecond))) }
	r.SpanArg("fork", AgentRank, ms(0.5), ms(1), "rank", 0)
	r.MarkAt(PhaseRankForked, 0, ms(1))
	r.Request("fullinit", 0, ms(2), time.Time{}, ms(2.1))
	r.Request("kvs-put", 0, ms(2.2), time.Time{}, ms(2.3))
	r.Request("kvs-fence", 0, ms(2.4), ms(5), ms(5.2))
	r.Add("net.bytes.sent", 100)
	r.Add("net.bytes.sent", 50)
	r.MarkAt(PhaseRankExit, 0, ms(6))
	r.Request("finalize", 0, ms(5.5), time.Time{}, ms(6.5)) // written after the reap was stamped

	far := NewTracer(1)
	far.MarkAt(PhaseRankForked, 1, far.Start().Add(time.Millisecond))
	far.Request("kvs-fence", 1, far.Start().Add(2*time.Millisecond), far.Start().Add(3*time.Millisecond), far.Start().Add(3*time.Millisecond))
	far.MarkAt(PhaseRankExit, 1, far.Start().Add(4*time.Millisecond))
	r.Merge(NodeInfo{Node: 1, Host: "h1", Offset: 10 * time.Millisecond, Err: 20 * time.Microsecond}, far.Events())

	tr := checkedTrace(t, r)

	find := func(pid, tid int, name string) perftest.Event {
		t.Helper()
		for _, e := range tr.On(pid, tid) {
			if e.Name == name && e.Ph == "X" {
				return e
			}
		}
		t.Fatalf("no slice %q on track %d/%d: %v", name, pid, tid, tr.On(pid, tid))
		return perftest.Event{}
	}
	near := func(a, b float64) bool { return a-b < 1e-6 && b-a < 1e-6 }
	life, exec, pmi := find(2, 1, "rank 0"), find(2, 1, SliceExec), find(2, 1, SlicePMI)
	if life.Ts != 1000 || !near(life.End(), 6500) {
		t.Errorf("life slice %v, want [1000, 6500]", life)
	}
	if exec.Ts != 1000 || !near(exec.End(), 2000) {
		t.Errorf("exec slice %v, want [1000, 2000]", exec)
	}
	if pmi.Ts != 2000 || !near(pmi.End(), 6500) {
		t.Errorf("PMI slice %v, want [2000, 6500]", pmi)
	}
	fence, wait := find(2, 1, "kvs-fence"), find(2, 1, SliceWaiting)
	if fence.Cat != CatRequest || fence.Ts != 2400 || !near(fence.End(), 5200) {
		t.Errorf("fence request %v, want [2400, 5200] in category request", fence)
	}
	if wait.Ts != 2400 || !near(wait.End(), 5000) {
		t.Errorf("waiting slice %v, want [2400, 5000]", wait)
	}
	// The reap was stamped before the last reply: no exit slice of
	// negative length; the life covers the reply.
	for _, e := range tr.On(2, 1) {
		if e.Name == SliceExit {
			t.Errorf("exit slice %v on rank 0, want none", e)
		}
	}
	if ex := find(3, 2, SliceExit); ex.Ts != 13000 || !near(ex.End(), 14000) {
		t.Errorf("merged rank's exit slice %v, want [13000, 14000]", ex)
	}
	if f := find(2, 0, "fork"); f.Args["rank"] != 0.0 || f.Ts != 500 {
		t.Errorf("fork slice %v, want at 500 with rank 0", f)
	}
	var samples []float64
	for _, e := range tr.Named("net.bytes.sent") {
		if e.Ph == "C" {
			samples = append(samples, e.Args["value"].(float64))
		}
	}
	if len(samples) != 2 || samples[0] != 100 || samples[1] != 150 {
		t.Errorf("counter samples %v, want [100 150]", samples)
	}

	// The merged node: its own process, shifted by 10 ms, labelled with
	// the offset and its error.
	if name := tr.Processes[3]; name != "node 1 h1" {
		t.Errorf("merged process name %q, want node 1 h1", name)
	}
	if l := tr.Labels[3]; l == nil || l["clock_offset_us"] != 10000.0 || l["clock_err_us"] != 20.0 {
		t.Errorf("merged process labels %v, want offset 10000 µs, err 20 µs", l)
	}
	if f := find(3, 2, "kvs-fence"); f.Ts != 12000 {
		t.Errorf("merged fence at %v, want 12000 (2 ms + 10 ms offset)", f.Ts)
	}
}

// A report-only recorder keeps no trace-only stamps: requests and spans
// with arguments are dropped, counters keep their totals without samples,
// and none of it allocates.
func TestRecorderWithoutTracing(t *testing.T) {
	r := NewRecorder()
	if r.Tracing() {
		t.Fatal("NewRecorder traces")
	}
	now := time.Now()
	allocs := testing.AllocsPerRun(1000, func() {
		r.Request("kvs-get", 3, now, now, now)
		r.SpanArg("fork", -1, now, now, "rank", 3)
		r.Add("net.bytes.sent", 10)
	})
	if allocs != 0 {
		t.Errorf("trace-only stamps on a report-only recorder allocate %v times", allocs)
	}
	if evs := r.Events(); len(evs) != 0 {
		t.Errorf("report-only recorder kept %d events: %v", len(evs), evs)
	}
	if got := r.Counter("net.bytes.sent"); got != 10010 {
		t.Errorf("counter %d, want 10010", got)
	}
}

func TestBestClock(t *testing.T) {
	ms := time.Millisecond
	s := BestClock([]ClockSample{
		{Sent: 0, Peer: 105 * ms, Received: 10 * ms},
		{Sent: 20 * ms, Peer: 121 * ms, Received: 22 * ms},
		{Sent: 30 * ms, Peer: 0, Received: 29 * ms}, // unsound: received before sent
	})
	if s.Sent != 20*ms {
		t.Fatalf("best sample %+v, want the 2 ms round trip", s)
	}
	if s.Offset() != 100*ms || s.Err() != ms {
		t.Errorf("offset %v ± %v, want 100ms ± 1ms", s.Offset(), s.Err())
	}
	if (BestClock(nil) != ClockSample{}) {
		t.Error("BestClock of nothing is not the zero sample")
	}
}

// A rank seen only through marks (shared memory: no request spans) gets
// one fence slice per epoch, the k-th entry to the k-th release, inside
// its PMI slice; a text rank's fences are its requests, not repeated.
func TestTraceFencesFromMarks(t *testing.T) {
	r := NewTracer(0)
	ms := func(n float64) time.Time { return r.Start().Add(time.Duration(n * float64(time.Millisecond))) }
	for _, m := range []struct {
		phase string
		at    float64
	}{{PhaseRankForked, 1}, {PhaseFirstPMI, 2}, {PhaseFenceEnter, 3}, {PhaseFenceEnter, 4}, {PhaseFenceDone, 5}, {PhaseFenceDone, 6}, {PhaseFinalize, 7}, {PhaseRankExit, 8}} {
		r.MarkAt(m.phase, 0, ms(m.at))
	}
	r.MarkAt(PhaseFenceEnter, 1, ms(3))
	r.Request("kvs-fence", 1, ms(3), ms(5), ms(5.5))
	r.MarkAt(PhaseFenceDone, 1, ms(5))
	tr := checkedTrace(t, r)
	fences := tr.Named(SliceFence)
	if len(fences) != 2 || fences[0].Tid != 1 || fences[0].Ts != 3000 || fences[1].Ts != 4000 {
		t.Fatalf("fence slices %v, want two on rank 0 from 3 ms and 4 ms", fences)
	}
	// The second epoch overlaps the first's end: cut there, so slices nest.
	if e0, e1 := fences[0].End(), fences[1].End(); e0 != 5000 || e1 > e0 {
		t.Errorf("fence ends %v and %v, want 5000 and at most 5000", e0, e1)
	}
}

// The nodes of spawned jobs (NodeInfo.Job) are processes of their own,
// numbered after the command line's job's, named "job J node N"; a job
// merged from this process (Local) has no clock label. The summary is of
// the command line's job alone.
func TestSpawnedJobsTrace(t *testing.T) {
	r := NewTracer(0)
	r.MarkAt(PhaseRankForked, 0, r.Start().Add(time.Millisecond))
	child := func() *Recorder {
		c := NewTracer(0)
		c.MarkAt(PhaseRankForked, 0, c.Start().Add(time.Millisecond))
		c.MarkAt(PhaseRankForked, 1, c.Start().Add(2*time.Millisecond))
		return c
	}
	r.Merge(NodeInfo{Node: 0, Job: 2, Offset: 5 * time.Millisecond, Local: true}, child().Events())
	r.Merge(NodeInfo{Node: 0, Job: 1, Offset: 3 * time.Millisecond, Local: true}, child().Events())

	tr := checkedTrace(t, r)
	want := map[int]string{2: "node 0 (in pmirun)", 3: "job 1 node 0 (in pmirun)", 4: "job 2 node 0 (in pmirun)"}
	for pid, name := range want {
		if tr.Processes[pid] != name {
			t.Errorf("process %d is %q, want %q (all: %v)", pid, tr.Processes[pid], name, tr.Processes)
		}
	}
	if len(tr.Processes) != len(want) || len(tr.Labels) != 0 {
		t.Errorf("processes %v, labels %v: want %v and no clock labels", tr.Processes, tr.Labels, want)
	}
	if forks := tr.Named(PhaseRankForked); len(forks) != 5 {
		t.Errorf("%d fork marks, want 5", len(forks))
	}
	if s := r.Summary(1); s.Forked != 1 {
		t.Errorf("summary counts %d forks, want the command line's job's 1", s.Forked)
	}
}

// checkedTrace writes r's Chrome trace and returns it parsed, failing t
// if the trace fails the format check.
func checkedTrace(t *testing.T, r *Recorder) *perftest.Trace {
	t.Helper()
	var buf bytes.Buffer
	if err := r.WriteChromeTrace(&buf); err != nil {
		t.Fatal(err)
	}
	tr, err := perftest.Check(buf.Bytes())
	if err != nil {
		t.Fatalf("trace fails the format check: %v\n%s", err, buf.String())
	}
	return tr
}
