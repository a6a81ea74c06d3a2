package virtual

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
)

// fakeStamps is an allgather result of stamps: rank r's value is vals[r].
type fakeStamps [][]byte

func (f fakeStamps) Len() int        { return len(f) }
func (f fakeStamps) At(r int) []byte { return f[r] }

// testMachine is the machine of the test's clocks.
const testMachine = 0x5eed

// encodeStamps is a rank's value as exchangeStamps sends it, with its
// clock on testMachine.
func encodeStamps(inOut ...int64) []byte { return encodeStampsOn(testMachine, inOut...) }

// encodeStampsOn is a rank's value as exchangeStamps sends it, with its
// clock on machine.
func encodeStampsOn(machine uint64, inOut ...int64) []byte {
	b := binary.LittleEndian.AppendUint64(nil, machine)
	for _, t := range inOut {
		b = binary.LittleEndian.AppendUint64(b, uint64(t))
	}
	return b
}

func TestFoldStamps(t *testing.T) {
	// Three ranks, two rounds. Round 0: rank 1 enters first (100) and
	// rank 2 last (130); rank 0 completes last (200). Round 1: the ranks
	// enter together and complete at once.
	vals := fakeStamps{
		encodeStamps(110, 200, 300, 310),
		encodeStamps(100, 190, 300, 310),
		encodeStamps(130, 195, 300, 310),
	}
	ends := make([]roundEnds, 2)
	if foreign, err := foldStamps(ends, vals, testMachine); err != nil || foreign != 0 {
		t.Fatalf("foldStamps: %d ranks on other machines, %v", foreign, err)
	}
	// Rank 0 entered 20ns before the last other rank in round 0, with
	// the others in round 1.
	for i, want := range []struct{ span, tail, gap time.Duration }{{100, 70, -20}, {10, 10, 0}} {
		e := ends[i]
		if e.span() != want.span || e.tail() != want.tail || e.ranks != 3 {
			t.Errorf("round %d: span %v tail %v over %d ranks, want %v, %v over 3", i, e.span(), e.tail(), e.ranks, want.span, want.tail)
		}
		if gap, ok := e.lateGap(); !ok || gap != want.gap {
			t.Errorf("round %d: rank 0 entered %v after the others (%v), want %v", i, gap, ok, want.gap)
		}
	}
	// Rank 0 entering after the others, and alone.
	late := make([]roundEnds, 1)
	if _, err := foldStamps(late, fakeStamps{encodeStamps(500, 520), encodeStamps(100, 530), encodeStamps(90, 510)}, testMachine); err != nil {
		t.Fatal(err)
	}
	if gap, ok := late[0].lateGap(); !ok || gap != 400 || late[0].tail() != 30 {
		t.Errorf("rank 0 late by 400ns: gap %v (%v), tail %v; want 400ns and a 30ns tail", gap, ok, late[0].tail())
	}
	alone := make([]roundEnds, 1)
	if _, err := foldStamps(alone, fakeStamps{encodeStamps(5, 6)}, testMachine); err != nil {
		t.Fatal(err)
	}
	if _, ok := alone[0].lateGap(); ok {
		t.Errorf("a gap for a job of one rank")
	}

	for name, bad := range map[string]fakeStamps{
		"short value":        {encodeStamps(1, 2, 3, 4), encodeStamps(1, 2)},
		"out before in":      {encodeStamps(5, 4, 6, 7)},
		"value of one round": {encodeStamps(1, 2)},
		"no machine":         {encodeStamps(1, 2, 3, 4)[8:]},
	} {
		if _, err := foldStamps(make([]roundEnds, 2), bad, testMachine); err == nil {
			t.Errorf("%s: no error", name)
		}
	}

	// Ranks whose clocks are on another machine are counted.
	mixed := fakeStamps{encodeStamps(1, 2, 3, 4), encodeStampsOn(7, 1, 2, 3, 4), encodeStampsOn(8, 1, 2, 3, 4)}
	if foreign, err := foldStamps(make([]roundEnds, 2), mixed, testMachine); err != nil || foreign != 2 {
		t.Errorf("two ranks on other machines: counted %d, %v", foreign, err)
	}
}

func TestScaleReportLine(t *testing.T) {
	us := func(n int) time.Duration { return time.Duration(n) * time.Microsecond }
	r := scaleReport{op: "ring", size: 8, local: 4, warmup: us(50),
		times: []time.Duration{us(30), us(10), us(20), us(40)},
		ends: []roundEnds{
			{firstIn: 0, lastIn: int64(us(5)), lastOut: int64(us(25)), ranks: 8},  // span 25, tail 20
			{firstIn: 0, lastIn: int64(us(2)), lastOut: int64(us(12)), ranks: 8},  // span 12, tail 10
			{firstIn: 0, lastIn: int64(us(30)), lastOut: int64(us(70)), ranks: 8}, // span 70, tail 40
			{firstIn: 0, lastIn: int64(us(1)), lastOut: int64(us(31)), ranks: 8}}} // span 31, tail 30
	want := "fastpmi-scale op=ring P=8 local=4 rounds=4 median_us=25.0 min_us=10.0 max_us=40.0 mean_us=25.0 warmup_us=50.0" +
		" span_median_us=28.0 span_min_us=12.0 tail_median_us=25.0 tail_min_us=10.0 tail_max_us=40.0"
	if got := r.line(); got != want {
		t.Errorf("line\n got %s\nwant %s", got, want)
	}
	if !strings.HasPrefix(want, ScaleLinePrefix+" ") {
		t.Errorf("line does not start with %q", ScaleLinePrefix)
	}

	// A late-arrival job says how long rank 0 waited, in how many rounds
	// it entered last, and by how little.
	late := r
	late.late = us(2000)
	late.ends = []roundEnds{
		{firstIn: 0, lastIn: 900, lastOut: 1000, rank0In: 900, othersIn: 400, ranks: 8, others: 7}, // last by 500ns
		{firstIn: 0, lastIn: 900, lastOut: 1000, rank0In: 900, othersIn: 600, ranks: 8, others: 7}, // last by 300ns
		{firstIn: 0, lastIn: 900, lastOut: 1000, rank0In: 100, othersIn: 900, ranks: 8, others: 7}, // another rank 800ns after it
	}
	want = "fastpmi-scale op=ring P=8 local=4 rounds=4 median_us=25.0 min_us=10.0 max_us=40.0 mean_us=25.0 warmup_us=50.0 late_us=2000.0" +
		" span_median_us=1.0 span_min_us=1.0 tail_median_us=0.1 tail_min_us=0.1 tail_max_us=0.1 late_last=2 late_gap_min_us=-0.8"
	if got := late.line(); got != want {
		t.Errorf("late-arrival line\n got %s\nwant %s", got, want)
	}

	// Stamps from other machines' clocks give no span and tail.
	r.foreign = 3
	want = "fastpmi-scale op=ring P=8 local=4 rounds=4 median_us=25.0 min_us=10.0 max_us=40.0 mean_us=25.0 warmup_us=50.0" +
		" clocks=unshared foreign=3"
	if got := r.line(); got != want {
		t.Errorf("line with clocks on other machines\n got %s\nwant %s", got, want)
	}
}

// machineClock agrees with CLOCK_MONOTONIC read by a system call.
func TestMachineClock(t *testing.T) {
	c, err := newMachineClock()
	if err != nil {
		t.Skip(err) // not Linux
	}
	for range 100 {
		a := c.now()
		m, err := sys.MonotonicNanos()
		if err != nil {
			t.Fatal(err)
		}
		b := c.now()
		// Calibration error is well under a microsecond; allow for a
		// descheduled test.
		const slack = int64(50 * time.Microsecond)
		if m < a-slack || m > b+slack {
			t.Fatalf("clock_gettime %d outside [%d, %d] read around it", m, a, b)
		}
	}
	// The machine is the boot's, the same for every clock made here.
	id, err := sys.BootID()
	if err != nil {
		t.Fatal(err)
	}
	if c2, _ := newMachineClock(); c.machine != id || c2.machine != id {
		t.Errorf("clocks on machines %#x and %#x, want the boot id %#x", c.machine, c2.machine, id)
	}
}

// stampExchange books the counters' growth between the last rank's enter
// and the last rank's leave.
func TestStampExchangeBooks(t *testing.T) {
	rec := perf.NewRecorder()
	rec.Add("tree.msgs.sent", 11)
	rec.Add("bcast.bytes.in", 1000)
	x := &stampExchange{rec: rec, ranks: 2}
	x.enter()
	rec.Add("tree.msgs.sent", 1) // still the timed rounds' (a rank has not entered)
	x.enter()
	rec.Add("tree.msgs.sent", 1)
	rec.Add("bcast.bytes.in", 160)
	rec.Add("bcast.bytes.raw", 320)
	rec.Add("net.frames.sent", 3)
	x.leave()
	rec.Add("bcast.bytes.raw", 1) // not yet: a rank has no result
	x.leave()
	rec.Add("tree.msgs.sent", 5) // after the exchange
	got := rec.Counters()
	for name, want := range map[string]int64{
		StampCounterPrefix + "tree.msgs.sent":  1,
		StampCounterPrefix + "bcast.bytes.in":  160,
		StampCounterPrefix + "bcast.bytes.raw": 321,
		StampCounterPrefix + "net.frames.sent": 0,
	} {
		if got[name] != want {
			t.Errorf("%s = %d, want %d", name, got[name], want)
		}
	}
}

// cpuMeter books the CPU time and the rank rounds completed from the first
// rank's begin to the last rank's end, once, when the last rank ends.
func TestCPUMeterBooks(t *testing.T) {
	rec := perf.NewRecorder()
	m := &cpuMeter{rec: rec, ranks: 2}
	m.rounds.Add(1) // a warm-up round before the window
	m.begin()
	m.rounds.Add(1) // the other rank's warm-up round, inside the window
	m.begin()
	burnCPU(t, 10*time.Millisecond)
	m.rounds.Add(4)
	m.end()
	if got := rec.Counters(); got[CPUCounter] != 0 || got[CPURoundsCounter] != 0 {
		t.Fatalf("booked %v before the last rank ended", got)
	}
	m.rounds.Add(2)
	m.end()
	got := rec.Counters()
	if got[CPURoundsCounter] != 7 {
		t.Errorf("%s = %d, want 7", CPURoundsCounter, got[CPURoundsCounter])
	}
	if cpu := time.Duration(got[CPUCounter]); cpu < 10*time.Millisecond || cpu > time.Minute {
		t.Errorf("%s = %v around 10 ms of CPU", CPUCounter, cpu)
	}
}

// burnCPU spins until the process has used d more CPU time.
func burnCPU(t *testing.T, d time.Duration) {
	t.Helper()
	start, err := sys.ProcessCPUNanos()
	if err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
		now, err := sys.ProcessCPUNanos()
		if err != nil {
			t.Fatal(err)
		}
		if time.Duration(now-start) >= d {
			return
		}
	}
	t.Fatalf("the process clock did not reach %v in a minute", d)
}
