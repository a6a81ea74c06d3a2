package launch

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/ring"
	"github.com/fastpmi/fastpmi/tree"
)

// rootNode is pmirun's side of one job of a multi-node run: the root of
// its agent tree, its agents' links and bootstrap processes. The run's
// services (names, fate, output, spawn) are its multiRun's. Only the
// job's own goroutine touches it (runMulti's for the command line's job,
// one per spawned job); links and bootstrap processes feed it through
// channels.
type rootNode struct {
	run   *multiRun
	cfg   Config
	spec  *node.Spec
	hosts []string // the job's nodes
	at    []int    // the run's node index of each of the job's nodes
	rec   *perf.Recorder
	tr    netio.Transport // the run's
	ln    netio.Listener  // where the job's agents dial in
	conns []netio.Conn    // by node
	// step: one bootstrap process, srun, runs every node's agent (its
	// bootExit is node 0's); set by agents.
	step  bool
	in    chan node.FrameIn
	exits chan bootExit
	// notices carries what a daemon says before it ends its node of the
	// job (daemon mode: it is shutting down).
	notices chan bootExit
	quit    chan struct{}  // closed when the loop is over: link readers stop delivering
	links   sync.WaitGroup // the goroutines reading links and waiting for bootstrap processes

	topo    tree.Topology
	tnode   *tree.Node
	lim     tree.Limits
	codec   netio.Codec
	contrib [3]uint64 // epochs the root contributed, by tree.Kind
	kvs     rootKVS   // the Tree get strategy's top
	// waiting is each node's last Waiting report; stuck when the whole
	// job started waiting, zero while it does not (deadlock).
	waiting []node.Waiting
	stuck   time.Time

	done []bool // the node's agent reported its counters (its ranks ended)
	// contributed is, for a done node, the last collective epoch all its
	// ranks entered (node.Done): later ones wait for it in vain.
	contributed []uint64
	gone        []bool // the node's bootstrap process exited
	lost        []bool // the node was declared lost (silent, its link failed): not waited for
	ended       []bool // the node's link delivered its end (FrameIn.Err)
	counters    []map[string]int64
	lastRx      []time.Time
	killed      bool
	// started, for a spawned job, answers its spawner once every node is
	// ready (node.FrameReady: the job id) or could not be (the reason);
	// then nil. nready counts the nodes ready.
	started func(jobID string, err error)
	nready  int
	sigs    <-chan os.Signal // signals to forward to the job's ranks (multiRun.signal)

	// sendFailed holds the nodes a send to failed: only the first is
	// logged (a lost node's link would log every heartbeat, four a
	// second, while pmirun waits for its output). send runs on the loop
	// and on name-service goroutines.
	sendMu     sync.Mutex
	sendFailed map[int]bool
	// closed is set once the job is over and closeLinks closes its
	// links: a send that then finds one closed (the answer to a spawn
	// its rank asked for before the job ended, sent when the child job
	// is ready) has no one to tell, and is not logged.
	closed atomic.Bool
}

type bootExit struct {
	i   int
	err error
}

// placement assigns ranks to nodes and returns the ring map: by the
// hosts' slots, else --ppn per node (in blocks, or --cyclic), else spread
// evenly over the k nodes. A job of fewer ranks than a list of hosts
// names runs on the first hosts its ranks fill, as Hydra and srun run it
// (the map then has fewer than k nodes); the loopback bootstrap's
// --nodes asks for that many nodes, each with ranks.
func placement(cfg Config, k int) (*ring.Map, error) {
	nodes, err := placeRanks(cfg, k)
	if err != nil {
		return nil, err
	}
	used := len(nodes)
	for used > 0 && len(nodes[used-1]) == 0 {
		used--
	}
	if cfg.Bootstrap != "loopback" {
		nodes = nodes[:used]
	}
	for n, rs := range nodes {
		if len(rs) == 0 {
			return nil, fmt.Errorf("%d ranks leave node %d of --nodes %d without a rank: every node needs at least one rank", cfg.Size, n, k)
		}
	}
	return ring.FromNodes(nodes)
}

// placeRanks lists the ranks of each of the k nodes (placement).
func placeRanks(cfg Config, k int) ([][]int, error) {
	if cfg.PPN == 0 && slices.ContainsFunc(cfg.Slots, func(s int) bool { return s > 0 }) {
		return slotPlacement(cfg.Size, cfg.Slots, cfg.Cyclic), nil
	}
	nodes := make([][]int, k)
	ppn := cfg.PPN
	if ppn == 0 && !cfg.Cyclic {
		// Spread evenly, as srun does: blocks of consecutive ranks, the
		// first Size mod k nodes one rank more.
		r := 0
		for n := range nodes {
			c := cfg.Size / k
			if n < cfg.Size%k {
				c++
			}
			for range c {
				nodes[n] = append(nodes[n], r)
				r++
			}
		}
		return nodes, nil
	}
	if ppn == 0 {
		ppn = (cfg.Size + k - 1) / k
	}
	if ppn*k < cfg.Size {
		return nil, fmt.Errorf("%d ranks do not fit %d nodes with %d per node", cfg.Size, k, ppn)
	}
	for r := range cfg.Size {
		n := r / ppn
		if cfg.Cyclic {
			n = r % k
		}
		nodes[n] = append(nodes[n], r)
	}
	return nodes, nil
}

// slotPlacement fills each host with its slots (HOST:SLOTS; 1 when
// unsaid) of consecutive ranks, host after host, starting over at the
// first host while ranks remain (as Hydra does). With cyclic, the hosts
// take one rank each in turn instead, those whose slots are full
// skipped, until all are (srun's cyclic distribution), and over again.
func slotPlacement(size int, slots []int, cyclic bool) [][]int {
	nodes := make([][]int, len(slots))
	left := make([]int, len(slots)) // slots free in this pass
	r := 0
	for r < size {
		for i, s := range slots {
			left[i] = max(s, 1)
		}
		for free := true; free && r < size; {
			free = false
			for i := range slots {
				take := left[i]
				if cyclic {
					take = min(take, 1)
				}
				for ; take > 0 && r < size; take-- {
					nodes[i] = append(nodes[i], r)
					r++
					left[i]--
				}
				free = free || left[i] > 0
			}
		}
	}
	return nodes
}

func runMulti(ctx context.Context, cfg Config, job *jobOut) error {
	hosts, err := cfg.hostList()
	if err != nil {
		return early(cfg, 2, err.Error())
	}
	for i, h := range hosts {
		if cfg.Bootstrap == "netns" {
			hosts[i], _, _ = strings.Cut(h, "=")
		}
	}
	if cfg.Bootstrap == "slurm" && cfg.PPN == 0 {
		// A job of the allocation's tasks runs them where Slurm put
		// them, as srun and Hydra do: spread evenly, an allocation of
		// 4 and 1 tasks (salloc -n 5 on nodes of 4 CPUs) got 3 and 2,
		// a rank more than the second node has CPUs for.
		if t := slurmTasks(len(hosts)); sum(t) == cfg.Size {
			cfg.Slots = t
		}
	}
	m, err := placement(cfg, len(hosts))
	if err != nil {
		return early(cfg, 2, err.Error())
	}
	hosts = hosts[:m.Nodes()] // the hosts the ranks fill
	K := len(hosts)
	codec, err := netio.ParseCodec(cfg.Codec)
	if err != nil {
		return early(cfg, 2, err.Error())
	}
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return early(cfg, 1, fmt.Sprintf("make job secret: %v", err))
	}
	rec := perf.NewRecorderFor(perf.LauncherNode, cfg.TracePath != "" || cfg.Verbose)
	tr, err := netio.New(netio.Config{Backend: cfg.NetBackend, Secret: secret, Logger: cfg.Logger})
	if err != nil {
		return early(cfg, 1, err.Error())
	}
	defer tr.Close()
	if cfg.Verbose {
		b := tr.Backend()
		procs := ""
		if p := agentProcs(cfg.Bootstrap, K); p > 0 {
			procs = fmt.Sprintf(" (GOMAXPROCS %d each)", p)
		}
		fmt.Fprintf(cfg.Stderr, "pmirun: %d nodes via %s%s, agent links over %s (%s), tree width %d, compression %s\n",
			K, cfg.Bootstrap, procs, b.Name, b.Reason, cfg.TreeWidth, cfg.Codec)
	}
	nodes := make([][]int, K)
	for n := range nodes {
		nodes[n] = m.Ranks(n)
	}
	wdir, err := os.Getwd()
	if err != nil {
		return early(cfg, 1, fmt.Sprintf("working directory: %v", err))
	}
	run := newMultiRun(cfg, hosts, tr, codec)
	run.trace = rec
	spec := cfg.spec(nodes, m.ProcessMapping())
	if cfg.Wdir != "" {
		wdir = cfg.Wdir
	}
	spec.Wdir, spec.Secret = wdir, secret
	spec.AgentProcs = agentProcs(cfg.Bootstrap, K)
	if cfg.Bootstrap == "ssh" || cfg.Bootstrap == "daemon" {
		spec.LauncherEnv = launcherEnv()
	}
	if cfg.Bootstrap == "daemon" {
		if mask, err := sys.Umask(); err == nil {
			spec.Umask = &mask
		}
	}
	at := make([]int, K)
	for i := range at {
		at[i] = i
	}
	r, err := run.newJob(spec, at, rec)
	if err != nil {
		return early(cfg, 1, err.Error())
	}
	job.root = r // its report is written when Run returns
	run.first = r.spec
	if err := r.spec.Validate(); err != nil {
		r.ln.Close()
		return early(cfg, 2, err.Error())
	}
	var dnames *daemonNames
	var names sync.WaitGroup // the name-service session's set-up
	var namesErr error
	if cfg.Bootstrap == "daemon" {
		// Runs on the same daemons share names: they live at the daemon
		// of the first node. The session is set up while the nodes'
		// connections are.
		dtr, err := run.daemonTransport()
		if err != nil {
			r.ln.Close()
			return early(cfg, 2, err.Error())
		}
		names.Go(func() {
			dnames, namesErr = dialDaemonNames(ctx, dtr, hosts[0], cfg.NetTimeout, cfg.Logger, run.serveDaemon)
		})
	}
	agents, err := r.agents(ctx, hosts)
	names.Wait()
	code := 2
	if err == nil && namesErr != nil {
		err, code = daemonDialErr(namesErr, cfg.SecretFile), 1
	}
	if err != nil {
		for _, a := range agents {
			a.kill()
		}
		if dnames != nil {
			dnames.Close()
		}
		r.ln.Close()
		if run.dtr != nil {
			run.dtr.Close()
		}
		return early(cfg, code, err.Error())
	}
	if dnames != nil {
		run.names = dnames
	}
	r.runJob(ctx, agents)
	run.wait()
	run.names.Close() // the daemons' session, or pmirun's own names
	tr.Close()
	if run.dtr != nil {
		run.dtr.Close()
	}
	run.out.Linger() // the agents' and daemons' output, as a node's (Node.Close)
	if cfg.Verbose {
		r.printCounters()
	}
	report(cfg, rec)
	return run.failure()
}

// runJob starts the job's agents, serves them until every node is done
// (or the run fails), and reaps them.
func (r *rootNode) runJob(ctx context.Context, agents []agentProc) {
	defer r.ln.Close()
	started := 0
	for i, a := range agents {
		if err := a.start(r, i, r.run.out); err != nil {
			what := fmt.Sprintf("agent of node %d on %s", r.at[i], r.hosts[i])
			if r.step {
				what = "srun, which runs every node's agent"
			}
			r.startFailed(fmt.Errorf("start %s: %v", what, err))
			break
		}
		r.links.Go(func() { r.exits <- bootExit{i, a.wait()} }) // exits holds one per agent
		started++
	}
	if started < len(agents) {
		// Those started wait for a table that will not come and cannot
		// be told to end (none said hello yet): all end now, as when
		// accept fails; one not started may hold a connection (daemon
		// mode).
		for _, a := range agents {
			a.kill()
		}
	}
	r.rec.Mark("agents started", -1)
	if started == len(agents) && !r.accept(ctx, r.ln, len(r.conns)) { // answers a spawner only on failure; FrameReady does on success
		// No agent has a rank yet, and those that never said hello
		// cannot be told to end (an ssh to a host that does not answer
		// waits for the TCP timeout): all end now.
		for _, a := range agents {
			a.kill()
		}
	}
	r.loop(ctx, started)
	r.run.ranksEnded(r)
	if r.spec.Jobno == 0 && r.run.hostd != nil {
		r.hold(ctx)
	}
	r.closeLinks()
	r.reap(agents[:started])
	close(r.quit)
	r.links.Wait()
	if r.run.trace.Tracing() {
		for i, done := range r.done {
			if !done {
				// Its events are lost with it; the trace still shows the node.
				r.run.trace.Merge(perf.NodeInfo{Node: r.at[i], Job: r.spec.Jobno, Host: r.hosts[i], Lost: true}, nil)
			}
		}
	}
}

// closeLinks closes the links to the job's agents, which end once they
// close.
func (r *rootNode) closeLinks() {
	r.closed.Store(true)
	for _, c := range r.conns {
		if c != nil {
			c.Close()
		}
	}
}

// hold keeps the first job's links, once its ranks have ended, until
// every job the run spawned has: its agents host those jobs, and end
// when pmirun closes the links. Meanwhile it heartbeats them, watches
// them as the loop does, forwards pmirun's signals to the jobs and
// fails the run if ctx ends; with --verbose, if the run spawned, it then
// prints what each agent holds (a leak shows).
func (r *rootNode) hold(ctx context.Context) {
	jobs := make(chan struct{})
	go func() { r.run.jobs.Wait(); close(jobs) }() // ends with the jobs, waited for below
	tick := time.NewTicker(node.Heartbeat)
	defer tick.Stop()
	done := ctx.Done()
	lost := make([]bool, len(r.conns)) // the node's loss was told
	fail := func(i int, why string) {
		if !lost[i] && !r.run.failed() {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s lost: %s", r.nodeName(i), why)})
		}
		lost[i] = true
	}
	for {
		select {
		case <-jobs:
			if r.cfg.Verbose && r.run.spawned() > 0 {
				r.printHosts()
			}
			return
		case fi := <-r.in:
			if fi.Err != nil {
				fail(fi.From, fi.Err.Error())
				continue
			}
			r.lastRx[fi.From] = time.Now()
		case e := <-r.exits:
			r.gone[e.i] = true
			if !lost[e.i] && !r.run.failed() {
				r.run.fail(&JobError{Code: 1, Msg: r.lostBy(e.i, e.err)})
			}
			lost[e.i] = true
		case sig := <-r.cfg.Signals:
			r.run.forward(sig)
		case <-done:
			done = nil
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-tick.C:
			for i := range r.conns {
				if r.conns[i] == nil || lost[i] {
					continue
				}
				r.send(i, netio.Frame{Type: node.FrameHeartbeat})
				if time.Since(r.lastRx[i]) > r.cfg.NetTimeout {
					fail(i, fmt.Sprintf("no message for %v", r.cfg.NetTimeout))
				}
			}
		}
	}
}

// printHosts prints, for --verbose, what each of the run's hosts holds
// once every spawned job has ended: the jobs it hosted, its goroutines,
// threads and descriptors. A host counts a job's node as served just
// after its Exit frame (it closes the submission first): it is asked
// again until it runs none, for up to NetTimeout.
func (r *rootNode) printHosts() {
	for i, addr := range r.run.hostd {
		ctx, cancel := context.WithTimeout(context.Background(), r.cfg.NetTimeout)
		st, err := daemon.QueryStatus(ctx, r.run.dtr, addr)
		for err == nil && len(st.Jobs) > 0 && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			st, err = daemon.QueryStatus(ctx, r.run.dtr, addr)
		}
		cancel()
		if err != nil {
			fmt.Fprintf(r.cfg.Stderr, "pmirun: node %d agent: %v\n", i, err)
			continue
		}
		fmt.Fprintf(r.cfg.Stderr, "pmirun: node %d agent (pid %d) hosted %d spawned jobs' nodes, holds %d jobs, %d goroutines, %d threads, %d descriptors, %d memfds\n",
			i, st.PID, st.Served, len(st.Jobs), st.Goroutines, st.Threads, st.FDs, st.Memfds)
	}
}

// startFailed ends a job whose agents did not all start: a spawned job's
// spawner gets the reason (and the run goes on); the command line's job
// fails the run.
func (r *rootNode) startFailed(err error) {
	if r.started != nil {
		fmt.Fprintf(r.cfg.Stderr, "pmirun: spawn of job %d failed: %v\n", r.spec.Jobno, err)
		r.started("", err)
		r.started = nil
		r.kill(&JobError{Code: 1, Msg: err.Error()})
		return
	}
	r.run.fail(&JobError{Code: 1, Msg: err.Error()})
}

// startEnded ends a job whose agents were still connecting when e
// ended the run (nil: the run had ended already); a spawner is told why.
func (r *rootNode) startEnded(e *JobError) {
	if e != nil {
		r.run.fail(e)
	}
	if r.started != nil {
		why := "the run ended"
		if f := r.run.jobError(); f != nil {
			why = f.Msg
		}
		r.started("", errors.New(why))
		r.started = nil
	}
}

// accept waits for every agent's hello, then sends them the table, and
// reports whether it did. If that fails, it closes the listener and every
// link accepted (and forgets them: nothing more is sent on them), so that
// the agents already up, which wait for the table, and those still to
// come end at once instead of at the kill grace.
func (r *rootNode) accept(ctx context.Context, ln netio.Listener, k int) bool {
	// The acceptor and the hello readers end when actx does (cancelled on
	// return), and accept waits for them.
	var readers sync.WaitGroup
	defer readers.Wait()
	actx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	type hello struct {
		c   netio.Conn
		h   node.Hello
		err error
	}
	var (
		connected bool // every agent said hello
		mu        sync.Mutex
		accepted  []netio.Conn // guarded by mu
		gaveUp    bool         // guarded by mu
	)
	defer func() {
		if connected {
			return
		}
		ln.Close()
		mu.Lock()
		gaveUp = true
		cs := accepted
		mu.Unlock()
		for _, c := range cs {
			c.Close()
		}
		clear(r.conns)
	}()
	hch := make(chan hello, k)
	deliver := func(h hello) {
		select {
		case hch <- h:
		case <-actx.Done():
			if h.c != nil {
				h.c.Close()
			}
		}
	}
	readers.Go(func() {
		for {
			c, err := ln.Accept(actx)
			if err != nil {
				deliver(hello{err: err})
				return
			}
			mu.Lock()
			late := gaveUp
			if !late {
				accepted = append(accepted, c)
			}
			mu.Unlock()
			if late {
				c.Close()
				continue
			}
			readers.Go(func() {
				f, err := c.Recv(actx)
				var h node.Hello
				if err == nil && f.Type == node.FrameHello {
					err = node.Decode(f.Payload, &h)
				} else if err == nil {
					err = fmt.Errorf("first frame type %d", f.Type)
				}
				deliver(hello{c: c, h: h, err: err})
			})
		}
	})
	addrs := make([]string, k)
	jobs := make([]string, k) // where each agent hosts the run's spawned jobs
	hellos := make([]node.Hello, k)
	got := 0
	// What ends the job while no rank runs yet: the run's timeout, the
	// run ending (another job failed), and a signal to pmirun, which
	// would end ranks that do not handle it (the first job's loop
	// forwards the run's signals).
	timeout := r.run.deadline()
	var signals <-chan os.Signal
	if r.spec.Jobno == 0 {
		signals = r.cfg.Signals
	}
	for got < k {
		select {
		case <-timeout:
			r.startEnded(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", r.cfg.Timeout)})
			return false
		case sig := <-signals:
			n := sys.SignalNumber(sig)
			r.startEnded(&JobError{Code: 128 + n, Msg: fmt.Sprintf("%s before the ranks started: the job ends", sys.SignalName(n))})
			return false
		case <-r.run.end:
			r.startEnded(nil)
			return false
		case h := <-hch:
			if h.c == nil {
				r.startFailed(fmt.Errorf("only %d of %d agents connected: %v", got, k, h.err))
				return false
			}
			if h.err != nil || h.h.Node < 0 || h.h.Node >= k || r.conns[h.h.Node] != nil {
				r.cfg.Logger.Warn("refused agent connection", "from", h.c.RemoteAddr(), "err", h.err, "node", h.h.Node)
				h.c.Close()
				continue
			}
			r.conns[h.h.Node] = h.c
			addrs[h.h.Node] = h.h.Addr
			jobs[h.h.Node] = h.h.Jobs
			hellos[h.h.Node] = h.h
			got++
			if r.cfg.Verbose {
				fmt.Fprintf(r.cfg.Stderr, "pmirun: node %d (%s, pid %d) up at %s, %d ranks, links over %s\n",
					h.h.Node, h.h.Host, h.h.PID, h.h.Addr, h.h.Ranks, h.h.NetBE)
			}
		case e := <-r.exits:
			r.exits <- e // loop reports it
			why := "exit status 0"
			if e.err != nil { // exec's words for a non-zero one
				why = e.err.Error()
			}
			what := fmt.Sprintf("agent of node %d on %s exited before connecting", r.at[e.i], r.hosts[e.i])
			if r.step {
				what = "srun, which runs every node's agent, exited before they connected"
			}
			r.startFailed(fmt.Errorf("%s: %s%s", what, why, r.sshHint(e)))
			return false
		case <-actx.Done():
			if ctx.Err() != nil {
				r.startEnded(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
				return false
			}
			r.startFailed(r.notConnected(got, connectTimeout))
			return false
		}
	}
	connected = true
	if r.spec.Jobno == 0 {
		r.run.nodeNames = nodeNames(hellos, r.run.hosts)
	}
	r.run.joined(r, hellos)
	r.rec.Mark("agents connected", -1)
	if r.spec.Jobno == 0 && r.cfg.Bootstrap != "daemon" && !slices.Contains(jobs, "") {
		if err := r.run.host(jobs, r.spec.Secret); err != nil {
			r.cfg.Logger.Warn("the agents cannot host spawned jobs", "err", err)
		}
	}
	names := make([]string, k)
	for i, n := range r.at {
		names[i] = r.run.nodeNames[n]
	}
	table := node.Encode(node.Table{Addrs: addrs, Hosts: names})
	now := time.Now()
	for i, c := range r.conns {
		r.lastRx[i] = now
		r.send(i, netio.Frame{Type: node.FrameTable, Payload: table})
		r.links.Go(func() { node.Receive(c, i, r.in, r.quit) })
	}
	return true
}

// sshHint says what an agent started over ssh that exited before it
// connected most likely met, from its exit status: ssh's own 255 (the
// host not reached, or the login refused), or the remote shell's 127
// and 126 (no pmid at that path there, or not one it can run). ssh's
// and the shell's own words are on stderr; this names what to check.
func (r *rootNode) sshHint(e bootExit) string {
	var ee *exec.ExitError
	if r.cfg.Bootstrap != "ssh" || !errors.As(e.err, &ee) {
		return ""
	}
	host := r.hosts[e.i]
	if slices.ContainsFunc(localNames(), func(l string) bool { return strings.EqualFold(host, l) }) {
		return "" // started here, without ssh
	}
	pmid := r.cfg.PmidPath
	if pmid == "" {
		pmid = r.cfg.defaultAgent()
	}
	switch ee.ExitCode() {
	case 255:
		return fmt.Sprintf(" (ssh could not reach %s or log in there: see ssh's message)", host)
	case 127:
		return fmt.Sprintf(" (no %s on %s: see --pmid)", pmid, host)
	case 126:
		return fmt.Sprintf(" (%s on %s cannot be run: see --pmid)", pmid, host)
	}
	return ""
}

// connectTimeout bounds the wait for every agent's hello (a variable for
// the tests).
var connectTimeout = 30 * time.Second

// notConnected says which agents did not say hello within d (got did):
// their nodes and hosts, the first few of them.
func (r *rootNode) notConnected(got int, d time.Duration) error {
	var missing []string
	for i, c := range r.conns {
		if c == nil {
			missing = append(missing, fmt.Sprintf("node %d on %s", r.at[i], r.hosts[i]))
		}
	}
	const shown = 4
	if len(missing) > shown {
		missing = append(missing[:shown], fmt.Sprintf("%d more", len(missing)-shown))
	}
	what := "agent of " + missing[0]
	if len(missing) > 1 {
		what = "agents of " + strings.Join(missing[:len(missing)-1], ", ") + " and " + missing[len(missing)-1]
	}
	return fmt.Errorf("%s did not connect within %v (%d of %d did)", what, d, got, len(r.conns))
}

// send sends f to node i. A failure is logged (the first to each node)
// and returned: a broken link also ends its reader, which fails the job,
// so most callers need not look.
func (r *rootNode) send(i int, f netio.Frame) error {
	c := r.conns[i]
	if c == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.NetTimeout)
	defer cancel()
	err := c.Send(ctx, f)
	if err != nil {
		if r.closed.Load() && errors.Is(err, netio.ErrClosed) {
			return err
		}
		r.sendMu.Lock()
		first := !r.sendFailed[i]
		if first {
			if r.sendFailed == nil {
				r.sendFailed = make(map[int]bool)
			}
			r.sendFailed[i] = true
		}
		r.sendMu.Unlock()
		if first {
			r.cfg.Logger.Warn("send to agent (further failures to this node are not logged)", "node", i, "err", err)
		}
	}
	return err
}

// kill tells every agent to end its ranks.
func (r *rootNode) kill(e *JobError) {
	r.killed = true
	// Nodes that are done too: their ranks may have left processes
	// behind, which a failed job ends.
	for i := range r.conns {
		r.send(i, netio.Frame{Type: node.FrameKill, Payload: node.Encode(node.Kill{Code: e.Code, Msg: e.Msg})})
	}
}

func (r *rootNode) loop(ctx context.Context, started int) {
	timeout := r.run.deadline()
	end := r.run.end
	signals := r.cfg.Signals
	if r.spec.Jobno > 0 {
		signals = nil // the run's first job forwards them to every job
	}
	tick := time.NewTicker(node.Heartbeat)
	defer tick.Stop()
	done := ctx.Done()
	var grace <-chan time.Time
	exited := 0
	for exited < started {
		if (r.run.failed() || r.killed) && grace == nil {
			// Agents get time to end their ranks and report; then their
			// bootstrap processes are killed.
			grace = time.After(r.cfg.KillGrace + r.cfg.NetTimeout)
		}
		select {
		case fi := <-r.in:
			r.frame(fi)
		case e := <-r.exits:
			exited++
			r.agentExited(e)
		case nt := <-r.notices:
			if !r.done[nt.i] && !r.killed {
				r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s lost: %v", r.nodeName(nt.i), nt.err)})
			}
			r.lost[nt.i] = true
		case sig := <-signals:
			r.run.forward(sig)
		case sig := <-r.sigs:
			for i := range r.conns {
				r.send(i, netio.Frame{Type: node.FrameSignal, Payload: node.Encode(node.Signal{Sig: sys.SignalNumber(sig)})})
			}
		case <-tick.C:
			r.deadlock()
			for i := range r.conns {
				if r.conns[i] == nil {
					continue
				}
				r.send(i, netio.Frame{Type: node.FrameHeartbeat})
				if !r.done[i] && !r.lost[i] && time.Since(r.lastRx[i]) > r.cfg.NetTimeout {
					// Lost: the job fails (if it has not), and the end
					// does not wait for this node's report.
					r.lost[i] = true
					if !r.killed {
						r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s lost: no message for %v", r.nodeName(i), r.cfg.NetTimeout)})
					}
				}
			}
		case <-timeout:
			timeout = nil
			r.run.fail(&JobError{Code: ExitTimeout, Msg: fmt.Sprintf("job timed out after %v", r.cfg.Timeout)})
		case <-done:
			done = nil
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("job cancelled: %v", context.Cause(ctx))})
		case <-end:
			end = nil
			if !r.killed {
				r.kill(r.run.jobError())
			}
		case <-grace:
			return
		}
		if r.allDone() {
			return
		}
	}
}

// deadlock ends the job when every node with live ranks has said that
// all of them wait (node.Waiting) and nothing changed for
// node.DeadlockGrace, if some wait in gets (no rank is left to make the
// put they wait for) or some in a collective that the ranks of a done
// node never entered (they finalized without it, and a collective needs
// every rank of the job). Called every Heartbeat.
func (r *rootNode) deadlock() {
	if r.waiting == nil || r.run.failed() || r.killed {
		return
	}
	gets, live := 0, 0
	var epoch uint64 // the first collective epoch a live rank waits in
	var what []string
	for i, w := range r.waiting {
		if r.done[i] || r.gone[i] {
			continue
		}
		if !w.All {
			r.stuck = time.Time{}
			return
		}
		live++
		gets += w.Gets
		what = append(what, w.What...)
		if w.Epoch != 0 && (epoch == 0 || w.Epoch < epoch) {
			epoch = w.Epoch
		}
	}
	absent := -1 // a done node that never entered that epoch
	for i := range r.done {
		if r.done[i] && !r.gone[i] && epoch != 0 && r.contributed[i] < epoch {
			absent = i
			break
		}
	}
	if (gets == 0 && absent < 0) || live == 0 {
		r.stuck = time.Time{}
		return
	}
	if r.stuck.IsZero() {
		r.stuck = time.Now()
		return
	}
	if time.Since(r.stuck) < node.DeadlockGrace {
		return
	}
	if len(what) > 6 {
		what = append(what[:6], "...")
	}
	if gets == 0 {
		r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("deadlock: every live rank of the job waits (%s), in collective %d among others, which the ranks of %s never entered: they ended without it",
			strings.Join(what, ", "), epoch, r.nodeName(absent))})
		return
	}
	r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("deadlock: every live rank of the job waits and no put can come (%s)", strings.Join(what, ", "))})
}

// agentExited takes the end of a node's bootstrap process: a node that
// ended before it was done fails the job, in the agent's words if it
// sent any before it ended (drainLink).
func (r *rootNode) agentExited(e bootExit) {
	r.gone[e.i] = true
	r.drainLink(e.i)
	if !r.done[e.i] && !r.run.failed() && !r.killed {
		r.run.fail(&JobError{Code: 1, Msg: r.lostBy(e.i, e.err)})
	}
}

// linkDrain bounds drainLink's wait for a link's end after its agent
// exited: the kernel closes the agent's end as the process ends.
const linkDrain = time.Second

// drainLink serves the frames that arrive until node i's link has ended,
// its agent having exited: what the agent sent before it exited (the
// reason it gives, a rank's start failure) comes before the link's end,
// and is the job's failure rather than "lost: agent exit status 1"
// (where a goroutine's wake-up put the exit first, half the time). Not
// for srun's exit (r.step), which is every node's.
func (r *rootNode) drainLink(i int) {
	if r.step || r.conns[i] == nil || r.ended[i] {
		return
	}
	t := time.NewTimer(linkDrain)
	defer t.Stop()
	for {
		select {
		case fi := <-r.in:
			if fi.From == i && fi.Err != nil {
				// The end itself: the exit, which caused it, is what the
				// caller says.
				r.ended[i] = true
				r.lost[i] = !r.done[i]
				return
			}
			r.frame(fi)
		case <-t.C:
			return
		}
	}
}

// lostBy says what the end of bootstrap process i (err: how it ended)
// did to the job: "node 1 (n2) lost: agent exit status 1", or, where one
// srun runs every node's agent, "every node lost: srun exit status 1".
func (r *rootNode) lostBy(i int, err error) string {
	why := "exited"
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee) && sys.ExitSignal(ee.ProcessState) > 0:
		// As a rank's end is said, not Go's "signal: killed".
		sig := sys.ExitSignal(ee.ProcessState)
		why = fmt.Sprintf("killed by signal %d (%s)", sig, signalName(sig))
	case err != nil:
		why = err.Error()
	}
	if r.step {
		return "every node lost: srun, which runs their agents, " + why
	}
	return fmt.Sprintf("%s lost: agent %s", r.nodeName(i), why)
}

// allDone reports whether every node is done or gone: the agents still
// up wait for pmirun to close their links before they exit.
func (r *rootNode) allDone() bool {
	for i, d := range r.done {
		if !d && !r.gone[i] && !r.lost[i] {
			return false
		}
	}
	return true
}

// reap waits for the agents the loop has not seen end, killing those
// that linger. It learns of ends only from r.exits (the goroutine waiting
// for an agent owns it until it sends).
func (r *rootNode) reap(agents []agentProc) {
	deadline := time.After(r.cfg.NetTimeout)
	pending := 0
	for i, a := range agents {
		if !r.gone[i] {
			pending++
			if r.lost[i] {
				a.kill() // nothing to wait for
			}
		}
	}
	for pending > 0 {
		select {
		case e := <-r.exits:
			r.gone[e.i] = true
			pending--
		case <-deadline:
			said := false
			for i, a := range agents {
				if r.gone[i] {
					continue
				}
				if _, ok := a.(*daemonAgent); ok && !said {
					// Its output may wait for pmirun's stdout (pmirun |
					// less): what it still holds is dropped, which only
					// pmirun can say (the daemon's word on it would wait
					// behind that output).
					said = r.run.out.SayStalled(r.cfg.NetTimeout)
				}
				a.kill()
			}
			deadline = nil
		}
	}
}

// nodeName names the job's node i in messages as the run names it, by
// the run's node number (a spawned job's node i is the run's node
// r.at[i]) and its host: "node 2 (h2)".
func (r *rootNode) nodeName(i int) string {
	return fmt.Sprintf("node %d (%s)", r.at[i], r.hosts[i])
}

func (r *rootNode) frame(fi node.FrameIn) {
	i := fi.From
	if fi.Err != nil {
		r.ended[i] = true
		if !r.done[i] && !r.run.failed() && !r.killed {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s lost: %v", r.nodeName(i), fi.Err)})
		}
		r.lost[i] = !r.done[i]
		return
	}
	r.lastRx[i] = time.Now()
	switch fi.Frame.Type {
	case node.FrameHeartbeat:
	case node.FrameEvent:
		var e agent.Event
		if err := node.Decode(fi.Frame.Payload, &e); err != nil {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s sent a bad event: %v", r.nodeName(i), err)})
			return
		}
		switch e.Kind {
		case agent.EventInit:
			r.rec.Mark(perf.PhaseInit, e.Rank)
		case agent.EventFinalized:
			r.rec.Mark(perf.PhaseFinalize, e.Rank)
		case agent.EventExited:
			r.rec.Mark(perf.PhaseRankExit, e.Rank)
		}
		r.run.event(r.spec.Jobno, r.nodeName(i), e)
	case node.FrameReady:
		if r.nready++; r.nready == len(r.conns) && r.started != nil {
			r.started(r.spec.JobID, nil)
			r.started = nil
		}
	case node.FrameEnding:
		var e node.Ending
		if err := node.Decode(fi.Frame.Payload, &e); err != nil {
			e.Msg = err.Error()
		}
		if !r.done[i] && !r.killed {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s lost: %s", r.nodeName(i), e.Msg)})
		}
	case node.FrameClock:
		var c node.Clock
		if node.Decode(fi.Frame.Payload, &c) == nil {
			c.Peer = r.run.trace.Since() // the clock every job's nodes are merged on
			r.send(i, netio.Frame{Type: node.FrameClock, Payload: node.Encode(c)})
		}
	case node.FrameDone:
		r.done[i] = true
		var d node.Done
		if err := node.Decode(fi.Frame.Payload, &d); err != nil {
			r.cfg.Logger.Warn("node sent a bad final report", "node", i, "err", err)
			return
		}
		r.counters[i] = d.Counters
		r.contributed[i] = d.Contributed
		if r.run.trace.Tracing() && d.Events != nil {
			r.mergeTrace(i, &d)
		}
		// The link stays open until every node is done (the agent waits
		// for that, so its peers never see it leave early).
	case node.FrameName:
		var m node.Name
		if err := node.Decode(fi.Frame.Payload, &m); err != nil {
			return
		}
		// The name service answers before it returns (on this
		// goroutine), but for a lookup that waits for its name and a
		// spawn: those answer from another goroutine, later.
		reply := func(port string, err error) {
			resp := node.Name{ID: m.ID, Op: "", Name: m.Name, Port: port}
			if errors.Is(err, agent.ErrNameNotFound) {
				resp.NotFound = true
			} else if err != nil {
				resp.Err = err.Error()
			}
			r.answerName(i, resp)
		}
		noPort := func(err error) { reply("", err) }
		switch m.Op {
		case "publish":
			r.run.names.Publish(m.Name, m.Port, m.Once, noPort)
		case "unpublish":
			r.run.names.Unpublish(m.Name, noPort)
		case "lookup":
			r.run.names.Lookup(m.Name, min(max(m.Wait, 0), agent.MaxNameWait), reply)
		case "joblayout":
			r.run.jobLayout(&m, func(l *agent.Layout, err error) {
				resp := node.Name{ID: m.ID, Layout: l}
				if err != nil {
					resp.Err = err.Error()
				}
				r.answerName(i, resp)
			})
		case "rankdata":
			r.run.jobRankData(&m, func(blob []byte, found bool, err error) {
				resp := node.Name{ID: m.ID, Data: blob, NotFound: !found && err == nil}
				if err != nil {
					resp.Err = err.Error()
				}
				r.answerName(i, resp)
			})
		case "jobs":
			r.run.jobsColl(r, i, &m, func(data []byte, err error) {
				resp := node.Name{ID: m.ID, Name: m.Name, Data: data}
				if err != nil {
					resp.Err = err.Error()
				}
				r.answerName(i, resp)
			})
		case "spawn":
			if m.Rank < 0 || m.Rank >= r.spec.Size {
				reply("", fmt.Errorf("spawn from rank %d of a job of %d", m.Rank, r.spec.Size))
				return
			}
			r.run.spawn(context.Background(), r, m.Spawn, m.Rank, reply)
		default:
			reply("", fmt.Errorf("unknown name operation %q", m.Op))
		}
	case node.FrameKVS:
		r.kvs.frame(r, i, fi.Frame.Payload)
	case node.FrameWaiting:
		var w node.Waiting
		if node.Decode(fi.Frame.Payload, &w) == nil {
			if r.waiting == nil {
				r.waiting = make([]node.Waiting, len(r.conns))
			}
			r.waiting[i] = w
			r.stuck = time.Time{} // something changed: the grace starts again
		}
	case node.FrameTree:
		m, err := tree.DecodeMsg(fi.Frame.Payload)
		if err == nil && m.From != i+1 { // tree node t is the job's node t-1
			err = fmt.Errorf("it claims to come from tree node %d, not %d", m.From, i+1)
		}
		if err != nil {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%s sent a bad tree message: %v", r.nodeName(i), err)})
			return
		}
		// The root has no ranks: it contributes an empty set to every
		// epoch it has not seen yet, in order.
		for r.contrib[m.Kind] < m.Epoch {
			r.contrib[m.Kind]++
			var empty []byte
			if m.Kind == tree.Fence {
				empty, _ = tree.AppendKVs(nil, nil)
			} else {
				empty, _ = tree.AppendEntries(nil, nil)
			}
			rd, err := r.tnode.Contribute(m.Kind, r.contrib[m.Kind], empty)
			if err != nil {
				r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("tree: %v", err)})
				return
			}
			r.ready(rd)
		}
		rd, err := r.tnode.Step(m)
		if err != nil {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("tree: %v", err)})
			return
		}
		r.ready(rd)
	default:
		r.cfg.Logger.Warn("unexpected frame from agent", "node", i, "type", fi.Frame.Type)
	}
}

// answerName sends node i the answer to its name request. An answer too
// large for the link (every node's data of a collective across jobs) is
// refused before anything goes out: the node is told so instead, or it
// would wait for the answer until its request's deadline (an hour for a
// lookup that waits) and then say pmirun did not answer.
func (r *rootNode) answerName(i int, resp node.Name) {
	b := node.Encode(resp)
	if err := r.send(i, netio.Frame{Type: node.FrameName, Payload: b}); errors.Is(err, netio.ErrFrameTooLarge) {
		r.send(i, netio.Frame{Type: node.FrameName, Payload: node.Encode(node.Name{ID: resp.ID,
			Err: fmt.Sprintf("pmirun's answer, %d bytes, cannot go to %s: %v", len(b), r.nodeName(i), err)})})
	}
}

// mergeTrace adds node i's events to the run's trace, as events of the
// run's node it is and of this job, shifted by the clock offset its
// probes estimated (none without a sample: the events are then placed as
// if the clocks started together, and the label says so with an
// unbounded error).
func (r *rootNode) mergeTrace(i int, d *node.Done) {
	trace := r.run.trace
	info := perf.NodeInfo{Node: r.at[i], Job: r.spec.Jobno, Host: r.hosts[i], Mono: d.Mono, Dropped: d.Dropped, Err: -1}
	if d.Clock != nil {
		info.Offset, info.Err = d.Clock.Offset(), d.Clock.Err()
	}
	if boot, err := sys.BootID(); err == nil && boot == d.Boot && d.Mono != 0 && trace.MonoStart() != 0 {
		info.True, info.HasTrue = time.Duration(d.Mono-trace.MonoStart()), true
	}
	trace.Merge(info, d.Events)
}

// ready sends the root's tree messages; a gathered epoch is compressed
// once and broadcast.
func (r *rootNode) ready(rd tree.Ready) {
	for _, m := range rd.Msgs {
		err := r.send(m.To-1, netio.Frame{Type: node.FrameTree, Epoch: m.Epoch, Payload: tree.AppendMsg(nil, m)})
		if errors.Is(err, netio.ErrFrameTooLarge) {
			// Refused before anything went out: the link is fine, and
			// the node would wait for the result for ever.
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("%v epoch %d: the result, %d bytes, cannot go to %s: %v", m.Kind, m.Epoch, len(m.Payload), r.nodeName(m.To-1), err)})
			return
		}
	}
	for _, ev := range rd.Events {
		if ev.Type != tree.EventGathered {
			continue
		}
		var t0 time.Time
		if r.rec.Tracing() {
			t0 = time.Now()
		}
		z, err := netio.Compress(r.codec, nil, ev.Payload)
		if r.rec.Tracing() {
			r.rec.SpanArg("compress", perf.AgentRank, t0, time.Now(), "bytes", int64(len(ev.Payload)))
		}
		if err != nil {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("compress broadcast: %v", err)})
			return
		}
		r.rec.Add("bcast.bytes.raw", int64(len(ev.Payload)))
		r.rec.Add("bcast.bytes.sent", int64(len(z)))
		if ev.Kind == tree.Fence {
			r.rec.Mark(perf.PhaseFenceDone, -1)
		} else {
			r.rec.Mark(perf.PhaseAllgatherDone, -1)
		}
		rd2, err := r.tnode.Broadcast(ev.Kind, ev.Epoch, z)
		if err != nil {
			r.run.fail(&JobError{Code: 1, Msg: fmt.Sprintf("tree: %v", err)})
			return
		}
		r.ready(rd2)
	}
}

// printCounters prints each node's network counters (--verbose).
func (r *rootNode) printCounters() {
	for i, c := range r.counters {
		if c == nil {
			continue
		}
		keys := make([]string, 0, len(c))
		for k := range c {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%d", k, c[k])
		}
		fmt.Fprintf(r.cfg.Stderr, "pmirun: node %d counters:%s\n", i, b.String())
	}
	raw, sent := r.rec.Counter("bcast.bytes.raw"), r.rec.Counter("bcast.bytes.sent")
	if raw > 0 {
		fmt.Fprintf(r.cfg.Stderr, "pmirun: broadcast bytes raw %d, sent %d (%.2fx)\n", raw, sent, float64(raw)/float64(max(sent, 1)))
	}
}
