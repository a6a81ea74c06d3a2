package node

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/pmix"
	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/shm"
)

// Options are what the process running a node gives it besides the Spec.
type Options struct {
	Index  int       // this node's index in Spec.Nodes
	Stdin  io.Reader // rank 0's input (node holding rank 0 only); nil = /dev/null
	Stdout io.Writer // the ranks' output; nil = os.Stdout
	Stderr io.Writer // nil = os.Stderr
	Logger *slog.Logger
	Perf   *perf.Recorder // nil = a new one
	// Upstream is the rest of the job; nil = agent.Local (one node).
	Upstream agent.Upstream
	// Emit receives the node's reports about its ranks, on the goroutine
	// that calls Node's methods.
	Emit func(agent.Event)
	// Ready, when set, is called after each event the node queues on
	// Events, from the goroutine that queued it; it must not block. An
	// owner of many nodes waits for it instead of selecting on every
	// node's channel, then drains the channels of the nodes it named.
	Ready func()
	// Sleeper, if set, is where the agent's shared-memory front end
	// sleeps when idle, without a thread of its own (agent.Config.Sleeper):
	// an owner of many nodes shares one among them and closes it after
	// them. nil = the agent sleeps on its own thread.
	Sleeper *shm.Sleeper
	// Starter, when set, plays the ranks instead of forking Spec.Prog
	// (Spec.Virtual); nil = fork.
	Starter Starter
	// Hosts names each node of Spec.Nodes for the ranks (Table.Hosts);
	// nil for a job of one node, named by this machine's host name.
	Hosts []string
}

// Starter plays a node's ranks inside the agent's process instead of
// forking them (the scale benchmark's virtual ranks, internal/virtual). It
// starts them and returns at once, with a function that asks every rank to
// stop (a kill; called at most once, from the node's goroutine). Each rank
// must end with exactly one Host.Exited call.
type Starter func(h Host) (stop func(), err error)

// Host is what a Starter's ranks get of their node.
type Host struct {
	Spec    *Spec
	Ranks   []int        // global ranks, local order
	Segment *shm.Segment // the node's segment (a Starter needs Spec.NoShm false)
	Agent   *agent.Agent
	Perf    *perf.Recorder
	// Stdout and Stderr write whole lines to the job's output.
	Stdout, Stderr func(line []byte)
	// Exited reports that local rank i ended with code; safe from any
	// goroutine.
	Exited func(i, code int)
}

// Node is one job's share of one node: the agent, the local ranks'
// processes (or a Starter's goroutine ranks) and their output. It turns
// what happens to each rank into Events for the job's fate (Options.Emit)
// and carries out the fate's orders (Kill, Signal). Only its owner's
// goroutine calls its methods; the forkers, rank waiters and the agent feed
// it through the channel Events returns.
type Node struct {
	spec   *Spec
	opt    Options
	ranks  []int // global ranks here, local order
	ag     *agent.Agent
	rec    *perf.Recorder
	out    *Output
	host   string     // %h in output prefixes and file names (hostName), if a pattern has it
	env    []string   // every rank's environment but its own variables
	apps   []int      // each local rank's App (index into spec.Apps)
	paths  []string   // each App's resolved program, for the Apps with local ranks
	binds  [][]int    // CPUs of each local rank (Spec.Bind), or nil
	stdins []*os.File // each local rank's input (Spec.StdinRank all), or nil; closed as it starts

	// shells[ai] says App ai's program is a script without "#!", which
	// /bin/sh runs (execvp's fallback, which Hydra relies on): set by
	// the first rank whose exec fails with an exec format error, read by
	// the ranks forked after it, on the forking goroutines.
	shells []atomic.Bool

	// cpus are the CPUs this process may use, read once by New (cpusErr
	// if they could not be), for the oversubscription test and binding.
	// oversubscribed: the node runs more ranks than that; slack is the
	// timer slack its ranks start with (rankSlack).
	cpus           []int
	cpusErr        error
	oversubscribed bool
	slack          time.Duration
	// devNull is the input of the ranks that read none, opened once by
	// Resolve (os/exec would open it for every rank), closed by Close.
	devNull *os.File
	// pmiIDs are the local ranks' PMI_ID tokens with PMIPort (pmiport.go).
	pmiIDs []string
	seg    *os.File     // shared-memory segment passed to ranks, or nil
	shm    *shm.Segment // the segment itself (goroutine ranks map it in place)
	evch   chan event

	procs   map[int]*rankProc // by global rank
	judged  int               // procs whose end was judged and reported
	killing bool              // Kill was called (its grace timer is one of the waiters)
	waiters sync.WaitGroup    // the fork phase, the rank processes' waiters, the exit judges, the disconnect timers
	quit    chan struct{}     // closed by Close: judges and timers stop waiting

	// forking is true from Start until Handle takes evStarted: the ranks
	// are forked meanwhile (forkAll), and handed over through fk.
	forking bool
	fk      forkPhase
	// tag is in every rank's environment (guard.TagVar): the process's
	// guard kills what holds it if this process dies while the ranks are
	// forked, before it registered them all.
	tag string

	// starterStop stops a Starter's ranks, or is nil.
	starterStop func()
	// topo makes the node's topology file (topology.go), or is nil: the
	// ranks are played, or lstopo is not installed.
	topo *topology
	// pmix serves the ranks over PMIx too (Spec.MPI "pmix", pmix.go), or
	// is nil; pmixDir is the node's directory for Open MPI's shared-memory
	// files, removed at Close.
	pmix    *pmix.Job
	pmixDir string
}

// New creates node o.Index of spec: its agent and shared-memory segment.
// It starts no rank (Start does).
func New(spec *Spec, o Options) (*Node, error) {
	if o.Index < 0 || o.Index >= len(spec.Nodes) {
		return nil, fmt.Errorf("node index %d: want 0..%d", o.Index, len(spec.Nodes)-1)
	}
	if o.Hosts != nil && len(o.Hosts) != len(spec.Nodes) {
		return nil, fmt.Errorf("%d node names for %d nodes", len(o.Hosts), len(spec.Nodes))
	}
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Stderr == nil {
		o.Stderr = os.Stderr
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Perf == nil {
		o.Perf = perf.NewRecorder()
	}
	if o.Emit == nil {
		o.Emit = func(agent.Event) {}
	}
	ranks := spec.Nodes[o.Index]
	var ids []string
	var peerCheck func(net.Conn) error
	if spec.PMIPort {
		var err error
		if ids, err = newPMIIDs(len(ranks)); err != nil {
			return nil, err
		}
		peerCheck = samePeerUser
	}
	n := &Node{
		pmiIDs: ids,
		spec:   spec, opt: o, ranks: ranks, rec: o.Perf,
		evch:  make(chan event, 8*len(ranks)+64),
		quit:  make(chan struct{}),
		procs: make(map[int]*rankProc, len(ranks)),
	}
	if n.cpus, n.cpusErr = sys.AllowedCPUs(); n.cpusErr == nil {
		n.oversubscribed = len(ranks) > len(n.cpus)
	}
	n.slack = rankSlack(spec.TimerSlack, n.oversubscribed)
	var late map[string]func()
	if o.Starter == nil {
		if p := lstopoPath(); p != "" {
			n.topo = &topology{lstopo: p}
			// The first read of the attribute has the owner's loop make
			// the file (Handle, evTopology).
			late = map[string]func(){agent.AttrHwlocXML: func() { n.send(event{kind: evTopology}) }}
		}
	}
	if len(spec.Apps) > 0 {
		n.apps = make([]int, len(ranks))
		for i, g := range ranks {
			n.apps[i] = spec.App(g)
		}
	}
	preput := make([]agent.KV, len(spec.Preput))
	for i, p := range spec.Preput {
		preput[i] = agent.KV{Key: p.Key, Val: p.Val, Owner: -1}
	}
	kvs, err := agent.ParseKVSPolicy(spec.KVS)
	if err != nil {
		return nil, err
	}
	ag, err := agent.New(agent.Config{
		JobID:        spec.JobID,
		Size:         spec.Size,
		Local:        ranks,
		Appnum:       n.apps,
		Mapping:      spec.Mapping,
		UniverseSize: spec.Usize,
		SpawnerJobID: spec.SpawnerJobID,
		Preput:       preput,
		KVS:          kvs,
		Upstream:     o.Upstream,
		Events:       func(e agent.Event) { n.send(event{kind: evAgent, ev: e}) },
		Logger:       o.Logger,
		Perf:         o.Perf,
		LateAttrs:    late,
		IDs:          ids,
		PeerCheck:    peerCheck,
		Sleeper:      o.Sleeper,
	})
	if err != nil {
		return nil, err
	}
	n.ag = ag
	prefix := spec.Prefix
	if prefix == "" && spec.Label {
		prefix = "[%r] "
	}
	if spec.Jobno > 0 {
		// A spawned job's ranks are "job,rank": [1,0] is job 1's rank 0.
		prefix = strings.ReplaceAll(prefix, "%r", strconv.Itoa(spec.Jobno)+",%r")
	}
	if strings.Contains(prefix+spec.OutPattern+spec.ErrPattern, "%h") {
		n.host = hostName(o)
	}
	n.out = NewOutput(NewPrefix(prefix, n.host), spec.Size > 1, spec.PartialLines, o.Stdout, o.Stderr)
	n.tag = guard.NewTag()
	n.env = append(baseEnv(spec, len(ranks)), guard.TagVar+"="+n.tag)
	if !spec.NoShm {
		seg, err := shm.Create(segmentParams(len(ranks), spec.Size))
		if err != nil {
			ag.Close()
			if sys.IsFileSizeLimit(err) {
				// The segment is a file (a memfd) to the kernel.
				return nil, fmt.Errorf("create shared memory: %w (the file size limit, RLIMIT_FSIZE: see ulimit -f; or run with --no-shm to use PMI_FD only)", err)
			}
			return nil, fmt.Errorf("create shared memory: %w (run with --no-shm to use PMI_FD only)", err)
		}
		if o.Starter != nil {
			// Every party is a goroutine of this process.
			seg.SetWaiter(shm.InProcessWaiter())
		}
		if err := ag.AttachSegment(seg); err != nil {
			seg.Close()
			ag.Close()
			return nil, err
		}
		n.seg = seg.File()
		n.shm = seg
		fd := 4
		if spec.PMIPort {
			fd = 3
		}
		n.env = append(n.env, "FASTPMI_SHM_FD="+strconv.Itoa(fd))
	}
	if spec.PMIPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			ag.Close()
			return nil, fmt.Errorf("listen for PMI_PORT connections: %w", err)
		}
		ag.ServeListener(ln)
		n.env = append(n.env, "PMI_PORT="+ln.Addr().String())
	}
	if err := n.startPMIx(); err != nil {
		ag.Close()
		return nil, err
	}
	return n, nil
}

// Memory counters (RecordMemory): the agent process's peak resident size
// and the shared segment's touched pages, one copy per node however many
// ranks map it.
const (
	CounterAgentRSS    = "agent.rss.peak.bytes"
	CounterSegResident = "segment.resident.bytes"
)

// hostName is what %h names this node in output prefixes and file
// names: the run's name for it (Options.Hosts: the node names its ranks
// see, a host name with a suffix where nodes share one) when the
// launcher named the run's nodes, else this machine's host name.
func hostName(o Options) string {
	if o.Hosts != nil {
		return o.Hosts[o.Index]
	}
	h, _ := os.Hostname()
	return h
}

// RecordMemory adds the node's memory counters to its recorder; call it
// once, when the ranks have ended and before Close. A figure that cannot
// be read is left out.
func (n *Node) RecordMemory() {
	if rss, err := sys.PeakRSS(); err == nil {
		n.rec.Add(CounterAgentRSS, rss)
	}
	if n.seg != nil {
		if b, err := sys.FileMemory(n.seg); err == nil {
			n.rec.Add(CounterSegResident, b)
		}
	}
}

// segmentParams sizes a node's segment. The node KVS holds a few keys per
// rank (its entries are not pre-faulted: unused capacity costs address
// space, not memory).
func segmentParams(local, size int) shm.Params {
	kvs := min(max(4*shm.DefaultKVSCapacity, 16*size), 1<<20)
	return shm.Params{LocalRanks: local, WorldSize: size, KVSCapacity: kvs, FirstEpoch: 1}
}

// SegmentBytes is the memory a node of local ranks in a job of size
// ranks takes at once for its shared segment, or why the segment cannot
// be made.
func SegmentBytes(local, size int) (uint64, error) {
	return shm.ResidentBytes(segmentParams(local, size))
}

// Agent returns the node's agent.
func (n *Node) Agent() *agent.Agent { return n.ag }

// Ranks returns the node's global ranks, in local order.
func (n *Node) Ranks() []int { return n.ranks }

// Resolve finds the program of every App with ranks on this node; an
// error means no rank can start (the caller reports it, exit code 127).
func (n *Node) Resolve() error {
	if n.opt.Starter != nil {
		return nil
	}
	n.paths = make([]string, len(n.spec.Apps))
	n.shells = make([]atomic.Bool, len(n.spec.Apps))
	for _, ai := range n.apps {
		if n.paths[ai] != "" {
			continue
		}
		a := &n.spec.Apps[ai]
		path, err := a.Resolve(n.spec.Wdir, n.env)
		if err != nil {
			if len(n.spec.Apps) > 1 {
				return fmt.Errorf("cannot run %q (command %d): %w", a.Prog, ai, err)
			}
			return fmt.Errorf("cannot run %q: %w", a.Prog, err)
		}
		n.paths[ai] = path
	}
	if n.spec.Bind != "" {
		if n.cpusErr != nil {
			return fmt.Errorf("bind ranks: %w", n.cpusErr)
		}
		n.binds = bindSets(sys.CPUPlaces(n.cpus), n.spec.Bind, n.spec.MapBy, len(n.ranks))
	}
	if n.spec.StdinRank == -2 && n.opt.Stdin != nil {
		var err error
		if n.stdins, err = stdinFiles(n.opt.Stdin, len(n.ranks)); err != nil {
			return fmt.Errorf("stdin for every rank: %w", err)
		}
	} else if n.devNull == nil {
		var err error
		if n.devNull, err = os.Open(os.DevNull); err != nil {
			return fmt.Errorf("input of the ranks: %w", err)
		}
	}
	return nil
}

// wdir is where App ai's ranks start.
func (n *Node) wdir(ai int) string { return n.spec.Apps[ai].workDir(n.spec.Wdir) }

// Start begins the node's ranks and returns: it forks every local rank on
// goroutines of its own (or hands them to the Starter) while the owner's
// loop goes on, so that a signal, a timeout or a failure during the fork
// phase is acted on at once (Kill stops the forks still to come). Once
// every rank is forked, the owner's Handle (evStarted) hands their PMI
// connections to the agent: no running rank is served before that, so on
// a machine with fewer CPUs than ranks the ranks that are up wait in their
// first PMI read instead of taking the CPU from the forks still to come
// (docs/benchmarks.md); a rank whose process has ended is served at once,
// by its waiter. Up to forkers ranks are forked at once. A rank that
// cannot start is reported, and no rank after it is started (those
// already forked are ended with the job). Call Resolve first.
func (n *Node) Start() {
	if n.opt.Starter != nil {
		n.startPlayed()
		return
	}
	if len(n.paths) != len(n.spec.Apps) {
		n.failStart(0, "no program resolved")
		return
	}
	reserveThreads()
	n.forking = true
	n.waiters.Go(func() {
		// A rank runs from its fork, and a busy process may take a while
		// to register it with its guard: until every rank forked is
		// registered, the guard kills by the ranks' tag.
		tagged := guard.Forking(n.tag)
		forks := n.forkAll()
		if tagged {
			guard.Forked(n.tag)
		}
		n.send(event{kind: evStarted, forks: forks})
	})
}

// started ends the fork phase (evStarted, on the owner's goroutine): every
// forked rank is the node's, the first rank that could not start is
// reported, the agent stops waiting for the ranks that did not start, and
// the forked ranks' PMI connections are served.
func (n *Node) started(forks []forked) {
	n.adopt(nil)
	n.forking = false
	failed, unstarted := -1, 0
	for i, f := range forks {
		if f.p == nil {
			unstarted++
			if f.err != nil && failed < 0 {
				failed = i
			}
			continue
		}
		// On the rank's own track, before its life: forks overlap.
		n.rec.Span(perf.SliceFork, f.p.rank, f.t0, f.t1)
		n.rec.MarkAt(perf.PhaseRankForked, f.p.rank, f.t1)
	}
	if failed >= 0 {
		err := forks[failed].err
		why := err.Error()
		if sys.IsProcessLimit(err) {
			why += " (no room for another process: see ulimit -u and the pids cgroup's pids.max)"
		}
		if sys.IsFileLimit(err) {
			why += " (no descriptors left for another rank: see ulimit -n)"
		}
		var pe *fs.PathError
		if errors.Is(err, fs.ErrNotExist) && errors.As(err, &pe) {
			if in := interpreter(pe.Path); in != "" {
				// The file is there: what is missing is what runs it.
				why += fmt.Sprintf(" (its interpreter %q is not found)", in)
			}
		}
		n.opt.Emit(agent.Event{Kind: agent.EventStartFailed, Rank: n.ranks[failed], Code: ExitCodeFor(err), Msg: why})
	} else if unstarted > 0 {
		n.opt.Logger.Info("the job ended while its ranks were forked", "forked", len(forks)-unstarted, "unstarted", unstarted)
	}
	for i, f := range forks {
		if f.p == nil { // the ranks that started are judged when they end
			n.ag.RankGone(n.ranks[i], "never started")
		}
	}
	guard.StartupOver() // the guard's start-up no longer competes with the ranks'
	for _, f := range forks {
		if f.p != nil {
			n.serve(f.p)
		}
	}
}

// watch starts rank p's waiter, as soon as it is forked: its exit is
// reaped, and queued for the owner's loop, while the other forks go on.
func (n *Node) watch(p *rankProc) {
	n.waiters.Go(func() {
		ws, werr := p.proc.Wait() // in the poller: no thread per rank
		ev := event{kind: evExit, ev: agent.Event{Kind: agent.EventExited, Rank: p.rank}}
		if werr == nil {
			code, sig, signaled := sys.WaitCode(ws)
			ev.ev.Code = code
			if signaled {
				ev.ev.Sig = sig
			}
		} else {
			ev.ev.Code, ev.ev.Msg = 1, werr.Error()
		}
		// Reaped: the group's id is free for reuse once its last
		// process has gone, so its guard registration must not
		// outlive that; if the rank left processes behind, it ends
		// with the job (Close).
		ev.groupGone = sys.GroupGone(p.pid)
		n.send(ev)
		// Its exit first: a connection that ends after its process
		// did is not a lost rank. What it sent is served before the
		// exit is judged (Handle waits for the agent to drain it).
		n.serve(p)
	})
}

// forkers is how many ranks a node forks at once. A fork returns once
// the child has exec'd (Go forks with CLONE_VFORK), and the child runs as
// a scheduling group of its own (its session): on a busy machine several
// forks in flight overlap those waits, which one after the other made
// "ranks forked" the longest phase of a job (docs/benchmarks.md).
const forkers = 4

// forked is one rank's fork: its process, or why it did not start, and
// when the fork began and ended (for the trace).
type forked struct {
	p      *rankProc
	err    error
	t0, t1 time.Time
}

// forkAll forks the node's ranks, up to forkers at once, gives each
// forked rank to the owner (forkPhase.add) and starts its waiter, and
// returns each one's result by local index. Once a fork failed, or Kill
// stopped the phase, no other begins; forks already under way finish.
// The result of a rank not tried has neither p nor err.
func (n *Node) forkAll() []forked {
	out := make([]forked, len(n.ranks))
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for range min(forkers, len(n.ranks)) {
		wg.Go(func() {
			for !failed.Load() && !n.fk.stopped.Load() {
				i := int(next.Add(1) - 1)
				if i >= len(n.ranks) {
					return
				}
				f := &out[i]
				f.t0 = time.Now()
				f.p, f.err = n.startRank(n.ranks[i], i)
				f.t1 = time.Now()
				if f.err != nil {
					failed.Store(true)
					continue
				}
				n.fk.add(f.p)
				n.watch(f.p)
			}
		})
	}
	wg.Wait()
	return out
}

// forkPhase is what the forkers share with the owner's goroutine while a
// node's ranks are forked (Start): each rank forked waits in forked until
// the owner adopts it into Node.procs, which the owner does before it
// acts on ranks; a signal the owner sends meanwhile is kept in sent, and
// a rank forked after it gets it from its forker, so that every rank gets
// every signal, once. Kill stops the phase: no fork begins after it.
type forkPhase struct {
	mu     sync.Mutex
	forked []*rankProc // forked, not yet adopted (guarded by mu)
	sent   []os.Signal // sent to the node's ranks during the phase, in order (guarded by mu)
	// stopped is set by Kill and loaded by the forkers before each
	// fork (forkAll).
	stopped atomic.Bool
}

// add hands the forked rank p to the owner, and sends it the signals the
// ranks forked before it got. A forker calls it before p's waiter starts,
// so p is not yet reaped when they reach its group.
func (fp *forkPhase) add(p *rankProc) {
	fp.mu.Lock()
	fp.forked = append(fp.forked, p)
	sent := fp.sent
	fp.mu.Unlock()
	for _, sig := range sent {
		_ = sys.SignalGroup(p.pid, sig)
	}
}

// take returns the ranks forked since the last take. A sig that is not
// nil is kept, in the same step, for the ranks forked from now on: the
// caller sends it to those it took.
func (fp *forkPhase) take(sig os.Signal) []*rankProc {
	fp.mu.Lock()
	defer fp.mu.Unlock()
	if sig != nil {
		fp.sent = append(fp.sent, sig)
	}
	ps := fp.forked
	fp.forked = nil
	return ps
}

// adopt takes the ranks forked so far into procs, during the fork phase
// (the owner's methods call it before they act on ranks); a sig that is
// not nil is about to be sent to every rank (forkPhase.take).
func (n *Node) adopt(sig os.Signal) {
	if !n.forking {
		return
	}
	for _, p := range n.fk.take(sig) {
		n.procs[p.rank] = p
	}
}

// failStart reports that local rank i could not start, and releases the
// agent's waits for it and every rank after it.
func (n *Node) failStart(i int, why string) { n.failStartCode(i, 1, why) }

// failStartCode is failStart with the job's exit code (ExitCodeFor).
func (n *Node) failStartCode(i, code int, why string) {
	n.opt.Emit(agent.Event{Kind: agent.EventStartFailed, Rank: n.ranks[i], Code: code, Msg: why})
	for _, r := range n.ranks[i:] {
		n.ag.RankGone(r, "never started")
	}
}

// startPlayed hands the ranks to the Starter.
func (n *Node) startPlayed() {
	if n.shm == nil {
		n.failStart(0, "ranks played in the agent need the shared-memory segment (drop --no-shm)")
		return
	}
	for _, g := range n.ranks {
		n.procs[g] = &rankProc{rank: g}
	}
	stop, err := n.opt.Starter(Host{
		Spec: n.spec, Ranks: n.ranks, Segment: n.shm, Agent: n.ag, Perf: n.rec,
		Stdout: n.out.out.writeLines, Stderr: n.out.err.writeLines,
		Exited: func(i, code int) {
			n.send(event{kind: evExit, ev: agent.Event{Kind: agent.EventExited, Rank: n.ranks[i], Code: code}})
		},
	})
	if err != nil {
		for _, g := range n.ranks {
			delete(n.procs, g)
		}
		n.failStart(0, err.Error())
		return
	}
	n.starterStop = stop
}

// Events delivers what happens to the node's ranks; the owner passes each
// to Handle.
func (n *Node) Events() <-chan RankEvent { return n.evch }

// send queues ev for the owner (Events) and tells it (Options.Ready).
func (n *Node) send(ev event) {
	n.evch <- ev
	if n.opt.Ready != nil {
		n.opt.Ready()
	}
}

// Live is the number of started ranks whose end has not been judged and
// reported yet: a rank that exited with code 0 stays live until the agent
// has read all it sent (did it finalize?), so that its verdict is never
// lost to a loop that stops at the last exit. During the fork phase the
// ranks still to fork count too, and the phase itself counts as one until
// Handle took its end (evStarted): every rank may have been forked and
// judged before that event reaches the loop, whose forks it reports.
func (n *Node) Live() int {
	if n.forking {
		return len(n.ranks) - n.judged + 1
	}
	return len(n.procs) - n.judged
}

// Kill ends every local rank: SIGTERM now, SIGKILL after KillGrace (an
// event on Events, which Handle acts on).
func (n *Node) Kill() {
	if n.killing {
		return
	}
	n.killing = true
	n.fk.stopped.Store(true) // no fork begins from now on
	n.Signal(sys.SIGTERM)
	n.waiters.Go(func() {
		t := time.NewTimer(n.spec.KillGrace)
		defer t.Stop()
		select {
		case <-t.C:
			n.send(event{kind: evKillGrace})
		case <-n.quit:
		}
	})
}

// KillNow sends every local rank SIGKILL at once, without Kill's grace.
func (n *Node) KillNow() { n.Signal(sys.SIGKILL) }

// Signal sends sig to every local rank's process group (during the fork
// phase: to the ranks forked so far, and to the others as they are
// forked), and to the groups of ended ranks whose processes outlived
// them: a job that fails or is interrupted ends those too.
func (n *Node) Signal(sig os.Signal) {
	n.adopt(sig)
	for _, p := range n.procs {
		if p.pid == 0 { // played ranks have no process
			continue
		}
		switch {
		case !p.exited:
			_ = sys.SignalGroup(p.pid, sig)
		case p.leftBehind:
			if sys.IsGroupGone(sys.SignalGroup(p.pid, sig)) {
				p.leftBehind = false // the group is gone; its id may be reused
			}
		}
	}
	if n.starterStop != nil && (sig == sys.SIGTERM || sig == sys.SIGKILL) {
		n.starterStop()
		n.starterStop = nil
	}
}

// Handle judges one local event and reports it.
func (n *Node) Handle(re RankEvent) {
	n.adopt(nil)
	ev := re.ev
	switch re.kind {
	case evStarted:
		n.started(re.forks)
	case evExit:
		p := n.procs[ev.Rank]
		if p == nil || p.exited {
			return
		}
		p.exited = true
		if re.groupGone {
			p.unguard()
		} else {
			p.leftBehind = true
		}
		n.rec.Mark(perf.PhaseRankExit, ev.Rank)
		// Judge once the agent has served everything the rank sent: its
		// finalize or abort may still be in the socket or the request
		// ring, and must be reported before the exit it preceded.
		drained := n.ag.Drained(ev.Rank)
		wait := 500 * time.Millisecond // a code 0 exit: did it finalize?
		if ev.Sig != 0 || ev.Code != 0 {
			wait = 100 * time.Millisecond // a failure: report it soon
		}
		n.waiters.Go(func() {
			t := time.NewTimer(wait)
			defer t.Stop()
			select {
			case <-drained:
			case <-t.C:
			case <-n.quit:
				return
			}
			n.ag.Settle(ev.Rank)
			j := ev
			j.Spoke, j.Fin = n.ag.RankStatus(ev.Rank)
			n.send(event{kind: evJudged, ev: j})
		})
	case evJudged:
		p := n.procs[ev.Rank]
		if p == nil || p.judged {
			return
		}
		p.judged = true
		n.judged++
		if ev.Sig != 0 || ev.Code != 0 {
			why := describeExit(ev)
			msg := stage(ev.Spoke, ev.Fin)
			if ev.Msg != "" {
				msg = ": " + ev.Msg
			}
			n.opt.Emit(agent.Event{Kind: agent.EventExited, Rank: ev.Rank, Code: ev.Code, Sig: ev.Sig, Msg: msg, Spoke: ev.Spoke, Fin: ev.Fin})
			// Only now release the peers waiting for this rank: the failure
			// is reported first, so their own exits cannot be blamed first.
			n.ag.RankGone(ev.Rank, why)
			return
		}
		n.opt.Emit(ev) // a clean exit: kind, rank, how far it got in PMI
		if !ev.Fin {
			n.ag.RankGone(ev.Rank, "exited with code 0 without PMI finalize")
		}
	case evDisconnectTimer:
		if p := n.procs[ev.Rank]; p != nil && !p.exited {
			n.opt.Emit(ev) // the EventLost the timer was armed with
		}
	case evTopology:
		n.startTopology()
	case evKillGrace:
		n.KillNow()
	case evAgent:
		n.agentEvent(ev)
	}
}

// agentEvent passes on what the agent reported: a lost connection is
// judged after a grace period (the process's exit, if it comes, explains
// it better); the rest goes to the job's fate as it is.
func (n *Node) agentEvent(ev agent.Event) {
	if ev.Kind != agent.EventDisconnected {
		n.opt.Emit(ev)
		return
	}
	p := n.procs[ev.Rank]
	if p == nil || p.exited {
		return
	}
	n.waiters.Go(func() {
		t := time.NewTimer(n.spec.DisconnectGrace)
		defer t.Stop()
		select {
		case <-t.C:
			n.send(event{kind: evDisconnectTimer, ev: agent.Event{Kind: agent.EventLost, Rank: ev.Rank, Spoke: ev.Spoke}})
		case <-n.quit:
		}
	})
}

// stage says where in PMI a failed rank was, from the agent's view.
func stage(spoke, fin bool) string {
	switch {
	case fin:
		return " after PMI finalize"
	case spoke:
		return " after PMI init, before finalize"
	}
	return " before PMI init"
}

// drain handles events that raced with the last exit, without waiting.
func (n *Node) drain() {
	for {
		select {
		case ev := <-n.evch:
			n.Handle(ev)
		default:
			return
		}
	}
}

// outputLinger is how long the ranks' output is still forwarded after
// the last rank ended: processes a rank started in the background may
// hold its output pipes for ever.
const outputLinger = 2 * time.Second

// rankList names ranks for a message: "rank 3", "ranks 0, 2 and 5", the
// first ten and a count beyond.
func rankList(rs []int) string {
	if len(rs) == 1 {
		return "rank " + strconv.Itoa(rs[0])
	}
	var b strings.Builder
	b.WriteString("ranks ")
	for i, r := range rs[:min(len(rs), 10)] {
		switch {
		case i == len(rs)-1:
			b.WriteString(" and ")
		case i > 0:
			b.WriteString(", ")
		}
		b.WriteString(strconv.Itoa(r))
	}
	if len(rs) > 10 {
		fmt.Fprintf(&b, " and %d more", len(rs)-10)
	}
	return b.String()
}

// Close handles the events that raced with the last exit, closes the
// agent, waits (boundedly) for the output and for every goroutine the node
// started. Call it once Live is 0.
func (n *Node) Close() {
	n.drain()
	if n.killing {
		// A job that was ended leaves nothing behind: a rank's child
		// forked as the rank got its SIGTERM (a shell forks with the
		// signal blocked) outlives it, in its group.
		n.Signal(sys.SIGKILL)
	}
	// The job is over: processes its ranks left behind are no longer
	// the guard's (they survive a normal end, as they always did).
	for _, p := range n.procs {
		p.unguard()
	}
	for _, f := range n.stdins {
		f.Close() // those of ranks never started (the others' are closed)
	}
	if n.devNull != nil {
		n.devNull.Close()
	}
	n.closePMIx() // before the agent: its requests fail, none is left to the agent's end
	n.ag.Close()
	n.out.Linger()
	// Every rank is judged (Live is 0): the goroutines still running are
	// disconnect timers of ranks already reported. Stop them, taking what
	// they send meanwhile.
	close(n.quit)
	if n.topo != nil && n.topo.cancel != nil {
		n.topo.cancel() // an lstopo still running is not waited for
	}
	done := make(chan struct{})
	go func() { n.waiters.Wait(); close(done) }()
	for {
		select {
		case <-n.evch:
		case <-done:
			n.topo.remove()
			return
		}
	}
}
