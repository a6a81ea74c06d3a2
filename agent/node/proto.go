package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/version"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// Frame types between pmirun (the root) and the node agents (pmid), and
// between agents. Control messages (rare: a few per rank per job) are
// JSON; collective messages carry the tree and ring packages' binary
// encodings unchanged.
const (
	FrameHello     uint16 = 1  // agent → root: Hello
	FrameTable     uint16 = 2  // root → agent: Table, once every agent said hello
	FrameEvent     uint16 = 3  // agent → root: agent.Event (rank init, finalize, exit, abort, ...)
	FrameKill      uint16 = 4  // root → agent: Kill, end the job
	FrameSignal    uint16 = 5  // root → agent: Signal, forward to ranks
	FrameName      uint16 = 6  // agent → root: Name request; root → agent: Name response
	FrameTree      uint16 = 7  // tree.Msg (fence and allgather gather/broadcast)
	FrameRing      uint16 = 8  // ring.Message between ring neighbours
	FrameLink      uint16 = 9  // agent → agent: Link, first frame of a peer link
	FrameDone      uint16 = 10 // agent → root: every local rank has been reaped
	FrameHeartbeat uint16 = 11 // both ways, while idle
	FrameClock     uint16 = 12 // agent → root: Clock probe; root → agent: the probe answered (traced jobs)
	// FrameKVS = 13 (kvsnet.go)
	FrameWaiting uint16 = 14 // agent → root: Waiting, when it changes
	FrameEnding  uint16 = 15 // agent → root: Ending, before the node ends its ranks for a reason of its own
	// FrameReady: agent → root, no payload, once the node's share of the
	// job is set up (its agent, segment and PMIx namespace exist) and
	// its ranks are about to be forked. A spawn is answered once every
	// node of the new job is ready: a PMIx parent may then connect to
	// the children, whose namespace every node's server library must
	// know by then.
	FrameReady uint16 = 16
)

// Ending is why a node ends its ranks on its own (its daemon shuts
// down). As the cause of RunAgent's context (context.WithCancelCause) it
// makes the node send it to the root (FrameEnding) before it ends its
// ranks: on the link that carries their events, so the root learns why
// before it hears of the first rank ended, and blames the node, not that
// rank.
type Ending struct {
	Msg string `json:"msg"`
}

func (e *Ending) Error() string { return e.Msg }

// Waiting is a node's part of the job-wide deadlock check: All says every
// live rank of the node waits in its agent and nothing the node sent for
// the KVS is still on its way; Gets how many of them wait in gets; What
// names the first few and what they wait for; Epoch is the first
// collective epoch one of them waits in (0: none). pmirun ends the job
// as a deadlock when every node with live ranks has said All and nothing
// changed for DeadlockGrace, if at least one rank waits in a get, or one
// in a collective that a node whose ranks are done never entered
// (Done.Contributed).
type Waiting struct {
	All   bool     `json:"all"`
	Gets  int      `json:"gets,omitempty"`
	What  []string `json:"what,omitempty"`
	Epoch uint64   `json:"epoch,omitempty"`
}

// DeadlockGrace is how long the whole job must stay waiting, every node
// saying so, before pmirun calls it a deadlock: long enough for any
// message already on its way to arrive and be reported.
const DeadlockGrace = time.Second

// Hello is an agent's first frame to the root.
type Hello struct {
	Node   int    `json:"node"`
	Addr   string `json:"addr"` // where its peers dial it
	Host   string `json:"host"`
	PID    int    `json:"pid"`
	NetBE  string `json:"netio"`
	Ranks  int    `json:"ranks"`
	Reason string `json:"reason,omitempty"`
	// Jobs, from an agent of the command line's job started per job, is
	// where its process takes the nodes of the jobs the run spawns on its
	// host (a daemon scoped to the run, agent/daemon's protocol); "" when
	// it takes none.
	Jobs string `json:"jobs,omitempty"`
}

// Proc names the agent's process, host and pid: collectives across jobs
// count processes, not nodes (agent/jobsdir).
func (h Hello) Proc() string { return h.Host + "/" + strconv.Itoa(h.PID) }

// Table gives every agent the addresses of all agents, and the name by
// which the ranks know each node (PMIx's node map and PMIX_HOSTNAME): one
// name per node of the run, the same in every job the node serves.
type Table struct {
	Addrs []string `json:"addrs"`
	Hosts []string `json:"hosts"`
}

type Kill struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

type Signal struct {
	Sig int `json:"sig"`
}

// Name is a request to the root's job-wide services (Op set) or its
// response (Op empty): the name service, spawn, whose response carries
// the new job's id in Port, and collectives across jobs.
type Name struct {
	ID   uint64 `json:"id"`
	Op   string `json:"op,omitempty"` // "publish", "unpublish", "lookup", "spawn"
	Name string `json:"name,omitempty"`
	Port string `json:"port,omitempty"`
	// Spawn is a spawn request, as the rank sent it, and Rank the
	// global rank that sent it.
	Spawn *pmiwire.Spawn `json:"spawn,omitempty"`
	Rank  int            `json:"rank,omitempty"`
	// Layout answers Op "joblayout": where the job of Procs runs; in Op
	// "jobreg" (to a daemon: a run registers a job), where job Name runs,
	// and Agents the agent process of each of its nodes (Hello.Proc). In
	// Op "jobs" to a daemon, Agents holds the entering process.
	Layout *agent.Layout `json:"layout,omitempty"`
	Agents []string      `json:"agents,omitempty"`
	// Procs are the participants of a collective across jobs (Op
	// "jobs", of kind Name); Data is the node's data in the request and
	// every node's in the answer.
	Procs []agent.JobRanks `json:"procs,omitempty"`
	Data  []byte           `json:"data,omitempty"`
	Err   string           `json:"err,omitempty"`
	// NotFound marks a lookup or unpublish of an unknown name.
	NotFound bool `json:"notfound,omitempty"`
	// Once (publish) and Wait (lookup) are agent.Name's (PMIx's).
	Once bool          `json:"once,omitempty"`
	Wait time.Duration `json:"wait,omitempty"`
}

// Clock is a clock probe of a traced job: the agent sends Seq and Sent
// (its recorder's Since); the root answers with both and its own Since in
// Peer.
type Clock struct {
	Seq  int           `json:"seq"`
	Sent time.Duration `json:"sent"`
	Peer time.Duration `json:"peer,omitempty"`
}

// Done is an agent's last report to the root (FrameDone), once its ranks
// have ended: its counters, and for a traced job (Spec.Trace) its events
// with the best clock sample taken over the control link, its recorder's
// start on CLOCK_MONOTONIC and its boot id (so the root can tell when
// the two clocks are one).
type Done struct {
	// Contributed is the last collective epoch every rank of the node
	// entered: the others wait in later ones in vain.
	Contributed uint64            `json:"contributed,omitempty"`
	Counters    map[string]int64  `json:"counters"`
	Events      []perf.Event      `json:"events,omitempty"`
	Clock       *perf.ClockSample `json:"clock,omitempty"`
	Mono        int64             `json:"mono,omitempty"`
	Boot        uint64            `json:"boot,omitempty"`
	Dropped     int               `json:"dropped,omitempty"`
}

// MaxTraceEvents bounds the events one node sends in its Done (about
// 100 bytes each): the rest are counted in Done.Dropped.
const MaxTraceEvents = 200_000

type Link struct {
	From int `json:"from"`
}

func Encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err)) // only our own plain structs
	}
	return b
}

func Decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %T: %w", v, err)
	}
	return nil
}

// DecodeSpec decodes b, which carries a job spec (an agent's spec line,
// a daemon's submission), into v, refusing a field this build does not
// know: it comes from a pmirun of another fastpmi build, and asks for
// something (a umask, an environment mode) that this agent would
// otherwise leave out of the job without a word.
func DecodeSpec(b []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	err := d.Decode(v)
	if err != nil && strings.Contains(err.Error(), "unknown field") {
		return fmt.Errorf("decode %T: %w, which this agent's build does not know (%s): pmirun is of another fastpmi build; run pmirun and pmid of one build", v, err, version.String("pmid"))
	}
	if err != nil {
		return fmt.Errorf("decode %T: %w", v, err) // as Decode
	}
	return nil
}

// Heartbeat is how often an idle link carries a Heartbeat; a link silent
// for NetTimeout is declared dead.
const Heartbeat = 250 * time.Millisecond

// FrameIn is a frame received on a link, or the link's end (Err set,
// the last one from that link).
type FrameIn struct {
	From  int // the peer's node index; -1 = the root (pmirun)
	Frame netio.Frame
	Err   error
}

// Receive delivers link c's frames to in, tagged with from, until the link
// ends (its error is delivered too) or quit is closed. The caller owns the
// goroutine that runs it and closes c to end it.
func Receive(c netio.Conn, from int, in chan<- FrameIn, quit <-chan struct{}) {
	for {
		f, err := c.Recv(context.Background())
		select {
		case in <- FrameIn{From: from, Frame: f, Err: err}:
		case <-quit:
			return
		}
		if err != nil {
			return
		}
	}
}
