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
	"time"

	"github.com/fastpmi/fastpmi/internal/benchplot"
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
	if err := parseFlagSet(fs, args, "pmibench -spawn [options]", "Times spawn latency and spawn rate with per-job agents and with daemons."); err != nil {
		return o, err
	}
	var err error
	if o.sizes, err = parseInts(*sizes); err != nil {
		return o, fmt.Errorf("parse -sizes: %w", err)
	}
	switch {
	case o.count < 1 || o.rounds < 1:
		return o, fmt.Errorf("-count %d, -rounds %d: want at least 1", o.count, o.rounds)
	case o.nodes < 2:
		return o, fmt.Errorf("-nodes %d: want at least 2", o.nodes)
	case o.rateTime < 0:
		return o, fmt.Errorf("-rate-time %v: want 0 or more", o.rateTime)
	}
	return o, nil
}

// spawnSetup is one row of the tables: a number of nodes and a way of
// running the parent job there.
type spawnSetup struct {
	nodes int
	way   string   // "per-job" or "daemon"
	args  []string // pmirun's arguments before -n
}

// spawnRow is what was measured of one setup.
type spawnRow struct {
	setup   spawnSetup
	latency map[int][]time.Duration // by child size: every timed spawn
	launch  map[int][]time.Duration // by job size: pmirun's wall time for a job of noop ranks
	spawns  int                     // rate test
	secs    float64
	errs    []string
}

func runSpawn(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseSpawnFlags(args, stderr)
	root, code, done := start(err, stderr)
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
	// more jobs at once than a daemon runs by default.
	ds, err := startDaemons(ctx, pmirun, o.nodes, stderr, "--max-jobs", strconv.Itoa(maxSpawnJobs))
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	}
	defer ds.stop(stderr)
	secret := []string{"--secret-file", ds.secret}
	pairs := [][2]spawnSetup{
		{{1, "per-job", nil}, {1, "daemon", append([]string{"--daemons", ds.addrs[0]}, secret...)}},
		{{o.nodes, "per-job", []string{"--bootstrap", "loopback", "--nodes", strconv.Itoa(o.nodes)}},
			{o.nodes, "daemon", append([]string{"--daemons", strings.Join(ds.addrs, ",")}, secret...)}},
	}
	var rows []*spawnRow
	for _, pair := range pairs {
		a := &spawnRow{setup: pair[0], latency: map[int][]time.Duration{}, launch: map[int][]time.Duration{}}
		b := &spawnRow{setup: pair[1], latency: map[int][]time.Duration{}, launch: map[int][]time.Duration{}}
		rows = append(rows, a, b)
		for round := 0; round < o.rounds && ctx.Err() == nil; round++ {
			for _, size := range o.sizes {
				for _, row := range []*spawnRow{a, b} {
					fmt.Fprintf(stderr, "pmibench: %d node(s), %s: round %d, spawns of %d\n", row.setup.nodes, row.setup.way, round+1, size)
					row.measureLatency(ctx, o, pmirun, prog, size)
					row.measureLaunch(ctx, o, pmirun, prog, size)
				}
			}
		}
		if o.rateTime > 0 {
			for _, row := range []*spawnRow{a, b} {
				fmt.Fprintf(stderr, "pmibench: %d node(s), %s: spawn rate for %v\n", row.setup.nodes, row.setup.way, o.rateTime)
				row.measureRate(ctx, o, pmirun, prog)
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
		code = 1
	}
	return code
}

// argv is pmirun's command line for the setup's parent job.
func (r *spawnRow) argv(pmirun, prog string, progArgs ...string) []string {
	argv := append([]string{pmirun}, r.setup.args...)
	argv = append(argv, "-n", strconv.Itoa(r.setup.nodes), prog)
	return append(argv, progArgs...)
}

// runJob runs argv and returns its standard output.
func runJob(ctx context.Context, o spawnOptions, argv []string) ([]byte, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cmd := ExecCommand(ctx, argv)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	t0 := time.Now()
	err := cmd.Run()
	wall := time.Since(t0)
	if err != nil {
		return nil, wall, fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, lastLines(errb.String(), 3))
	}
	return out.Bytes(), wall, nil
}

func (r *spawnRow) measureLatency(ctx context.Context, o spawnOptions, pmirun, prog string, size int) {
	const untimed = 2
	out, _, err := runJob(ctx, o, r.argv(pmirun, prog, "latency", strconv.Itoa(size), strconv.Itoa(o.count+untimed)))
	if err != nil {
		r.errs = append(r.errs, err.Error())
		return
	}
	var got []time.Duration
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var n int
		var us float64
		if _, err := fmt.Sscanf(sc.Text(), "spawn_us %d %f", &n, &us); err == nil && n == size {
			got = append(got, time.Duration(us*float64(time.Microsecond)))
		}
	}
	if len(got) != o.count+untimed {
		r.errs = append(r.errs, fmt.Sprintf("spawns of %d: %d timings, want %d", size, len(got), o.count+untimed))
		return
	}
	r.latency[size] = append(r.latency[size], got[untimed:]...)
}

// measureLaunch times a job of size noop ranks launched the same way
// (its nodes as many as the setup's, at most one per rank).
func (r *spawnRow) measureLaunch(ctx context.Context, o spawnOptions, pmirun, prog string, size int) {
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
	argv := append([]string{pmirun}, args...)
	argv = append(argv, "-n", strconv.Itoa(size), prog, "noop")
	if _, wall, err := runJob(ctx, o, argv); err != nil {
		r.errs = append(r.errs, err.Error())
	} else {
		r.launch[size] = append(r.launch[size], wall)
	}
}

func (r *spawnRow) measureRate(ctx context.Context, o spawnOptions, pmirun, prog string) {
	out, _, err := runJob(ctx, o, r.argv(pmirun, prog, "rate", strconv.FormatFloat(o.rateTime.Seconds(), 'f', 3, 64)))
	if err != nil {
		r.errs = append(r.errs, err.Error())
		return
	}
	if _, err := fmt.Sscanf(string(out), "spawn_rate %d %f", &r.spawns, &r.secs); err != nil || r.secs <= 0 {
		r.errs = append(r.errs, fmt.Sprintf("rate test printed %q", out))
	}
}

func medianOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func msText(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64)
}

// writeSpawnTables prints the latency table (median ms of one spawn, and
// of a launch of the same size) and the rate table, with each daemon
// row's ratio to the per-job row above it.
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
	for i, r := range rows {
		spawn := []string{strconv.Itoa(r.setup.nodes), r.setup.way, "spawn ms (median)"}
		launch := []string{strconv.Itoa(r.setup.nodes), r.setup.way, "launch ms (median)"}
		ratio := []string{strconv.Itoa(r.setup.nodes), r.setup.way, "spawn, per-job/daemon"}
		for _, s := range o.sizes {
			m := medianOf(r.latency[s])
			spawn = append(spawn, fmt.Sprintf("%s (%s–%s)", msText(m), msText(slices.Min(append(r.latency[s], m))), msText(slices.Max(append(r.latency[s], m)))))
			launch = append(launch, msText(medianOf(r.launch[s])))
			if i%2 == 1 && m > 0 {
				ratio = append(ratio, fmt.Sprintf("%.2f", float64(medianOf(rows[i-1].latency[s]))/float64(m)))
			}
		}
		row(spawn...)
		row(launch...)
		if i%2 == 1 {
			row(ratio...)
		}
	}
	if o.rateTime == 0 {
		return
	}
	fmt.Fprintln(w)
	row("nodes", "agents", "spawns", "seconds", "spawns/s", "daemon/per-job")
	if o.markdown {
		row(slices.Repeat([]string{"---"}, 6)...)
	}
	for i, r := range rows {
		rate := 0.0
		if r.secs > 0 {
			rate = float64(r.spawns) / r.secs
		}
		ratio := ""
		if i%2 == 1 && rows[i-1].secs > 0 && rate > 0 {
			ratio = fmt.Sprintf("%.2f", rate/(float64(rows[i-1].spawns)/rows[i-1].secs))
		}
		row(strconv.Itoa(r.setup.nodes), r.setup.way, strconv.Itoa(r.spawns), fmt.Sprintf("%.2f", r.secs), fmt.Sprintf("%.1f", rate), ratio)
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
				spawn.Y = append(spawn.Y, ms(medianOf(ls)))
				spawn.Lo = append(spawn.Lo, ms(slices.Min(ls)))
				spawn.Hi = append(spawn.Hi, ms(slices.Max(ls)))
			}
			if ls := r.launch[size]; len(ls) > 0 {
				launch.X = append(launch.X, float64(size))
				launch.Y = append(launch.Y, ms(medianOf(ls)))
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
