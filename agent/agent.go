// Package agent is the node agent: it serves the ranks of one job on one
// node over the PMI-1/PMI-2 text protocol (one connection per rank, usually
// the PMI_FD socketpair the launcher created), holds the node's view of the
// job's key-value space (KVS), node attributes, and runs the job's
// collectives — fence/barrier, ring — for its local ranks.
//
// Model. One Agent per job per node. Each rank connection is read by one
// goroutine (started by Serve, owned and waited for by the Agent) that
// decodes requests with pmiwire and applies them to the agent state under
// a single mutex, Agent.mu. Requests that cannot be answered at once (a
// fence, a ring, a node attribute read with wait=TRUE, a name-service
// request) leave a deferred reply that is written when the collective or
// the Upstream completes. The Upstream is never called under mu: calls are
// queued and made once the handler has released it. Replies are built
// under mu but written to the sockets after mu is released, so a slow or
// stuck rank never stalls the agent.
//
// Everything that reaches beyond this node goes through the Upstream
// interface: the job-wide part of a fence or ring, and the job services held
// by the launcher (name publishing, abort). A single-node job uses Local.
//
// Lifetimes. New returns a running agent with no connections; Serve adds a
// rank connection; Close closes every connection, fails every waiting
// request, and waits for the connection goroutines. Events (a rank's first
// PMI command, finalize, a lost connection, an abort) are reported through
// Config.Events so the launcher can decide the job's fate; the agent never
// kills processes itself.
package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"

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
	// Mapping is PMI_process_mapping ("" if it cannot be represented).
	Mapping string
	// UniverseSize is answered to get_universe_size / universeSize; -1 means
	// unlimited.
	UniverseSize int
	// SpawnerJobID is set for a job created by spawn.
	SpawnerJobID string

	Upstream Upstream       // job-wide collectives and services; nil = Local
	Events   Events         // launcher callbacks; nil = ignore
	Logger   *slog.Logger   // nil = discard
	Perf     *perf.Recorder // nil = no stamps
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
	if c.Upstream == nil {
		c.Upstream = NewLocal()
	}
	if c.Events == nil {
		c.Events = NoEvents{}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Events are the agent's reports to its launcher. Methods are called
// without agent locks held and must not block for long.
type Events interface {
	// RankInit: the rank sent its first PMI command (init or fullinit).
	RankInit(rank int)
	// RankFinalized: the rank completed PMI finalize.
	RankFinalized(rank int)
	// RankDisconnected: the rank's PMI connection closed before finalize
	// (after it spoke PMI when spoke is true).
	RankDisconnected(rank int, spoke bool)
	// Abort: the rank asked to abort the job.
	Abort(rank, code int, msg string)
	// ProtocolError: the rank sent something the agent could not frame;
	// its connection was closed.
	ProtocolError(rank int, err error)
}

// NoEvents ignores every event.
type NoEvents struct{}

func (NoEvents) RankInit(int)               {}
func (NoEvents) RankFinalized(int)          {}
func (NoEvents) RankDisconnected(int, bool) {}
func (NoEvents) Abort(int, int, string)     {}
func (NoEvents) ProtocolError(int, error)   {}

// rankState is one local rank. Fields are guarded by Agent.mu.
type rankState struct {
	local, global, appnum int
	conn                  *textConn // nil until a connection is bound
	spoke                 bool      // sent at least one request
	finalized             bool
	gone                  bool          // connection closed or process ended
	ended                 bool          // counted in Agent.ended (finalized or gone)
	pending               []KV          // puts since the last fence
	collSeq               uint64        // fence/allgather epochs entered
	ringSeq               uint64        // ring exchanges entered
	inRing                bool          // waiting for the answer of ring exchange ringSeq
	drained               chan struct{} // closed when the bound connection has ended
}

// Agent serves one job's local ranks. See the package comment.
type Agent struct {
	cfg Config
	log *slog.Logger
	rec *perf.Recorder

	wg sync.WaitGroup // connection goroutines

	mu sync.Mutex
	// Guarded by mu.
	closed      bool
	ranks       []*rankState
	ended       int // ranks finalized or gone
	byGlobal    map[int]*rankState
	conns       map[*textConn]struct{}
	listeners   []net.Listener
	kvs         map[string]string // committed job KVS (visible to get)
	fenceSeq    uint64            // completed world fences
	groups      map[string]*collective
	rings       map[uint64]*ringEpoch // ring exchanges in progress, by epoch
	ringSeq     uint64                // completed ring exchanges
	ringWaiting int                   // ranks waiting in a ring exchange
	nodeAttr    map[string]string
	sparse      map[string]string     // sparse puts, visible at once
	waits       map[string][]waiter   // parked requests by "kvs:<key>" or "attr:<key>"
	later       []func()              // run by the handler after it unlocks mu
	agSeq       uint64                // completed allgathers
	colls       map[uint64]*epochColl // collectives in progress, by epoch
	delivered   uint64                // epochs delivered, in order
	epochSink   EpochSink             // shared-memory delivery, or nil
	seg         *shm.Segment          // shared-memory segment served, or nil

	names map[*nameCall]struct{} // name requests waiting for the Upstream (names.go), guarded by mu
}

// New starts an agent for cfg.
func New(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:      cfg,
		log:      cfg.Logger,
		rec:      cfg.Perf,
		byGlobal: make(map[int]*rankState, len(cfg.Local)),
		conns:    make(map[*textConn]struct{}),
		kvs:      make(map[string]string),
		groups:   make(map[string]*collective),
		nodeAttr: make(map[string]string),
		sparse:   make(map[string]string),
		waits:    make(map[string][]waiter),
		colls:    make(map[uint64]*epochColl),
		rings:    make(map[uint64]*ringEpoch),
		names:    make(map[*nameCall]struct{}),
	}
	for i, g := range cfg.Local {
		app := 0
		if cfg.Appnum != nil {
			app = cfg.Appnum[i]
		}
		rs := &rankState{local: i, global: g, appnum: app, drained: make(chan struct{})}
		a.ranks = append(a.ranks, rs)
		a.byGlobal[g] = rs
	}
	a.mark(perf.PhaseAgentReady, -1)
	return a, nil
}

func (a *Agent) mark(phase string, rank int) {
	if a.rec != nil {
		a.rec.Mark(phase, rank)
	}
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
// as an unbound connection until ln is closed or the agent is closed. The
// agent closes ln on Close.
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
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
			if err := a.ServeUnbound(c); err != nil {
				return
			}
		}
	}()
}

func (a *Agent) serve(conn net.Conn, rs *rankState) error {
	c := &textConn{a: a, nc: conn}
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		conn.Close()
		return ErrClosed
	}
	if rs != nil {
		if rs.conn != nil {
			a.mu.Unlock()
			conn.Close()
			return fmt.Errorf("serve rank %d: already connected", rs.global)
		}
		rs.conn = c
		c.rank = rs
	}
	a.conns[c] = struct{}{}
	a.wg.Add(1)
	a.mu.Unlock()
	go func() {
		defer a.wg.Done()
		c.run()
	}()
	return nil
}

// Close closes every rank connection, answers every waiting request with
// an error, and waits for the connection goroutines. It is idempotent.
func (a *Agent) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		a.wg.Wait()
		return nil
	}
	a.closed = true
	var out outbox
	a.failAllLocked(&out, errors.New("agent shutting down"))
	a.failNamesLocked(&out, errors.New("agent shutting down"))
	for _, ln := range a.listeners {
		ln.Close()
	}
	seg := a.seg
	conns := make([]*textConn, 0, len(a.conns))
	for c := range a.conns {
		conns = append(conns, c)
	}
	a.mu.Unlock()
	out.flush()
	for _, c := range conns {
		c.nc.Close()
	}
	if seg != nil {
		seg.Agent().Kick() // wakes serveShm, which sees closed
	}
	a.wg.Wait()
	if seg != nil {
		seg.Close()
	}
	return nil
}

// RankGone tells the agent that a local rank's process ended (or will never
// start). Collectives that can no longer complete fail at once with err,
// so no rank waits for a peer that is gone.
func (a *Agent) RankGone(global int, why string) {
	a.mu.Lock()
	rs := a.byGlobal[global]
	if rs == nil || rs.gone {
		a.mu.Unlock()
		return
	}
	rs.gone = true
	var out outbox
	if !rs.finalized {
		a.peerGoneLocked(&out, rs, why)
	}
	a.mu.Unlock()
	out.flush()
}

// Drained returns a channel closed once the connection of rank global has
// ended and every request it carried has been served (nil if the rank is
// not local).
func (a *Agent) Drained(global int) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rs := a.byGlobal[global]; rs != nil {
		return rs.drained
	}
	return nil
}

// RankStatus reports whether rank global has spoken PMI and finalized.
func (a *Agent) RankStatus(global int) (spoke, finalized bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if rs := a.byGlobal[global]; rs != nil {
		return rs.spoke, rs.finalized
	}
	return false, false
}

// Stats is a snapshot for reports and tests.
type Stats struct {
	Fences   uint64 // completed world fences
	Rings    uint64
	KVSKeys  int
	Finished int // ranks that finalized
}

// Stats returns counters of the agent's work so far.
func (a *Agent) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := Stats{Fences: a.fenceSeq, Rings: a.ringSeq, KVSKeys: len(a.kvs)}
	for _, rs := range a.ranks {
		if rs.finalized {
			s.Finished++
		}
	}
	return s
}

// jobAttr returns a job attribute served to both protocols.
func (a *Agent) jobAttr(key string) (string, bool) {
	switch key {
	case "PMI_process_mapping":
		return a.cfg.Mapping, true
	case "universeSize", "PMI_universe_size":
		return strconv.Itoa(a.cfg.UniverseSize), true
	case "PMI_hwloc_xmlfile":
		return "unavailable", true
	}
	return "", false
}

// deferred is a reply waiting for a collective or a node attribute. A
// text-protocol request sets c and reply (the bytes to write); a request
// from another path sets done, which completes it and may queue wake-ups
// on the outbox. Both are called under Agent.mu.
type deferred struct {
	c     *textConn
	reply func(err error, val string) []byte
	done  func(out *outbox, err error, val string)
}

// outbox collects replies built under Agent.mu, written after it is
// released.
type outbox struct {
	msgs []outMsg
}

// complete answers a deferred request.
func (o *outbox) complete(d deferred, err error, val string) {
	if d.done != nil {
		d.done(o, err, val)
		return
	}
	o.add(d.c, d.reply(err, val))
}

type outMsg struct {
	c *textConn
	b []byte
}

func (o *outbox) add(c *textConn, b []byte) {
	if c != nil && b != nil {
		o.msgs = append(o.msgs, outMsg{c, b})
	}
}

func (o *outbox) flush() {
	for _, m := range o.msgs {
		m.c.write(m.b)
	}
	o.msgs = nil
}
