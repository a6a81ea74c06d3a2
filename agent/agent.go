// Package agent is the node agent: it serves the ranks of one job on one
// node over the PMI-1/PMI-2 text protocol (one connection per rank, usually
// the PMI_FD socketpair the launcher created) and over shared memory,
// holds the node's view of the job's key-value space (KVS), node
// attributes, and runs the job's collectives — fence/barrier, allgather,
// ring — for its local ranks.
//
// Model. The PMI semantics live in Core (core.go), a pure state machine in
// the shape of etcd-io/raft's RawNode: typed operations go in through
// Step, and Ready says what to do — replies addressed to (rank, request),
// Upstream calls, epochs to publish in shared memory, launcher events,
// perf marks. The Agent is the shell around it. Each rank connection is
// read by one goroutine (started by Serve, owned and waited for by the
// Agent) that decodes requests (text.go) into operations; the
// shared-memory front end (shm.go) is one goroutine that does the same
// for every rank's request ring. Completions from the Upstream come back
// as operations on whatever goroutine the Upstream calls back on. Every
// such turn steps the core under one mutex, Agent.mu, takes its Ready, and
// carries it out after releasing mu: the shared-memory part (pushing
// responses, publishing epochs) under pubMu, handed over from mu so
// batches publish in the order they were made; text replies written to
// the sockets without any agent lock, and another rank's replies only
// through that rank's bounded queue (textout.go), so a slow or stuck rank
// never stalls the agent or another rank; then events and Upstream calls, so the Upstream is
// never called under an agent lock.
//
// Everything that reaches beyond this node goes through the Upstream
// interface: the job-wide part of a fence or ring, and the job services held
// by the launcher (name publishing, abort). A single-node job uses Local.
//
// Lifetimes. New returns a running agent with no connections; Serve adds a
// rank connection; AttachSegment adds the shared-memory front end; Close
// closes every connection, fails every waiting request, and waits for the
// goroutines. Events (a rank's first PMI command, finalize, a lost
// connection, an abort) are reported through Config.Events so the launcher
// can decide the job's fate; the agent never kills processes itself.
package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// ErrClosed is returned by Serve after Close.
var ErrClosed = errors.New("agent: closed")

// Config describes one job on this node.
type Config struct {
	JobID string // KVS name / PMI-2 job id
	Size  int    // ranks in the whole job
	// Local lists the global ranks served by this agent, in local-rank order.
	Local []int
	// Appnum gives each local rank's application number (MPMD index),
	// indexed like Local; nil means 0 for all.
	Appnum []int
	// Mapping is PMI_process_mapping ("" if it cannot be represented: the
	// attribute is then absent).
	Mapping string
	// UniverseSize is answered to get_universe_size / universeSize; -1 means
	// unlimited.
	UniverseSize int
	// SpawnerJobID is set for a job created by spawn.
	SpawnerJobID string
	// Preput are keys in the job KVS from the start, readable before the
	// first fence: what a spawner put for its children (Owner -1).
	Preput []KV
	// LateAttrs are job attributes whose values the owner supplies later
	// with SetJobAttr, in bounded time once asked (jobattr.go): the first
	// read of key calls LateAttrs[key] (without agent locks; it must not
	// block), and reads wait for the value.
	LateAttrs map[string]func()
	// IDs, if set, are the PMI_ID tokens of the local ranks, by local
	// index: decimal integers (MPICH reads PMI_ID with atoi), unique and
	// unguessable. A PMI-1 client on PMI_PORT must present its rank's
	// token at initack (port.go).
	IDs []string
	// PeerCheck, if set, vets each PMI_PORT connection before anything is
	// read from it; an error refuses it (port.go).
	PeerCheck func(net.Conn) error
	// ReplyQueueBytes bounds the replies queued for one text connection
	// whose rank does not read them (textout.go); past it the rank is
	// failed. 0 means defaultReplyQueueBytes(Size).
	ReplyQueueBytes int
	// KVS is the policy for keys put without a hint (remote.go).
	KVS KVSPolicy
	// Sleeper, if set, is where the shared-memory front end sleeps once
	// it has had nothing to do for shmIdleWake: with no thread of its own
	// (shm.Sleeper; a process may serve thousands of idle jobs). It is the
	// owner's, shared by its agents, closed after them. nil = each agent
	// sleeps on its own thread.
	Sleeper *shm.Sleeper

	Upstream Upstream // job-wide collectives and services; nil = Local
	// Events receives the agent's reports (event.go: init, finalize,
	// abort, a lost connection, a protocol error) so the launcher can
	// decide the job's fate; called without agent locks held, it must not
	// block for long. nil = ignore.
	Events func(Event)
	Logger *slog.Logger   // nil = discard
	Perf   *perf.Recorder // nil = no stamps
}

func (c *Config) validate() error {
	if c.Size < 1 {
		return fmt.Errorf("agent config: job size %d, want >= 1", c.Size)
	}
	if len(c.Local) == 0 {
		return errors.New("agent config: no local ranks")
	}
	seen := make(map[int]bool, len(c.Local))
	for _, r := range c.Local {
		if r < 0 || r >= c.Size {
			return fmt.Errorf("agent config: local rank %d outside job of size %d", r, c.Size)
		}
		if seen[r] {
			return fmt.Errorf("agent config: rank %d listed twice", r)
		}
		seen[r] = true
	}
	if c.Appnum != nil && len(c.Appnum) != len(c.Local) {
		return fmt.Errorf("agent config: %d appnums for %d local ranks", len(c.Appnum), len(c.Local))
	}
	if c.JobID == "" {
		c.JobID = "fastpmi"
	}
	if len(c.JobID) > pmiwire.KVSNameMax {
		return fmt.Errorf("agent config: job id longer than %d bytes", pmiwire.KVSNameMax)
	}
	if c.UniverseSize == 0 || c.UniverseSize < -1 {
		c.UniverseSize = -1
	}
	if c.IDs != nil && len(c.IDs) != len(c.Local) {
		return fmt.Errorf("agent config: %d PMI_IDs for %d local ranks", len(c.IDs), len(c.Local))
	}
	if c.ReplyQueueBytes < 0 {
		return fmt.Errorf("agent config: reply queue of %d bytes", c.ReplyQueueBytes)
	}
	if c.ReplyQueueBytes == 0 {
		c.ReplyQueueBytes = defaultReplyQueueBytes(c.Size)
	}
	if c.Upstream == nil {
		c.Upstream = NewLocal()
	}
	if c.Events == nil {
		c.Events = func(Event) {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// rankConn is the shell's side of one local rank. Fields other than the
// constants are guarded by Agent.mu.
type rankConn struct {
	local, global, appnum int
	conn                  *textConn     // nil until a connection is bound
	drained               chan struct{} // closed when the bound connection has ended
}

// Agent serves one job's local ranks. See the package comment.
type Agent struct {
	cfg Config
	log *slog.Logger
	rec *perf.Recorder

	replyQueueBytes int            // cfg.ReplyQueueBytes
	ids             map[string]int // cfg.IDs: token → global rank; nil without
	port            portStats
	closing         chan struct{} // closed by Close: stops the accept loops' back-off

	wg sync.WaitGroup // connection goroutines, the listeners' and serveShm

	mu sync.Mutex
	// Guarded by mu.
	core      *Core
	closed    bool
	ranks     []*rankConn // by local index
	unbound   int         // PMI_PORT connections not yet bound to a rank (port.go)
	conns     map[*textConn]struct{}
	listeners []net.Listener
	seg       *shm.Segment // shared-memory segment served, or nil (also nil once closed)
	shmDead   []bool       // local ranks whose request ring broke the protocol: not read again (shm.go)
	ext       External     // the external front end (external.go), or nil; set once
	// shmPending[i]: local rank i's shared-memory requests the core has
	// not answered yet (counted by serveRingLocked, taken off by take),
	// bounded as a text connection's are (MaxPendingPerConn).
	shmPending []int
	// answers holds the done callbacks of ServeGet and ServeRankData
	// requests by the ID the core echoes in UpAnswer; answerSeq numbers
	// them.
	answers   map[uint64]func(val string, found bool, err error)
	answerSeq uint64

	// pubMu is held while a turn carries out the shared-memory part of its
	// Ready: the producing ends of the response rings, the node KVS and the
	// result array are written only under it, and turns take it before
	// releasing mu, so epochs are published in order. Lock order: mu, then
	// pubMu; nothing under pubMu blocks or calls out.
	pubMu sync.Mutex
	// shmFailed[i]: local rank i's response could not be pushed (it was
	// reported once); guarded by pubMu, made on the first failure.
	shmFailed []bool
	// shmReads holds, for a tracer only (perf.Recorder.Tracing), when each
	// shared-memory request not yet answered was read and by which turn
	// (shmtrace.go); guarded by pubMu, made on the first request.
	shmReads map[shmKey]shmRead
}

// New starts an agent for cfg.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	off, size := cfg.Upstream.RingLayout(len(cfg.Local))
	a := &Agent{
		replyQueueBytes: cfg.ReplyQueueBytes,
		closing:         make(chan struct{}),
		cfg:             cfg,
		log:             cfg.Logger,
		rec:             cfg.Perf,
		core:            NewCore(&cfg, off, size),
		conns:           make(map[*textConn]struct{}),
		answers:         make(map[uint64]func(string, bool, error)),
	}
	for i, g := range cfg.Local {
		app := 0
		if cfg.Appnum != nil {
			app = cfg.Appnum[i]
		}
		a.ranks = append(a.ranks, &rankConn{local: i, global: g, appnum: app, drained: make(chan struct{})})
	}
	if cfg.IDs != nil {
		a.ids = make(map[string]int, len(cfg.IDs))
		for i, id := range cfg.IDs {
			if _, dup := a.ids[id]; dup || id == "" {
				return nil, fmt.Errorf("agent config: PMI_ID %q empty or listed twice", id)
			}
			a.ids[id] = cfg.Local[i]
		}
	}
	if a.rec != nil {
		a.rec.Mark(perf.PhaseAgentReady, -1)
	}
	return a, nil
}

// Serve starts serving conn as the PMI connection of local rank local
// (the PMI_FD socketpair). The agent owns conn from now on.
func (a *Agent) Serve(local int, conn net.Conn) error {
	if local < 0 || local >= len(a.ranks) {
		conn.Close()
		return fmt.Errorf("serve local rank %d: agent has %d local ranks", local, len(a.ranks))
	}
	return a.serve(conn, a.ranks[local])
}

// ServeUnbound serves a connection whose rank is learned from the client's
// initack (PMI-1, PMI_PORT mode) or fullinit (PMI-2) request.
func (a *Agent) ServeUnbound(conn net.Conn) error { return a.serve(conn, nil) }

// ServeListener accepts connections on ln (PMI_PORT mode) and serves each
// as an unbound connection until ln is closed or the agent is closed,
// vetted as port.go says. The agent closes ln on Close.
func (a *Agent) ServeListener(ln net.Listener) {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		ln.Close()
		return
	}
	a.listeners = append(a.listeners, ln)
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		a.acceptLoop(ln)
	}()
}

func (a *Agent) serve(conn net.Conn, rc *rankConn) error {
	c := &textConn{a: a, nc: conn, wake: make(chan struct{}, 1), done: make(chan struct{})}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return ErrClosed
	}
	if rc != nil {
		if rc.conn != nil {
			a.mu.Unlock()
			conn.Close()
			return fmt.Errorf("serve rank %d: already connected", rc.global)
		}
		rc.conn = c
		c.rank = rc
	} else {
		c.admitLocked()
	}
	a.conns[c] = struct{}{}
	a.wg.Add(2)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		c.run()
	}()
	go func() {
		defer a.wg.Done()
		c.writeLoop()
	}()
	return nil
}

// Close closes every rank connection, answers every waiting request with
// an error, and waits for the goroutines. It is idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.wg.Wait()
		return nil
	}
	a.closed = true
	close(a.closing)
	_ = a.core.Step(Shutdown{})
	t := newTurn()
	t.take(a) // with the segment: waiting shm ranks get their error
	seg := a.seg
	a.seg = nil
	for _, ln := range a.listeners {
		ln.Close()
	}
	conns := make([]*textConn, 0, len(a.conns))
	for c := range a.conns {
		conns = append(conns, c)
	}
	// The shutdown errors are delivered before the connections close,
	// each within closeFlush: a rank that does not read cannot hold Close.
	deadline := time.Now().Add(closeFlush)
	for _, c := range conns {
		_ = c.nc.SetWriteDeadline(deadline)
	}
	t.final = true
	a.release(t)
	for _, c := range conns {
		c.waitFlushed(deadline)
		c.nc.Close()
	}
	if seg != nil {
		seg.Agent().Kick() // wakes serveShm, which sees closed
	}
	a.wg.Wait()
	if n := a.port.refused.Load(); n > 1 {
		a.log.Warn("PMI_PORT connections refused", "count", n)
	}
	if seg != nil {
		a.pubMu.Lock() // a turn that took the segment before Close is done with it
		seg.Close()
		a.pubMu.Unlock()
	}
	return nil
}

// RankGone tells the agent that a local rank's process ended (or will never
// start). Collectives that can no longer complete fail at once with err,
// so no rank waits for a peer that is gone.
func (a *Agent) RankGone(global int, why string) {
	a.mu.Lock()
	if l := a.core.LocalOf(global); l >= 0 {
		_ = a.core.Step(Gone{Local: l, Why: why})
	}
	a.finishLocked(newTurn())
}

// Drained returns a channel closed once the connection of rank global has
// ended and every request it carried has been served (nil if the rank is
// not local).
func (a *Agent) Drained(global int) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.core.LocalOf(global); l >= 0 {
		return a.ranks[l].drained
	}
	return nil
}

// RankStatus reports whether rank global has spoken PMI and finalized.
func (a *Agent) RankStatus(global int) (spoke, finalized bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if l := a.core.LocalOf(global); l >= 0 {
		return a.core.RankStatus(l)
	}
	return false, false
}

// Stats is a snapshot for reports and tests.
type Stats struct {
	Fences   uint64 // completed world fences
	Rings    uint64
	KVSKeys  int
	Finished int // ranks that finalized
	// On-demand KVS (remote.go): fetches sent to other nodes, gets that
	// waited behind one instead (node coalescing), gets served for other
	// nodes, bytes of fetched values cached, fences whose unhinted puts
	// went sparse under PolicyAuto, placed puts refused over quota.
	Fetches, Coalesced, Served, CacheBytes, AutoSparse, PlaceRefused int
}

// Stats returns counters of the agent's work so far.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.core.Stats()
}

// step is one turn for an operation that comes from outside a front end
// (an Upstream completion).
func (a *Agent) step(op Op) {
	a.mu.Lock()
	if err := a.core.Step(op); err != nil {
		a.log.Error("agent core step", "op", fmt.Sprintf("%T", op), "err", err)
	}
	a.finishLocked(newTurn())
}

// turn is what one turn of the agent has to carry out once mu is released:
// the core's Ready, with each text reply resolved to its connection and
// request while mu was held, plus the front ends' own output.
type turn struct {
	rd     Ready
	text   []textOut    // in order: direct answers, then core replies
	shm    []Reply      // replies to shared-memory requests
	ext    []Reply      // replies to the external front end's requests
	extFE  External     // where they and rd.Asks go (Agent.ext when the turn was taken)
	seg    *shm.Segment // the segment to publish in, nil without one
	events []func()     // the front ends' own reports (protocol errors)

	// seq numbers the turn (turnSeq): a shared-memory request answered
	// by a later turn than the one that read it waited (shmtrace.go).
	seq uint64
	// For a tracer (perf.Recorder.Tracing), a text turn's request: when it
	// was read (zero otherwise) and its command, which names the trace
	// slices of the turn's direct answers.
	read  time.Time
	cmd   string
	self  *textConn // the connection whose reader makes this turn, or nil
	final bool      // Close's turn: every text reply is written at once
}

// textOut is one text reply: b, or the encoding of r for rq.
type textOut struct {
	c    *textConn
	rq   *textReq
	r    Reply
	b    []byte
	rank int // the rank answered (global), for the trace
}

// turns recycles turns: a turn's slices keep their capacity from one turn
// to the next, so a turn allocates nothing once the agent is warm.
var turns = sync.Pool{New: func() any { return new(turn) }}

// newTurn returns an empty turn; release gives it back.
func newTurn() *turn {
	t := turns.Get().(*turn)
	t.seq = turnSeq.Add(1)
	return t
}

// turnSeq numbers turns (turn.seq).
var turnSeq atomic.Uint64

// free empties t and gives it back for reuse; t must not be used after.
func (t *turn) free() {
	t.rd.reset()
	clear(t.text)
	clear(t.shm)
	clear(t.events)
	clear(t.ext)
	t.text, t.shm, t.events, t.seg, t.self, t.final = t.text[:0], t.shm[:0], t.events[:0], nil, nil, false
	t.ext, t.extFE = t.ext[:0], nil
	t.read, t.cmd = time.Time{}, ""
	turns.Put(t)
}

// take collects the core's Ready into t, after what t already holds.
// Under a.mu.
func (t *turn) take(a *Agent) {
	n := len(t.rd.Replies)
	a.core.TakeReady(&t.rd)
	t.seg = a.seg
	t.extFE = a.ext
	for _, r := range t.rd.Replies[n:] {
		switch r.Req.Via {
		case ViaText:
			c := a.ranks[r.Local].conn
			if c == nil {
				continue
			}
			rq := c.pending[r.Req.ID]
			if rq == nil {
				continue
			}
			delete(c.pending, r.Req.ID)
			t.text = append(t.text, textOut{c: c, rq: rq, r: r, rank: a.ranks[r.Local].global})
		case ViaShm:
			if r.Local < len(a.shmPending) && a.shmPending[r.Local] > 0 {
				a.shmPending[r.Local]--
			}
			t.shm = append(t.shm, r)
		case ViaExternal:
			t.ext = append(t.ext, r)
		}
	}
}

// finishLocked ends a turn begun under a.mu: it takes the core's Ready,
// releases a.mu and carries the turn out.
func (a *Agent) finishLocked(t *turn) {
	t.take(a)
	a.release(t)
}

// release hands a.mu over to pubMu and carries t out, then frees t: marks, the
// shared-memory part and the encoding of text replies under pubMu (an
// allgather's values may be views of input slots that ranks reuse once
// the epoch is published), then writes, events and Upstream calls without
// agent locks.
func (a *Agent) release(t *turn) {
	a.pubMu.Lock()
	a.mu.Unlock()
	if a.rec != nil {
		for _, m := range t.rd.Marks {
			a.rec.Mark(m.Phase, m.Rank)
		}
	}
	for i := range t.text {
		if o := &t.text[i]; o.rq != nil {
			o.b = o.rq.encode(&o.r)
		}
	}
	if t.extFE != nil {
		for i := range t.ext {
			t.extFE.Reply(t.ext[i])
		}
	}
	if t.seg != nil {
		// The epochs' own replies (a failed collective's error), then
		// the epochs, then the other replies: a rank moved past a failed
		// epoch it never entered (its get failed with it) finds it
		// published when its answer comes, and numbers its next
		// collective after it.
		for i := range t.shm {
			if collReply(&t.shm[i]) {
				a.shmReply(t, &t.shm[i])
			}
		}
		for i := range t.rd.Results {
			a.publish(t.seg, &t.rd.Results[i])
		}
		for i := range t.shm {
			if !collReply(&t.shm[i]) {
				a.shmReply(t, &t.shm[i])
			}
		}
	}
	a.pubMu.Unlock()
	if a.rec.Tracing() {
		a.writeTraced(t)
	} else {
		for _, o := range t.text {
			t.send(o)
		}
	}
	for _, f := range t.events {
		f()
	}
	for _, e := range t.rd.Events {
		a.cfg.Events(e)
	}
	for _, u := range t.rd.Upstream {
		a.call(u)
	}
	for _, k := range t.rd.Wants {
		if f := a.cfg.LateAttrs[k]; f != nil {
			f()
		}
	}
	for _, ask := range t.rd.Asks {
		if t.extFE == nil {
			a.step(RankDataDone{ID: ask.ID, Err: ErrNoExternal})
			continue
		}
		t.extFE.AskRankData(ask.ID, ask.Rank)
	}
	t.free()
}

// writeTraced writes t's text replies and stamps each request on the
// tracer: read to written, waiting until this turn if the request was
// read in an earlier one. A direct answer is to the turn's own request;
// it runs on that connection's goroutine, the only one that binds its
// rank.
func (a *Agent) writeTraced(t *turn) {
	answered := time.Now()
	for _, o := range t.text {
		t.send(o)
		end := time.Now()
		switch {
		case o.rq != nil && !o.rq.read.IsZero():
			var waited time.Time
			if !o.rq.read.Equal(t.read) {
				waited = answered
			}
			a.rec.Request(o.rq.m.Cmd, o.rank, o.rq.read, waited, end)
		case o.rq == nil && !t.read.IsZero():
			a.rec.Request(t.cmd, o.c.rankNum(), t.read, time.Time{}, end)
		}
	}
}

// send delivers a text reply: the reader's own at once (back-pressure on
// its rank only), and Close's (under a deadline); another rank's through
// that rank's queue, never blocking on its socket (textout.go).
func (t *turn) send(o textOut) {
	if o.c == t.self || t.final {
		o.c.write(o.b)
	} else {
		o.c.queue(o.b)
	}
}

// call makes one Upstream call; its completion is a new turn.
func (a *Agent) call(u UpCall) {
	up := a.cfg.Upstream
	switch u.Kind {
	case UpFence:
		up.Fence(u.Epoch, u.KVs, func(all []KV, err error) { a.step(FenceDone{Epoch: u.Epoch, KVs: all, Err: err}) })
	case UpAllgather:
		up.Allgather(u.Epoch, u.Values, func(all [][]byte, err error) {
			a.step(AllgatherDone{Epoch: u.Epoch, Values: all, Err: err})
		})
	case UpRingEdge:
		up.RingEdge(u.Epoch, u.ToLeft, u.Value, func(v string, err error) {
			a.step(RingEdgeDone{Epoch: u.Epoch, ToLeft: u.ToLeft, Value: v, Err: err})
		})
	case UpPublish:
		up.Publish(u.Name, u.Port, u.Once, func(err error) { a.step(NameDone{ID: u.ID, Err: err}) })
	case UpUnpublish:
		up.Unpublish(u.Name, func(err error) { a.step(NameDone{ID: u.ID, Err: err}) })
	case UpLookup:
		up.Lookup(u.Name, u.Linger, func(port string, err error) { a.step(NameDone{ID: u.ID, Port: port, Err: err}) })
	case UpSpawn:
		up.Spawn(u.Spawn, u.Owner, func(jobID string, err error) { a.step(SpawnDone{ID: u.ID, JobID: jobID, Err: err}) })
	case UpPlace:
		up.Place(u.Name, u.Port, u.Owner)
	case UpFetch:
		up.Fetch(u.Name, u.Src, u.Wait, func(val string, found bool, err error) {
			a.step(FetchDone{ID: u.ID, Found: found, Val: val, Err: err})
		})
	case UpRankData:
		done := func(val string, found bool, err error) {
			a.step(RankDataDone{ID: u.ID, Found: found, Val: val, Err: err})
		}
		if u.Name != "" {
			up.FetchJobRankData(u.Name, u.Src, done)
		} else {
			up.FetchRankData(u.Src, done)
		}
	case UpJobLayout:
		up.FetchJobLayout(u.Name, func(l *Layout, err error) { a.step(JobLayoutDone{ID: u.ID, Layout: l, Err: err}) })
	case UpJobs:
		up.JobsCollective(u.Name, u.Jobs, []byte(u.Port), func(data []byte, err error) {
			a.step(JobsCollDone{ID: u.ID, Data: data, Err: err})
		})
	case UpAnswer:
		a.mu.Lock()
		done := a.answers[u.ID]
		delete(a.answers, u.ID)
		a.mu.Unlock()
		if done != nil {
			done(u.Port, u.Found, u.Err)
		}
	}
}

// Waiting reports whether every live local rank waits in the agent, how
// many in gets, and what the first few wait for (Core.Waiting).
func (a *Agent) Waiting() (all bool, gets int, what []string, epoch uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.core.Waiting()
}

// Contributed is the last collective epoch every local rank entered
// (Core.Contributed).
func (a *Agent) Contributed() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.core.Contributed()
}

// ServeGet answers a get for key that another node routed here (see
// ServeGet the operation); done gets the answer, on some goroutine, once.
func (a *Agent) ServeGet(key string, src int, wait, final bool, done func(val string, found bool, err error)) {
	a.mu.Lock()
	a.answerSeq++
	id := a.answerSeq
	a.answers[id] = done
	if err := a.core.Step(ServeGet{ID: id, Key: key, Src: src, Wait: wait, Final: final}); err != nil {
		delete(a.answers, id)
		a.mu.Unlock()
		done("", false, err)
		return
	}
	a.finishLocked(newTurn())
}

// ServeRankData answers another node's request for the data of rank, a
// rank of this node (see ServeRankData the operation, rankdata.go); done
// gets the answer, on some goroutine, once. Without an external front end
// there is none.
func (a *Agent) ServeRankData(rank int, done func(val string, found bool, err error)) {
	a.mu.Lock()
	a.answerSeq++
	id := a.answerSeq
	a.answers[id] = done
	if err := a.core.Step(ServeRankData{ID: id, Rank: rank}); err != nil {
		delete(a.answers, id)
		a.mu.Unlock()
		done("", false, err)
		return
	}
	a.finishLocked(newTurn())
}

// PlaceKV stores a sparse put another node placed here, or says why
// not (over the node's quota).
func (a *Agent) PlaceKV(key, val string, owner int) error {
	a.mu.Lock()
	err := a.core.Step(PlaceKV{Key: key, Val: val, Owner: owner})
	a.finishLocked(newTurn())
	return err
}
