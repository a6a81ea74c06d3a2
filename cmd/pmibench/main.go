// Command pmibench times pmirun against MPICH's Hydra (mpiexec), and
// with -slurm and -ompi against Slurm's srun and Open MPI's mpirun, side
// by side on the same workloads.
//
//	pmibench [-runs 10] [-warmup 1] [-n 1,4,16,64,128] [-workload pmi2,hello]
//	         [-pmirun PATH] [-mpiexec PATH|none] [-pmi2-prog PATH] [-hello-prog PATH]
//	         [-timeout 60s] [-markdown] [-json FILE] [-plot DIR] [-v] [-lib DIR]
//	         [-slurm] [-ompi PATH [-ompi-hello-prog PATH]] [-mpi pmix [-pmix-prog PATH]]
//
// With -lib DIR (a directory holding a libpmi2.so.0, such as libfastpmi's
// build/lib) a first column runs pmirun with its ranks loading that
// library over shared memory, so the ratio column compares it with the
// programs' own libpmi2 under the same pmirun.
//
// For every rank count N and workload it runs "pmirun -n N PROG" and
// "mpiexec [-bind-to none] -n N PROG", first -warmup untimed runs of each,
// then -runs timed runs of each, alternating (pmirun, hydra, pmirun,
// hydra, ...) so that a change in the machine's load hits both alike. Each
// run is timed wall-clock, from starting the launcher to reaping it, with
// stdin and stdout on /dev/null. A run that does not exit 0 (or outlives
// -timeout) is reported on stderr as an error and left out of the
// statistics. At the end pmibench prints one row per (workload, N): the
// median of each launcher, the ratio pmirun/hydra (below 1 means pmirun is
// faster), each launcher's min and max, and the number of failed runs; as
// aligned text, or as a markdown table with -markdown. -json FILE also
// writes every raw sample with the configuration. -plot DIR draws the
// figures (SVG and PNG, see plot.go): each workload's median wall time
// over N per launcher, and pmirun's phases at each N, read from a
// --report that every timed pmirun run then writes (a file write at the
// end of each run, counted in its time). The exit status is 1 if
// any run failed or pmibench was interrupted, 2 on a usage error.
//
// Workloads: "pmi2" runs -pmi2-prog (default build/cprog/pmi2_bench) and
// "hello" runs -hello-prog (default build/cprog/mpi_hello); defaults are
// relative to the repository root (found by walking up from the current
// directory to fastpmi's go.mod), paths given on the command line are
// relative to the current directory. "make cprog" builds both. Any program
// works, e.g. -workload pmi2 -pmi2-prog /bin/true to time bare launches.
//
// Workload "true" runs -true-prog (default build/cprog/true_static, a
// static program that exits at once) and measures bare launches; with it,
// -floor (default build/cprog/forkfloor, when built) adds the fork+exec
// floor as a launcher of its own, "floor": a minimal C launcher forking
// N copies, timed in the same alternation as the others.
//
// Launchers: -pmirun defaults to build/bin/pmirun under the repository root,
// else pmirun in PATH. -mpiexec defaults to mpiexec.hydra, else mpiexec, in
// PATH; when neither exists (or with -mpiexec none) the Hydra columns are
// left out with a note. pmibench reads "mpiexec -h" once: it passes
// "-bind-to none" when the launcher accepts it (pmirun does not bind
// either), and names the column "hydra" only if the help text says Hydra,
// "pmirun-B" for another pmirun build (to time two builds side by side),
// else "mpiexec".
//
// With -slurm pmibench starts a one-node Slurm of its own (munged,
// slurmctld and slurmd in a PID namespace, as the tests start theirs; see
// slurm.go) and adds a column "slurm": "srun --mpi=pmi2 --overcommit -n N
// PROG", each run a whole Slurm job; Slurm is stopped when pmibench ends,
// whatever ends it. With -ompi PATH (Open MPI's mpirun) a column
// "ompi-mpirun*" runs the hello workload with -ompi-hello-prog (default
// build/cprog/ompi_hello: the same source built with Open MPI): a
// different MPI, so wall time only, marked "*". With -mpi pmix (Open MPI
// programs: pmirun --mpi pmix, srun --mpi=pmix) the column is
// "ompi-mpirun" and runs every workload's program as is; workload "pmix"
// runs -pmix-prog (default build/cprog/pmix_bench, a PMIx client doing
// put, commit, fence and a get of every rank's key). The table has one
// ratio column per peer: the first launcher's median over the peer's.
//
// With -scale pmibench instead runs many loopback agents with goroutine
// ranks and reports time, bytes and messages per collective; see scale.go.
// With -spawn it times spawn latency and spawn rate; see spawn.go. With
// -paper it reproduces the research's figures 9-12 and Table II (Fence vs
// Allgather, overlap of the non-blocking ones with compute, an
// MPI_Init-style start-up) on the -scale harness; see paper.go.
//
// Example (what "make bench" runs):
//
//	pmibench -n 1,4,16,64,128 -runs 10 -pmirun build/bin/pmirun \
//		-pmi2-prog build/cprog/pmi2_bench -hello-prog build/cprog/mpi_hello
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/agentmain"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/internal/version"
	"github.com/fastpmi/fastpmi/internal/virtual"
	"github.com/fastpmi/fastpmi/jobreport"
)

const modulePath = "github.com/fastpmi/fastpmi"

// Default locations, relative to the repository root.
const (
	defaultPmirun    = "build/bin/pmirun"
	defaultPMI2Prog  = "build/cprog/pmi2_bench"
	defaultHelloProg = "build/cprog/mpi_hello"
	defaultTrueProg  = "build/cprog/true_static"
	defaultFloor     = "build/cprog/forkfloor"
	defaultPMIxProg  = "build/cprog/pmix_bench"
	defaultOmpiHello = "build/cprog/ompi_hello"
)

func main() {
	if len(os.Args) == 2 && (os.Args[1] == "--version" || os.Args[1] == "-version") {
		fmt.Println(version.String("pmibench"))
		return
	}
	if len(os.Args) > 1 && (os.Args[1] == "--node" || os.Args[1] == "-node") {
		// pmirun started this binary as the agent of a job of virtual
		// ranks (pmid plays none: it does not link the client library).
		// Its ranks are goroutines: no guard.
		os.Exit(agentmain.Main("pmibench", "", os.Args[1:], os.Stdin, os.Stdout, os.Stderr, virtual.Start))
	}
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGINT, sys.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// options are the parsed command line.
type options struct {
	runs, warmup int
	ns           []int
	workloads    []string
	pmirun       string
	mpiexec      string
	pmi2Prog     string
	helloProg    string
	trueProg     string
	floor        string
	timeout      time.Duration
	markdown     bool
	jsonPath     string
	plotDir      string
	verbose      bool
	daemon       bool // time pmirun on running daemons against per-job loopback agents
	daemonNodes  int
	lib          string // a libpmi2.so.0 directory (libfastpmi): its own pmirun column, first
	mpi          string // pmirun's --mpi ("" = its default)
	pmixProg     string
	slurm        bool   // start a local Slurm and add its srun column
	ompi         string // Open MPI's mpirun: a column of its own ("" = none)
	ompiHello    string // the hello source built with Open MPI, for -ompi without -mpi pmix
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("pmibench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.IntVar(&o.runs, "runs", 10, "timed runs per launcher, N and workload")
	fs.IntVar(&o.warmup, "warmup", 1, "untimed runs per launcher before the timed ones")
	nList := fs.String("n", "1,4,16,64,128", "comma-separated rank counts")
	wList := fs.String("workload", "pmi2,hello", "comma-separated workloads: pmi2, hello, true, pmix (with -mpi pmix)")
	fs.StringVar(&o.pmirun, "pmirun", "", "pmirun binary (default "+defaultPmirun+" under the repo root, else pmirun in PATH)")
	fs.StringVar(&o.mpiexec, "mpiexec", "", `Hydra's mpiexec (default mpiexec.hydra, else mpiexec, in PATH; "none" to skip)`)
	fs.StringVar(&o.pmi2Prog, "pmi2-prog", "", "program of the pmi2 workload (default "+defaultPMI2Prog+" under the repo root)")
	fs.StringVar(&o.helloProg, "hello-prog", "", "program of the hello workload (default "+defaultHelloProg+" under the repo root)")
	fs.StringVar(&o.pmixProg, "pmix-prog", "", "program of the pmix workload (default "+defaultPMIxProg+" under the repo root)")
	fs.BoolVar(&o.slurm, "slurm", false, "start a one-node Slurm (munged, slurmctld, slurmd; root) for the run and add a column: srun --mpi=pmi2 (--mpi=pmix with -mpi pmix); stopped at the end")
	fs.StringVar(&o.ompi, "ompi", "", "Open MPI's mpirun (e.g. mpirun.openmpi): adds a column; without -mpi pmix it runs the hello workload only, with -ompi-hello-prog (a different MPI: wall time only)")
	fs.StringVar(&o.ompiHello, "ompi-hello-prog", "", "the hello program built with Open MPI, for -ompi without -mpi pmix (default "+defaultOmpiHello+" under the repo root)")
	fs.StringVar(&o.trueProg, "true-prog", "", "program of the true workload (default "+defaultTrueProg+" under the repo root)")
	fs.StringVar(&o.floor, "floor", "", `fork+exec floor launcher for the true workload (default `+defaultFloor+` under the repo root when built; "none" to skip)`)
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "limit for one run")
	fs.BoolVar(&o.markdown, "markdown", false, "print the table as markdown")
	fs.StringVar(&o.jsonPath, "json", "", "write every raw sample as JSON to this file")
	fs.StringVar(&o.plotDir, "plot", "", "draw the figures (SVG and PNG) into this `DIR`; pmirun's runs then write a --report for their phases")
	fs.BoolVar(&o.verbose, "v", false, "print every run as it finishes")
	fs.BoolVar(&o.daemon, "daemon", false, "instead of Hydra, time pmirun on running daemons (pmid --daemon, started by pmibench) against per-job agents over the loopback bootstrap")
	fs.StringVar(&o.lib, "lib", "", "directory of another libpmi2.so.0 (e.g. build/lib, libfastpmi): adds a first column, pmirun with ranks loading it (LD_LIBRARY_PATH) over shared memory (FASTPMI_TRANSPORT=shm)")
	fs.StringVar(&o.mpi, "mpi", "", "pmirun's --mpi for every job (pmix: Open MPI programs; compare with Open MPI's mpirun as -mpiexec)")
	fs.IntVar(&o.daemonNodes, "daemon-nodes", 2, "with -daemon: daemons, and loopback agents per job (fewer when N is smaller)")
	if err := parseFlagSet(fs, args, "pmibench [options]", "Times pmirun against Hydra's mpiexec (and, with -slurm and -ompi, Slurm's srun and Open MPI's mpirun), alternating runs.\n"+
		"With -scale (collectives over goroutine ranks in loopback agents), -spawn (spawn latency and rate) or -paper (the research's figures) it runs that benchmark instead: pmibench -scale -h, -spawn -h, -paper -h list their options."); err != nil {
		return o, err
	}
	var err error
	if o.ns, err = parseInts(*nList); err != nil {
		return o, fmt.Errorf("parse -n: %w", err)
	}
	for _, w := range strings.Split(*wList, ",") {
		if w = strings.TrimSpace(w); w == "" {
			continue
		}
		if slices.Contains(o.workloads, w) {
			return o, fmt.Errorf("parse -workload: %s twice (its runs would be one row)", w)
		}
		o.workloads = append(o.workloads, w)
	}
	switch {
	case len(o.workloads) == 0:
		return o, errors.New("parse -workload: empty list")
	case o.runs < 1:
		return o, fmt.Errorf("parse -runs: %d is below 1", o.runs)
	case o.warmup < 0:
		return o, fmt.Errorf("parse -warmup: %d is negative", o.warmup)
	case o.timeout <= 0:
		return o, fmt.Errorf("parse -timeout: %v is not positive", o.timeout)
	case o.daemonNodes < 1:
		return o, fmt.Errorf("parse -daemon-nodes: %d is below 1", o.daemonNodes)
	case o.daemon && (o.mpi != "" || o.lib != "" || o.ompi != "" || o.mpiexec != ""):
		// Its two columns are pmirun's own ways of starting a job: the
		// other launchers' columns, and -mpi, were dropped or timed a
		// fork-bootstrap pmirun beside them.
		return o, errors.New("parse -daemon: it times pmirun on per-job loopback agents against daemons, and takes none of -mpi, -lib, -ompi, -mpiexec")
	case o.mpi != "" && o.mpi != node.MPIPMI && o.mpi != node.MPIPMIx:
		// Only the name: whether pmirun serves PMIx is pmirun's build's.
		return o, fmt.Errorf("parse -mpi: %q: want %s or %s", o.mpi, node.MPIPMI, node.MPIPMIx)
	}
	return o, nil
}

// parseFlagSet parses args with fs, whose usage text is usage and about
// then the flags; arguments beyond the flags are an error.
// A bad flag is one line (the caller prints it), the usage only for -h.
func parseFlagSet(fs *flag.FlagSet, args []string, usage, about string) error {
	out := fs.Output()
	fs.Usage = func() {}
	fs.SetOutput(io.Discard) // the flag package's own message: the error says it
	err := fs.Parse(args)
	fs.SetOutput(out)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprintf(out, "usage: %s\n\n%s\n\n", usage, about)
		fs.PrintDefaults()
		return err
	}
	if err != nil {
		return fmt.Errorf("%w (see pmibench -h)", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("parse arguments: unexpected %q", fs.Arg(0))
	}
	return nil
}

// parseInts parses a comma-separated list of distinct positive integers
// (empty items, as in "1,,2", are skipped).
func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil {
			return nil, fmt.Errorf("read %q: %w", f, err)
		}
		if n < 1 {
			return nil, fmt.Errorf("read %q: want a positive count", f)
		}
		if slices.Contains(out, n) {
			return nil, fmt.Errorf("read %q: %d twice (its runs would be one row)", s, n)
		}
		out = append(out, n)
	}
	if len(out) == 0 {
		return nil, errors.New("read list: empty")
	}
	return out, nil
}

// start ends a run whose options did not parse (exit 0 after -h, 2 after
// an error) or whose -json file or -plot directory ("" for none) could
// not be written when its runs are over, and otherwise finds the
// repository root defaults are relative to.
func start(parseErr error, stderr io.Writer, jsonPath, plotDir string) (root string, code int, done bool) {
	if errors.Is(parseErr, flag.ErrHelp) {
		return "", 0, true
	}
	if parseErr == nil {
		parseErr = checkOutputs(jsonPath, plotDir)
	}
	if parseErr != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", parseErr)
		return "", 2, true
	}
	cwd, err := os.Getwd()
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: find current directory: %v\n", err)
		return "", 2, true
	}
	return repoRoot(cwd), 0, false
}

// checkOutputs refuses, before any run, a -json file or -plot directory
// that could not be written once the runs are over. It makes nothing: a
// missing -plot directory is made when the figures are saved, so a run
// refused later (no pmirun, no Hydra) leaves none behind.
func checkOutputs(jsonPath, plotDir string) error {
	if jsonPath != "" {
		if err := jobreport.CheckWritable(jsonPath); err != nil {
			return fmt.Errorf("invalid -json %s: %w", jsonPath, err)
		}
	}
	if plotDir != "" {
		if err := checkPlotDir(plotDir); err != nil {
			return fmt.Errorf("invalid -plot %s: %w", plotDir, err)
		}
	}
	return nil
}

// checkPlotDir says why dir could not be made, or written in: the
// nearest path at or above it that is there must be a writable
// directory.
func checkPlotDir(dir string) error {
	for d := dir; ; d = filepath.Dir(d) {
		st, err := os.Stat(d)
		switch {
		case err == nil && !st.IsDir():
			return fmt.Errorf("%s is not a directory", d)
		case err == nil:
			f, err := os.CreateTemp(d, ".pmibench-plot-*")
			if err != nil {
				return fmt.Errorf("cannot write in %s: %w", d, errors.Unwrap(err))
			}
			f.Close()
			return os.Remove(f.Name())
		case errors.Is(err, fs.ErrPermission) || d == filepath.Dir(d):
			return err
		}
		// Not there, or under a file: the path above says which.
	}
}

// modeArgs reports whether args select mode (-mode or --mode, anywhere
// before a "--") and returns them without that flag.
func modeArgs(args []string, mode string) ([]string, bool) {
	for i, a := range args {
		switch a {
		case "--":
			return args, false
		case "-" + mode, "--" + mode, "-" + mode + "=true", "--" + mode + "=true":
			return append(slices.Clone(args[:i]), args[i+1:]...), true
		}
	}
	return args, false
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if rest, ok := modeArgs(args, "scale"); ok {
		return runScale(ctx, rest, stdout, stderr)
	}
	if rest, ok := modeArgs(args, "spawn"); ok {
		return runSpawn(ctx, rest, stdout, stderr)
	}
	if rest, ok := modeArgs(args, "paper"); ok {
		return runPaper(ctx, rest, stdout, stderr)
	}
	o, err := parseFlags(args, stderr)
	root, code, done := start(err, stderr, o.jsonPath, o.plotDir)
	if done {
		return code
	}

	var notes []string
	note := func(format string, a ...any) {
		msg := fmt.Sprintf(format, a...)
		notes = append(notes, msg)
		fmt.Fprintf(stderr, "pmibench: %s\n", msg)
	}

	pmirun, err := findPmirun(o.pmirun, root)
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	}
	launchers := []Launcher{{Name: "pmirun", Path: pmirun}}
	if o.mpi != "" {
		launchers[0].Args = []string{"--mpi", o.mpi}
	}
	hydra, err := findMpiexec(o.mpiexec)
	if o.daemon {
		ds, err := startDaemons(ctx, pmirun, o.daemonNodes, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			return 2
		}
		defer ds.stop(stderr)
		launchers, hydra = ds.launchers(pmirun), ""
	}
	switch {
	case o.daemon:
	case err != nil:
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	case o.mpiexec == "none" && !o.slurm && o.ompi == "":
		note("-mpiexec none: timing pmirun alone")
	case o.mpiexec == "none":
	case hydra == "" && (o.slurm || o.ompi != ""):
		note("no Hydra mpiexec (mpiexec.hydra or mpiexec in PATH, or -mpiexec): no Hydra column")
	case hydra == "":
		note("no Hydra mpiexec (mpiexec.hydra or mpiexec in PATH, or -mpiexec): timing pmirun alone")
	default:
		l, perr := probeMpiexec(ctx, hydra)
		if perr != nil {
			note("%v; running it without -bind-to none", perr)
		}
		if l.Name != "hydra" {
			note("%s does not say it is Hydra: its column is named %q", hydra, l.Name)
		}
		launchers = append(launchers, l)
	}

	if o.ompi != "" {
		l, err := ompiLauncher(o, root)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			return 2
		}
		if l.Prog != "" {
			note("%s runs %s, Open MPI's build of the hello workload's source: a different MPI than the other columns (wall time only)", l.Name, l.Prog)
		}
		launchers = append(launchers, l)
	}

	if o.lib != "" {
		dir, err := filepath.Abs(o.lib)
		if err == nil {
			_, err = os.Stat(filepath.Join(dir, "libpmi2.so.0"))
		}
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: -lib %s: %v\n", o.lib, err)
			return 2
		}
		// The library's column comes first, so the ratio is it over
		// pmirun with the programs' own library.
		l := Launcher{Name: "pmirun+lib", Path: pmirun, Args: []string{"--env", "LD_LIBRARY_PATH=" + dir, "--env", "FASTPMI_TRANSPORT=shm"}}
		launchers = append([]Launcher{l}, launchers...)
	}

	workloads, err := resolveWorkloads(o, root)
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return 2
	}
	if slices.ContainsFunc(workloads, func(w Workload) bool { return w.Name == "true" }) && o.floor != "none" {
		floor, err := resolveProg(o.floor, defaultFloor, root)
		switch {
		case err == nil:
			launchers = append(launchers, Launcher{Name: "floor", Path: floor, Only: "true"})
		case o.floor != "":
			fmt.Fprintf(stderr, "pmibench: find -floor: %v\n", err)
			return 2
		default:
			note("no fork+exec floor (%s: run make cprog): the true workload runs without it", defaultFloor)
		}
	}

	if o.slurm {
		// Last before the runs: a usage error above starts no daemon.
		// The column goes after Hydra's, before Open MPI's and the floor.
		sl, err := startSlurm(ctx, stderr)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			return 1
		}
		defer sl.stop(stderr)
		at := slices.IndexFunc(launchers, func(l Launcher) bool { return strings.HasPrefix(l.Name, "ompi-mpirun") || l.Name == "floor" })
		if at < 0 {
			at = len(launchers)
		}
		launchers = slices.Insert(launchers, at, sl.launcher(o.mpi))
	}

	var reportPath string
	if o.plotDir != "" {
		tmp, err := os.MkdirTemp("", "pmibench-report-")
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: directory for pmirun's reports: %v\n", err)
			return 1
		}
		defer os.RemoveAll(tmp)
		reportPath = filepath.Join(tmp, "pmirun.json")
		for i := range launchers {
			if launchers[i].Name == "pmirun" {
				launchers[i].Args = append(slices.Clone(launchers[i].Args), "--report", reportPath)
			}
		}
	}
	phases := map[int]map[string]time.Duration{} // pmirun's phases by sample Seq (-plot)

	names := make([]string, len(launchers))
	for i, l := range launchers {
		names[i] = l.Name
		fmt.Fprintf(stderr, "pmibench: %s = %s\n", l.Name, strings.Join(append([]string{l.Path}, l.Args...), " "))
	}
	fmt.Fprintf(stderr, "pmibench: %d timed runs (+%d warm-up) per launcher, N and workload; %d CPUs; timeout %v per run\n",
		o.runs, o.warmup, runtime.NumCPU(), o.timeout)

	failed := 0
	// Progress: one line per finished (workload, N) cell with an
	// estimate of the time left, from the timed runs' pace so far.
	total := 0
	for _, w := range workloads {
		for _, l := range launchers {
			if l.runs(w) {
				total += len(o.ns) * o.runs
			}
		}
	}
	runStart, finished := time.Now(), 0
	r := &Runner{
		Timeout: o.timeout,
		Progress: func(s Sample) {
			finished++
			if !s.OK() {
				failed++
				fmt.Fprintf(stderr, "pmibench: %s N=%d %s run %d: %s\n", s.Workload, s.N, s.Launcher, s.Run, s.Err)
			} else if o.verbose {
				fmt.Fprintf(stderr, "pmibench: %s N=%d %s run %d: %v\n", s.Workload, s.N, s.Launcher, s.Run, s.Wall)
			}
			// The cell's line comes after its last run's.
			if last := s.Run == o.runs-1 && s.Launcher == lastLauncher(launchers, s.Workload); last && finished < total {
				left := time.Duration(float64(time.Since(runStart)) / float64(finished) * float64(total-finished))
				fmt.Fprintf(stderr, "pmibench: %s N=%d done: %d of %d runs, about %v left\n",
					s.Workload, s.N, finished, total, left.Round(time.Second))
			}
			if reportPath != "" && s.OK() && s.Launcher == "pmirun" {
				if rep, err := jobreport.ReadFile(reportPath); err == nil {
					phases[s.Seq] = samplePhases(rep, s.Wall)
				}
			}
		},
	}
	started := time.Now()
	samples, runErr := r.Run(ctx, Plan{Ns: o.ns, Workloads: workloads, Launchers: launchers, Runs: o.runs, Warmup: o.warmup})
	if runErr != nil {
		note("stopped early: %v", context.Cause(ctx))
	}

	code = 0
	if failed > 0 || runErr != nil {
		code = 1
	}
	rows := Summarize(samples, names)
	if err := WriteTable(stdout, rows, names, o.markdown); err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		code = 1
	}
	if o.jsonPath != "" {
		host, _ := os.Hostname()
		rep := Report{
			Started: started, Host: host, CPUs: runtime.NumCPU(),
			Runs: o.runs, Warmup: o.warmup, TimeoutNS: o.timeout,
			Workloads: workloads, Notes: notes, Samples: samples, Phases: phases,
		}
		for _, l := range launchers {
			rep.Launchers = append(rep.Launchers, reportLauncher{Name: l.Name, Path: l.Path, Args: l.Args, Prog: l.Prog, Only: l.Only})
		}
		if err := writeJSONFile(o.jsonPath, rep); err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
	}
	if o.plotDir != "" {
		prefix := ""
		if o.mpi == "pmix" {
			prefix = "ompi-" // beside the MPICH figures of the same workload names
		}
		files, err := writeLauncherPlots(o.plotDir, prefix, rows, samples, phases, names)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
		sayWritten(stderr, files)
	}
	return code
}

// sayWritten says which figures were written, if any: a run stopped
// before its first result writes none, and says nothing of them.
func sayWritten(stderr io.Writer, files []string) {
	if len(files) > 0 {
		fmt.Fprintf(stderr, "pmibench: wrote %s\n", strings.Join(files, " "))
	}
}

func writeJSONFile(path string, rep Report) error {
	if rep.Samples == nil {
		rep.Samples = []Sample{} // "samples": [] when stopped before any, never null
	}
	if err := jobreport.WriteOut(path, func(w io.Writer) error { return WriteJSON(w, rep) }); err != nil {
		return fmt.Errorf("write json output %s: %w", path, err)
	}
	return nil
}

// repoRoot returns the nearest directory at or above dir whose go.mod
// declares fastpmi's module, or dir itself if there is none.
func repoRoot(dir string) string {
	for d := dir; ; {
		if isModuleRoot(d) {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return dir
		}
		d = parent
	}
}

func isModuleRoot(dir string) bool {
	f, err := os.Open(filepath.Join(dir, "go.mod"))
	if err != nil {
		return false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], `"`) == modulePath
		}
	}
	return false
}

// resolveProg turns a program given on the command line (relative to the
// current directory, or a name looked up in PATH) or a default (relative to
// root) into an absolute path of an executable file.
func resolveProg(given, def, root string) (string, error) {
	p := given
	if p == "" {
		p = filepath.Join(root, def)
	}
	found, err := exec.LookPath(p)
	if err != nil {
		return "", err
	}
	return filepath.Abs(found)
}

func findPmirun(given, root string) (string, error) {
	p, err := resolveProg(given, defaultPmirun, root)
	if err == nil {
		return p, nil
	}
	if given != "" {
		return "", fmt.Errorf("find pmirun: %w", err)
	}
	if p, err := exec.LookPath("pmirun"); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("find pmirun: %w (run make build, or pass -pmirun PATH)", err)
}

// lastLauncher is the name of the last launcher that runs workload w:
// its last run ends a cell.
func lastLauncher(ls []Launcher, w string) string {
	name := ""
	for _, l := range ls {
		if l.Only == "" || l.Only == w {
			name = l.Name
		}
	}
	return name
}

// ompiLauncher is Open MPI's mpirun (-ompi), oversubscribed and unbound
// like the other launchers, allowed to run as root. Without -mpi pmix the
// workloads are MPICH's or libpmi2's, which it cannot start as one job:
// it runs only the hello workload, with Open MPI's build of its source,
// and its column name says so ("*").
func ompiLauncher(o options, root string) (Launcher, error) {
	p, err := exec.LookPath(o.ompi)
	if err == nil {
		p, err = filepath.Abs(p)
	}
	if err != nil {
		return Launcher{}, fmt.Errorf("find -ompi: %w", err)
	}
	l := Launcher{Name: "ompi-mpirun", Path: p, Args: []string{"--allow-run-as-root", "--oversubscribe", "--bind-to", "none"}}
	if o.mpi == "pmix" {
		return l, nil
	}
	if !slices.Contains(o.workloads, "hello") {
		return Launcher{}, errors.New("-ompi without -mpi pmix runs the hello workload only: add it to -workload")
	}
	if l.Prog, err = resolveProg(o.ompiHello, defaultOmpiHello, root); err != nil {
		return Launcher{}, fmt.Errorf("find -ompi-hello-prog: %w (run make cprog)", err)
	}
	l.Name, l.Only = "ompi-mpirun*", "hello"
	return l, nil
}

// findMpiexec returns the Hydra launcher to use, or "" for none.
func findMpiexec(given string) (string, error) {
	switch given {
	case "none":
		return "", nil
	case "":
		for _, name := range []string{"mpiexec.hydra", "mpiexec"} {
			if p, err := exec.LookPath(name); err == nil {
				return filepath.Abs(p)
			}
		}
		return "", nil
	}
	p, err := exec.LookPath(given)
	if err != nil {
		return "", fmt.Errorf("find mpiexec: %w", err)
	}
	return filepath.Abs(p)
}

// probeTimeout bounds "mpiexec -h".
const probeTimeout = 10 * time.Second

// probeMpiexec reads "path -h" and returns the launcher it describes. On
// error the launcher is still usable, without extra options.
func probeMpiexec(ctx context.Context, path string) (Launcher, error) {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "-h")
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	name, args := mpiexecOptions(string(out))
	l := Launcher{Name: name, Path: path, Args: args}
	if err != nil && len(args) == 0 {
		return l, fmt.Errorf("read %s -h: %w", path, err)
	}
	return l, nil
}

// mpiexecOptions derives the column name and the extra options of an
// mpiexec from its -h text.
func mpiexecOptions(help string) (name string, args []string) {
	name = "mpiexec"
	switch {
	case strings.HasPrefix(strings.TrimSpace(help), "usage: pmirun"):
		// Another pmirun build, timed against the one under test (its
		// help names Hydra too).
		return "pmirun-B", nil
	case strings.Contains(strings.ToLower(help), "hydra"):
		name = "hydra"
	}
	for _, line := range strings.Split(help, "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[0] == "-bind-to" {
			args = []string{"-bind-to", "none"}
			break
		}
	}
	return name, args
}

// resolveWorkloads maps workload names to programs and checks that each
// program exists.
func resolveWorkloads(o options, root string) ([]Workload, error) {
	var out []Workload
	for _, name := range o.workloads {
		var given, def, flagName string
		switch name {
		case "pmi2":
			given, def, flagName = o.pmi2Prog, defaultPMI2Prog, "-pmi2-prog"
		case "hello":
			given, def, flagName = o.helloProg, defaultHelloProg, "-hello-prog"
		case "true":
			given, def, flagName = o.trueProg, defaultTrueProg, "-true-prog"
		case "pmix":
			if o.mpi != "pmix" {
				return nil, errors.New("parse -workload: workload pmix needs -mpi pmix (its ranks speak PMIx only)")
			}
			given, def, flagName = o.pmixProg, defaultPMIxProg, "-pmix-prog"
		default:
			return nil, fmt.Errorf("parse -workload: unknown workload %q (want pmi2, hello, true or pmix)", name)
		}
		prog, err := resolveProg(given, def, root)
		if err != nil {
			return nil, fmt.Errorf("find program of workload %s: %w (run make cprog, or pass %s PATH)", name, err, flagName)
		}
		w := Workload{Name: name, Prog: prog}
		if name == "pmi2" {
			// Hydra 4.0.2 rejects the ring command and ends the job: its
			// runs do put, fence and gets only.
			w.ArgsFor = map[string][]string{"hydra": {"noring"}, "mpiexec": {"noring"}}
		}
		out = append(out, w)
	}
	return out, nil
}
