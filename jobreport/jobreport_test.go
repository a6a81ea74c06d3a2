package jobreport

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/perf"
)

func sample() *Report {
	return &Report{
		Version: Version, JobID: "fastpmi-1-ab", Size: 4, Bootstrap: "loopback", NetBackend: "net", Virtual: "ring",
		Started: time.Date(2025, 1, 2, 3, 4, 5, 6, time.UTC), Wall: 1500 * time.Millisecond,
		ExitCode: 3, Failure: "rank 1 exited with code 3",
		Phases: []Phase{{Name: "agents started", Count: 1, First: 10, Last: 10}, {Name: perf.PhaseInit, Count: 4, First: 20, Last: 40}},
		Nodes: []Node{
			{Index: 0, Host: "127.0.0.1", Ranks: 2, Counters: map[string]int64{"net.frames.sent": 7}},
			{Index: 1, Host: "127.0.0.1", Ranks: 2}, // never reported
		},
		RootCounters: map[string]int64{"bcast.bytes.raw": 100, "bcast.bytes.sent": 60},
		Scale: &Scale{Op: "ring", P: 4, Local: 2, Rounds: 3, Median: 250 * time.Microsecond, Min: 1, Max: 2, Mean: 3, Warmup: 4,
			SpanMedian: 5, SpanMin: 6, TailMedian: 7, TailMin: 8, TailMax: 9, Late: time.Millisecond, LateLast: 2, LateGapMin: -12},
	}
}

func TestRoundTrip(t *testing.T) {
	want := sample()
	path := filepath.Join(t.TempDir(), "report.json")
	if err := want.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("read back\n got %+v\nwant %+v", got, want)
	}
	// The temporary file was renamed into place: nothing else is left.
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Errorf("%d files in the report's directory, want 1", len(ents))
	}
}

// A path that is no regular file is written, not replaced: a pipe (as
// /dev/stdout is when pmirun's output is piped) gets the report and stays
// a pipe, a link keeps pointing where it did and its file gets the report.
// Renamed into place, the report replaced the pipe and the link (and, for
// root, /dev/null itself), and CheckWritable refused /dev/stdout to users
// who cannot make files in /dev.
func TestWriteInPlace(t *testing.T) {
	dir := t.TempDir()
	want := sample()

	fifo := filepath.Join(dir, "fifo")
	if out, err := exec.Command("mkfifo", fifo).CombinedOutput(); err != nil {
		t.Skipf("mkfifo: %v: %s", err, out)
	}
	if err := CheckWritable(fifo); err != nil {
		t.Errorf("CheckWritable(a pipe nobody reads yet) = %v, want nil", err)
	}
	// O_RDWR: the open waits for no writer, and the report fits the pipe.
	r, err := os.OpenFile(fifo, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := want.WriteFile(fifo); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode()&fs.ModeNamedPipe == 0 {
		t.Fatalf("after WriteFile the pipe is %v (%v), want a pipe still", st.Mode(), err)
	}
	var got Report
	if err := json.NewDecoder(r).Decode(&got); err != nil {
		t.Fatalf("read the report from the pipe: %v", err)
	}
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("read from the pipe\n got %+v\nwant %+v", got, want)
	}

	target := filepath.Join(t.TempDir(), "kept.json")
	if err := os.WriteFile(target, []byte(strings.Repeat("an older, longer file ", 1000)), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(dir, "link.json")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	if err := CheckWritable(link); err != nil {
		t.Errorf("CheckWritable(a link to a file) = %v, want nil", err)
	}
	if err := want.WriteFile(link); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Lstat(link); err != nil || st.Mode()&fs.ModeSymlink == 0 {
		t.Fatalf("after WriteFile the link is %v (%v), want a link still", st.Mode(), err)
	}
	if back, err := ReadFile(target); err != nil || !reflect.DeepEqual(back, want) {
		t.Errorf("the link's file holds %+v (%v), want the report", back, err)
	}
	if err := CheckWritable("/dev/null"); err != nil {
		t.Errorf("CheckWritable(/dev/null) = %v, want nil", err)
	}
}

// The field names are the document's contract: readers in other languages
// depend on them.
func TestFieldNames(t *testing.T) {
	b, err := sample().Marshal()
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	keys := func(m map[string]any) []string {
		var ks []string
		for k := range m {
			ks = append(ks, k)
		}
		slices.Sort(ks)
		return ks
	}
	for _, c := range []struct {
		what string
		got  map[string]any
		want []string
	}{
		{"report", m, []string{"bootstrap", "exit_code", "failure", "job_id", "netio", "nodes", "phases", "root_counters", "scale", "size", "started", "version", "virtual", "wall_ns"}},
		{"phase", m["phases"].([]any)[0].(map[string]any), []string{"count", "first_ns", "last_ns", "name"}},
		{"node", m["nodes"].([]any)[0].(map[string]any), []string{"counters", "host", "index", "ranks"}},
		// foreign_clocks, zero here, is left out.
		{"scale", m["scale"].(map[string]any), []string{"late_gap_min_ns", "late_last", "late_ns", "local", "max_ns", "mean_ns", "median_ns", "min_ns", "op", "p", "rounds", "span_median_ns", "span_min_ns", "tail_max_ns", "tail_median_ns", "tail_min_ns", "warmup_ns"}},
	} {
		if got := keys(c.got); !slices.Equal(got, c.want) {
			t.Errorf("%s fields %q, want %q", c.what, got, c.want)
		}
	}
	if m["wall_ns"].(float64) != 1.5e9 || m["nodes"].([]any)[1].(map[string]any)["counters"] != nil {
		t.Errorf("wall_ns %v, silent node's counters %v: want 1.5e9 and null", m["wall_ns"], m["nodes"].([]any)[1])
	}
}

func TestVersion(t *testing.T) {
	for _, v := range []int{0, Version + 1} {
		r := sample()
		r.Version = v
		b, _ := r.Marshal()
		if _, err := Unmarshal(b); !errors.Is(err, ErrVersion) {
			t.Errorf("version %d: %v, want ErrVersion", v, err)
		}
	}
	if _, err := Unmarshal([]byte("{")); err == nil {
		t.Error("truncated document accepted")
	}
	if _, err := ReadFile(filepath.Join(t.TempDir(), "none.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v, want ErrNotExist", err)
	}
}

func TestPhases(t *testing.T) {
	evs := []perf.Event{
		{Kind: perf.KindMark, Name: perf.PhaseRankForked, Rank: 0, At: 5},
		{Kind: perf.KindMark, Name: perf.PhaseRankForked, Rank: 1, At: 6},
		{Kind: perf.KindSpan, Name: "fence", Rank: 0, At: 7, Dur: 10},
		{Kind: perf.KindMark, Name: perf.PhaseInit, Rank: 1, At: 8},
		{Kind: perf.KindMark, Name: perf.PhaseInit, Rank: 0, At: 9},
		{Kind: perf.KindMark, Name: perf.PhaseRankExit, Rank: 0, At: 20},
	}
	want := []Phase{
		{Name: perf.PhaseRankForked, Count: 2, First: 5, Last: 6},
		{Name: perf.PhaseInit, Count: 2, First: 8, Last: 9},
		{Name: perf.PhaseRankExit, Count: 1, First: 20, Last: 20},
	}
	r := &Report{Phases: Phases(evs)}
	if !reflect.DeepEqual(r.Phases, want) {
		t.Errorf("phases\n got %+v\nwant %+v", r.Phases, want)
	}
	if p, ok := r.Phase(perf.PhaseInit); !ok || p.Count != 2 {
		t.Errorf("Phase(init) = %+v, %v", p, ok)
	}
	if _, ok := r.Phase("fence"); ok {
		t.Error("a span became a phase")
	}
}

// Rank 0's figures survive the trip through its node's counters; the
// node's other counters are left as they were.
func TestScaleCounters(t *testing.T) {
	want := *sample().Scale
	c := want.Counters()
	for k := range c {
		if !strings.HasPrefix(k, ScaleCounterPrefix) {
			t.Errorf("counter %q without the prefix", k)
		}
	}
	if c[ScaleCounterPrefix+"median_ns"] != int64(250*time.Microsecond) || c[ScaleCounterPrefix+"late_gap_min_ns"] != -12 {
		t.Errorf("counters %v", c)
	}
	if _, ok := c[ScaleCounterPrefix+"op"]; ok {
		t.Error("op booked as a counter")
	}
	c["net.frames.sent"] = 9
	rest, got, err := SplitScale(c, "ring")
	if err != nil {
		t.Fatal(err)
	}
	if got == nil || *got != want {
		t.Errorf("figures\n got %+v\nwant %+v", got, want)
	}
	if !reflect.DeepEqual(rest, map[string]int64{"net.frames.sent": 9}) {
		t.Errorf("rest %v", rest)
	}
	if len(c) != len(want.Counters())+1 {
		t.Error("SplitScale changed its argument")
	}

	// Zero figures JSON leaves out are not booked, and come back zero.
	plain := Scale{Op: "fence", P: 2, Local: 1, Rounds: 1, Median: 1, Min: 1, Max: 1, Mean: 1, ForeignClocks: 1}
	pc := plain.Counters()
	if _, ok := pc[ScaleCounterPrefix+"span_median_ns"]; ok {
		t.Errorf("absent span booked: %v", pc)
	}
	if _, got, _ := SplitScale(pc, "fence"); got == nil || *got != plain {
		t.Errorf("plain figures came back as %+v", got)
	}

	// Counters without figures, and none at all.
	if rest, s, err := SplitScale(map[string]int64{"a": 1}, "ring"); s != nil || err != nil || rest["a"] != 1 {
		t.Errorf("no figures: %v %v %v", rest, s, err)
	}
	if rest, s, err := SplitScale(nil, "ring"); rest != nil || s != nil || err != nil {
		t.Errorf("nil counters: %v %v %v", rest, s, err)
	}
	if _, _, err := SplitScale(map[string]int64{ScaleCounterPrefix + "nosuch": 1}, "ring"); err == nil {
		t.Error("unknown figure accepted")
	}
}
