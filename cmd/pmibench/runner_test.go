package main

import (
	"context"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

var trueWork = Workload{Name: "w", Prog: "/bin/true"}

// shell is a launcher that runs script with /bin/sh; the rest of the
// command line ("-n N prog") becomes the script's $0, $1, ...
func shell(name, script string) Launcher {
	return Launcher{Name: name, Path: "/bin/sh", Args: []string{"-c", script}}
}

func TestArgv(t *testing.T) {
	l := Launcher{Name: "hydra", Path: "/usr/bin/mpiexec", Args: []string{"-bind-to", "none"}}
	w := Workload{Name: "hello", Prog: "/x/mpi_hello", Args: []string{"a", "b"}}
	got := l.Argv(16, w)
	want := []string{"/usr/bin/mpiexec", "-bind-to", "none", "-n", "16", "/x/mpi_hello", "a", "b"}
	if !slices.Equal(got, want) {
		t.Errorf("Argv = %q, want %q", got, want)
	}
	if got := (Launcher{Path: "pmirun"}).Argv(1, trueWork); !slices.Equal(got, []string{"pmirun", "-n", "1", "/bin/true"}) {
		t.Errorf("Argv = %q", got)
	}
}

func TestOnceSuccess(t *testing.T) {
	var r Runner
	s := r.Once(context.Background(), Launcher{Name: "true", Path: "/bin/true"}, 4, trueWork)
	if !s.OK() || s.Wall <= 0 {
		t.Fatalf("sample = %+v, want a timed success", s)
	}
	if s.Launcher != "true" || s.N != 4 || s.Workload != "w" {
		t.Errorf("sample labels = %+v", s)
	}
}

func TestOnceTimesWholeRun(t *testing.T) {
	var r Runner
	// The launcher passes its arguments on, as a real one would: the run
	// lasts as long as the "program" (sleep) it starts.
	l := shell("sh", `shift; exec "$@"`)
	s := r.Once(context.Background(), l, 2, Workload{Name: "sleep", Prog: "/bin/sleep", Args: []string{"0.2"}})
	if !s.OK() {
		t.Fatalf("run failed: %s", s.Err)
	}
	if s.Wall < 200*time.Millisecond || s.Wall > 5*time.Second {
		t.Errorf("wall = %v, want about 200ms", s.Wall)
	}
}

func TestOnceFailure(t *testing.T) {
	var r Runner
	s := r.Once(context.Background(), shell("sh", "echo boom >&2; exit 3"), 1, trueWork)
	if s.OK() {
		t.Fatal("exit 3 was counted as success")
	}
	if s.Wall != 0 {
		t.Errorf("failed run was timed: %v", s.Wall)
	}
	for _, want := range []string{"run /bin/sh -c", "exit status 3", "boom"} {
		if !strings.Contains(s.Err, want) {
			t.Errorf("error %q does not mention %q", s.Err, want)
		}
	}
}

func TestOnceMissingLauncher(t *testing.T) {
	var r Runner
	s := r.Once(context.Background(), Launcher{Name: "x", Path: "/nonexistent/launcher"}, 1, trueWork)
	if s.OK() || !strings.Contains(s.Err, "/nonexistent/launcher") {
		t.Errorf("sample = %+v, want an error naming the launcher", s)
	}
}

func TestOnceTimeout(t *testing.T) {
	// The launcher's child (sleep) shares its process group, so the
	// timeout must take both down well before stopGrace.
	r := Runner{Timeout: 200 * time.Millisecond}
	start := time.Now()
	s := r.Once(context.Background(), shell("sh", "sleep 30; exit 0"), 1, trueWork)
	if took := time.Since(start); took > stopGrace {
		t.Errorf("timed-out run took %v to return", took)
	}
	if s.OK() || !strings.Contains(s.Err, "time out after 200ms") {
		t.Errorf("sample = %+v, want a time-out error", s)
	}
}

func TestOnceCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	var r Runner
	s := r.Once(ctx, shell("sh", "sleep 30"), 1, trueWork)
	if s.OK() || !strings.Contains(s.Err, "cancel") {
		t.Errorf("sample = %+v, want a cancel error", s)
	}
}

// recorder is a CommandFunc that logs which launcher each run used and
// runs /bin/true (or /bin/false for launchers named "bad").
type recorder struct {
	mu    sync.Mutex
	order []string
}

func (c *recorder) command(ctx context.Context, argv []string) *exec.Cmd {
	c.mu.Lock()
	c.order = append(c.order, argv[0])
	c.mu.Unlock()
	if argv[0] == "bad" {
		return exec.CommandContext(ctx, "/bin/false")
	}
	return exec.CommandContext(ctx, "/bin/true")
}

func TestRunAlternates(t *testing.T) {
	var rec recorder
	var progress []Sample
	r := Runner{Command: rec.command, Progress: func(s Sample) { progress = append(progress, s) }}
	plan := Plan{
		Ns:        []int{1, 4},
		Workloads: []Workload{{Name: "pmi2", Prog: "/bin/true"}, {Name: "hello", Prog: "/bin/true"}},
		Launchers: []Launcher{{Name: "pmirun", Path: "A"}, {Name: "hydra", Path: "B"}},
		Runs:      3,
		Warmup:    1,
	}
	samples, err := r.Run(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	// Per cell: warm-up A B, then A B A B A B; four cells.
	cell := []string{"A", "B", "A", "B", "A", "B", "A", "B"}
	var want []string
	for range 4 {
		want = append(want, cell...)
	}
	if !slices.Equal(rec.order, want) {
		t.Errorf("launch order = %v, want %v", rec.order, want)
	}
	if len(samples) != 2*2*3*2 {
		t.Fatalf("got %d samples, want 24", len(samples))
	}
	if !slices.Equal(samples, progress) {
		t.Error("Progress did not see exactly the returned samples")
	}
	for i, s := range samples {
		cellIdx := i / 6
		wantN := []int{1, 1, 4, 4}[cellIdx]
		wantW := []string{"pmi2", "hello"}[cellIdx%2]
		wantL := []string{"pmirun", "hydra"}[i%2]
		if s.Seq != i || s.Run != (i%6)/2 || s.N != wantN || s.Workload != wantW || s.Launcher != wantL || !s.OK() {
			t.Errorf("sample %d = %+v, want seq %d run %d N %d %s %s", i, s, i, (i%6)/2, wantN, wantW, wantL)
		}
	}
}

func TestRunKeepsGoingAfterFailures(t *testing.T) {
	var rec recorder
	r := Runner{Command: rec.command}
	plan := Plan{
		Ns:        []int{2},
		Workloads: []Workload{trueWork},
		Launchers: []Launcher{{Name: "good", Path: "good"}, {Name: "bad", Path: "bad"}},
		Runs:      2,
	}
	samples, err := r.Run(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	var ok, failed int
	for _, s := range samples {
		if s.OK() {
			ok++
			if s.Launcher != "good" {
				t.Errorf("bad launcher succeeded: %+v", s)
			}
		} else {
			failed++
		}
	}
	if ok != 2 || failed != 2 {
		t.Errorf("ok %d, failed %d; want 2, 2", ok, failed)
	}
}

func TestRunStopsWhenCancelled(t *testing.T) {
	var rec recorder
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	n := 0
	r := Runner{Command: rec.command, Progress: func(Sample) {
		if n++; n == 3 {
			cancel()
		}
	}}
	plan := Plan{Ns: []int{1}, Workloads: []Workload{trueWork}, Launchers: []Launcher{{Name: "a", Path: "a"}}, Runs: 100}
	samples, err := r.Run(ctx, plan)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if len(samples) != 3 {
		t.Errorf("got %d samples after cancelling at 3", len(samples))
	}
}

// A run cut short by the stop (Ctrl-C) is no failure: it was counted as
// one, and the table's failed column said a run failed that Ctrl-C ended.
func TestRunStopMidRunIsNoFailure(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r := Runner{Command: func(ctx context.Context, argv []string) *exec.Cmd {
		if argv[0] == "slow" {
			cancel() // the stop arrives while this run goes on
			return exec.CommandContext(ctx, "/bin/sleep", "30")
		}
		return exec.CommandContext(ctx, "/bin/true")
	}}
	plan := Plan{Ns: []int{1}, Workloads: []Workload{trueWork}, Launchers: []Launcher{{Name: "fast", Path: "fast"}, {Name: "slow", Path: "slow"}}, Runs: 2}
	samples, err := r.Run(ctx, plan)
	if !errors.Is(err, context.Canceled) {
		t.Errorf("err = %v, want context.Canceled", err)
	}
	if len(samples) != 1 || !samples[0].OK() || samples[0].Launcher != "fast" {
		t.Errorf("samples %+v, want the one run of fast that finished", samples)
	}
}

func TestRunRejectsBadPlan(t *testing.T) {
	var r Runner
	good := Plan{Ns: []int{1}, Workloads: []Workload{trueWork}, Launchers: []Launcher{{Name: "a", Path: "/bin/true"}}, Runs: 1}
	for name, mutate := range map[string]func(*Plan){
		"no ns":     func(p *Plan) { p.Ns = nil },
		"zero n":    func(p *Plan) { p.Ns = []int{0} },
		"no work":   func(p *Plan) { p.Workloads = nil },
		"no launch": func(p *Plan) { p.Launchers = nil },
		"no runs":   func(p *Plan) { p.Runs = 0 },
		"warmup":    func(p *Plan) { p.Warmup = -1 },
	} {
		p := good
		mutate(&p)
		if _, err := r.Run(context.Background(), p); err == nil || !strings.HasPrefix(err.Error(), "check plan: ") {
			t.Errorf("%s: err = %v, want a plan error", name, err)
		}
	}
	if _, err := r.Run(context.Background(), good); err != nil {
		t.Errorf("good plan: %v", err)
	}
}

func TestTailBuffer(t *testing.T) {
	tb := &tailBuffer{max: 8}
	tb.Write([]byte("hello "))
	if got := tb.String(); got != "hello " {
		t.Errorf("tail = %q", got)
	}
	tb.Write([]byte("world, again"))
	if got := tb.String(); got != "...d, again" {
		t.Errorf("tail = %q, want %q", got, "...d, again")
	}
}

// A launcher with Only runs that workload alone (the fork+exec floor runs
// the true workload, never a PMI one), still alternating with the others.
func TestRunOnly(t *testing.T) {
	var rec recorder
	r := Runner{Command: rec.command}
	plan := Plan{
		Ns:        []int{2},
		Workloads: []Workload{{Name: "pmi2", Prog: "/bin/true"}, {Name: "true", Prog: "/bin/true"}},
		Launchers: []Launcher{{Name: "pmirun", Path: "A"}, {Name: "floor", Path: "F", Only: "true"}},
		Runs:      2,
		Warmup:    1,
	}
	samples, err := r.Run(context.Background(), plan)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"A", "A", "A", "A", "F", "A", "F", "A", "F"}
	if !slices.Equal(rec.order, want) {
		t.Errorf("launch order = %v, want %v", rec.order, want)
	}
	for _, s := range samples {
		if s.Launcher == "floor" && s.Workload != "true" {
			t.Errorf("floor ran %s", s.Workload)
		}
	}
	if len(samples) != 6 {
		t.Errorf("%d samples, want 6", len(samples))
	}
}
