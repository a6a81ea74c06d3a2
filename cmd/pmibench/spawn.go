package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/benchplot"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
)

// Spawn mode (-spawn): the research's spawn benchmarks, run by a real
// libpmi2 program (tests/cprog/pmi2_spawnbench.c) whose rank 0 times its
// own PMI2_Job_Spawn calls.
//
//   - latency: the time of one spawn call in the parent, children of each
//     -sizes, -count spawns in a row (after two untimed ones); median,
//     min and max. Next to it, the time pmirun takes to launch a job of
//     the same size whose ranks do the same (PMI init and finalize):
//     what a spawn is to be compared with.
//   - rate: spawns per second of one-process children, back to back for
//     -rate-time, the children sleeping until the end.
//
// Each is measured with per-job agents and with running daemons, on one
// node (the fork bootstrap: the agent inside pmirun; one daemon) and on
// -nodes nodes (loopback agents, one per node, started for the parent
// job and running its spawned jobs too; as many daemons), alternating
// the two ways -rounds times.
//
// With -slurm a third way joins the one-node rows: the same program under
// "srun --mpi=pmi2" on a one-node Slurm pmibench starts (slurm.go), its
// PMI2_Job_Spawn served by Slurm's pmi2 plugin, which runs one more srun
// per spawn for a new step of the job. That srun takes its options from
// the environment pmibench gives the parent's: SLURM_OVERLAP=1 (without
// it Slurm 22.05 gives the parent step every CPU of the job and the
// spawned step waits for them forever) and SLURM_OVERCOMMIT=1 (children
// beyond the node's CPUs). Its launch column is "srun -n SIZE ... noop",
// a new job each.

// rateFileLimit is the RLIMIT_NOFILE pmibench gives the rate test's
// launchers where it may: 10 s of spawns on one node leave thousands of
// live jobs, about 6 descriptors each in pmirun (12 with daemons).
const rateFileLimit = 1 << 20

// spawnOptions are spawn mode's parsed command line.
type spawnOptions struct {
	sizes    []int
	count    int
	rounds   int
	rateTime time.Duration
	nodes    int
	pmirun   string
	prog     string
	timeout  time.Duration
	markdown bool
	plotDir  string
	slurm    bool
}

const defaultSpawnProg = "build/cprog/pmi2_spawnbench"

// maxSpawnJobs is the daemons' --max-jobs in spawn mode.
const maxSpawnJobs = 8192

func parseSpawnFlags(args []string, stderr io.Writer) (spawnOptions, error) {
	var o spawnOptions
	fs := flag.NewFlagSet("pmibench -spawn", flag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("sizes", "1,2,4,8,16,64", "comma-separated child job sizes for the latency test")
	fs.IntVar(&o.count, "count", 20, "timed spawns per size, launcher and round")
	fs.IntVar(&o.rounds, "rounds", 2, "rounds alternating per-job agents and daemons")
	fs.DurationVar(&o.rateTime, "rate-time", 10*time.Second, "how long the rate test spawns (0 skips it)")
	fs.IntVar(&o.nodes, "nodes", 4, "nodes of the multi-node rows (loopback agents, daemons)")
	fs.StringVar(&o.pmirun, "pmirun", "", "pmirun binary (default "+defaultPmirun+" under the repo root, else pmirun in PATH)")
	fs.StringVar(&o.prog, "prog", "", "the spawning program (default "+defaultSpawnProg+" under the repo root)")
	fs.DurationVar(&o.timeout, "timeout", 300*time.Second, "limit for one run")
	fs.BoolVar(&o.markdown, "markdown", false, "print the tables as markdown")
	fs.StringVar(&o.plotDir, "plot", "", "write the latency figure (spawn-latency.svg and .png) to `DIR`")
	fs.BoolVar(&o.slurm, "slurm", false, "start a one-node Slurm (root) and add a row: the same program under srun --mpi=pmi2, Slurm's PMI-2 spawn")
	if err := parseFlagSet(fs, args, "pmibench -spawn [options]", "Times spawn latency and spawn rate with per-job agents and with daemons."); err != nil {
		return o, err
	}
	var err error
	if o.sizes, err = parseInts(*sizes); err != nil {
		return o, fmt.Errorf("parse -sizes: %w", err)
	}
	switch {
	case o.count < 1:
		return o, fmt.Errorf("parse -count: %d is below 1", o.count)
	case o.rounds < 1:
		return o, fmt.Errorf("parse -rounds: %d is below 1", o.rounds)
	case o.nodes < 2:
		return o, fmt.Errorf("parse -nodes: %d is below 2", o.nodes)
	case o.rateTime < 0:
		return o, fmt.Errorf("parse -rate-time: %v is negative", o.rateTime)
	case o.timeout <= 0:
		return o, fmt.Errorf("parse -timeout: %v is not positive", o.timeout)
	}
	return o, nil
}

// spawnSetup is one row of the tables: a number of nodes and a way of
// running the parent job there.
type spawnSetup struct {
	nodes int
	way   string   // "per-job", "daemon" or "slurm"
	path  string   // the launcher: pmirun, or srun
	args  []string // the launcher's arguments before -n
	env   []string // the launcher's environment; nil: pmibench's
}

// spawnRow is what was measured of one setup.
type spawnRow struct {
	setup   spawnSetup
	latency map[int][]time.Duration // by child size: every timed spawn
	launch  map[int][]time.Duration // by job size: the launcher's wall time for a job of noop ranks
	hung    map[int]int             // by child size: spawns that never returned (Slurm)
	spawns  int                     // rate test
	secs    float64
	refused bool // the launcher refused a spawn before the time was up: the rate is that of the spawns before it
	errs    []string
	// vs, when set, is the row this one is compared with in the tables:
	// slow is the slower way (latency slow/fast, rate fast/slow).
	vs *spawnRatio
}

// spawnRatio names the two rows of a comparison.
type spawnRatio struct{ slow, fast *spawnRow }

func (q *spawnRatio) label() string { return q.slow.setup.way + "/" + q.fast.setup.way }

func runSpawn(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseSpawnFlags(args, stderr)
	root, code, done := start(err, stderr, "", o.plotDir)
	if done {
		return code
	}
	pmirun, err := findPmirun(o.pmirun, root)
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	}
	prog, err := resolveProg(o.prog, defaultSpawnProg, root)
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: find the spawning program: %v (run make cprog, or pass -prog PATH)\n", err)
		return 2
	}
	// The rate test keeps every child job running until its end: far
	// more jobs at once than a daemon runs by default, each holding a
	// few descriptors in pmirun or a daemon (the launchers inherit the
	// limit raised here). What the test measures is the launcher's rate,
	// not the shell's ulimit -n: a launcher that is out of descriptors
	// anyway refuses the spawn (the row says so).
	if o.rateTime > 0 {
		if lim, err := sys.RaiseFileLimit(rateFileLimit); err != nil {
			fmt.Fprintf(stderr, "pmibench: the rate test runs with RLIMIT_NOFILE %d: %v\n", lim, err)
		} else if lim < rateFileLimit {
			fmt.Fprintf(stderr, "pmibench: the rate test runs with RLIMIT_NOFILE %d (not raised to %d)\n", lim, rateFileLimit)
		}
	}
	ds, err := startDaemons(ctx, pmirun, o.nodes, stderr, "--max-jobs", strconv.Itoa(maxSpawnJobs))
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	}
	defer ds.stop(stderr)
	secret := []string{"--secret-file", ds.secret}
	groups := [][]spawnSetup{
		{{1, "per-job", pmirun, nil, nil}, {1, "daemon", pmirun, append([]string{"--daemons", ds.addrs[0]}, secret...), nil}},
		{{o.nodes, "per-job", pmirun, []string{"--bootstrap", "loopback", "--nodes", strconv.Itoa(o.nodes)}, nil},
			{o.nodes, "daemon", pmirun, append([]string{"--daemons", strings.Join(ds.addrs, ",")}, secret...), nil}},
	}
	if o.slurm {
		sl, err := startSlurm(ctx, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			return 1
		}
		defer sl.stop(stderr)
		l := sl.launcher("")
		env := append(slices.Clone(l.Env), "SLURM_OVERLAP=1", "SLURM_OVERCOMMIT=1")
		groups[0] = append(groups[0], spawnSetup{1, "slurm", l.Path, l.Args, env})
	}
	var rows []*spawnRow
	for _, group := range groups {
		var gr []*spawnRow
		for _, setup := range group {
			gr = append(gr, &spawnRow{setup: setup, latency: map[int][]time.Duration{}, launch: map[int][]time.Duration{}, hung: map[int]int{}})
		}
		// daemon against per-job agents; Slurm against the daemon.
		gr[1].vs = &spawnRatio{slow: gr[0], fast: gr[1]}
		if len(gr) > 2 {
			gr[2].vs = &spawnRatio{slow: gr[2], fast: gr[1]}
		}
		rows = append(rows, gr...)
		for round := 0; round < o.rounds && ctx.Err() == nil; round++ {
			for _, size := range o.sizes {
				for _, row := range gr {
					fmt.Fprintf(stderr, "pmibench: %d node(s), %s: round %d, spawns of %d\n", row.setup.nodes, row.setup.way, round+1, size)
					row.measureLatency(ctx, o, prog, size)
					row.measureLaunch(ctx, o, prog, size)
				}
			}
		}
		if o.rateTime > 0 {
			for _, row := range gr {
				if ctx.Err() != nil {
					break
				}
				fmt.Fprintf(stderr, "pmibench: %d node(s), %s: spawn rate for %v\n", row.setup.nodes, row.setup.way, o.rateTime)
				row.measureRate(ctx, o, prog)
			}
		}
	}
	writeSpawnTables(stdout, o, rows)
	code = 0
	if o.plotDir != "" {
		files, err := plotSpawn(o.plotDir, o, rows)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: plot: %v\n", err)
			code = 1
		}
		for _, f := range files {
			fmt.Fprintf(stderr, "pmibench: wrote %s\n", f)
		}
	}
	for _, r := range rows {
		for _, e := range r.errs {
			fmt.Fprintf(stderr, "pmibench: %d node(s), %s: %s\n", r.setup.nodes, r.setup.way, e)
			code = 1
		}
	}
	if ctx.Err() != nil {
		fmt.Fprintf(stderr, "pmibench: stopped early: %v\n", context.Cause(ctx))
		code = 1
	}
	return code
}

// argv is the command line of the setup's parent job.
func (r *spawnRow) argv(prog string, progArgs ...string) []string {
	argv := append([]string{r.setup.path}, r.setup.args...)
	argv = append(argv, "-n", strconv.Itoa(r.setup.nodes), prog)
	return append(argv, progArgs...)
}

// runJob runs argv in env (nil: pmibench's) and returns its standard
// output.
func runJob(ctx context.Context, o spawnOptions, argv, env []string) ([]byte, time.Duration, error) {
	out, wall, _, err := runJobStall(ctx, o, argv, env, 0)
	return out, wall, err
}

// slurmSpawnStall is how long a spawn under Slurm may take before it
// counts as hung: Slurm 22.05's PMI2_Job_Spawn sometimes never returns,
// its children's srun long gone (docs/spawn.md).
const slurmSpawnStall = 30 * time.Second

// runJobStall is runJob that also ends the job, returning stalled, when
// stall (> 0) passes without a new line of output; the output so far is
// returned with any error.
func runJobStall(ctx context.Context, o spawnOptions, argv, env []string, stall time.Duration) (out []byte, wall time.Duration, stalled bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cmd := ExecCommand(ctx, argv)
	cmd.Env = env
	stdout := &lineClock{last: time.Now()}
	var errb tailBuffer
	errb.max = stderrTail
	cmd.Stdout, cmd.Stderr = stdout, &errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, 0, false, fmt.Errorf("%s: %w", strings.Join(argv, " "), err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // received below
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for err == nil {
		select {
		case err = <-done:
			if err == nil {
				return stdout.bytes(), time.Since(t0), false, nil
			}
		case <-tick.C:
			if stall > 0 && !stalled && stdout.since() > stall {
				stalled = true
				cancel()
			}
		}
	}
	wall = time.Since(t0)
	return stdout.bytes(), wall, stalled, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, lastLines(errb.String(), 3))
}

// lineClock collects a job's standard output and when its last line
// ended. The command's copier writes to it from its own goroutine.
type lineClock struct {
	mu   sync.Mutex
	buf  bytes.Buffer // guarded by mu
	last time.Time    // guarded by mu: the last newline written, or the start
}

func (c *lineClock) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.buf.Write(p)
	if bytes.IndexByte(p, '\n') >= 0 {
		c.last = time.Now()
	}
	return len(p), nil
}

func (c *lineClock) since() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.last)
}

func (c *lineClock) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

// fail records the error of one of the row's jobs, unless the
// benchmark's stop (ctx: Ctrl-C, SIGTERM) ended it: that job did not
// fail, and the stop is said once, at the end.
func (r *spawnRow) fail(ctx context.Context, err error) {
	if ctx.Err() == nil {
		r.errs = append(r.errs, err.Error())
	}
}

// spawnAttempts bounds the jobs a Slurm row runs for one size and round
// when spawns hang.
const spawnAttempts = 3

// measureLatency runs the latency test once: -count timed spawns of size
// children after two untimed ones. Under Slurm a spawn may hang: the job
// is ended slurmSpawnStall after its last answer, the hang counted, the
// timings before it kept, and a new job asks for the rest (at most
// spawnAttempts jobs).
func (r *spawnRow) measureLatency(ctx context.Context, o spawnOptions, prog string, size int) {
	const untimed = 2
	var stall time.Duration
	attempts := 1
	if r.setup.way == "slurm" {
		stall, attempts = slurmSpawnStall, spawnAttempts
	}
	var got []time.Duration
	for range attempts {
		want := o.count - len(got)
		if want <= 0 || ctx.Err() != nil {
			break
		}
		out, _, stalled, err := runJobStall(ctx, o, r.argv(prog, "latency", strconv.Itoa(size), strconv.Itoa(want+untimed)), r.setup.env, stall)
		var these []time.Duration
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			var n int
			var us float64
			if _, err := fmt.Sscanf(sc.Text(), "spawn_us %d %f", &n, &us); err == nil && n == size {
				these = append(these, time.Duration(us*float64(time.Microsecond)))
			}
		}
		if len(these) > untimed {
			got = append(got, these[untimed:]...)
		}
		switch {
		case stalled:
			r.hung[size]++
		case err != nil:
			r.fail(ctx, err)
			return
		case len(these) != want+untimed:
			r.errs = append(r.errs, fmt.Sprintf("spawns of %d: %d timings, want %d", size, len(these), want+untimed))
			return
		}
	}
	if r.hung[size] > 0 {
		r.errs = append(r.errs, fmt.Sprintf("spawns of %d: %d hung (no answer within %v), %d of %d timed spawns done", size, r.hung[size], stall, len(got), o.count))
	}
	r.latency[size] = append(r.latency[size], got...)
}

// measureLaunch times a job of size noop ranks launched the same way
// (its nodes as many as the setup's, at most one per rank).
func (r *spawnRow) measureLaunch(ctx context.Context, o spawnOptions, prog string, size int) {
	setup := *r
	setup.setup.nodes = min(r.setup.nodes, size)
	args := slices.Clone(r.setup.args)
	for i, a := range args {
		switch {
		case a == "--nodes":
			args[i+1] = strconv.Itoa(setup.setup.nodes)
		case a == "--daemons":
			args[i+1] = strings.Join(strings.Split(args[i+1], ",")[:setup.setup.nodes], ",")
		}
	}
	argv := append([]string{r.setup.path}, args...)
	argv = append(argv, "-n", strconv.Itoa(size), prog, "noop")
	if _, wall, err := runJob(ctx, o, argv, r.setup.env); err != nil {
		r.fail(ctx, err)
	} else {
		r.launch[size] = append(r.launch[size], wall)
	}
}

// measureRate runs the rate test; under Slurm a job whose output has
// not come slurmSpawnStall after the test's end is ended as hung.
func (r *spawnRow) measureRate(ctx context.Context, o spawnOptions, prog string) {
	var stall time.Duration
	if r.setup.way == "slurm" {
		stall = o.rateTime + slurmSpawnStall
	}
	out, _, stalled, err := runJobStall(ctx, o, r.argv(prog, "rate", strconv.FormatFloat(o.rateTime.Seconds(), 'f', 3, 64)), r.setup.env, stall)
	if stalled {
		r.errs = append(r.errs, fmt.Sprintf("rate test hung: no answer %v after its end", slurmSpawnStall))
		return
	}
	if err != nil {
		r.fail(ctx, err)
		return
	}
	var refused string
	if n, err := fmt.Sscanf(string(out), "spawn_rate %d %f %s", &r.spawns, &r.secs, &refused); n < 2 || r.secs <= 0 {
		r.errs = append(r.errs, fmt.Sprintf("rate test printed %q (%v)", out, err))
	}
	r.refused = refused == "refused"
}

func msText(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// writeSpawnTables prints the latency table (median ms of one spawn, and
// of a launch of the same size) and the rate table, with each compared
// row's ratio (per-job/daemon under a daemon row, slurm/daemon under
// Slurm's): how many times faster the faster way is.
func writeSpawnTables(w io.Writer, o spawnOptions, rows []*spawnRow) {
	row := func(cells ...string) {
		if o.markdown {
			fmt.Fprintf(w, "| %s |\n", strings.Join(cells, " | "))
		} else {
			fmt.Fprintln(w, strings.Join(cells, "\t"))
		}
	}
	head := []string{"nodes", "agents", "measure"}
	for _, s := range o.sizes {
		head = append(head, "N="+strconv.Itoa(s))
	}
	row(head...)
	if o.markdown {
		row(slices.Repeat([]string{"---"}, len(head))...)
	}
	for _, r := range rows {
		spawn := []string{strconv.Itoa(r.setup.nodes), r.setup.way, "spawn ms (median)"}
		launch := []string{strconv.Itoa(r.setup.nodes), r.setup.way, "launch ms (median)"}
		var ratio []string
		if r.vs != nil {
			ratio = []string{strconv.Itoa(r.setup.nodes), r.setup.way, "spawn, " + r.vs.label()}
		}
		for _, s := range o.sizes {
			m := perf.Median(r.latency[s])
			cell := fmt.Sprintf("%s (%s–%s)", msText(m), msText(slices.Min(append(r.latency[s], m))), msText(slices.Max(append(r.latency[s], m))))
			if h := r.hung[s]; h > 0 {
				cell += fmt.Sprintf(" [%d hung]", h)
			}
			spawn = append(spawn, cell)
			launch = append(launch, msText(perf.Median(r.launch[s])))
			if r.vs != nil {
				slow, fast := perf.Median(r.vs.slow.latency[s]), perf.Median(r.vs.fast.latency[s])
				q := "-"
				if slow > 0 && fast > 0 {
					q = fmt.Sprintf("%.2f", float64(slow)/float64(fast))
				}
				ratio = append(ratio, q)
			}
		}
		row(spawn...)
		row(launch...)
		if r.vs != nil {
			row(ratio...)
		}
	}
	if o.rateTime == 0 {
		return
	}
	fmt.Fprintln(w)
	row("nodes", "agents", "spawns", "seconds", "spawns/s", "faster/slower")
	if o.markdown {
		row(slices.Repeat([]string{"---"}, 6)...)
	}
	rateOf := func(r *spawnRow) float64 {
		if r.secs <= 0 {
			return 0
		}
		return float64(r.spawns) / r.secs
	}
	for _, r := range rows {
		ratio := ""
		if r.vs != nil {
			if slow, fast := rateOf(r.vs.slow), rateOf(r.vs.fast); slow > 0 && fast > 0 {
				ratio = fmt.Sprintf("%.2f (%s/%s)", fast/slow, r.vs.fast.setup.way, r.vs.slow.setup.way)
			}
		}
		if r.secs <= 0 {
			// Not measured (stopped before it, or its job failed): no
			// figures, never a rate of 0.
			row(strconv.Itoa(r.setup.nodes), r.setup.way, "-", "-", "-", ratio)
			continue
		}
		spawns := strconv.Itoa(r.spawns)
		if r.refused {
			spawns += " (then refused)"
		}
		row(strconv.Itoa(r.setup.nodes), r.setup.way, spawns, fmt.Sprintf("%.2f", r.secs), fmt.Sprintf("%.1f", rateOf(r)), ratio)
	}
}

// plotSpawn draws spawn latency over the child job's size, one line per
// setup (median, min–max), with the launch of a job of that size by the
// same setup dashed beside it.
func plotSpawn(dir string, o spawnOptions, rows []*spawnRow) ([]string, error) {
	var series []benchplot.Series
	for _, r := range rows {
		name := fmt.Sprintf("%d node(s), %s", r.setup.nodes, r.setup.way)
		spawn := benchplot.Series{Name: "spawn, " + name, Lo: []float64{}, Hi: []float64{}}
		launch := benchplot.Series{Name: "launch, " + name}
		for _, size := range o.sizes {
			if ls := r.latency[size]; len(ls) > 0 {
				spawn.X = append(spawn.X, float64(size))
				spawn.Y = append(spawn.Y, ms(perf.Median(ls)))
				spawn.Lo = append(spawn.Lo, ms(slices.Min(ls)))
				spawn.Hi = append(spawn.Hi, ms(slices.Max(ls)))
			}
			if ls := r.launch[size]; len(ls) > 0 {
				launch.X = append(launch.X, float64(size))
				launch.Y = append(launch.Y, ms(perf.Median(ls)))
			}
		}
		series = append(series, spawn, launch)
	}
	p, err := benchplot.Lines(benchplot.Axes{
		Title: "spawn latency (median, min–max) and launch of a job of that size", X: "processes spawned",
		Y: "wall time (ms)", LogX: true, LogY: true,
	}, series)
	if err != nil {
		return nil, err
	}
	return benchplot.Save(p, dir, "spawn-latency")
}
