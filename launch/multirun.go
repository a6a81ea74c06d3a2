package launch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/jobsdir"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/tree"
)

// multiRun is a multi-node run: the command line's job and every job its
// ranks spawn, each a rootNode served by a goroutine of its own, sharing
// the run's hosts, transport, name service, output and fate. The first
// failure of any job ends them all (every job's loop sees end closed and
// kills its agents); the run is over when every job is. With per-job
// agents the first job's agents run the spawned jobs too (hostd), and
// that job keeps their links until the run is over (rootNode.hold).
//
// Lock order: mu only; fate's end callback runs under it and only closes
// end.
type multiRun struct {
	cfg   Config
	hosts []string // the run's nodes
	tr    netio.Transport
	codec netio.Codec
	names nameService  // agent.Local, or the daemons' (daemonnames.go)
	out   *node.Output // safe for concurrent use
	start time.Time    // the run's timeout counts from here
	end   chan struct{}
	// dtr connects to the daemons (daemon mode), made by the first job
	// that needs it, or to the run's hosts (hostd); only runMulti's
	// goroutine and the jobs it starts (before it waits for them) touch
	// it.
	dtr netio.Transport
	// trace is the command line's job's recorder, where the nodes of
	// every job of the run put their events when it traces (--trace,
	// --verbose): the command line's job's under their nodes, a spawned
	// job's under its job number (rootNode.mergeTrace), all on its
	// clock. Written once by runMulti before its job starts; read-only
	// after.
	trace *perf.Recorder
	// first is the command line's job's spec, which every spawned job's
	// spec starts from (spawnReq.childSpec), whichever job spawned it:
	// written once by runMulti before its job starts; read-only after.
	first *node.Spec
	// hostd, with per-job agents, is where the command line's job's
	// agent on each of the run's nodes takes the nodes of spawned jobs
	// (node.Hello.Jobs): the run's hosts, which its spawned jobs are
	// submitted to like jobs to daemons. Nil when some agent hosts none
	// (the spawned jobs' agents are then started by the bootstrap).
	// Written once by the first job's accept, on runMulti's goroutine,
	// before any spawn can be asked for; read-only after.
	hostd []string
	// nodeNames are the run's nodes' names for the ranks, by node
	// (nodeNames.go): written once by the first job's accept, like
	// hostd; read-only after.
	nodeNames []string

	jobs sync.WaitGroup // the spawned jobs' goroutines
	// intr counts Ctrl-Cs; only runMulti's goroutine (the first job's
	// loop, then wait) reads the run's signals and touches it.
	intr interrupts

	mu    sync.Mutex
	fate  *fate                          // guarded by mu
	jobno int                            // jobs made so far, guarded by mu
	live  map[*rootNode]int              // running jobs and their processes (0 once ended: ranksEnded), guarded by mu
	sigs  map[*rootNode]chan<- os.Signal // each running job's signal inbox, guarded by mu
	// reserved counts the processes of spawned jobs admitted and not yet
	// in live (admit), guarded by mu.
	reserved int
	// dir holds the running jobs for collectives across them and other
	// nodes' questions (jobscoll.go); safe for concurrent use.
	dir *jobsdir.Dir[*rootNode]
	// rdWaits are the rank-data requests across jobs waiting for a
	// node's answer, by rdSeq (jobscoll.go), guarded by mu.
	rdWaits map[uint64]jobRankWait
	rdSeq   uint64
}

func newMultiRun(cfg Config, hosts []string, tr netio.Transport, codec netio.Codec) *multiRun {
	if cfg.RootAddr == "" && (cfg.Bootstrap == "ssh" || cfg.Bootstrap == "slurm") {
		// Where the hosts are reached from, unless the user said:
		// rootListenAddr and rootDialAddr take it as said.
		cfg.RootAddr = routeAddr(hosts)
	}
	run := &multiRun{
		cfg: cfg, hosts: hosts, tr: tr, codec: codec, names: agent.NewLocal(),
		out:   node.NewOutput(node.Prefix{}, true, cfg.interactive, cfg.Stdout, cfg.Stderr),
		intr:  interrupts{stderr: cfg.Stderr},
		start: time.Now(), end: make(chan struct{}),
		live: make(map[*rootNode]int), sigs: make(map[*rootNode]chan<- os.Signal), dir: jobsdir.New[*rootNode]("in this run"),
		rdWaits: make(map[uint64]jobRankWait),
	}
	run.fate = &fate{stderr: cfg.Stderr, end: func(*JobError) { close(run.end) }}
	return run
}

// fail fails the run (the first failure wins).
func (run *multiRun) fail(e *JobError) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.fate.fail(e)
}

// failed reports whether the run has failed.
func (run *multiRun) failed() bool {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.fate.failure != nil
}

// failure is the run's outcome: its failure, a rank's non-zero exit
// after finalize, or nil.
func (run *multiRun) failure() error {
	run.mu.Lock()
	defer run.mu.Unlock()
	if e := run.fate.outcome(); e != nil {
		return e
	}
	return nil
}

// jobError is the run's failure, or nil.
func (run *multiRun) jobError() *JobError {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.fate.failure
}

// event applies a report about a rank of job jobno from the node where
// names.
func (run *multiRun) event(jobno int, where string, e agent.Event) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.fate.jobEvent(jobno, where, e)
}

// signal forwards sig to every running job.
func (run *multiRun) signal(sig os.Signal) {
	run.mu.Lock()
	defer run.mu.Unlock()
	for _, ch := range run.sigs {
		select {
		case ch <- sig:
		default: // that job has signals queued already
		}
	}
}

// forward passes a signal pmirun got to every job's ranks; a second
// Ctrl-C within the window ends the run instead.
func (run *multiRun) forward(sig os.Signal) {
	if run.intr.kill(sig) {
		run.fail(interruptError())
		return
	}
	run.signal(sig)
}

// deadline is when the run times out (nil: no timeout).
func (run *multiRun) deadline() <-chan time.Time {
	if run.cfg.Timeout <= 0 {
		return nil
	}
	return time.After(time.Until(run.start.Add(run.cfg.Timeout)))
}

// newJob makes the root of job spec, whose nodes are the run's nodes at,
// listening for its agents; the spec's Root is set.
func (run *multiRun) newJob(spec *node.Spec, at []int, rec *perf.Recorder) (*rootNode, error) {
	ln, err := run.tr.Listen(run.cfg.rootListenAddr())
	if err != nil {
		return nil, fmt.Errorf("listen for agents: %v", err)
	}
	spec.Root = run.cfg.rootDialAddr(ln.Addr())
	K := len(spec.Nodes)
	hosts := make([]string, K)
	for i, n := range at {
		hosts[i] = run.hosts[n]
	}
	sigs := make(chan os.Signal, 4)
	r := &rootNode{
		run: run, cfg: run.cfg, spec: spec, hosts: hosts, at: at, rec: rec, tr: run.tr, ln: ln, codec: run.codec,
		conns: make([]netio.Conn, K), in: make(chan node.FrameIn, 256), exits: make(chan bootExit, K), notices: make(chan bootExit, K),
		done: make([]bool, K), contributed: make([]uint64, K), gone: make([]bool, K), lost: make([]bool, K), ended: make([]bool, K), counters: make([]map[string]int64, K),
		lastRx: make([]time.Time, K), sigs: sigs,
		quit: make(chan struct{}),
	}
	r.topo, _ = tree.NewTopology(K+1, run.cfg.TreeWidth)
	r.lim = tree.JobLimits(spec.Size)
	if r.tnode, err = tree.NewNode(tree.Config{Topology: r.topo, Node: 0, Limits: r.lim}); err != nil {
		ln.Close()
		return nil, err
	}
	run.mu.Lock()
	run.live[r] = spec.Size
	run.sigs[r] = sigs
	run.mu.Unlock()
	return r, nil
}

// ranksEnded stops counting job r's processes as running (against the
// universe size, and in leastload placement): its ranks have ended, though
// the job holds its agents' links a while longer (the first job's until
// the run is over: rootNode.hold).
func (run *multiRun) ranksEnded(r *rootNode) {
	run.mu.Lock()
	defer run.mu.Unlock()
	if _, ok := run.live[r]; ok {
		run.live[r] = 0
	}
}

// ended forgets a job that is over.
func (run *multiRun) ended(r *rootNode) {
	run.mu.Lock()
	delete(run.live, r)
	delete(run.sigs, r)
	run.fate.jobOver(r.spec.Jobno)
	later := run.dropJobRankData(r)
	run.mu.Unlock()
	run.dir.Remove(r.spec.JobID)
	if d := run.daemons(); d != nil {
		d.unregister(r.spec.JobID)
	}
	for _, f := range later {
		f()
	}
}

// wait waits for every spawned job, forwarding signals meanwhile (the
// command line's job, which forwarded them so far, is over).
func (run *multiRun) wait() {
	done := make(chan struct{})
	go func() { run.jobs.Wait(); close(done) }() // ends with the jobs, waited for below
	for {
		select {
		case <-done:
			return
		case sig := <-run.cfg.Signals:
			run.forward(sig)
		}
	}
}

// spawned is how many jobs the run's ranks have spawned.
func (run *multiRun) spawned() int {
	run.mu.Lock()
	defer run.mu.Unlock()
	return run.jobno
}

// host makes the first job's agents, at addrs by node, the run's hosts
// of its spawned jobs, reached with the run's secret.
func (run *multiRun) host(addrs []string, secret []byte) error {
	dtr, err := daemon.NewTransport(secret, run.cfg.Logger)
	if err != nil {
		return err
	}
	run.dtr, run.hostd = dtr, addrs
	return nil
}

// daemonTransport connects to the daemons with their secret.
func (run *multiRun) daemonTransport() (netio.Transport, error) {
	if run.dtr != nil {
		return run.dtr, nil
	}
	secret, err := daemon.LoadSecret(run.cfg.SecretFile, false)
	if err != nil {
		return nil, err
	}
	// It only dials, and a dial that fails is said once, naming the
	// daemon and the secret file (daemonDialErr): netio's own log of it
	// is for --verbose.
	var log *slog.Logger
	if run.cfg.Verbose {
		log = run.cfg.Logger
	}
	run.dtr, err = daemon.NewTransport(secret, log)
	return run.dtr, err
}

// spawn starts the job req asks for on the run's nodes, as a child of
// job parent's rank rank; done is called once every node of the child
// job is ready (node.FrameReady: set up, forking its ranks), or with the
// reason the job could not start. It runs on the parent job's goroutine
// and returns at once: the child job has a goroutine of its own.
func (run *multiRun) spawn(ctx context.Context, parent *rootNode, req *pmiwire.Spawn, rank int, done func(string, error)) {
	r, agents, err := run.newChild(ctx, parent, req, rank)
	if err != nil {
		spawnFailed(run.cfg.Stderr, parent.spec.Jobno, err)
		done("", err)
		return
	}
	r.started = done
	run.jobs.Go(func() {
		defer run.ended(r)
		r.runJob(ctx, agents)
	})
}

// newChild makes the root of the job req asks for and its agents.
func (run *multiRun) newChild(ctx context.Context, parent *rootNode, req *pmiwire.Spawn, rank int) (*rootNode, []agentProc, error) {
	if run.failed() {
		return nil, nil, errors.New("the run is ending")
	}
	root := run.first
	sr, err := newSpawnReq(req, run.hostIndex, parent.at, root.Wdir)
	if err != nil {
		return nil, nil, err
	}
	// The programs are looked up here, where pmirun runs: a spawn of a
	// program that does not exist fails without starting anything (the
	// nodes share pmirun's file system, as on clusters and test hosts).
	// A bare name is looked up on the PATH the ranks get, --env's over
	// pmirun's, as the nodes look it up.
	env := append(os.Environ(), root.Env...)
	for i := range sr.apps {
		if _, err := sr.apps[i].Resolve(root.Wdir, env); err != nil {
			return nil, nil, fmt.Errorf("command %d: cannot run %q: %v", i, sr.apps[i].Prog, err)
		}
	}
	jobno, load, err := run.admit(sr)
	if err != nil {
		return nil, nil, err
	}
	spec, at := sr.childSpec(root, parent.spec.JobID, rank, jobno, sr.place(len(run.hosts), load))
	spec.Root = ""
	r, err := run.newJob(spec, at, perf.NewRecorder())
	run.release(sr.size) // counted as r's now, or not at all
	if err != nil {
		return nil, nil, err
	}
	if err := spec.Validate(); err != nil {
		run.ended(r)
		r.ln.Close()
		return nil, nil, err
	}
	agents, err := r.agents(ctx, r.hosts)
	if err != nil {
		run.ended(r)
		r.ln.Close()
		return nil, nil, err
	}
	return r, agents, nil
}

// admit numbers the job spawn request sr asks for, or refuses it when
// the universe size leaves no room for it beside the run's running
// processes; its processes count as running from here (reserved) until
// newJob counts them as the new job's (release), so that spawns asked
// for at once by several jobs cannot together overfill the universe.
// With leastload placement it also returns the processes each of the
// run's nodes runs.
func (run *multiRun) admit(sr *spawnReq) (jobno int, load []int, err error) {
	run.mu.Lock()
	defer run.mu.Unlock()
	live := run.reserved
	for _, n := range run.live {
		live += n
	}
	if err := sr.fits(run.cfg.UniverseSize, live); err != nil {
		return 0, nil, err
	}
	if run.cfg.SpawnPlacement == "leastload" {
		load = make([]int, len(run.hosts))
		for r, procs := range run.live {
			if procs == 0 {
				continue // its ranks have ended
			}
			for i, n := range r.at {
				load[n] += len(r.spec.Nodes[i])
			}
		}
	}
	run.reserved += sr.size
	run.jobno++
	return run.jobno, load, nil
}

// release stops counting n processes admit reserved.
func (run *multiRun) release(n int) {
	run.mu.Lock()
	defer run.mu.Unlock()
	run.reserved -= n
}

// hostIndex returns the run's nodes named h (a spawn's host info key):
// by the bootstrap's name (--hosts, a namespace, a daemon's address), or
// by the name the ranks know the node by (their PMIX_HOSTNAME: nodeNames,
// which tells apart nodes that share a bootstrap name, as the loopback
// bootstrap's).
func (run *multiRun) hostIndex(h string) []int {
	var ns []int
	for i, name := range run.hosts {
		if strings.EqualFold(name, h) || (i < len(run.nodeNames) && strings.EqualFold(run.nodeNames[i], h)) {
			ns = append(ns, i)
		}
	}
	return ns
}
