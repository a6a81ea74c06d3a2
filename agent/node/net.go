package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/ring"
	"github.com/fastpmi/fastpmi/shm"
	"github.com/fastpmi/fastpmi/tree"
)

// AgentOptions run one node of a multi-node job in its own process (pmid).
type AgentOptions struct {
	Index  int       // this node's index in Spec.Nodes
	Listen string    // address to listen on for peer agents; "": the address this node reaches pmirun from, port 0
	Stdin  io.Reader // rank 0's input (node 0 only)
	Stdout io.Writer
	Stderr io.Writer
	Logger *slog.Logger
	// Starter, when set, plays the ranks in this process (Spec.Virtual).
	Starter Starter
	// HostJobs, when set, makes this node's process host the run's
	// spawned jobs as well (a per-job pmid, internal/agentmain): it is
	// called once, before the Hello, with the host of the address the
	// node reaches pmirun from, and returns where the process takes
	// those jobs' nodes (Hello.Jobs). An error is logged and the node
	// runs without: pmirun then starts agents for its spawns.
	HostJobs func(host string) (addr string, err error)
	// Sleeper is where the node's agent sleeps when idle (Options.Sleeper).
	Sleeper *shm.Sleeper
	// Lost, when set, is called on the node's goroutine when it gives
	// pmirun up (its link failed, or was silent for Spec.NetTimeout) and
	// ends its ranks: what still waits to reach pmirun (a daemon's
	// output, Stdout and Stderr) may stop waiting.
	Lost func()
}

// agentNode is one node of a multi-node job, on its own goroutine (run):
// the Node (agent and ranks), the control link to pmirun, the links to
// peer agents, and the tree and ring state machines. The agent reaches it
// through netUpstream, whose calls are queued on ops. The links' receive
// loops are the only other goroutines; run waits for them.
type agentNode struct {
	spec  *Spec
	idx   int      // this node
	hosts []string // every node's name for the ranks (Table.Hosts)
	opt   AgentOptions
	log   *slog.Logger
	rec   *perf.Recorder
	tr    netio.Transport
	ctl   netio.Conn
	peers map[int]netio.Conn
	in    chan FrameIn
	ops   chan func()
	n     *Node
	recv  sync.WaitGroup // the links' receive loops
	quit  chan struct{}  // closed when run returns: receive loops stop delivering

	topo    tree.Topology
	tnode   *tree.Node
	lim     tree.Limits
	rmap    *ring.Map
	rlink   *ring.Link
	fenceN  uint64
	agN     uint64
	fenceCB map[uint64]func([]agent.KV, error)
	agCB    map[uint64]func([][]byte, error)
	ringCB  [2]map[uint64]func(string, error) // ring edges waiting for the neighbour, by side (0: left) and epoch
	names   map[uint64]nameWait               // name requests sent to pmirun, by ID
	nameID  uint64
	lastRx  map[int]time.Time // the watched links' last frame (-1: pmirun)
	watched []int             // peers whose links carry heartbeats: those of the start
	dead    error
	// sendFails counts the failed sends by link (-1: pmirun); only the
	// first on a link is logged: a link that is gone would otherwise log
	// every rank's event after it (hundreds of lines in a daemon's log
	// for one killed pmirun).
	sendFails map[int]int
	kvs       kvsNet
	// treeT0 holds, for a tracer, when this node contributed to each
	// epoch of the tree, by kind: the epoch's trace slice starts there.
	treeT0 map[tree.Kind]map[uint64]time.Time
}

// RunAgent runs node o.Index of spec until its ranks have ended. Its
// errors name the node. It changes nothing process-wide.
func RunAgent(ctx context.Context, spec *Spec, o AgentOptions) error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Index < 0 || o.Index >= len(spec.Nodes) {
		return fmt.Errorf("node index %d: want 0..%d", o.Index, len(spec.Nodes)-1)
	}
	if spec.Wdir != "" {
		if st, err := os.Stat(spec.Wdir); err != nil || !st.IsDir() {
			return fmt.Errorf("node %d: working directory of the job: %s is not a directory here", o.Index, spec.Wdir)
		}
	}
	a := &agentNode{
		spec: spec, idx: o.Index, opt: o, log: o.Logger.With("node", o.Index), rec: perf.NewRecorderFor(o.Index, spec.Trace),
		peers: make(map[int]netio.Conn), in: make(chan FrameIn, 256), ops: make(chan func(), 256),
		quit:    make(chan struct{}),
		fenceCB: make(map[uint64]func([]agent.KV, error)), agCB: make(map[uint64]func([][]byte, error)),
		names: make(map[uint64]nameWait), lastRx: make(map[int]time.Time),
		kvs: kvsNet{places: make(map[uint64]func(error)), fetches: make(map[uint64]fetchDone), outbox: make(map[int]*placeBatch),
			dialing: make(map[int][]netio.Frame), notify: make(chan struct{}, 1)},
	}
	return a.run(ctx, o.Listen)
}

func (a *agentNode) run(ctx context.Context, listen string) error {
	spec := a.spec
	var err error
	a.tr, err = netio.New(netio.Config{Backend: spec.NetBackend, Secret: spec.Secret, Logger: a.log})
	if err != nil {
		return fmt.Errorf("node %d: %w", a.idx, err)
	}
	defer a.tr.Close()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	a.ctl, err = a.tr.Dial(dctx, spec.Root)
	if err != nil {
		return fmt.Errorf("node %d: connect to pmirun at %s: %w", a.idx, spec.Root, err)
	}
	// Peers dial this node at the address it reached pmirun from (the
	// Hello's Addr): listen there only, not on every interface.
	host, _, _ := net.SplitHostPort(a.ctl.LocalAddr().String())
	if listen == "" {
		listen = net.JoinHostPort(host, "0")
	}
	ln, err := a.tr.Listen(listen)
	if err != nil {
		return fmt.Errorf("node %d: listen for peers: %w", a.idx, err)
	}
	hn, _ := os.Hostname()
	hello := Hello{Node: a.idx, Addr: announceAddr(listen, host, ln.Addr().String()), Host: hn, PID: os.Getpid(),
		NetBE: a.tr.Backend().Name, Ranks: len(spec.Nodes[a.idx])}
	if a.opt.HostJobs != nil {
		if hello.Jobs, err = a.opt.HostJobs(host); err != nil {
			a.log.Warn("cannot host the run's spawned jobs", "err", err)
			hello.Jobs = ""
		}
	}
	if err := a.ctl.Send(dctx, netio.Frame{Type: FrameHello, Payload: Encode(hello)}); err != nil {
		return fmt.Errorf("node %d: hello: %w", a.idx, err)
	}
	f, err := a.ctl.Recv(dctx)
	if err != nil || f.Type != FrameTable {
		return fmt.Errorf("node %d: wait for the agent table: %v (frame %d)", a.idx, err, f.Type)
	}
	var table Table
	if err := Decode(f.Payload, &table); err != nil || len(table.Addrs) != len(spec.Nodes) || len(table.Hosts) != len(spec.Nodes) {
		return fmt.Errorf("node %d: bad agent table: %v", a.idx, err)
	}
	a.hosts = table.Hosts
	// Linking to the peers may take long (a peer slow to start, or one
	// this node cannot reach, until dctx ends): pmirun must hear from
	// the node meanwhile, or it takes it for lost after NetTimeout and
	// says so instead of what keeps it. A heartbeat that finds the link
	// broken (pmirun gone) ends the set-up: nobody waits for the node.
	sctx, stopSetup := context.WithCancelCause(dctx)
	defer stopSetup(nil)
	stopBeats := make(chan struct{})
	var beats sync.WaitGroup
	beats.Go(func() {
		tick := time.NewTicker(Heartbeat)
		defer tick.Stop()
		for {
			select {
			case <-tick.C:
				hctx, cancel := context.WithTimeout(sctx, spec.NetTimeout)
				err := a.ctl.Send(hctx, netio.Frame{Type: FrameHeartbeat})
				cancel()
				if err != nil && sctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
					stopSetup(fmt.Errorf("link to pmirun lost while linking to the peers: %w", err))
					return
				}
			case <-stopBeats:
				return
			}
		}
	})
	err = a.setup(sctx, ln, table)
	close(stopBeats)
	beats.Wait()
	if err != nil {
		if cause := context.Cause(sctx); sctx.Err() != nil && dctx.Err() == nil && cause != nil {
			return fmt.Errorf("node %d: %w", a.idx, cause)
		}
		return fmt.Errorf("node %d: %w", a.idx, err)
	}
	a.recv.Go(func() { Receive(a.ctl, -1, a.in, a.quit) })
	for p, c := range a.peers {
		a.recv.Go(func() { Receive(c, p, a.in, a.quit) })
	}
	// The listener stays open for links the KVS dials later (kvsnet.go).
	actx, stopAccept := context.WithCancel(context.Background())
	a.recv.Go(func() { a.acceptPeers(actx, ln) })
	defer func() {
		// The receive loops end when their links close, and the
		// transport's Close closes every link; the accept loop when its
		// context ends.
		close(a.quit)
		stopAccept()
		ln.Close()
		a.tr.Close()
		a.recv.Wait()
	}()
	return a.loop(ctx)
}

// announceAddr is where peers dial a node that listens on listen (bound
// to bound) and reached pmirun from ctlHost: the host it was told to
// listen on, or for a wildcard (or none) the one it reached pmirun from,
// with the port it got.
func announceAddr(listen, ctlHost, bound string) string {
	_, port, _ := net.SplitHostPort(bound)
	host := ctlHost
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// setup builds the tree and ring state and the links to peer agents: the
// lower-numbered node of each pair dials.
func (a *agentNode) setup(ctx context.Context, ln netio.Listener, table Table) error {
	spec := a.spec
	var err error
	K := len(spec.Nodes)
	a.topo, err = tree.NewTopology(K+1, spec.TreeWidth)
	if err != nil {
		return err
	}
	a.lim = tree.JobLimits(spec.Size)
	a.tnode, err = tree.NewNode(tree.Config{Topology: a.topo, Node: a.idx + 1, Limits: a.lim})
	if err != nil {
		return err
	}
	a.rmap, err = ring.FromNodes(spec.Nodes)
	if err != nil {
		return err
	}
	a.rlink, err = ring.NewLink(a.rmap, a.idx)
	if err != nil {
		return err
	}
	a.ringCB = [2]map[uint64]func(string, error){{}, {}}
	strategy, err := ParseStrategy(spec.GetStrategy)
	if err != nil {
		return err
	}
	parent := atRoot
	if p := a.topo.Parent(a.idx + 1); p > 0 {
		parent = p - 1
	}
	a.kvs.rt = newRouter(strategy, spec, a.idx, parent)
	a.kvs.addrs = table.Addrs
	want := map[int]bool{}
	if parent != atRoot {
		want[parent] = true
	}
	for _, c := range a.topo.Children(a.idx + 1) {
		want[c-1] = true
	}
	if K > 1 {
		l, r := a.rmap.Neighbours(a.idx)
		want[l], want[r] = true, true
	}
	delete(want, a.idx)
	accept := 0
	for p := range want {
		if p < a.idx {
			accept++
			continue
		}
		c, err := a.tr.Dial(ctx, table.Addrs[p])
		if err != nil {
			return fmt.Errorf("link to node %d at %s: %w", p, table.Addrs[p], err)
		}
		if err := c.Send(ctx, netio.Frame{Type: FrameLink, Payload: Encode(Link{From: a.idx})}); err != nil {
			return fmt.Errorf("link to node %d: %w", p, err)
		}
		a.peers[p] = c
	}
	for ; accept > 0; accept-- {
		c, err := ln.Accept(ctx)
		if err != nil {
			var missing []string
			for _, p := range slices.Sorted(maps.Keys(want)) {
				if p < a.idx && a.peers[p] == nil {
					missing = append(missing, nodeWord(p))
				}
			}
			return fmt.Errorf("accept peer links (%s did not link to this node): %w", strings.Join(missing, ", "), err)
		}
		f, err := c.Recv(ctx)
		var lm Link
		if err == nil && f.Type == FrameLink {
			err = Decode(f.Payload, &lm)
		} else if err == nil {
			err = fmt.Errorf("first frame type %d", f.Type)
		}
		if err == nil && !want[lm.From] && lm.From >= 0 && lm.From < K && lm.From != a.idx && a.peers[lm.From] == nil {
			// A link the KVS of a node that has started already dialled
			// (kvsnet.go): kept, not one of the start's links.
			a.peers[lm.From] = c
			accept++
			continue
		}
		if err != nil || !want[lm.From] || a.peers[lm.From] != nil {
			c.Close()
			return fmt.Errorf("peer link from %v: unexpected (%v)", c.RemoteAddr(), err)
		}
		a.peers[lm.From] = c
	}
	// The start's links carry heartbeats and are watched for silence
	// (loop); links the KVS dials are not (pmirun watches every node):
	// 63 links a node at 64 nodes would cost each agent 250 heartbeats a
	// second.
	a.watched = slices.Sorted(maps.Keys(want))
	return nil
}

// send sends f to node to (-1: pmirun). A failure is logged (the first
// on each link) and returned: a broken link also shows in its receive
// loop, which fails what needs it, so most callers need not look.
func (a *agentNode) send(to int, f netio.Frame) error {
	c := a.ctl
	if to >= 0 {
		c = a.peers[to]
	}
	if c == nil {
		a.log.Error("no link", "to", to, "type", f.Type)
		return fmt.Errorf("no link to %s", nodeWord(to))
	}
	ctx, cancel := context.WithTimeout(context.Background(), a.spec.NetTimeout)
	defer cancel()
	err := c.Send(ctx, f)
	if err != nil {
		if a.sendFails == nil {
			a.sendFails = make(map[int]int)
		}
		if a.sendFails[to]++; a.sendFails[to] == 1 {
			a.log.Warn("send (further failures on this link are not logged)", "to", to, "type", f.Type, "err", err)
		}
	}
	a.rec.Add("net.frames.sent", 1)
	a.rec.Add("net.bytes.sent", int64(len(f.Payload)))
	return err
}

// lost ends the node's ranks when it gave pmirun up, and says so
// (AgentOptions.Lost).
func (a *agentNode) lost() {
	a.n.Kill()
	if a.opt.Lost != nil {
		a.opt.Lost()
	}
}

// heartbeat tells pmirun and the watched peers that this node lives.
func (a *agentNode) heartbeat() {
	a.send(-1, netio.Frame{Type: FrameHeartbeat})
	for _, p := range a.watched {
		a.send(p, netio.Frame{Type: FrameHeartbeat})
	}
}

func (a *agentNode) emit(e agent.Event) {
	a.send(-1, netio.Frame{Type: FrameEvent, Payload: Encode(e)})
}

func (a *agentNode) loop(ctx context.Context) error {
	spec := a.spec
	var err error
	a.n, err = New(spec, Options{
		Index: a.idx, Stdin: a.opt.Stdin, Stdout: a.opt.Stdout, Stderr: a.opt.Stderr, Logger: a.log,
		Perf: a.rec, Upstream: netUpstream{a}, Emit: a.emit, Starter: a.opt.Starter, Hosts: a.hosts,
		Sleeper: a.opt.Sleeper,
	})
	if err != nil {
		a.emit(agent.Event{Kind: agent.EventStartFailed, Rank: spec.Nodes[a.idx][0], Msg: err.Error()})
		a.send(-1, netio.Frame{Type: FrameDone, Payload: Encode(Done{Counters: a.rec.Counters()})})
		return err
	}
	if err := a.n.Resolve(); err != nil {
		a.emit(agent.Event{Kind: agent.EventStartFailed, Rank: spec.Nodes[a.idx][0], Code: ExitCodeFor(err), Msg: err.Error()})
	} else {
		a.send(-1, netio.Frame{Type: FrameReady})
		// The loop below runs while the ranks are forked: its
		// heartbeats go on (thousands of ranks, or a busy machine,
		// outlast NetTimeout), and pmirun's orders are carried out.
		a.n.Start()
	}
	tick := time.NewTicker(Heartbeat)
	defer tick.Stop()
	now := time.Now()
	a.lastRx[-1] = now
	for _, p := range a.watched {
		a.lastRx[p] = now
	}
	rootLost := false
	ending := false // ctx is done and the root was told why
	for a.n.Live() > 0 {
		select {
		case ev := <-a.n.Events():
			a.n.Handle(ev)
		case op := <-a.ops:
			op()
		case <-a.kvs.notify:
			a.runPosted()
		case <-a.kvs.flushC:
			a.kvs.flushC = nil
			a.flushPlaces()
		case fi := <-a.in:
			if fi.Err != nil {
				if fi.From < 0 && !rootLost {
					rootLost = true
					a.log.Error("lost pmirun; ending local ranks", "err", fi.Err)
					a.lost()
				}
				a.failLink(fi.From, fi.Err)
				continue
			}
			if _, ok := a.lastRx[fi.From]; ok {
				a.lastRx[fi.From] = time.Now()
			}
			a.rec.Add("net.bytes.recv", int64(len(fi.Frame.Payload)))
			a.frame(fi)
		case <-tick.C:
			a.heartbeat()
			a.expireNames(time.Now())
			a.reportWaiting()
			for p, t := range a.lastRx {
				if time.Since(t) > spec.NetTimeout {
					err := fmt.Errorf("no message for %v", spec.NetTimeout)
					if p < 0 && !rootLost {
						rootLost = true
						a.lost()
					}
					a.failLink(p, err)
					delete(a.lastRx, p)
				}
			}
		case <-ctx.Done():
			if !ending {
				ending = true
				var e *Ending
				if errors.As(context.Cause(ctx), &e) {
					a.send(-1, netio.Frame{Type: FrameEnding, Payload: Encode(e)})
				}
			}
			a.n.Kill()
		}
	}
	a.n.RecordMemory()
	a.recordKVS()
	contributed := a.n.Agent().Contributed()
	a.n.Close()
	if !rootLost {
		done := Done{Contributed: contributed, Counters: a.rec.Counters()}
		if a.spec.Trace {
			a.traceDone(ctx, &done)
		}
		a.send(-1, netio.Frame{Type: FrameDone, Payload: Encode(done)})
		// Stay until pmirun closes the link, when every node is done: a
		// node that leaves early would look lost to the peers still
		// running, and it still serves the keys placed here to them.
		// Heartbeats go on meanwhile; a pmirun silent for --net-timeout
		// ends the wait.
		for {
			select {
			case fi := <-a.in:
				if fi.From < 0 {
					if fi.Err != nil {
						return nil
					}
					a.lastRx[-1] = time.Now()
				}
				if fi.Err == nil {
					a.frameAfterDone(fi)
				}
			case <-a.kvs.notify:
				a.runPosted()
			case <-a.kvs.flushC:
				a.kvs.flushC = nil
				a.flushPlaces()
			case <-tick.C:
				a.send(-1, netio.Frame{Type: FrameHeartbeat})
				for _, p := range a.watched {
					a.send(p, netio.Frame{Type: FrameHeartbeat})
				}
				if time.Since(a.lastRx[-1]) > spec.NetTimeout {
					return nil
				}
			case <-ctx.Done():
				return nil
			}
		}
	}
	return errors.New("lost the connection to pmirun")
}

// frameAfterDone handles a frame that comes once the node's ranks have
// all ended: keys placed here still served; and a kill or signal from
// pmirun reaches what the ranks left behind (a background process), as
// on one node (Node.Signal, Node.Close), when the job fails after this
// node's part of it ended, or is interrupted.
func (a *agentNode) frameAfterDone(fi FrameIn) {
	switch fi.Frame.Type {
	case FrameKVS:
		a.kvsFrame(fi.From, fi.Frame.Payload)
	case FrameKill:
		if fi.From < 0 {
			a.n.KillNow()
		}
	case FrameSignal:
		var s Signal
		if fi.From < 0 && Decode(fi.Frame.Payload, &s) == nil {
			a.n.Signal(sys.Signal(s.Sig))
		}
	}
}

// clockProbes is how many clock probes a traced node sends to the root
// at the end; the one with the shortest round trip is kept.
const clockProbes = 8

// traceDone fills d with the node's events and its clock offset to the
// root, estimated with clock probes over the control link. Frames from
// the root other than the answers refresh its liveness; a probe the root
// leaves unanswered for NetTimeout ends the probing (the events go
// without an estimate). Meanwhile every other frame is served as once the
// node is done (frameAfterDone): other nodes still fetch keys placed here
// (they were dropped, and their gets waited for ever).
func (a *agentNode) traceDone(ctx context.Context, d *Done) {
	var samples []perf.ClockSample
	timeout := time.NewTimer(a.spec.NetTimeout)
	defer timeout.Stop()
probes:
	for seq := 1; seq <= clockProbes; seq++ {
		a.send(-1, netio.Frame{Type: FrameClock, Payload: Encode(Clock{Seq: seq, Sent: a.rec.Since()})})
		for {
			select {
			case fi := <-a.in:
				switch {
				case fi.From < 0 && fi.Err != nil:
					break probes
				case fi.Err != nil:
					continue
				case fi.From < 0:
					a.lastRx[-1] = time.Now()
				}
				var c Clock
				if fi.From >= 0 || fi.Frame.Type != FrameClock || Decode(fi.Frame.Payload, &c) != nil || c.Seq != seq {
					// Still a node of the job: other nodes' fetches of
					// the keys placed here are served meanwhile.
					a.frameAfterDone(fi)
					continue
				}
				samples = append(samples, perf.ClockSample{Sent: c.Sent, Peer: c.Peer, Received: a.rec.Since()})
				continue probes
			case <-a.kvs.notify:
				a.runPosted()
			case <-a.kvs.flushC:
				a.kvs.flushC = nil
				a.flushPlaces()
			case <-timeout.C:
				break probes
			case <-ctx.Done():
				break probes
			}
		}
	}
	if len(samples) > 0 {
		best := perf.BestClock(samples)
		d.Clock = &best
	}
	d.Events = a.rec.Events()
	if len(d.Events) > MaxTraceEvents {
		d.Dropped = len(d.Events) - MaxTraceEvents
		d.Events = d.Events[:MaxTraceEvents]
	}
	d.Mono = a.rec.MonoStart()
	d.Boot, _ = sys.BootID()
}

// nodeWord names node p (-1: pmirun) in messages.
func nodeWord(p int) string {
	if p < 0 {
		return "pmirun"
	}
	return fmt.Sprintf("node %d", p)
}

// treeWhat names what a tree message of type t carries, in messages.
func treeWhat(t tree.Type) string {
	if t == tree.Up {
		return "the contributions gathered here"
	}
	return "the result"
}

// failLink fails every collective that needs the link to node p (-1:
// the root).
func (a *agentNode) failLink(p int, err error) {
	who := nodeWord(p)
	a.failAll(fmt.Errorf("link to %s lost: %w", who, err))
}

// failAll fails every collective, KVS operation and name request waiting
// with e, and every later one (a.dead): the tree or a link they need is
// gone.
func (a *agentNode) failAll(e error) {
	if a.dead == nil {
		a.dead = e
	}
	for k, cb := range a.fenceCB {
		delete(a.fenceCB, k)
		cb(nil, e)
	}
	for k, cb := range a.agCB {
		delete(a.agCB, k)
		cb(nil, e)
	}
	a.failRing(e)
	a.failKVS(e)
	for id, w := range a.names {
		delete(a.names, id)
		w.done(Name{ID: id, Err: e.Error()})
	}
}

func (a *agentNode) frame(fi FrameIn) {
	switch fi.Frame.Type {
	case FrameKill, FrameSignal, FrameName:
		if fi.From >= 0 {
			// pmirun's orders and answers: a peer agent has no say in
			// them (as frameAfterDone).
			a.log.Warn("unexpected frame from a peer agent", "from", fi.From, "type", fi.Frame.Type)
			return
		}
	}
	switch fi.Frame.Type {
	case FrameHeartbeat:
	case FrameKill:
		var k Kill
		_ = Decode(fi.Frame.Payload, &k)
		a.log.Info("pmirun ends the job", "code", k.Code, "msg", k.Msg)
		a.n.Kill()
	case FrameSignal:
		var s Signal
		if Decode(fi.Frame.Payload, &s) == nil {
			a.n.Signal(sys.Signal(s.Sig))
		}
	case FrameName:
		var m Name
		if Decode(fi.Frame.Payload, &m) == nil {
			if w, ok := a.names[m.ID]; ok {
				delete(a.names, m.ID)
				w.done(m)
			}
		}
	case FrameTree:
		m, err := tree.DecodeMsg(fi.Frame.Payload)
		if err == nil && m.From != fi.From+1 { // tree node t is agent t-1; 0 is the root
			err = fmt.Errorf("message from tree node %d on the link to tree node %d", m.From, fi.From+1)
		}
		var r tree.Ready
		if err == nil {
			r, err = a.tnode.Step(m)
		}
		if err != nil {
			a.badMessage(fi.From, "tree", err)
			return
		}
		a.ready(r)
	case FrameKVS:
		a.kvsFrame(fi.From, fi.Frame.Payload)
	case FrameRing:
		m, err := ring.DecodeMessage(fi.Frame.Payload)
		if err == nil && m.From != fi.From {
			err = fmt.Errorf("message from node %d on the link to node %d", m.From, fi.From)
		}
		if err == nil {
			a.rec.Add("ring.msgs.recv", 1)
			err = a.ringRecv(m)
		}
		if err != nil {
			a.badMessage(fi.From, "ring", err)
		}
	default:
		a.log.Warn("unexpected frame", "from", fi.From, "type", fi.Frame.Type)
	}
}

// ready sends a tree state machine's messages and acts on its events.
func (a *agentNode) ready(r tree.Ready) {
	for _, m := range r.Msgs {
		to := m.To - 1 // tree node t is agent t-1; 0 is the root
		a.rec.Add("tree.msgs.sent", 1)
		err := a.send(to, netio.Frame{Type: FrameTree, Epoch: m.Epoch, Payload: tree.AppendMsg(nil, m)})
		if errors.Is(err, netio.ErrFrameTooLarge) {
			// Nothing else would notice: the link is fine, and the
			// epoch waits for this message for ever. The tree cannot
			// go on without it.
			a.failAll(fmt.Errorf("%v epoch %d: %s of %d bytes cannot go to %s: %w", m.Kind, m.Epoch, treeWhat(m.Type), len(m.Payload), nodeWord(to), err))
		}
	}
	for _, ev := range r.Events {
		if ev.Type != tree.EventDelivered {
			continue
		}
		a.rec.Add("bcast.bytes.in", int64(len(ev.Payload)))
		var t0 time.Time
		if a.rec.Tracing() {
			t0 = time.Now()
		}
		raw, err := netio.Decompress(nil, ev.Payload, int(a.lim.MaxTotal))
		if err == nil {
			a.rec.Add("bcast.bytes.raw", int64(len(raw)))
		}
		if a.rec.Tracing() {
			a.traceTree(ev.Kind, ev.Epoch, t0, len(raw))
		}
		switch ev.Kind {
		case tree.Fence:
			cb := a.fenceCB[ev.Epoch]
			delete(a.fenceCB, ev.Epoch)
			if cb == nil {
				continue
			}
			if err != nil {
				cb(nil, err)
				continue
			}
			kvs, err := tree.DecodeKVs(raw, a.lim)
			if err != nil {
				cb(nil, err)
				continue
			}
			out := make([]agent.KV, len(kvs))
			for i, kv := range kvs {
				out[i] = agent.KV{Key: string(kv.Key), Val: string(kv.Value)}
			}
			cb(out, nil)
		case tree.Allgather:
			cb := a.agCB[ev.Epoch]
			delete(a.agCB, ev.Epoch)
			if cb == nil {
				continue
			}
			if err != nil {
				cb(nil, err)
				continue
			}
			es, err := tree.DecodeEntries(raw, a.lim)
			if err != nil {
				cb(nil, err)
				continue
			}
			all := make([][]byte, a.spec.Size)
			for _, e := range es {
				all[e.Rank] = e.Value
			}
			cb(all, nil)
		}
	}
}

// contributed notes, for a tracer, that this node contributed to epoch
// of kind now.
func (a *agentNode) contributed(kind tree.Kind, epoch uint64) {
	if !a.rec.Tracing() {
		return
	}
	if a.treeT0 == nil {
		a.treeT0 = map[tree.Kind]map[uint64]time.Time{}
	}
	if a.treeT0[kind] == nil {
		a.treeT0[kind] = map[uint64]time.Time{}
	}
	a.treeT0[kind][epoch] = time.Now()
}

// traceTree stamps a delivered epoch on the agent's track: the tree's
// gather and broadcast from this node's contribution to the delivery,
// and the decompression of the broadcast (from t0, raw bytes out).
func (a *agentNode) traceTree(kind tree.Kind, epoch uint64, t0 time.Time, raw int) {
	now := time.Now()
	name := "allgather (tree)"
	if kind == tree.Fence {
		name = "fence (tree)"
	}
	if c, ok := a.treeT0[kind][epoch]; ok {
		delete(a.treeT0[kind], epoch)
		a.rec.SpanArg(name, perf.AgentRank, c, now, "epoch", int64(epoch))
	}
	a.rec.SpanArg("decompress", perf.AgentRank, t0, now, "bytes", int64(raw))
}

// ringSide indexes agentNode.ringCB: 0 for the edge with the left
// neighbour node (sent ToLeft), 1 for the right.
func ringSide(toLeft bool) int {
	if toLeft {
		return 0
	}
	return 1
}

// ringSend sends one boundary value of a ring epoch; done gets the
// neighbour's value for the same epoch, now if it already came.
func (a *agentNode) ringSend(epoch uint64, toLeft bool, value string, done func(string, error)) {
	d := ring.ToRight
	if toLeft {
		d = ring.ToLeft
	}
	m, got, ok, err := a.rlink.Send(d, epoch, value)
	if err != nil {
		done("", err)
		return
	}
	a.ringCB[ringSide(toLeft)][epoch] = done
	if m.To == a.idx { // the ring closes on this node
		if err := a.ringRecv(m); err != nil {
			a.log.Error("ring", "err", err)
			a.failRing(err)
		}
	} else {
		a.rec.Add("ring.msgs.sent", 1)
		a.send(m.To, netio.Frame{Type: FrameRing, Epoch: m.Epoch, Payload: ring.AppendMessage(nil, m)})
	}
	if ok {
		a.ringDeliver(ringSide(toLeft), epoch, got)
	}
}

// ringRecv takes a neighbour's ring message (or this node's own, on a
// ring that closes here). A bad one is refused with an error, and the
// caller fails what waits for it.
func (a *agentNode) ringRecv(m ring.Message) error {
	side, deliver, err := a.rlink.Recv(m)
	if err != nil {
		return err
	}
	if deliver {
		a.ringDeliver(ringSide(side == ring.ToLeft), m.Epoch, m.Value)
	}
	return nil
}

// badMessage takes a tree, ring or KVS message from node from (-1: pmirun)
// that does not decode or that its state machine refuses. The collective
// it belonged to can never complete (its part is lost, and the peer's
// state is not this node's), and with the heartbeats still coming nothing
// else would end the wait: every collective that needs the link fails as
// if it were lost, so the ranks waiting get an error naming the node
// instead of waiting for ever, and later ones fail at once.
func (a *agentNode) badMessage(from int, what string, err error) {
	if a.dead == nil { // once: a broken peer may send many
		a.log.Error("bad "+what+" message; failing the collectives", "from", from, "err", err)
	}
	a.failLink(from, fmt.Errorf("bad %s message: %w", what, err))
}

func (a *agentNode) ringDeliver(side int, epoch uint64, v string) {
	if cb := a.ringCB[side][epoch]; cb != nil {
		delete(a.ringCB[side], epoch)
		cb(v, nil)
	}
}

// failRing fails every ring edge waiting for a neighbour.
func (a *agentNode) failRing(err error) {
	for _, cbs := range a.ringCB {
		for e, cb := range cbs {
			delete(cbs, e)
			cb("", err)
		}
	}
}

// netUpstream is the agent's Upstream on a multi-node job: calls are
// queued to the node's loop.
type netUpstream struct{ a *agentNode }

func (u netUpstream) Fence(epoch uint64, puts []agent.KV, done func([]agent.KV, error)) {
	a := u.a
	// Placements go through post: the fence goes the same way, behind
	// them, and waits for them to arrive.
	a.post(func() { a.holdFence(func() { a.fence(puts, done) }) })
}

// fence contributes this node's puts to its next fence. On the loop.
func (a *agentNode) fence(puts []agent.KV, done func([]agent.KV, error)) {
	if a.dead != nil {
		done(nil, a.dead)
		return
	}
	a.fenceN++
	// The agent's core hands over one put per key, with its owner.
	kvs := make([]tree.KV, len(puts))
	for i, p := range puts {
		kvs[i] = tree.KV{Key: []byte(p.Key), Value: []byte(p.Val), Owner: uint32(p.Owner)}
	}
	tree.SortKVs(kvs)
	payload, err := tree.AppendKVs(nil, kvs)
	if err != nil {
		done(nil, err)
		return
	}
	a.fenceCB[a.fenceN] = done
	a.contributed(tree.Fence, a.fenceN)
	r, err := a.tnode.Contribute(tree.Fence, a.fenceN, payload)
	if err != nil {
		delete(a.fenceCB, a.fenceN)
		done(nil, err)
		return
	}
	a.ready(r)
}

func (u netUpstream) Allgather(epoch uint64, in []tree.Entry, done func([][]byte, error)) {
	u.a.ops <- func() {
		a := u.a
		if a.dead != nil {
			done(nil, a.dead)
			return
		}
		a.agN++
		tree.SortEntries(in) // the core made in for this call
		payload, err := tree.AppendEntries(nil, in)
		if err != nil {
			done(nil, err)
			return
		}
		a.agCB[a.agN] = done
		a.contributed(tree.Allgather, a.agN)
		r, err := a.tnode.Contribute(tree.Allgather, a.agN, payload)
		if err != nil {
			delete(a.agCB, a.agN)
			done(nil, err)
			return
		}
		a.ready(r)
	}
}

func (u netUpstream) RingLayout(int) (offset, size int) {
	return u.a.rmap.Offset(u.a.idx), u.a.rmap.Size()
}

func (u netUpstream) RingEdge(epoch uint64, toLeft bool, value string, done func(string, error)) {
	u.a.ops <- func() {
		if a := u.a; a.dead != nil {
			done("", a.dead)
		} else {
			a.ringSend(epoch, toLeft, value, done)
		}
	}
}

// nameWait is a name request sent to pmirun, waiting on the node's loop
// for the answer frame with its ID until deadline.
type nameWait struct {
	done     func(Name)
	deadline time.Time
}

// nameGrace is how much longer than NetTimeout a name request waits for
// pmirun's answer.
const nameGrace = 5 * time.Second

// name sends the name request m to pmirun from the node's loop; done gets
// the answer there. A lookup that waits for its name (m.Wait) gives
// pmirun that much longer to answer.
func (u netUpstream) name(m Name, done func(Name)) {
	u.a.ops <- func() {
		a := u.a
		if a.dead != nil {
			done(Name{Err: a.dead.Error()})
			return
		}
		a.nameID++
		m.ID = a.nameID
		// pmirun's answer carries no Op: it answers the request of its ID,
		// whose Op and Name the answer's error names (nameErr).
		answered := func(r Name) { r.Op, r.Name = m.Op, m.Name; done(r) }
		a.names[m.ID] = nameWait{done: answered, deadline: time.Now().Add(a.spec.NetTimeout + nameGrace + m.Wait)}
		b := Encode(m)
		if err := a.send(-1, netio.Frame{Type: FrameName, Payload: b}); errors.Is(err, netio.ErrFrameTooLarge) {
			// Refused before anything went out: no answer will come,
			// and the deadline may be an hour away.
			delete(a.names, m.ID)
			answered(Name{ID: m.ID, Err: fmt.Sprintf("%s: the request, %d bytes, cannot go to pmirun: %v", m.Op, len(b), err)})
		}
	}
}

// expireNames fails the name requests pmirun has left unanswered past
// their deadline. The loop calls it on every Heartbeat tick.
func (a *agentNode) expireNames(now time.Time) {
	for id, w := range a.names {
		if now.After(w.deadline) {
			delete(a.names, id)
			w.done(Name{ID: id, Err: "name service: no answer from pmirun"})
		}
	}
}

func (u netUpstream) Publish(name, port string, once bool, done func(error)) {
	u.name(Name{Op: "publish", Name: name, Port: port, Once: once}, func(r Name) { done(nameErr(r)) })
}

func (u netUpstream) Unpublish(name string, done func(error)) {
	u.name(Name{Op: "unpublish", Name: name}, func(r Name) { done(nameErr(r)) })
}

func (u netUpstream) Lookup(name string, wait time.Duration, done func(string, error)) {
	u.name(Name{Op: "lookup", Name: name, Wait: wait}, func(r Name) { done(r.Port, nameErr(r)) })
}

// Spawn asks pmirun to start the job; its answer carries the job id.
func (u netUpstream) Spawn(req *pmiwire.Spawn, rank int, done func(string, error)) {
	u.name(Name{Op: "spawn", Spawn: req, Rank: rank}, func(r Name) { done(r.Port, nameErr(r)) })
}

// JobsCollective asks pmirun to join this node to a collective across
// jobs; its answer carries every node's data. The other jobs' ranks may
// take long to get there: the request waits as long as a lookup may.
func (u netUpstream) JobsCollective(kind string, procs []agent.JobRanks, data []byte, done func([]byte, error)) {
	u.name(Name{Op: "jobs", Name: kind, Procs: procs, Data: data, Wait: agent.MaxNameWait}, func(r Name) { done(r.Data, nameErr(r)) })
}

func nameErr(m Name) error {
	switch {
	case m.NotFound:
		return fmt.Errorf("%s %q: %w", m.Op, m.Name, agent.ErrNameNotFound)
	case m.Err != "":
		return errors.New(m.Err)
	}
	return nil
}
