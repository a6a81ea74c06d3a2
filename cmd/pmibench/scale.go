package main

// Scale mode: many agents × many ranks on one machine.
//
//	pmibench -scale [-nodes 4,16,64] [-ppn 16,64,128,256] [-ops allgather,fence,ring,iallgather]
//	         [-rounds 10] [-late off|auto|D] [-netio net,uring] [-compress auto] [-tree-width 8]
//	         [-max-p 0] [-net-timeout 60s] [-timeout 300s] [-pmirun PATH]
//	         [-markdown] [-json FILE] [-v]
//
// For every K in -nodes, ranks per node in -ppn, operation in -ops and
// agent-link backend in -netio it runs
//
//	pmirun --bootstrap loopback --nodes K -n K*PPN --ppn PPN --virtual OP \
//	       --virtual-rounds R --report FILE --netio B --compress C --net-timeout T true
//
// K agents (pmid) on 127.0.0.1, each playing its PPN ranks as goroutines
// that use the real shared-memory client (node.Spec.Virtual, package
// internal/virtual). Global rank 0 reduces its own per-round times (after
// virtual.WarmupRounds untimed rounds) and each round's tail and span
// over all ranks to a jobreport.Scale, which reaches pmirun with its
// node's counters; pmirun writes it, every node's counters and the root's
// broadcast totals to FILE (a temporary file per job; jobreport.Report).
// pmibench reads the report and prints, per job size P, one row per operation
// and K: each backend's median and minimum time per operation, side by
// side, then each backend's median tail and median span, then each
// backend's agent CPU per rank and round (virtual.CPUCounter), then what a
// node received per operation (broadcast bytes before decompression, "in", and
// after, "raw"), the collective messages a node sent per operation (tree +
// ring; the ring's are the inter-node ring messages) and all frames a node
// sent in the whole job (control events, heartbeats and collectives).
// Counters cover warm-up and timed rounds, so per-operation figures divide
// by their sum; the ranks' untimed exchange of timestamps, which the nodes
// book again under virtual.StampCounterPrefix, is taken out of them.
//
// Before each job size it computes the shared-memory segment every node
// maps (shm.Size: control blocks and rings per local rank, plus the
// allgather result array, 2 × P entries of shm.DefaultMaxValue bytes, all
// pre-faulted) and warns when K segments approach the memory available;
// configurations that would not fit are skipped with a note.
//
// -late runs every job as a late arrival (pmirun --virtual-late): each
// round starts with an untimed barrier, after which global rank 0 waits
// before it enters, so that it arrives last at a machine the others have
// left quiet; the tail is then the operation's latency after its last
// rank arrived, which on a machine with fewer cores than ranks the
// back-to-back rounds cannot show. "auto" waits lateAuto(P). The tables
// add, per backend, the timed rounds in which rank 0 did enter last.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/internal/virtual"
	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/shm"
)

// scaleOptions are scale mode's parsed command line.
type scaleOptions struct {
	nodes, ppns []int
	ops         []string
	backends    []string
	rounds      int
	late        string // -late: "off", "auto" or a duration
	codec       string
	treeWidth   int
	maxP        int
	netTimeout  time.Duration
	timeout     time.Duration
	pmirun      string
	markdown    bool
	jsonPath    string
	plotDir     string
	verbose     bool
}

func parseScaleFlags(args []string, stderr io.Writer) (scaleOptions, error) {
	var o scaleOptions
	fs := flag.NewFlagSet("pmibench -scale", flag.ContinueOnError)
	fs.SetOutput(stderr)
	nodes := fs.String("nodes", "4,16,64", "comma-separated agent counts K")
	ppns := fs.String("ppn", "16,64,128,256", "comma-separated ranks per agent")
	ops := fs.String("ops", "allgather,fence,ring,iallgather", "comma-separated workloads: "+strings.Join(node.VirtualWorkloads, ", ")+
		"; or the on-demand KVS comparisons: "+strings.Join(kvsOps, ", "))
	backends := fs.String("netio", "net,uring", "comma-separated agent-link backends: net, uring, auto")
	fs.StringVar(&o.late, "late", "off", "late arrival: rank 0 enters each round this long after a barrier (off, auto, or a duration)")
	o.jobFlags(fs, "draw the scale curves (SVG and PNG) into this `DIR`")
	if err := parseFlagSet(fs, args, "pmibench -scale [options]", "Runs K loopback agents with goroutine ranks and reports time, bytes and messages per operation."); err != nil {
		return o, err
	}
	var err error
	if o.nodes, err = parseInts(*nodes); err != nil {
		return o, fmt.Errorf("parse -nodes: %w", err)
	}
	if o.ppns, err = parseInts(*ppns); err != nil {
		return o, fmt.Errorf("parse -ppn: %w", err)
	}
	if o.ops, err = parseNames(*ops, append(slices.Clone(node.VirtualWorkloads), kvsOps...)); err != nil {
		return o, fmt.Errorf("parse -ops: %w", err)
	}
	if o.backends, err = parseNames(*backends, []string{"net", "uring", "auto"}); err != nil {
		return o, fmt.Errorf("parse -netio: %w", err)
	}
	if _, err := o.lateFor(1); err != nil {
		return o, fmt.Errorf("parse -late: %w", err)
	}
	return o, o.checkJobFlags()
}

// jobFlags defines the flags of the scale jobs' settings that -scale
// and -paper share; plot is -plot's help.
func (o *scaleOptions) jobFlags(fs *flag.FlagSet, plot string) {
	fs.IntVar(&o.rounds, "rounds", node.DefaultVirtualRounds, "timed rounds per job")
	fs.StringVar(&o.codec, "compress", "auto", "broadcast compression: auto, s2, zstd, none")
	fs.IntVar(&o.treeWidth, "tree-width", 0, "agent tree width (default pmirun's)")
	fs.IntVar(&o.maxP, "max-p", 0, "skip jobs of more ranks (0 = no limit)")
	fs.DurationVar(&o.netTimeout, "net-timeout", 60*time.Second, "pmirun --net-timeout: thousands of goroutine ranks on few CPUs starve heartbeats")
	fs.DurationVar(&o.timeout, "timeout", 300*time.Second, "limit for one job")
	fs.StringVar(&o.pmirun, "pmirun", "", "pmirun binary (default "+defaultPmirun+" under the repo root, else pmirun in PATH)")
	fs.BoolVar(&o.markdown, "markdown", false, "print the tables as markdown")
	fs.StringVar(&o.jsonPath, "json", "", "write every job's results as JSON to this file")
	fs.StringVar(&o.plotDir, "plot", "", plot)
	fs.BoolVar(&o.verbose, "v", false, "print each job's command line")
}

// checkJobFlags checks the values of jobFlags.
func (o *scaleOptions) checkJobFlags() error {
	if _, err := netio.ParseCodec(o.codec); err != nil {
		return fmt.Errorf("parse -compress: %w", err)
	}
	switch {
	case o.rounds < 1:
		return fmt.Errorf("parse -rounds: %d is below 1", o.rounds)
	case o.timeout <= 0:
		return fmt.Errorf("parse -timeout: %v is not positive", o.timeout)
	case o.netTimeout <= 0:
		return fmt.Errorf("parse -net-timeout: %v is not positive", o.netTimeout)
	case o.maxP < 0:
		return fmt.Errorf("parse -max-p: %d is negative", o.maxP)
	case o.treeWidth < 0:
		return fmt.Errorf("parse -tree-width: %d is negative", o.treeWidth)
	}
	return nil
}

// lateAuto is -late auto's wait for a job of p ranks: long enough for the
// others, after the barrier, to enter and finish what they can without
// rank 0 on this machine's CPUs (a generous 20µs of CPU per rank; the
// scale workloads take 4-70µs per rank and round, mostly after rank 0
// arrived), plus 20ms for agents the kernel has not run yet. Rank 0's
// report says in how many rounds it entered last.
func lateAuto(p int) time.Duration {
	return 20*time.Millisecond + time.Duration(p)*20*time.Microsecond/time.Duration(max(1, runtime.NumCPU()))
}

// lateFor is -late's wait for a job of p ranks; 0 when off.
func (o scaleOptions) lateFor(p int) (time.Duration, error) {
	switch o.late {
	case "", "off", "0":
		return 0, nil
	case "auto":
		return lateAuto(p), nil
	}
	d, err := time.ParseDuration(o.late)
	switch {
	case err != nil:
		return 0, fmt.Errorf("%q: want off, auto or a duration", o.late)
	case d < 0:
		return 0, fmt.Errorf("%v is negative", d)
	}
	return d, nil
}

// parseNames parses a comma-separated list whose items must be in valid.
// kvsOps are the on-demand KVS comparisons -ops takes besides the
// workloads: PATTERN/DESIGN, the research's figure 7 — the dense and
// sparse patterns under Current (put, fence, get) and on demand under
// each get strategy (pmirun --get-strategy) — and cards/POLICY, an MPI
// library's start-up (unhinted business cards, a fence, every card read)
// under each --kvs policy.
var kvsOps = []string{
	"dense/current", "dense/tree", "dense/dkvs", "dense/direct",
	"sparse/current", "sparse/tree", "sparse/dkvs", "sparse/direct",
	"cards/dense", "cards/sparse", "cards/auto",
}

// virtualOp is the workload (node.Spec.Virtual) that -ops entry op runs.
func virtualOp(op string) string {
	pattern, design, ok := strings.Cut(op, "/")
	switch {
	case !ok:
		return op
	case pattern == "cards":
		return "kvs-cards"
	case design == "current":
		return "kvs-" + pattern
	}
	return "kvs-" + pattern + "-od"
}

func parseNames(s string, valid []string) ([]string, error) {
	var out []string
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(valid, f) {
			return nil, fmt.Errorf("unknown %q (want %s)", f, strings.Join(valid, ", "))
		}
		if slices.Contains(out, f) {
			// Its jobs would run twice, one result shown for both.
			return nil, fmt.Errorf("%q twice", f)
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, errors.New("empty list")
	}
	return out, nil
}

// scaleConfig is one job: K agents of PPN ranks, one operation, one backend.
type scaleConfig struct {
	Op      string `json:"op"`
	Backend string `json:"netio"`
	Nodes   int    `json:"nodes"`
	PPN     int    `json:"ppn"`
	// Work is the compute of a workload that computes (pmirun
	// --virtual-work; the -paper figures 10 and 11), else 0.
	Work time.Duration `json:"work_ns,omitempty"`
}

// P is the job's size.
func (c scaleConfig) P() int { return c.Nodes * c.PPN }

// scaleResult is what one job reported.
type scaleResult struct {
	scaleConfig
	Rounds    int           `json:"rounds"`            // timed rounds (rank 0's figures)
	Median    time.Duration `json:"median_ns"`         // per operation, rank 0
	Min       time.Duration `json:"min_ns"`            // per operation, rank 0
	Max       time.Duration `json:"max_ns"`            // per operation, rank 0
	Warmup    time.Duration `json:"warmup_ns"`         // the untimed rounds together
	SpanMed   time.Duration `json:"span_median_ns"`    // per round, first entry to last completion, all ranks
	SpanMin   time.Duration `json:"span_min_ns"`       // per round, all ranks
	TailMed   time.Duration `json:"tail_median_ns"`    // per round, last entry to last completion, all ranks
	TailMin   time.Duration `json:"tail_min_ns"`       // per round, all ranks
	TailMax   time.Duration `json:"tail_max_ns"`       // per round, all ranks
	CPURound  time.Duration `json:"cpu_rank_round_ns"` // agents' CPU per rank and round (cpuPerRankRound)
	Late      time.Duration `json:"late_ns,omitempty"` // rank 0's wait after each round's barrier (-late)
	LateLast  int           `json:"late_last_rounds"`  // timed rounds rank 0 entered after every other rank
	LateGap   time.Duration `json:"late_gap_min_ns"`   // least time by which it did (negative: it did not)
	Wall      time.Duration `json:"wall_ns"`           // the whole pmirun
	LinkedBy  string        `json:"linked_by"`         // backend pmirun reported using
	Counters  []nodeCounter `json:"node_counters"`     // by node index, from pmirun's report
	RootRaw   int64         `json:"root_bcast_raw"`    // bytes the root gathered, all rounds (not the timestamp exchange)
	RootSent  int64         `json:"root_bcast_sent"`   // after compression
	SegBytes  int           `json:"segment_bytes"`     // shm.Size of one node's segment
	Err       string        `json:"error,omitempty"`   // the job failed
	Skipped   string        `json:"skipped,omitempty"` // the job was not run
	StderrEnd string        `json:"stderr_end,omitempty"`
	// cut says the benchmark's stop (Ctrl-C, SIGTERM) ended the job, or
	// came before it: no result, never a failure (scaleRunner.run).
	cut bool
}

// nodeCounter is one node's counters (jobreport.Node.Counters), whole job.
type nodeCounter map[string]int64

// ops is the number of operations the counters cover.
func (r scaleResult) ops() int64 { return int64(r.Rounds + virtual.WarmupRounds) }

// perNode returns min and max over nodes of counter name summed over
// names, per operation, without the timestamp exchange's share.
func (r scaleResult) perNode(names ...string) (lo, hi float64, ok bool) {
	if len(r.Counters) == 0 || r.Rounds == 0 {
		return 0, 0, false
	}
	for i, c := range r.Counters {
		if c == nil {
			return 0, 0, false
		}
		var v int64
		for _, n := range names {
			v += c[n] - c[virtual.StampCounterPrefix+n]
		}
		f := float64(v) / float64(r.ops())
		if i == 0 || f < lo {
			lo = f
		}
		if i == 0 || f > hi {
			hi = f
		}
	}
	return lo, hi, true
}

// maxNode is the largest value of counter name over the nodes (a
// figure of the whole job, such as a peak), and whether every node
// reported it.
func (r scaleResult) maxNode(name string) (float64, bool) {
	if len(r.Counters) == 0 {
		return 0, false
	}
	var hi int64
	for _, c := range r.Counters {
		v, ok := c[name]
		if !ok {
			return 0, false
		}
		hi = max(hi, v)
	}
	return float64(hi), true
}

func maxBytesCell(b float64, ok bool) string {
	if !ok {
		return "-"
	}
	return bytesCell(b)
}

// cpuPerRankRound is the CPU time the agents' processes used per rank and
// round during the timed rounds (virtual.CPUCounter over
// virtual.CPURoundsCounter, summed over nodes): the agent's and the
// goroutine ranks' work for one rank's round.
func (r scaleResult) cpuPerRankRound() (time.Duration, bool) {
	var cpu, rounds int64
	for _, c := range r.Counters {
		cpu += c[virtual.CPUCounter]
		rounds += c[virtual.CPURoundsCounter]
	}
	if rounds <= 0 || cpu <= 0 {
		return 0, false
	}
	return time.Duration(cpu / rounds), true
}

// fromReport fills r from pmirun's report of the job (--report): rank
// 0's figures, every node's counters and the root's broadcast totals.
func (r *scaleResult) fromReport(rep *jobreport.Report) error {
	s := rep.Scale
	switch {
	case s == nil:
		return errors.New("pmirun's report has no scale figures from rank 0")
	case s.P != r.P() || s.Op != virtualOp(r.Op):
		return fmt.Errorf("report for op=%s P=%d, want %s P=%d", s.Op, s.P, r.Op, r.P())
	case len(rep.Nodes) != r.Nodes:
		return fmt.Errorf("report of %d nodes, want %d", len(rep.Nodes), r.Nodes)
	}
	r.Rounds = s.Rounds
	r.Median, r.Min, r.Max, r.Warmup = s.Median, s.Min, s.Max, s.Warmup
	r.SpanMed, r.SpanMin = s.SpanMedian, s.SpanMin
	r.TailMed, r.TailMin, r.TailMax = s.TailMedian, s.TailMin, s.TailMax
	r.Late, r.LateLast, r.LateGap = s.Late, s.LateLast, s.LateGapMin
	r.LinkedBy = rep.NetBackend
	r.Counters = make([]nodeCounter, r.Nodes)
	for i, n := range rep.Nodes {
		if n.Counters == nil {
			return fmt.Errorf("no counters from node %d", i)
		}
		r.Counters[i] = n.Counters
	}
	r.CPURound, _ = r.cpuPerRankRound()
	// Every node receives the root's broadcasts as the root sent them, so
	// a node's share of the timestamp exchange is the root's too.
	r.RootRaw = rep.RootCounters["bcast.bytes.raw"] - r.Counters[0][virtual.StampCounterPrefix+"bcast.bytes.raw"]
	r.RootSent = rep.RootCounters["bcast.bytes.sent"] - r.Counters[0][virtual.StampCounterPrefix+"bcast.bytes.in"]
	return nil
}

// scaleArgv is pmirun's command line for c, writing its report to
// report.
func (o scaleOptions) scaleArgv(pmirun string, c scaleConfig, report string) []string {
	argv := []string{pmirun, "--bootstrap", "loopback", "--nodes", strconv.Itoa(c.Nodes),
		"-n", strconv.Itoa(c.P()), "--ppn", strconv.Itoa(c.PPN),
		"--virtual", virtualOp(c.Op), "--virtual-rounds", strconv.Itoa(o.rounds), "--report", report,
		"--netio", c.Backend, "--compress", o.codec, "--net-timeout", o.netTimeout.String()}
	switch pattern, design, _ := strings.Cut(c.Op, "/"); {
	case pattern == "cards": // MPICH's start-up under a --kvs policy
		argv = append(argv, "--kvs", design)
	case design != "" && design != "current":
		argv = append(argv, "--get-strategy", design)
	}
	if o.treeWidth > 0 {
		argv = append(argv, "--tree-width", strconv.Itoa(o.treeWidth))
	}
	if late, _ := o.lateFor(c.P()); late > 0 {
		argv = append(argv, "--virtual-late", late.String())
	}
	if c.Work > 0 {
		argv = append(argv, "--virtual-work", c.Work.String())
	}
	return append(argv, "true")
}

// runScaleJob runs one job, whose pmirun writes its report to report,
// and reads the report.
func runScaleJob(ctx context.Context, o scaleOptions, argv []string, c scaleConfig, report string) scaleResult {
	r := scaleResult{scaleConfig: c}
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	cmd := ExecCommand(ctx, argv)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	start := time.Now()
	err := cmd.Run()
	r.Wall = time.Since(start)
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded):
		r.Err = fmt.Sprintf("timed out after %v", o.timeout)
	case err != nil:
		r.Err = err.Error()
	default:
		rep, rerr := jobreport.ReadFile(report)
		if rerr == nil {
			rerr = r.fromReport(rep)
		}
		if rerr != nil {
			r.Err = rerr.Error()
		}
	}
	if r.Err != "" {
		r.StderrEnd = lastLines(stderr.String(), 4)
	}
	return r
}

// lastLines returns the last n lines of s, joined by " | ".
func lastLines(s string, n int) string {
	keep := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(keep[max(0, len(keep)-n):], " | ")
}

// memAvailable is MemAvailable from /proc/meminfo in bytes, or 0 where it
// cannot be read (the memory check is then skipped).
func memAvailable() int64 {
	b, err := sys.MemAvailable()
	if err != nil {
		return 0
	}
	return int64(min(b, math.MaxInt64))
}

// scalePlan lists the jobs in the order they run: by P, then K, then op,
// the backends alternating within each (op, K, PPN) so drift in the
// machine's load hits them alike.
func (o scaleOptions) scalePlan() []scaleConfig {
	var out []scaleConfig
	for _, k := range o.nodes {
		for _, ppn := range o.ppns {
			for _, op := range o.ops {
				for _, b := range o.backends {
					out = append(out, scaleConfig{Op: op, Backend: b, Nodes: k, PPN: ppn})
				}
			}
		}
	}
	opIdx := func(op string) int { return slices.Index(o.ops, op) }
	slices.SortStableFunc(out, func(a, b scaleConfig) int {
		return cmp.Or(cmp.Compare(a.P(), b.P()), cmp.Compare(a.Nodes, b.Nodes), cmp.Compare(opIdx(a.Op), opIdx(b.Op)))
	})
	return out
}

// scaleRunner runs scale jobs one at a time, as -scale and -paper plan
// them: the memory check, pmirun's command line and report, and a line
// per job on stderr.
type scaleRunner struct {
	o       scaleOptions
	pmirun  string
	avail   int64  // memAvailable at the start
	reports string // directory for pmirun's reports
	stderr  io.Writer
	total   int // jobs planned, for the progress lines (0: unknown)

	jobs    int             // jobs run or skipped so far
	started time.Time       // of the first job
	warned  map[[2]int]bool // (K, PPN) whose segments' size was warned about
}

// newScaleRunner finds pmirun, reads the memory available and makes the
// directory for pmirun's reports, which close removes; on failure it
// says why on stderr and returns pmibench's exit code.
func newScaleRunner(o scaleOptions, root string, stderr io.Writer) (h *scaleRunner, code int, ok bool) {
	pmirun, err := findPmirun(o.pmirun, root)
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		return nil, 2, false
	}
	reports, err := os.MkdirTemp("", "pmibench-scale-")
	if err != nil {
		fmt.Fprintf(stderr, "pmibench: directory for pmirun's reports: %v\n", err)
		return nil, 1, false
	}
	return &scaleRunner{o: o, pmirun: pmirun, avail: memAvailable(), reports: reports, stderr: stderr, warned: map[[2]int]bool{}}, 0, true
}

// close removes pmirun's reports.
func (h *scaleRunner) close() { os.RemoveAll(h.reports) }

// run runs job c, or skips it when it would not fit (-max-p, memory), and
// says so on stderr. A job the benchmark's stop (ctx) ended, or came
// before, is cut: said by the caller, never as the job's failure.
func (h *scaleRunner) run(ctx context.Context, c scaleConfig) scaleResult {
	o, stderr := h.o, h.stderr
	if h.jobs++; h.jobs == 1 {
		h.started = time.Now()
	}
	progress := fmt.Sprintf("[%d", h.jobs)
	if h.total > 0 {
		progress += fmt.Sprintf("/%d", h.total)
	}
	progress += fmt.Sprintf(", %s elapsed]", time.Since(h.started).Round(time.Second))
	r := scaleResult{scaleConfig: c}
	seg, serr := shm.Size(shm.Params{LocalRanks: c.PPN, WorldSize: c.P()})
	r.SegBytes = seg
	total := int64(seg) * int64(c.Nodes)
	switch {
	case o.maxP > 0 && c.P() > o.maxP:
		r.Skipped = fmt.Sprintf("P=%d above -max-p", c.P())
	case serr != nil:
		r.Skipped = fmt.Sprintf("segment: %v", serr)
	case h.avail > 0 && total > h.avail*3/4:
		r.Skipped = fmt.Sprintf("%d segments of %s (%s) exceed 3/4 of the %s available", c.Nodes, mib(int64(seg)), mib(total), mib(h.avail))
	}
	if key := [2]int{c.Nodes, c.PPN}; !h.warned[key] && serr == nil && r.Skipped == "" {
		h.warned[key] = true
		if h.avail > 0 && total > h.avail/4 {
			fmt.Fprintf(stderr, "pmibench: warning: K=%d PPN=%d: %d pre-faulted segments of %s = %s of the %s available\n",
				c.Nodes, c.PPN, c.Nodes, mib(int64(seg)), mib(total), mib(h.avail))
		}
	}
	if r.Skipped != "" {
		fmt.Fprintf(stderr, "pmibench: %s skip %s K=%d PPN=%d %s: %s\n", progress, c.Op, c.Nodes, c.PPN, c.Backend, r.Skipped)
		return r
	}
	report := filepath.Join(h.reports, fmt.Sprintf("job-%d.json", h.jobs))
	argv := o.scaleArgv(h.pmirun, c, report)
	if ctx.Err() != nil {
		return scaleResult{scaleConfig: c, cut: true}
	}
	if o.verbose {
		fmt.Fprintf(stderr, "pmibench: %s\n", strings.Join(argv, " "))
	}
	got := runScaleJob(ctx, o, argv, c, report)
	got.SegBytes = seg
	if got.Err != "" && ctx.Err() != nil {
		got.cut = true
		return got
	}
	if got.Err != "" {
		fmt.Fprintf(stderr, "pmibench: %s %s K=%d PPN=%d P=%d %s: %s: %s\n", progress, c.Op, c.Nodes, c.PPN, c.P(), c.Backend, got.Err, got.StderrEnd)
		return got
	}
	work := ""
	if c.Work > 0 {
		work = " work " + perf.FormatDuration(c.Work)
	}
	fmt.Fprintf(stderr, "pmibench: %s %s K=%d PPN=%d P=%d %s%s: median %s min %s tail %s span %s cpu/rank/round %s (job %s, segment %s/node)\n",
		progress, c.Op, c.Nodes, c.PPN, c.P(), got.LinkedBy, work, perf.FormatDuration(got.Median), perf.FormatDuration(got.Min),
		perf.FormatDuration(got.TailMed), perf.FormatDuration(got.SpanMed), perf.FormatDuration(got.CPURound),
		perf.FormatDuration(got.Wall), mib(int64(seg)))
	if got.Late > 0 && got.LateLast < got.Rounds {
		fmt.Fprintf(stderr, "pmibench: warning: %s K=%d PPN=%d %s: rank 0 entered last in %d of %d rounds after waiting %s (another rank entered %s after it): raise -late\n",
			c.Op, c.Nodes, c.PPN, c.Backend, got.LateLast, got.Rounds, perf.FormatDuration(got.Late), perf.FormatDuration(-got.LateGap))
	}
	return got
}

func runScale(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseScaleFlags(args, stderr)
	root, code, done := start(err, stderr, o.jsonPath, o.plotDir)
	if done {
		return code
	}
	h, code, ok := newScaleRunner(o, root, stderr)
	if !ok {
		return code
	}
	defer h.close()
	fmt.Fprintf(stderr, "pmibench: scale: pmirun = %s; %d CPUs, %s available; %d timed rounds per job (+%d warm-up); compression %s; late arrival %s\n",
		h.pmirun, runtime.NumCPU(), mib(h.avail), o.rounds, virtual.WarmupRounds, o.codec, o.late)

	started := time.Now()
	var results []scaleResult
	code = 0
	plan := o.scalePlan()
	h.total = len(plan)
	for _, c := range plan {
		r := h.run(ctx, c)
		if r.cut {
			fmt.Fprintf(stderr, "pmibench: stopped early: %v\n", context.Cause(ctx))
			code = 1
			break
		}
		results = append(results, r)
		if r.Err != "" {
			code = 1
		}
	}
	if err := writeScaleTables(stdout, results, o.backends, o.markdown); err != nil {
		fmt.Fprintf(stderr, "pmibench: %v\n", err)
		code = 1
	}
	if o.jsonPath != "" {
		if err := writeScaleJSON(o.jsonPath, o, started, results); err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
	}
	if o.plotDir != "" {
		files, err := writeScalePlots(o.plotDir, results)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
		kvs, err := writeKVSPlots(o.plotDir, results)
		files = append(files, kvs...)
		if err != nil {
			fmt.Fprintf(stderr, "pmibench: %v\n", err)
			code = 1
		}
		sayWritten(stderr, files)
	}
	return code
}

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// scaleRow is one (op, K, PPN) with a result per backend.
type scaleRow struct {
	op        string
	nodes     int
	ppn       int
	byBackend map[string]scaleResult
}

// scaleTables groups results into rows per P, in P order.
func scaleTables(results []scaleResult) (ps []int, rows map[int][]*scaleRow) {
	rows = make(map[int][]*scaleRow)
	for _, r := range results {
		p := r.P()
		var row *scaleRow
		for _, x := range rows[p] {
			if x.op == r.Op && x.nodes == r.Nodes {
				row = x
			}
		}
		if row == nil {
			if len(rows[p]) == 0 {
				ps = append(ps, p)
			}
			row = &scaleRow{op: r.Op, nodes: r.Nodes, ppn: r.PPN, byBackend: map[string]scaleResult{}}
			rows[p] = append(rows[p], row)
		}
		row.byBackend[r.Backend] = r
	}
	slices.Sort(ps)
	return ps, rows
}

// scaleTable lays out one P's rows: per backend median and min per
// operation (rank 0's own rounds); per backend the median tail, then the
// median span (each round over all ranks); per backend the agents' CPU
// per rank and round (cpuPerRankRound); in late-arrival jobs (-late), per
// backend the timed rounds rank 0 entered last; then, from the first backend
// that succeeded, per node and operation the broadcast bytes received
// (compressed "in" and "raw"), their ratio, the collective messages sent
// (tree + ring, min-max over nodes), and all frames a node sent in the
// job (max over nodes).
func scaleTable(rows []*scaleRow, backends []string) (header []string, body [][]string) {
	header = []string{"op", "K", "ppn"}
	for _, b := range backends {
		header = append(header, b+" median", b+" min")
	}
	for _, b := range backends {
		header = append(header, b+" tail")
	}
	for _, b := range backends {
		header = append(header, b+" span")
	}
	for _, b := range backends {
		header = append(header, b+" CPU/rank/round")
	}
	late := slices.ContainsFunc(rows, func(row *scaleRow) bool {
		for _, r := range row.byBackend {
			if r.Late > 0 {
				return true
			}
		}
		return false
	})
	if late {
		for _, b := range backends {
			header = append(header, b+" late last")
		}
	}
	header = append(header, "bcast in/node", "bcast raw/node", "in/raw", "tree msgs/node", "ring msgs/node", "kvs msgs/node", "frames/node (job)",
		"agent RSS (peak)", "segment resident")
	for _, row := range rows {
		line := []string{row.op, strconv.Itoa(row.nodes), strconv.Itoa(row.ppn)}
		var tails, spans, cpus, lasts []string
		var first *scaleResult
		for _, b := range backends {
			r, ok := row.byBackend[b]
			switch {
			case !ok:
				line = append(line, "-", "-")
			case r.Skipped != "":
				line = append(line, "skipped", "-")
			case r.Err != "":
				line = append(line, "failed", "-")
			default:
				line = append(line, perf.FormatDuration(r.Median), perf.FormatDuration(r.Min))
				if first == nil {
					first = &r
				}
			}
			tail, span := "-", "-"
			if ok && r.Skipped == "" && r.Err == "" && r.SpanMed > 0 {
				tail, span = perf.FormatDuration(r.TailMed), perf.FormatDuration(r.SpanMed)
			}
			tails, spans = append(tails, tail), append(spans, span)
			cpu := "-"
			if ok && r.Skipped == "" && r.Err == "" && r.CPURound > 0 {
				cpu = perf.FormatDuration(r.CPURound)
			}
			cpus = append(cpus, cpu)
			last := "-"
			if ok && r.Skipped == "" && r.Err == "" && r.Late > 0 && r.SpanMed > 0 {
				last = fmt.Sprintf("%d/%d", r.LateLast, r.Rounds)
			}
			lasts = append(lasts, last)
		}
		line = append(append(append(line, tails...), spans...), cpus...)
		if late {
			line = append(line, lasts...)
		}
		if first == nil {
			body = append(body, append(line, "-", "-", "-", "-", "-", "-", "-", "-", "-"))
			continue
		}
		in, _, _ := first.perNode("bcast.bytes.in")
		raw, _, _ := first.perNode("bcast.bytes.raw")
		ratio := "-"
		if raw > 0 {
			ratio = fmt.Sprintf("%.2f", in/raw)
		}
		line = append(line, bytesCell(in), bytesCell(raw), ratio,
			rangeCell(first.perNode("tree.msgs.sent")), rangeCell(first.perNode("ring.msgs.sent")), rangeCell(first.perNode("kvs.msgs.sent")))
		_, frames, _ := first.perNode("net.frames.sent")
		line = append(line, strconv.FormatInt(int64(frames*float64(first.ops())+0.5), 10))
		line = append(line, maxBytesCell(first.maxNode(node.CounterAgentRSS)), maxBytesCell(first.maxNode(node.CounterSegResident)))
		body = append(body, line)
	}
	return header, body
}

func bytesCell(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MiB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func rangeCell(lo, hi float64, ok bool) string {
	switch {
	case !ok:
		return "-"
	case lo == hi:
		return strconv.FormatFloat(lo, 'g', 3, 64)
	}
	return fmt.Sprintf("%.3g-%.3g", lo, hi)
}

// writeScaleTables writes one table per P.
func writeScaleTables(w io.Writer, results []scaleResult, backends []string, markdown bool) error {
	ps, rows := scaleTables(results)
	for i, p := range ps {
		header, body := scaleTable(rows[p], backends)
		if i > 0 {
			fmt.Fprintln(w)
		}
		if markdown {
			fmt.Fprintf(w, "P = %d\n\n", p)
			if _, err := io.WriteString(w, perf.MarkdownTable(header, body)); err != nil {
				return fmt.Errorf("write table: %w", err)
			}
			continue
		}
		fmt.Fprintf(w, "P = %d\n", p)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		for _, line := range append([][]string{header}, body...) {
			fmt.Fprintln(tw, strings.Join(line, "\t")+"\t")
		}
		if err := tw.Flush(); err != nil {
			return fmt.Errorf("write table: %w", err)
		}
	}
	return nil
}

// scaleReport is the -json output of scale mode.
type scaleReport struct {
	Started time.Time     `json:"started"`
	Host    string        `json:"host,omitempty"`
	CPUs    int           `json:"cpus"`
	Rounds  int           `json:"rounds"`
	Warmup  int           `json:"warmup_rounds"`
	Codec   string        `json:"compress"`
	Results []scaleResult `json:"results"`
}

func writeScaleJSON(path string, o scaleOptions, started time.Time, results []scaleResult) error {
	if results == nil {
		results = []scaleResult{} // "results": [] when stopped before any, never null
	}
	host, _ := os.Hostname()
	rep := scaleReport{Started: started, Host: host, CPUs: runtime.NumCPU(), Rounds: o.rounds,
		Warmup: virtual.WarmupRounds, Codec: o.codec, Results: results}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("encode results: %w", err)
	}
	if err := jobreport.WriteOut(path, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	}); err != nil {
		return fmt.Errorf("write json output %s: %w", path, err)
	}
	return nil
}
