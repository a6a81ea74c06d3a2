// Package virtual plays a node's ranks as goroutines of the agent's own
// process (node.Spec.Virtual): the scale benchmark's virtual ranks. It is
// benchmark code: pmibench links it and serves as the agent of virtual
// jobs (pmirun starts pmibench, not pmid, for --virtual); pmid and pmirun
// do not link it, nor the client library it uses.
//
// Each goroutine rank is a real shared-memory client (internal/clientseam) of the
// node's segment, so the agent serves it exactly as it serves a rank
// process; only fork/exec and the PMI_FD connection are left out, which
// lets one machine run many agents with thousands of ranks each. The
// pmix-fence workload's ranks are instead clients of a played PMIx
// server library, the agent's external front end (pmix.go).
//
// Ownership. Start (a node.Starter) runs on the node's loop goroutine and
// starts one goroutine per rank. A rank goroutine touches nothing of the
// node but its own Client, the output and Host.Exited: it reports its exit
// exactly once, as its last act, after its Client finalized, so the node
// (which runs until every rank exited) closes the agent, and with it the
// segment, only after every goroutine stopped using it: the node's wait
// for its ranks is the wait for these goroutines. The stop function Start
// returns cancels the goroutines' context (kill); a cancelled rank still
// finalizes and reports.
//
// Exit judging. A rank that exits with code 0 is judged once the agent
// has drained its PMI connection (node.Node.Handle). A virtual rank has no text
// connection, so Agent.Drained would never close and the judgement would
// wait for the 500 ms fallback. Its Finalize is synchronous — when it
// returns the agent has served every request of the rank — so the rank
// then binds an already-closed connection (drainedNow): the agent sees a
// finalized rank's connection end, closes Drained and reports nothing.
//
// Job-wide timing. Global rank 0's own per-round times measure, on a
// machine with fewer cores than ranks, mostly how long all ranks take to
// get a turn. So every rank also stamps each timed round on entry and on
// completion with the machine's CLOCK_MONOTONIC (machineClock), which all
// agents share because the scale benchmark runs them on one machine; after
// the timed rounds the ranks allgather their stamps (untimed) and rank 0
// reduces them to each round's span and tail (roundEnds), unless some
// ranks' clocks turn out to be on another machine. The exchange's share of
// the node's collective counters is booked again under StampCounterPrefix
// (stampExchange), so that readers of the counters can leave it out of the
// per-operation figures. Each node also books its process's CPU time over
// the timed rounds (cpuMeter). Rank 0 prints its figures on one line
// (scaleReport.line) and books the same figures on its node's recorder
// (jobreport.Scale.Counters), which carries them to pmirun's --report.
//
// Late arrival. Back to back, a round on a machine with fewer cores than
// ranks waits mostly for every rank's turn, whatever the operation does.
// With Spec.VirtualLate every round starts with an untimed barrier, and
// global rank 0 enters only after waiting that long (arrive): the others
// have entered and done what they could without it, the machine is quiet,
// and the round's tail is the operation's own latency after its last
// participant arrived, what a node with its own cores would see. Rank 0's
// report counts the rounds in which it did enter last.
//
// The research's figures. The paper-* workloads (pmibench -paper) exchange
// the research's MVAPICH2-like key and value by Fence or Allgather, their
// non-blocking forms, the non-blocking forms overlapped with sleeping or
// busy-spinning compute, and an MPI_Init-style start-up. Those that
// compute (workWorkloads) do so for Spec.VirtualWork in every round, a
// benchmark-only setting (pmirun --virtual-work) that the others refuse.
package virtual

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/internal/clientseam"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// WarmupRounds is the number of untimed rounds a virtual rank runs
// before the timed ones (they absorb the agents' and ranks' start-up
// skew). Counters of a virtual job cover warm-up and timed rounds alike.
const WarmupRounds = 1

// ScaleLinePrefix starts the one line global rank 0 of a virtual job
// prints to standard output with its timings (see scaleReport.line).
const ScaleLinePrefix = "fastpmi-scale"

// StampCounterPrefix starts the names under which a virtual node books
// its counters' growth during the timestamp exchange a second time:
// StampCounterPrefix+"tree.msgs.sent" is the part of "tree.msgs.sent"
// that the exchange caused (see stampExchange).
const StampCounterPrefix = "stamps."

// stampCounters are the counters stampExchange books: those a tree
// collective (the exchange is an allgather) moves. The links' frame and
// byte counters are left alone; they count heartbeats as well.
var stampCounters = []string{"tree.msgs.sent", "bcast.bytes.in", "bcast.bytes.raw"}

// virtualRound is one round of a workload for one rank: it runs the
// operation, calls done as soon as the operation returned, and then
// checks its result (the check is not part of the round's span and tail).
type virtualRound func(ctx context.Context, c *client.Client, round int, done func()) error

// workloads are the workloads Spec.Virtual may name (node.VirtualWorkloads
// lists their names for the root, which does not link this package).
var workloads = map[string]virtualRound{
	"allgather":  allgatherRound,
	"iallgather": iallgatherRound,
	"fence":      fenceRound,
	"ring":       ringRound,
	// The research's two access patterns ("PMI Extensions for Scalable
	// MPI Startup", figure 7), with put+fence+get (Current) and on demand
	// (-od: sparse put, get with wait, no fence; the job's get strategy
	// fetches).
	"kvs-dense":     kvsDenseRound(false),
	"kvs-dense-od":  kvsDenseRound(true),
	"kvs-sparse":    kvsSparseRound(false),
	"kvs-sparse-od": kvsSparseRound(true),
	// An MPI library's start-up: every rank puts its business card
	// without a hint (the job's --kvs policy decides how it travels),
	// fences, and reads every peer's card.
	"kvs-cards": cardsRound,
	// The research's "Non-blocking PMI Extensions" figures 9 and 12
	// (pmibench -paper): one exchange of its MVAPICH2-like key and
	// value (paperKey, paperValue) by each design, the non-blocking ones
	// waited for at once.
	"paper-fence":      paperFenceRound(false),
	"paper-ifence":     paperFenceRound(true),
	"paper-allgather":  paperAllgatherRound(false),
	"paper-iallgather": paperAllgatherRound(true),
}

// workWorkloads are the workloads that compute for Spec.VirtualWork in
// every round (node.VirtualWorkWorkloads): the research's figure 11
// (overlap of a non-blocking exchange with sleeping or busy-spinning
// compute) and figure 10 (an MPI_Init-style start-up).
var workWorkloads = map[string]func(work time.Duration) virtualRound{
	"paper-ifence-sleep":     overlapRound(false, sleepFor),
	"paper-ifence-spin":      overlapRound(false, spinFor),
	"paper-iallgather-sleep": overlapRound(true, sleepFor),
	"paper-iallgather-spin":  overlapRound(true, spinFor),
	"paper-init-fence":       initFenceRound,
	"paper-init-allgather":   initAllgatherRound,
	"paper-init-iallgather":  initIallgatherRound,
}

// workload returns the round of workload name with work (Spec.VirtualWork)
// bound in, checking that work is set exactly for the workloads that
// compute.
func workload(name string, work time.Duration) (virtualRound, error) {
	if err := node.CheckVirtualWork(name, work); err != nil {
		return nil, err
	}
	if round, ok := workloads[name]; ok {
		return round, nil
	}
	if mk, ok := workWorkloads[name]; ok {
		return mk(work), nil
	}
	return nil, fmt.Errorf("unknown workload %q (want %s)", name, strings.Join(node.VirtualWorkloads, ", "))
}

// Start plays the node's ranks as goroutines: a node.Starter.
func Start(h node.Host) (stop func(), err error) {
	spec := h.Spec
	var round virtualRound
	var srv *playedServer
	played, ok := pmixWorkloads[spec.Virtual]
	if ok {
		if err := node.CheckVirtualWork(spec.Virtual, spec.VirtualWork); err != nil {
			return nil, fmt.Errorf("virtual ranks: %w", err)
		}
		if srv, err = newPlayedServer(h.Agent, h.Ranks, spec.Size); err != nil {
			return nil, fmt.Errorf("virtual ranks: %w", err)
		}
	} else if round, err = workload(spec.Virtual, spec.VirtualWork); err != nil {
		return nil, fmt.Errorf("virtual ranks: %w", err)
	}
	clk, err := newMachineClock()
	if err != nil {
		return nil, fmt.Errorf("virtual ranks: %w", err)
	}
	rounds := spec.VirtualRounds
	if rounds == 0 {
		rounds = node.DefaultVirtualRounds
	}
	x := &stampExchange{rec: h.Perf, ranks: len(h.Ranks)}
	cpu := &cpuMeter{rec: h.Perf, ranks: len(h.Ranks)}
	maxValue := h.Segment.Params().MaxValue
	ctx, cancel := context.WithCancel(context.Background())
	for i, g := range h.Ranks {
		vr := virtualRank{
			info:     clientseam.Info{Rank: g, Size: spec.Size, LocalRank: i, LocalSize: len(h.Ranks), JobID: spec.JobID},
			op:       spec.Virtual,
			round:    round,
			played:   played,
			srv:      srv,
			rounds:   rounds,
			late:     spec.VirtualLate,
			clk:      clk,
			x:        x,
			cpu:      cpu,
			maxValue: maxValue,
		}
		go func() { // ends with Exited, which the node waits for
			code := 0
			if err := vr.run(ctx, h); err != nil {
				code = 1
				if ctx.Err() == nil { // a kill cancelled it: the job's failure is reported elsewhere
					h.Stderr(fmt.Appendf(nil, "pmid: rank %d: %v\n", g, err))
				}
			}
			h.Exited(i, code)
		}()
	}
	return cancel, nil
}

// virtualRank is one goroutine rank.
type virtualRank struct {
	info     clientseam.Info
	op       string
	round    virtualRound  // the workload's round on a shared-memory client, or
	played   playedRound   // on a client of srv, the node's played PMIx server (pmix.go)
	srv      *playedServer // shared by the node's ranks
	rounds   int
	late     time.Duration // Spec.VirtualLate
	clk      machineClock
	x        *stampExchange // shared by the node's ranks
	cpu      *cpuMeter      // shared by the node's ranks
	maxValue int            // the segment's value limit, which bounds one allgather of stamps
}

// run plays the rank: WarmupRounds untimed rounds, then the timed
// rounds back to back (or each after a barrier and rank 0's late arrival,
// see arrive), then the timestamp exchange, then Finalize. Global rank 0
// prints the timings.
func (v virtualRank) run(ctx context.Context, h node.Host) error {
	var pmi rankPMI
	var round func(ctx context.Context, r int, done func()) error
	if v.srv != nil {
		p, err := v.srv.connect(v.info.LocalRank)
		if err != nil {
			return err
		}
		pmi = p
		round = func(ctx context.Context, r int, done func()) error { return v.played(ctx, p, r, done) }
	} else {
		cl, err := clientseam.New(h.Segment, v.info)
		if err != nil {
			return err
		}
		c := cl.(*client.Client)
		pmi = shmPMI{c}
		round = func(ctx context.Context, r int, done func()) error { return v.round(ctx, c, r, done) }
	}
	err := v.play(ctx, pmi, round, h)
	if ferr := pmi.Finalize(); ferr != nil {
		return errors.Join(err, ferr)
	}
	if err != nil {
		return err
	}
	if derr := drainedNow(h.Agent, v.info.LocalRank); derr != nil {
		// Judging falls back to the node's timeout; not an error.
		h.Stderr(fmt.Appendf(nil, "pmid: rank %d: %v\n", v.info.Rank, derr))
	}
	return nil
}

// rankPMI is what a rank does besides its workload's rounds: the
// barrier before a late round, the allgather of its stamps, finalize. A
// shared-memory client does it (shmPMI), or a played PMIx client.
type rankPMI interface {
	Barrier(ctx context.Context) error
	Allgather(ctx context.Context, v []byte) (stampValues, error)
	Finalize() error
}

// shmPMI is a shared-memory client as a rankPMI.
type shmPMI struct{ c *client.Client }

func (s shmPMI) Barrier(ctx context.Context) error { return s.c.Fence(ctx) }
func (s shmPMI) Finalize() error                   { return s.c.Finalize() }

func (s shmPMI) Allgather(ctx context.Context, v []byte) (stampValues, error) {
	vals, err := s.c.Allgather(ctx, v)
	if err != nil {
		return nil, err
	}
	return vals, nil
}

func (v virtualRank) play(ctx context.Context, c rankPMI, round func(ctx context.Context, r int, done func()) error, h node.Host) error {
	rep := scaleReport{op: v.op, size: v.info.Size, local: v.info.LocalSize, late: v.late}
	timed := v.info.Rank == 0
	stamps := make([]int64, 0, 2*v.rounds) // in and out of each timed round
	var out int64
	done := func() { out = v.clk.now() }
	for r := range WarmupRounds + v.rounds {
		if r == WarmupRounds {
			v.cpu.begin()
		}
		if err := v.arrive(ctx, c); err != nil {
			return fmt.Errorf("%s round %d: %w", v.op, r, err)
		}
		t := time.Now()
		in := v.clk.now()
		if err := round(ctx, r, done); err != nil {
			return fmt.Errorf("%s round %d: %w", v.op, r, err)
		}
		v.cpu.rounds.Add(1)
		switch d := time.Since(t); {
		case r < WarmupRounds:
			rep.warmup += d
			continue
		case timed:
			rep.times = append(rep.times, d)
		}
		stamps = append(stamps, in, out)
	}
	v.cpu.end()
	ends, foreign, err := v.exchangeStamps(ctx, c, stamps)
	if err != nil {
		return err
	}
	if timed {
		rep.ends, rep.foreign = ends, foreign
		// The figures travel to pmirun as node counters (its --report);
		// the line is for people and scripts reading the job's output.
		f, _ := rep.figures()
		for name, v := range f.Counters() {
			h.Perf.Add(name, v)
		}
		h.Stdout([]byte(rep.line() + "\n"))
	}
	// No end barrier: an agent whose ranks are done keeps its links open
	// until pmirun closes them all (agentNode.loop), so a peer still in
	// its last round never sees it leave.
	return nil
}

// arrive starts a round of a late-arrival job (Spec.VirtualLate): every
// rank enters an untimed barrier (an empty Fence), and global rank 0 then
// waits v.late before it goes on, so that it enters the operation last,
// after the others' entries and whatever work they could finish without
// it. Back-to-back jobs (v.late = 0) go straight on.
func (v virtualRank) arrive(ctx context.Context, c rankPMI) error {
	if v.late <= 0 {
		return nil
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("barrier before the round: %w", err)
	}
	if v.info.Rank != 0 {
		return nil
	}
	return sleepFor(ctx, v.late)
}

// An exchanged value of stamps starts with stampHeader bytes, the
// machine of the rank's clock (machineClock.machine, little-endian), and
// then holds stampBytes per timed round: entry and completion,
// little-endian int64 nanoseconds of machineClock.
const (
	stampHeader = 8
	stampBytes  = 16
)

// exchangeStamps allgathers every rank's stamps (2 per timed round), as
// many rounds per allgather as a value holds, and returns, on global rank
// 0 only, each round's ends over the job and how many ranks' clocks are
// on another machine than rank 0's (whose stamps cannot be compared with
// its own).
func (v virtualRank) exchangeStamps(ctx context.Context, c rankPMI, stamps []int64) (ends []roundEnds, foreign int, err error) {
	per := (v.maxValue - stampHeader) / stampBytes
	if per < 1 {
		return nil, 0, fmt.Errorf("exchange timestamps: values of %d bytes cannot hold a round's %d", v.maxValue, stampHeader+stampBytes)
	}
	if v.info.Rank == 0 {
		ends = make([]roundEnds, v.rounds)
	}
	v.x.enter()
	buf := make([]byte, 0, stampHeader+min(per, v.rounds)*stampBytes)
	for lo := 0; lo < v.rounds; lo += per {
		hi := min(lo+per, v.rounds)
		buf = binary.LittleEndian.AppendUint64(buf[:0], v.clk.machine)
		for _, t := range stamps[2*lo : 2*hi] {
			buf = binary.LittleEndian.AppendUint64(buf, uint64(t))
		}
		vals, err := c.Allgather(ctx, buf)
		if err != nil {
			return nil, 0, fmt.Errorf("exchange timestamps of rounds %d-%d: %w", lo, hi-1, err)
		}
		if ends != nil {
			if foreign, err = foldStamps(ends[lo:hi], vals, v.clk.machine); err != nil {
				return nil, 0, fmt.Errorf("exchange timestamps of rounds %d-%d: %w", lo, hi-1, err)
			}
		}
	}
	v.x.leave()
	return ends, foreign, nil
}

// stampValues is an allgather result of stamps (client.Values).
type stampValues interface {
	Len() int
	At(r int) []byte
}

// foldStamps adds every rank's stamps of len(ends) consecutive rounds, one
// value per rank as exchangeStamps sends it, to ends, and returns how many
// ranks' clocks are on another machine than machine.
func foldStamps(ends []roundEnds, vals stampValues, machine uint64) (foreign int, err error) {
	for r := range vals.Len() {
		b := vals.At(r)
		if len(b) != stampHeader+len(ends)*stampBytes {
			return 0, fmt.Errorf("rank %d sent %d bytes, want %d", r, len(b), stampHeader+len(ends)*stampBytes)
		}
		if binary.LittleEndian.Uint64(b) != machine {
			foreign++
		}
		b = b[stampHeader:]
		for k := range ends {
			in := int64(binary.LittleEndian.Uint64(b[k*stampBytes:]))
			out := int64(binary.LittleEndian.Uint64(b[k*stampBytes+8:]))
			if out < in {
				return 0, fmt.Errorf("rank %d completed a round %dns before entering it", r, in-out)
			}
			ends[k].add(r, in, out)
		}
	}
	return foreign, nil
}

// roundEnds is one timed round over the whole job: the first and the last
// rank's entry into the operation and the last rank's completion, and
// global rank 0's entry and the last entry of the others, in nanoseconds
// of machineClock.
type roundEnds struct {
	firstIn, lastIn, lastOut int64
	rank0In, othersIn        int64 // othersIn: of ranks other than 0
	ranks, others            int   // stamps added; of them, of ranks other than 0
}

// add adds rank's stamps of the round.
func (e *roundEnds) add(rank int, in, out int64) {
	if e.ranks == 0 {
		e.firstIn, e.lastIn, e.lastOut = in, in, out
	} else {
		e.firstIn, e.lastIn, e.lastOut = min(e.firstIn, in), max(e.lastIn, in), max(e.lastOut, out)
	}
	switch {
	case rank == 0:
		e.rank0In = in
	case e.others == 0:
		e.othersIn, e.others = in, 1
	default:
		e.othersIn, e.others = max(e.othersIn, in), e.others+1
	}
	e.ranks++
}

// lateGap is how long after every other rank global rank 0 entered the
// round (negative: some rank entered after it), and false for a job of
// one rank.
func (e roundEnds) lateGap() (time.Duration, bool) {
	if e.others == 0 || e.others == e.ranks {
		return 0, false
	}
	return time.Duration(e.rank0In - e.othersIn), true
}

// span is the round from the first rank's entry to the last rank's
// completion.
func (e roundEnds) span() time.Duration { return time.Duration(e.lastOut - e.firstIn) }

// tail is how long after the last rank entered every rank had its result:
// the operation's own latency once everybody arrived, without the arrival
// skew. The last rank to enter completes after it entered, so tail ≥ 0,
// and tail ≤ span.
func (e roundEnds) tail() time.Duration { return time.Duration(e.lastOut - e.lastIn) }

// machineClock reads the machine's CLOCK_MONOTONIC as nanoseconds, cheaply.
// On Linux, Go's monotonic clock is CLOCK_MONOTONIC read through the vDSO
// but counted from the process's start, so readings of different agents
// cannot be compared; clock_gettime(2) can, but as a system call it costs
// several times as much (about 300 ns against 50 ns here), which thousands
// of goroutine ranks would pay twice a round, on the measured path. So
// newMachineClock reads both once and keeps the offset; now adds it to
// Go's clock. The offset is off by at most half the narrowest of a few
// bracketing reads, well under a microsecond.
//
// Readings are comparable only between agents on one machine: machine
// names it (sys.BootID), so that rank 0 can tell when they are not. When
// the boot id cannot be read, machine is this process's own (its pid and
// its clock's offset), which no other agent shares: the span and tail are
// then left out rather than made up.
type machineClock struct {
	base    time.Time // carries Go's monotonic reading
	offset  int64     // CLOCK_MONOTONIC at base
	machine uint64
}

func newMachineClock() (machineClock, error) {
	var c machineClock
	best := time.Duration(-1)
	for range 5 {
		t0 := time.Now()
		m, err := sys.MonotonicNanos()
		if err != nil {
			return c, err
		}
		if w := time.Since(t0); best < 0 || w < best {
			best = w
			c = machineClock{base: t0, offset: m - int64(w/2)}
		}
	}
	id, err := sys.BootID()
	if err != nil {
		id = uint64(os.Getpid())<<32 ^ uint64(c.offset)
	}
	c.machine = id
	return c, nil
}

func (c machineClock) now() int64 { return c.offset + int64(time.Since(c.base)) }

// stampExchange books, on one node, the growth of the stampCounters while
// the node's ranks exchange their stamps, under StampCounterPrefix. It
// relies on the agent's order of work: a node's counters for a collective
// are final when its ranks get the result (it sends its tree messages
// before it delivers), and the node sends nothing for a collective until
// all its ranks entered it. So the growth from the moment the last local
// rank finished its timed rounds to the moment the last local rank has the
// exchange's last result is the exchange's alone.
type stampExchange struct {
	rec   *perf.Recorder
	ranks int // local ranks

	mu sync.Mutex
	// guarded by mu
	entered, left int              // local ranks that entered, left the exchange
	before        map[string]int64 // the counters when the last rank entered
}

// enter is called by each local rank before its first exchange allgather.
func (x *stampExchange) enter() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.entered++; x.entered == x.ranks {
		x.before = x.rec.Counters()
	}
}

// leave is called by each local rank once it has its last exchange result.
func (x *stampExchange) leave() {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.left++; x.left != x.ranks || x.before == nil {
		return
	}
	for _, name := range stampCounters {
		x.rec.Add(StampCounterPrefix+name, x.rec.Counter(name)-x.before[name])
	}
}

// The counters under which a virtual node books its CPU time during the
// timed rounds (see cpuMeter).
const (
	// CPUCounter is the CPU time, user and system, in nanoseconds, that
	// the node's process used from the moment its first rank began its
	// timed rounds to the moment its last rank finished them.
	CPUCounter = "virtual.cpu.ns"
	// CPURoundsCounter is the rounds its ranks completed in that time
	// (warm-up rounds of late ranks included: they cost the same).
	CPURoundsCounter = "virtual.cpu.rank.rounds"
)

// cpuMeter books a node's CPU time per rank round: the work the agent and
// its goroutine ranks do for one rank's round, protocol and scheduling
// included, which on a machine with fewer cores than ranks bounds how fast
// the job can get through rounds (P ranks x this / cores). It reads the
// process's CPU clock when the node's first rank begins its timed rounds
// and when its last rank has finished them, and counts the rank rounds
// completed in between.
type cpuMeter struct {
	rec    *perf.Recorder
	ranks  int          // local ranks
	rounds atomic.Int64 // rank rounds completed by local ranks, warm-up included

	mu sync.Mutex
	// guarded by mu
	begun, ended int   // local ranks that began, finished their timed rounds
	cpu0, done0  int64 // the CPU clock and rounds when the first rank began
	err          error // reading the CPU clock failed: book nothing
}

// begin is called by each local rank before its first timed round.
func (m *cpuMeter) begin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.begun++; m.begun == 1 {
		m.cpu0, m.err = sys.ProcessCPUNanos()
		m.done0 = m.rounds.Load()
	}
}

// end is called by each local rank after its last timed round.
func (m *cpuMeter) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ended++; m.ended != m.ranks || m.err != nil {
		return
	}
	cpu, err := sys.ProcessCPUNanos()
	if err != nil {
		return
	}
	m.rec.Add(CPUCounter, cpu-m.cpu0)
	m.rec.Add(CPURoundsCounter, m.rounds.Load()-m.done0)
}

// drainedNow tells the agent that local rank i, which has finalized, will
// send nothing more: it binds a connection whose other end is already
// closed, so the agent ends it at once and closes Drained (see the file
// comment).
func drainedNow(ag *agent.Agent, i int) error {
	ours, theirs := net.Pipe()
	ours.Close()
	if err := ag.Serve(i, theirs); err != nil {
		return fmt.Errorf("mark drained: %w", err)
	}
	return nil
}

// scaleReport is rank 0's timings of one virtual job.
type scaleReport struct {
	op          string
	size, local int
	warmup      time.Duration
	late        time.Duration   // Spec.VirtualLate
	times       []time.Duration // per timed round, rank 0's own
	ends        []roundEnds     // per timed round, over the job
	foreign     int             // ranks whose clocks are on another machine than rank 0's
}

// line formats the report as one machine-readable line:
//
//	fastpmi-scale op=allgather P=8192 local=128 rounds=10 median_us=... min_us=... max_us=... mean_us=... warmup_us=... span_median_us=... span_min_us=... tail_median_us=... tail_min_us=... tail_max_us=...
//
// Times are microseconds with one decimal. median, min, max and mean are
// global rank 0's own rounds, from before its operation to after it
// completed and its result was checked (a fence round is put, fence and
// get); rounds run back to back, so on a machine with fewer cores than
// ranks they measure how fast the job gets through rounds. warmup is the
// untimed rounds together.
//
// span and tail are per round over every rank, from each rank's
// CLOCK_MONOTONIC stamps just before its operation and just after it
// returned (before the check); the clocks are comparable only because
// every agent runs on the same machine. span is the last completion minus
// the first entry: the round job-wide, arrival skew included. tail is the
// last completion minus the last entry: how long after the last rank
// arrived every rank had its result, the operation's own latency once
// everybody is in. tail ≤ span in every round. When some ranks' clocks
// are on other machines than rank 0's, the span and tail fields are left
// out and the line ends in "clocks=unshared foreign=N" (N such ranks).
//
// A late-arrival job (Spec.VirtualLate) adds late_us, rank 0's wait
// after each round's barrier, and, with shared clocks, late_last, the
// timed rounds rank 0 entered after every other rank, and
// late_gap_min_us, the least time by which it did (negative when some
// rank entered after it). In the rounds rank 0 entered last, the tail is
// the operation's latency after a late arrival.
func (r scaleReport) line() string {
	f, gaps := r.figures()
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }
	head := fmt.Sprintf("%s op=%s P=%d local=%d rounds=%d median_us=%s min_us=%s max_us=%s mean_us=%s warmup_us=%s",
		ScaleLinePrefix, f.Op, f.P, f.Local, f.Rounds, us(f.Median), us(f.Min), us(f.Max), us(f.Mean), us(f.Warmup))
	if f.Late > 0 {
		head += " late_us=" + us(f.Late)
	}
	if f.ForeignClocks > 0 {
		return fmt.Sprintf("%s clocks=unshared foreign=%d", head, f.ForeignClocks)
	}
	line := fmt.Sprintf("%s span_median_us=%s span_min_us=%s tail_median_us=%s tail_min_us=%s tail_max_us=%s",
		head, us(f.SpanMedian), us(f.SpanMin), us(f.TailMedian), us(f.TailMin), us(f.TailMax))
	if f.Late <= 0 {
		return line
	}
	line += fmt.Sprintf(" late_last=%d", f.LateLast)
	if gaps {
		line += " late_gap_min_us=" + us(f.LateGapMin)
	}
	return line
}

// figures reduces the report to the figures line prints, which rank 0
// also books as counters for pmirun's --report (jobreport.Scale); gaps
// says whether LateGapMin was measured (some round had ranks besides
// rank 0).
func (r scaleReport) figures() (f jobreport.Scale, gaps bool) {
	f = jobreport.Scale{Op: r.op, P: r.size, Local: r.local, Rounds: len(r.times), Warmup: r.warmup, Late: r.late}
	f.Median, f.Min, f.Max, f.Mean = durationStats(r.times)
	if r.foreign > 0 {
		f.ForeignClocks = r.foreign
		return f, false
	}
	spans := make([]time.Duration, len(r.ends))
	tails := make([]time.Duration, len(r.ends))
	for i, e := range r.ends {
		spans[i], tails[i] = e.span(), e.tail()
	}
	f.SpanMedian, f.SpanMin, _, _ = durationStats(spans)
	f.TailMedian, f.TailMin, f.TailMax, _ = durationStats(tails)
	if r.late <= 0 {
		return f, false
	}
	ds := make([]time.Duration, 0, len(r.ends))
	for _, e := range r.ends {
		if g, ok := e.lateGap(); ok {
			ds = append(ds, g)
			if g > 0 {
				f.LateLast++
			}
		} else {
			f.LateLast++ // rank 0 alone is last
		}
	}
	if len(ds) > 0 {
		_, f.LateGapMin, _, _ = durationStats(ds)
	}
	return f, len(ds) > 0
}

// durationStats returns the median (the mean of the middle two for an
// even count), minimum, maximum and mean of ds; zeros for none.
func durationStats(ds []time.Duration) (med, lo, hi, mean time.Duration) {
	if len(ds) == 0 {
		return 0, 0, 0, 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	lo, hi = s[0], s[len(s)-1]
	med = s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return med, lo, hi, sum / time.Duration(len(s))
}

// The workloads. Values depend only on (rank, round), so any rank can
// check any other rank's value.

// agValueLen is the allgather workload's value size.
const agValueLen = 64

// agValue is rank r's allgather value in round k: rank and round, then a
// pattern.
func agValue(b []byte, r, k int) []byte {
	b = b[:agValueLen]
	binary.LittleEndian.PutUint32(b, uint32(r))
	binary.LittleEndian.PutUint32(b[4:], uint32(k))
	for i := 8; i < len(b); i++ {
		b[i] = byte(r*31 + k + i)
	}
	return b
}

// checkValues checks a few entries of an allgather result: the first and
// last rank, this rank, its successor and one that moves with the round.
func checkValues(vals client.Values, rank, size, round int) error {
	if vals.Len() != size {
		return fmt.Errorf("result holds %d ranks, want %d", vals.Len(), size)
	}
	var want [agValueLen]byte
	for _, r := range [...]int{0, size - 1, rank, (rank + 1) % size, (rank*7919 + round*104729) % size} {
		got := vals.At(r)
		if string(got) != string(agValue(want[:], r, round)) {
			return fmt.Errorf("value of rank %d: got %d bytes %x..., want rank %d round %d", r, len(got), got[:min(len(got), 8)], r, round)
		}
	}
	return nil
}

func allgatherRound(ctx context.Context, c *client.Client, round int, done func()) error {
	var b [agValueLen]byte
	vals, err := c.Allgather(ctx, agValue(b[:], c.Rank(), round))
	if err != nil {
		return err
	}
	done()
	return checkValues(vals, c.Rank(), c.Size(), round)
}

func iallgatherRound(ctx context.Context, c *client.Client, round int, done func()) error {
	var b [agValueLen]byte
	req := c.Iallgather(agValue(b[:], c.Rank(), round))
	if err := req.Wait(ctx); err != nil {
		return err
	}
	done()
	return checkValues(req.Values(), c.Rank(), c.Size(), round)
}

// businessCard is what an MPICH-style library would put for rank r in
// round k: its address as text, much alike from rank to rank (which is
// what makes broadcasts of them compress).
func businessCard(r, k int) string {
	node := r / 64
	return fmt.Sprintf("description#node%05d$port#%d$ifname#10.%d.%d.%d$shm_host#node%05d$round#%d$",
		node, 40000+r%20000, 1+node>>8, node&255, 1+r%64, node, k)
}

func cardKey(r int) string { return fmt.Sprintf("bc-%d", r) }

// fenceRound puts this rank's business card (dense: it travels with the
// fence), fences, and reads the next rank's card.
func fenceRound(ctx context.Context, c *client.Client, round int, done func()) error {
	r, size := c.Rank(), c.Size()
	if err := c.Put(cardKey(r), []byte(businessCard(r, round)), client.Dense); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	src := (r + 1) % size
	v, err := c.Get(ctx, cardKey(src), client.FromRank(src))
	if err != nil {
		return err
	}
	done()
	if want := businessCard(src, round); string(v) != want {
		return fmt.Errorf("get %s: %q, want %q", cardKey(src), v, want)
	}
	return nil
}

func ringRound(ctx context.Context, c *client.Client, round int, done func()) error {
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:], uint32(c.Rank()))
	binary.LittleEndian.PutUint32(b[4:], uint32(round))
	res, err := c.Ring(ctx, b[:])
	if err != nil {
		return err
	}
	done()
	switch {
	case res.Size != c.Size():
		return fmt.Errorf("ring of %d ranks, want %d", res.Size, c.Size())
	case res.Rank < 0 || res.Rank >= res.Size:
		return fmt.Errorf("ring position %d of %d", res.Rank, res.Size)
	case len(res.Left) != len(b) || len(res.Right) != len(b):
		return fmt.Errorf("ring neighbours' values of %d and %d bytes, want %d", len(res.Left), len(res.Right), len(b))
	case binary.LittleEndian.Uint32(res.Left[4:]) != uint32(round) || binary.LittleEndian.Uint32(res.Right[4:]) != uint32(round):
		return fmt.Errorf("ring neighbours' values from another round")
	}
	return nil
}

// kvsValue is rank r's 16-byte value of round k for key.
func kvsValue(key string, r, k int) []byte {
	return fmt.Appendf(nil, "%08x%08x", uint32(r)*2654435761^uint32(k), uint32(len(key)))
}

// kvsGet reads key put by src and checks it.
func kvsGet(ctx context.Context, c *client.Client, key string, src, round int, onDemand bool) ([]byte, error) {
	opts := []client.GetOption{client.FromRank(src)}
	if onDemand {
		opts = append(opts, client.WaitForPut())
	}
	return c.Get(ctx, key, opts...)
}

// kvsDenseRound: rank 0 puts one 16-byte key, every rank gets it.
func kvsDenseRound(onDemand bool) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		key := fmt.Sprintf("d-%d", round)
		hint := client.Dense
		if onDemand {
			hint = client.Sparse
		}
		if c.Rank() == 0 {
			if err := c.Put(key, kvsValue(key, 0, round), hint); err != nil {
				return err
			}
		}
		if !onDemand {
			if err := c.Fence(ctx); err != nil {
				return err
			}
		}
		v, err := kvsGet(ctx, c, key, 0, round, onDemand)
		if err != nil {
			return err
		}
		done()
		if want := kvsValue(key, 0, round); string(v) != string(want) {
			return fmt.Errorf("get %s: %q, want %q", key, v, want)
		}
		return nil
	}
}

// kvsSparseRound: every rank puts one 16-byte key and gets its two
// rank-space neighbours' keys.
func kvsSparseRound(onDemand bool) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		r, size := c.Rank(), c.Size()
		key := func(r int) string { return fmt.Sprintf("s-%d-%d", round, r) }
		hint := client.Dense
		if onDemand {
			hint = client.Sparse
		}
		if err := c.Put(key(r), kvsValue(key(r), r, round), hint); err != nil {
			return err
		}
		if !onDemand {
			if err := c.Fence(ctx); err != nil {
				return err
			}
		}
		var got [2][]byte
		nbs := [2]int{(r + size - 1) % size, (r + 1) % size}
		for i, nb := range nbs {
			v, err := kvsGet(ctx, c, key(nb), nb, round, onDemand)
			if err != nil {
				return err
			}
			got[i] = v
		}
		done()
		for i, nb := range nbs {
			if want := kvsValue(key(nb), nb, round); string(got[i]) != string(want) {
				return fmt.Errorf("get %s: %q, want %q", key(nb), got[i], want)
			}
		}
		return nil
	}
}

// cardsRound puts this rank's business card without a hint, fences and
// reads every rank's card, as MPICH does at start-up.
func cardsRound(ctx context.Context, c *client.Client, round int, done func()) error {
	r, size := c.Rank(), c.Size()
	key := func(r int) string { return fmt.Sprintf("card-%d-%d", round, r) }
	if err := c.Put(key(r), []byte(businessCard(r, round)), client.HintNone); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	bad := -1
	for i := range size {
		src := (r + i) % size
		v, err := c.Get(ctx, key(src), client.FromRank(src))
		if err != nil {
			return err
		}
		if bad < 0 && string(v) != businessCard(src, round) {
			bad = src
		}
	}
	done()
	if bad >= 0 {
		return fmt.Errorf("get %s: wrong card", key(bad))
	}
	return nil
}

// The research's figures ("Non-blocking PMI Extensions for Fast MPI
// Startup", figures 9-12, pmibench -paper). Every rank exchanges one
// value of the research's Table I/II lengths, which mimic MVAPICH2's
// start-up: a 9-byte key (fence designs) and an 18-byte value, the same
// value for the allgather designs (whose key is the rank itself). The
// fence designs then read one value (the next rank's) to check the
// exchange; the research's figure 9 leaves gets out, and reading every
// rank's value would cost P gets per rank per round.

// paperKeyLen and paperValueLen are the research's Table I lengths.
const (
	paperKeyLen   = 9
	paperValueLen = 18
)

// paperKey is rank r's key: "pmi" and six decimal digits (ranks below a
// million, far above what one machine runs).
func paperKey(r int) string { return fmt.Sprintf("pmi%06d", r%1000000) }

// paperValue is rank r's value of round k: both in hex, as an address
// would be.
func paperValue(r, k int) []byte {
	return fmt.Appendf(make([]byte, 0, paperValueLen), "%08x.%08x;", uint32(r), uint32(k))
}

// checkPaperValues checks a few entries of an allgather of paperValues,
// as checkValues does for agValues.
func checkPaperValues(vals client.Values, rank, size, round int) error {
	if vals.Len() != size {
		return fmt.Errorf("result holds %d ranks, want %d", vals.Len(), size)
	}
	for _, r := range [...]int{0, size - 1, rank, (rank + 1) % size, (rank*7919 + round*104729) % size} {
		if got, want := vals.At(r), paperValue(r, round); string(got) != string(want) {
			return fmt.Errorf("value of rank %d: got %q, want %q", r, got, want)
		}
	}
	return nil
}

// paperPut puts this rank's key and value for round; they travel with
// the fence.
func paperPut(c *client.Client, round int) error {
	return c.Put(paperKey(c.Rank()), paperValue(c.Rank(), round), client.Dense)
}

// paperGetNext reads the next rank's value after the fence of round,
// calls done and checks the value.
func paperGetNext(ctx context.Context, c *client.Client, round int, done func()) error {
	src := (c.Rank() + 1) % c.Size()
	v, err := c.Get(ctx, paperKey(src), client.FromRank(src))
	if err != nil {
		return err
	}
	done()
	if want := paperValue(src, round); string(v) != string(want) {
		return fmt.Errorf("get %s: %q, want %q", paperKey(src), v, want)
	}
	return nil
}

// paperFenceRound: put, Fence (or Ifence and Wait at once), get the next
// rank's value.
func paperFenceRound(nonBlocking bool) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		if err := paperPut(c, round); err != nil {
			return err
		}
		var err error
		if nonBlocking {
			err = c.Ifence().Wait(ctx)
		} else {
			err = c.Fence(ctx)
		}
		if err != nil {
			return err
		}
		return paperGetNext(ctx, c, round, done)
	}
}

// paperAllgatherRound: Allgather (or Iallgather and Wait at once) of
// this rank's value.
func paperAllgatherRound(nonBlocking bool) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		v := paperValue(c.Rank(), round)
		var vals client.Values
		if nonBlocking {
			req := c.Iallgather(v)
			if err := req.Wait(ctx); err != nil {
				return err
			}
			vals = req.Values()
		} else {
			var err error
			if vals, err = c.Allgather(ctx, v); err != nil {
				return err
			}
		}
		done()
		return checkPaperValues(vals, c.Rank(), c.Size(), round)
	}
}

// compute is a rank's work between starting a non-blocking collective
// and waiting for it (sleepFor or spinFor).
type compute func(ctx context.Context, d time.Duration) error

// sleepFor sleeps d: compute that leaves the CPU to the agent, the
// research's first kind.
func sleepFor(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// spinFor burns CPU until d has passed by the wall clock: the research's
// worst case, compute that contends with the agent for the CPU. Its
// bound is wall time, not CPU time, so a round ends after d however many
// goroutine ranks share the CPUs. It spins in slices of spinSlice and
// yields to the Go scheduler between them: Go preempts a goroutine that
// never yields only after 10 ms, so without the yield one spinning rank
// would hold its agent's CPU for that long, and the ranks behind it
// would start their exchange (and their compute) one after another
// instead of together, as ranks on cores of their own do. The agent's
// goroutines still queue behind every spinning rank of their process.
func spinFor(ctx context.Context, d time.Duration) error {
	start := time.Now()
	x := uint64(1)
	for n := 1; time.Since(start) < d; n++ {
		for t := time.Now(); time.Since(t) < spinSlice; {
			for range 64 {
				x = x*6364136223846793005 + 1442695040888963407
			}
		}
		runtime.Gosched()
		if n%64 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
	}
	if x == 0 { // keeps the arithmetic live; this LCG (odd increment) cannot return to 0 this soon
		return errors.New("spin: arithmetic went wrong")
	}
	return nil
}

// spinSlice is how long spinFor burns CPU between yields.
const spinSlice = 20 * time.Microsecond

// overlapRound (figure 11): start a non-blocking exchange (put and
// Ifence, or Iallgather), compute for work, then Wait and read the
// result. Overlap is judged by pmibench against the blocking design's
// time: overlapRound's time is the blocking time plus work when nothing
// overlaps, and work when everything does.
func overlapRound(allgather bool, comp compute) func(work time.Duration) virtualRound {
	return func(work time.Duration) virtualRound {
		return func(ctx context.Context, c *client.Client, round int, done func()) error {
			if allgather {
				req := c.Iallgather(paperValue(c.Rank(), round))
				if err := comp(ctx, work); err != nil {
					return err
				}
				if err := req.Wait(ctx); err != nil {
					return err
				}
				done()
				return checkPaperValues(req.Values(), c.Rank(), c.Size(), round)
			}
			if err := paperPut(c, round); err != nil {
				return err
			}
			req := c.Ifence()
			if err := comp(ctx, work); err != nil {
				return err
			}
			if err := req.Wait(ctx); err != nil {
				return err
			}
			return paperGetNext(ctx, c, round, done)
		}
	}
}

// The MPI_Init-style start-ups (figure 10): local initialisation work
// (sleeping work, as an MPI library's set-up of its devices) and the
// exchange of addresses. done marks the return from "MPI_Init".

// initFenceRound: work, put, Fence, get the next rank's value.
func initFenceRound(work time.Duration) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		if err := sleepFor(ctx, work); err != nil {
			return err
		}
		return paperFenceRound(false)(ctx, c, round, done)
	}
}

// initAllgatherRound: work, Allgather.
func initAllgatherRound(work time.Duration) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		if err := sleepFor(ctx, work); err != nil {
			return err
		}
		return paperAllgatherRound(false)(ctx, c, round, done)
	}
}

// initIallgatherRound: Iallgather started before the work; init returns
// after the work (done), and the Wait is deferred past it, to where the
// application first needs a peer's address (here: at once). The round
// ends when Wait returned, so the next round's Iallgather never overlaps
// this one.
func initIallgatherRound(work time.Duration) virtualRound {
	return func(ctx context.Context, c *client.Client, round int, done func()) error {
		req := c.Iallgather(paperValue(c.Rank(), round))
		if err := sleepFor(ctx, work); err != nil {
			return err
		}
		done()
		if err := req.Wait(ctx); err != nil {
			return err
		}
		return checkPaperValues(req.Values(), c.Rank(), c.Size(), round)
	}
}
