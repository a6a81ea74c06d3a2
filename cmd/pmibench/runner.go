package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Launcher is one way of starting a job: a launcher binary and the options
// it gets before "-n N".
type Launcher struct {
	Name string   // column name: "pmirun", "hydra"
	Path string   // the launcher binary
	Args []string // options placed before -n, e.g. -bind-to none
	// NodeArgs, when set, gives options for n ranks, placed after Args
	// (daemon mode: how many agents or daemons the job uses).
	NodeArgs func(n int) []string `json:"-"`
	// Only, when set, names the one workload this launcher runs (the
	// fork+exec floor serves no PMI: it runs the "true" workload only).
	Only string
	// Prog, when set, replaces the workload's program: another MPI's
	// build of the same source (Open MPI's mpirun cannot start an MPICH
	// program as one job), a column of wall time only.
	Prog string
	// Env, when set, is the launcher's whole environment (srun's names
	// the local Slurm's configuration); nil is pmibench's own.
	Env []string `json:"-"`
}

// runs reports whether l runs workload w.
func (l Launcher) runs(w Workload) bool { return l.Only == "" || l.Only == w.Name }

// Argv is the command line that runs prog with n ranks under l.
func (l Launcher) Argv(n int, w Workload) []string {
	argv := make([]string, 0, len(l.Args)+4+len(w.Args))
	argv = append(argv, l.Path)
	argv = append(argv, l.Args...)
	if l.NodeArgs != nil {
		argv = append(argv, l.NodeArgs(n)...)
	}
	prog := w.Prog
	if l.Prog != "" {
		prog = l.Prog
	}
	argv = append(argv, "-n", strconv.Itoa(n), prog)
	if args, ok := w.ArgsFor[l.Name]; ok {
		return append(argv, args...)
	}
	return append(argv, w.Args...)
}

// Workload is a program every launcher runs.
type Workload struct {
	Name string   `json:"name"` // "pmi2", "hello"
	Prog string   `json:"prog"` // absolute path of the program
	Args []string `json:"args,omitempty"`
	// ArgsFor replaces Args for the launcher of that name, for a step a
	// launcher does not support (Hydra 4.0.2 has no PMIX_Ring).
	ArgsFor map[string][]string `json:"args_for,omitempty"`
}

// Sample is one timed run. Wall is set only for runs that exited 0; a run
// that failed carries Err instead and is left out of every statistic.
type Sample struct {
	Seq      int           `json:"seq"` // position in the whole benchmark, warm-up runs excluded
	Workload string        `json:"workload"`
	N        int           `json:"n"`
	Launcher string        `json:"launcher"`
	Run      int           `json:"run"` // index of this launcher's run in its (N, workload) cell
	Wall     time.Duration `json:"wall_ns,omitempty"`
	Err      string        `json:"error,omitempty"`
}

// OK reports whether the run exited 0.
func (s Sample) OK() bool { return s.Err == "" }

// CommandFunc builds the command for one run of argv. The Runner sets the
// command's Stderr (to keep the tail for error messages) and leaves Stdin
// and Stdout nil (/dev/null); the func must leave those alone. It should
// arrange for the whole run to end when ctx is done.
type CommandFunc func(ctx context.Context, argv []string) *exec.Cmd

// stopGrace is how long a launcher has between SIGTERM (run timed out) and
// SIGKILL.
const stopGrace = 5 * time.Second

// ExecCommand is the default CommandFunc. The launcher runs in its own
// process group and dies with pmibench; when ctx is done its group gets
// SIGTERM (so the launcher can tear its ranks down) and, stopGrace later,
// the launcher gets SIGKILL.
func ExecCommand(ctx context.Context, argv []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = sys.RankProcAttr()
	cmd.Cancel = func() error { return sys.SignalGroup(cmd.Process.Pid, sys.SIGTERM) }
	cmd.WaitDelay = stopGrace
	return cmd
}

// Runner times whole launcher runs. The zero value runs with ExecCommand,
// a 60 s timeout and no progress reports.
type Runner struct {
	Command  CommandFunc   // nil = ExecCommand
	Timeout  time.Duration // per run; 0 = 60 s
	Progress func(Sample)  // called after each timed run, if set
}

// Plan says what to run: every workload at every N, Warmup untimed and then
// Runs timed runs per launcher, the launchers alternating run by run.
type Plan struct {
	Ns        []int
	Workloads []Workload
	Launchers []Launcher
	Runs      int
	Warmup    int
}

func (p Plan) validate() error {
	switch {
	case len(p.Ns) == 0:
		return errors.New("no rank counts")
	case len(p.Workloads) == 0:
		return errors.New("no workloads")
	case len(p.Launchers) == 0:
		return errors.New("no launchers")
	case p.Runs < 1:
		return fmt.Errorf("runs %d: want at least 1", p.Runs)
	case p.Warmup < 0:
		return fmt.Errorf("warmup %d: want 0 or more", p.Warmup)
	}
	for _, n := range p.Ns {
		if n < 1 {
			return fmt.Errorf("rank count %d: want at least 1", n)
		}
	}
	return nil
}

// Run executes p and returns every timed sample in the order it was taken.
// For each N and workload it first runs each launcher Warmup times, then
// alternates launcher by launcher (A, B, A, B, ...) so that drift in the
// machine's load hits every launcher alike. A failed run is recorded and
// the benchmark goes on; Run stops early, returning what it has and
// ctx.Err(), when ctx is done: the run that was cut short is left out,
// never counted as failed.
func (r *Runner) Run(ctx context.Context, p Plan) ([]Sample, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("check plan: %w", err)
	}
	var out []Sample
	for _, n := range p.Ns {
		for _, w := range p.Workloads {
			for range p.Warmup {
				for _, l := range p.Launchers {
					if !l.runs(w) {
						continue
					}
					if ctx.Err() != nil {
						return out, ctx.Err()
					}
					r.Once(ctx, l, n, w)
				}
			}
			for run := range p.Runs {
				for _, l := range p.Launchers {
					if !l.runs(w) {
						continue
					}
					if ctx.Err() != nil {
						return out, ctx.Err()
					}
					s := r.Once(ctx, l, n, w)
					if !s.OK() && ctx.Err() != nil {
						// Cut short by the stop, not failed: no sample.
						return out, ctx.Err()
					}
					s.Seq, s.Run = len(out), run
					out = append(out, s)
					if r.Progress != nil {
						r.Progress(s)
					}
				}
			}
		}
	}
	return out, nil
}

// stderrTail is how much of a failed run's stderr goes into its error.
const stderrTail = 512

// Once runs workload w with n ranks under l once and times it wall-clock,
// from just before the launcher is started to just after it has been
// reaped. Seq and Run are left zero.
func (r *Runner) Once(ctx context.Context, l Launcher, n int, w Workload) Sample {
	s := Sample{Workload: w.Name, N: n, Launcher: l.Name}
	timeout := r.Timeout
	if timeout <= 0 {
		timeout = 60 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	newCmd := r.Command
	if newCmd == nil {
		newCmd = ExecCommand
	}
	argv := l.Argv(n, w)
	cmd := newCmd(ctx, argv)
	if l.Env != nil {
		cmd.Env = l.Env
	}
	tail := &tailBuffer{max: stderrTail}
	cmd.Stderr = tail

	start := time.Now()
	err := cmd.Run()
	wall := time.Since(start)
	if ctx.Err() != nil && cmd.Process != nil {
		// Ended early: what the launcher left in its group goes too (srun
		// keeps a helper child that may outlive it by a moment). The group
		// id stays the launcher's while any member lives.
		_ = sys.SignalGroup(cmd.Process.Pid, sys.SIGKILL)
	}

	if err == nil {
		s.Wall = wall
		return s
	}
	var msg string
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		msg = fmt.Sprintf("time out after %v", timeout)
	case ctx.Err() != nil:
		msg = fmt.Sprintf("cancel: %v", ctx.Err())
	default:
		msg = err.Error()
	}
	s.Err = fmt.Sprintf("run %s: %s", strings.Join(argv, " "), msg)
	if t := strings.TrimSpace(tail.String()); t != "" {
		s.Err += ": " + strings.ReplaceAll(t, "\n", " | ")
	}
	return s
}

// tailBuffer keeps the last max bytes written to it. The command's stderr
// copier writes to it from its own goroutine.
type tailBuffer struct {
	max int

	mu  sync.Mutex
	buf bytes.Buffer // guarded by mu
	cut bool         // guarded by mu: bytes were dropped from the front
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
		t.cut = true
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.cut {
		return "..." + t.buf.String()
	}
	return t.buf.String()
}
