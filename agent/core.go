package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/tree"
)

// The core: the agent's PMI semantics for one job on one node as a pure
// state machine, in the shape of etcd-io/raft's RawNode. A front end
// (text.go, shm.go) decodes a rank's request into a typed operation and
// hands it to Core.Step; completions from the Upstream come back the same
// way (FenceDone, AllgatherDone, RingEdgeDone, NameDone, SpawnDone). Step changes
// state and records what has to happen as a result; Ready takes that
// record: replies addressed to (local rank, request), calls to make to the
// Upstream, delivered epochs to publish in shared memory, events for the
// launcher and perf marks. The core has no sockets, clocks, goroutines or
// locks; it is not safe for concurrent use. The Agent holds its mutex
// around Step and Ready and carries out each Ready after releasing it.
//
// Everything the core emits is in a deterministic order (no map
// iteration decides an order), so a script of operations always yields
// the same Ready batches: the golden tests in testdata/ rely on it.

// Req identifies a request for its front end; the core only echoes it in
// the reply. Via says which front end made it.
type Req struct {
	Via uint8
	ID  uint64
}

// Front ends, for Req.Via.
const (
	ViaTest uint8 = iota // tests
	ViaText              // text.go: ID indexes the connection's pending requests
	ViaShm               // shm.go: ID packs the request's op and sequence number
)

// Op is an operation for Core.Step. Rank operations name the local rank
// (index into Config.Local) and the request to answer.
type Op interface{ isOp() }

// Rank operations. Each is answered by exactly one Reply, except Spoke,
// Init and Abort (no reply).
type (
	// Spoke: the rank sent a request answered by its front end alone.
	Spoke struct{ Local int }
	// Init: the rank completed PMI init.
	Init struct{ Local int }
	// Put stores a key; hints as in pmiwire.Hint. Keys are checked by the front
	// end (checkPut).
	Put struct {
		Local    int
		Req      Req
		Key, Val string
		Hint     pmiwire.Hint
	}
	// Get reads a job attribute, a fenced key or a sparse key; with Wait
	// a missing key parks the request until it is put.
	Get struct {
		Local int
		Req   Req
		Key   string
		Wait  bool
		Src   int // the rank that put the key (PMI-2 srcid, client.FromRank), or -1
	}
	// JobAttr reads a job attribute; with KVS also a fenced key outside
	// the PMI_ namespace (PMI-2 info-getjobattr).
	JobAttr struct {
		Local int
		Req   Req
		Key   string
		KVS   bool
	}
	// PutNodeAttr sets a node attribute and answers waiting reads.
	PutNodeAttr struct {
		Local    int
		Req      Req
		Key, Val string
	}
	// GetNodeAttr reads a node attribute, waiting for it with Wait.
	GetNodeAttr struct {
		Local int
		Req   Req
		Key   string
		Wait  bool
	}
	// Fence enters the rank's next fence-or-allgather epoch as a fence.
	// Epoch, if not 0, is the epoch the rank believes it enters; another
	// is a protocol error. Detached: the rank goes on with other work
	// (Ifence) and waits for the fence only once a Block says so; until
	// then the deadlock check does not count it as waiting.
	Fence struct {
		Local    int
		Req      Req
		Epoch    uint64
		Detached bool
	}
	// Allgather enters the next epoch as an allgather contributing Value.
	// Value may be a view into a rank's shared-memory slot: the core keeps
	// it until the epoch is delivered. Detached as for Fence (Iallgather).
	Allgather struct {
		Local    int
		Req      Req
		Epoch    uint64
		Value    []byte
		Detached bool
	}
	// Block: the rank now waits for its collectives up to epoch Until
	// (BlockAll: every one it entered), as in a Wait on a detached one;
	// Until 0: it waits for nothing any more (a Wait or a waiting get cut
	// short): its collectives count as detached, even those it entered
	// without Detached, and its parked gets and node-attribute reads are
	// answered with an error and forgotten. No reply of its own. The
	// deadlock check reads it: a rank in an unstarted collective is stuck
	// only while it waits for it.
	Block struct {
		Local int
		Until uint64
	}
	// Barrier enters a PMI-1.2 group barrier among local ranks: Members
	// (local indices) or, when nil, every local rank.
	Barrier struct {
		Local   int
		Req     Req
		Group   string
		Members []int
	}
	// Ring enters the rank's next ring exchange.
	Ring struct {
		Local int
		Req   Req
		In    RingIn
	}
	// Name is a name-service request, handed to the Upstream.
	Name struct {
		Local      int
		Req        Req
		Op         NameOp
		Name, Port string
		// What PMIx adds (the text protocols and the Go client send
		// neither): Once (publish) withdraws the name at its first
		// lookup that finds it (PMIX_PERSIST_FIRST_READ); Wait (lookup)
		// is how long a lookup of a name not yet published waits for
		// it, 0 answering at once (PMIX_WAIT; at most MaxNameWait).
		Once bool
		Wait time.Duration
	}
	// Spawn asks the launcher to start a new job (spawn.go); the rank is
	// answered with the new job's id once the Upstream has started it.
	Spawn struct {
		Local int
		Req   Req
		Spawn *pmiwire.Spawn
	}
	// Abort asks the launcher to end the job.
	Abort struct {
		Local int
		Code  int
		Msg   string
	}
	// End: a front end ends the job for the rank (EventEnded), with the
	// job's exit code and why; the rank itself did not ask.
	End struct {
		Local int
		Code  int
		Msg   string
	}
	// Finalize ends the rank's PMI use; collectives it can no longer join
	// fail.
	Finalize struct {
		Local int
		Req   Req
	}
	// Gone: the rank's process ended (or will never start).
	Gone struct {
		Local int
		Why   string
	}
)

// Completions from the Upstream, and the agent's end.
type (
	// FenceDone completes fence epoch Epoch job-wide.
	FenceDone struct {
		Epoch uint64
		KVs   []KV
		Err   error
	}
	// AllgatherDone completes allgather epoch Epoch job-wide.
	AllgatherDone struct {
		Epoch  uint64
		Values [][]byte
		Err    error
	}
	// RingEdgeDone is the neighbour node's answer to an UpRingEdge call.
	RingEdgeDone struct {
		Epoch  uint64
		ToLeft bool
		Value  string
		Err    error
	}
	// NameDone is the Upstream's answer to name call ID.
	NameDone struct {
		ID   uint64
		Port string
		Err  error
	}
	// SpawnDone is the Upstream's answer to spawn call ID: the new job's
	// id, or why no job started.
	SpawnDone struct {
		ID    uint64
		JobID string
		Err   error
	}
	// Shutdown fails every waiting request; later name and spawn requests
	// fail.
	Shutdown struct{}
)

func (Spoke) isOp()         {}
func (Init) isOp()          {}
func (Put) isOp()           {}
func (Get) isOp()           {}
func (JobAttr) isOp()       {}
func (PutNodeAttr) isOp()   {}
func (GetNodeAttr) isOp()   {}
func (Fence) isOp()         {}
func (Allgather) isOp()     {}
func (Block) isOp()         {}
func (Barrier) isOp()       {}
func (Ring) isOp()          {}
func (Name) isOp()          {}
func (Spawn) isOp()         {}
func (Abort) isOp()         {}
func (End) isOp()           {}
func (Finalize) isOp()      {}
func (Gone) isOp()          {}
func (FenceDone) isOp()     {}
func (AllgatherDone) isOp() {}
func (RingEdgeDone) isOp()  {}
func (NameDone) isOp()      {}
func (SpawnDone) isOp()     {}
func (Shutdown) isOp()      {}

// ReplyKind says which operation a Reply answers.
type ReplyKind uint8

const (
	ReplyPut ReplyKind = iota + 1
	ReplyGet
	ReplyJobAttr
	ReplyPutNodeAttr
	ReplyGetNodeAttr
	ReplyFence
	ReplyAllgather
	ReplyBarrier
	ReplyRing
	ReplyName
	ReplyFinalize
	ReplySpawn
	ReplyJobs
	ReplyLayout
)

var replyNames = [...]string{"?", "put", "get", "jobattr", "putnodeattr", "getnodeattr", "fence", "allgather", "barrier", "ring", "name", "finalize", "spawn", "jobs", "layout"}

func (k ReplyKind) String() string {
	if int(k) < len(replyNames) {
		return replyNames[k]
	}
	return "reply" + strconv.Itoa(int(k))
}

// Reply answers one request. Err set means the request failed; otherwise
// the fields of its kind are set: Found and Val (get, jobattr,
// getnodeattr, a name lookup's port, a spawn's new job id), Epoch (fence and allgather, also on
// failure), Values (allgather, by rank; views the front end must not keep
// past the Ready), Ring (ring), Layout (layout: where another job runs,
// checked).
type Reply struct {
	Local  int
	Req    Req
	Kind   ReplyKind
	Err    error
	Found  bool
	Val    string
	Epoch  uint64
	Values [][]byte
	Ring   RingResult
	Layout *Layout
}

// RingResult is a rank's ring exchange result.
type RingResult struct {
	Pos, Size   int
	Left, Right string
}

// UpKind is the kind of an Upstream call.
type UpKind uint8

const (
	UpFence UpKind = iota + 1
	UpAllgather
	UpRingEdge
	UpPublish
	UpUnpublish
	UpLookup
	UpSpawn
	UpPlace     // a sparse put to place for other nodes: Name, Port (the value), Owner
	UpFetch     // a get for another node's key: ID, Name (the key), Src, Wait; answered by FetchDone
	UpAnswer    // the answer to ServeGet or ServeRankData ID: Found, Port (the value), Err
	UpRankData  // rank Src's data, from its node (of job Name, when another's): ID; answered by RankDataDone (rankdata.go)
	UpJobs      // a collective across jobs: ID, Name (its kind), Jobs, Port (the node's data); answered by JobsCollDone (jobs.go)
	UpJobLayout // where job Name of the run runs: ID; answered by JobLayoutDone (jobs.go)
)

var upNames = [...]string{"?", "fence", "allgather", "ringedge", "publish", "unpublish", "lookup", "spawn", "place", "fetch", "answer", "rankdata", "jobs", "joblayout"}

func (k UpKind) String() string { return upNames[k] }

// UpCall is a call the shell makes to the Upstream; its completion comes
// back as FenceDone, AllgatherDone, RingEdgeDone, NameDone or SpawnDone.
type UpCall struct {
	Kind   UpKind
	Epoch  uint64         // fence, allgather, ring edge
	KVs    []KV           // fence: the node's puts, one per key
	Values []tree.Entry   // allgather: the node's values (tree.Entry: one rank-value type for the agent and the tree)
	ToLeft bool           // ring edge: which side
	Value  string         // ring edge: the boundary value
	ID     uint64         // name, spawn and fetch calls; ServeGet answers
	Name   string         // a service name; a key (place, fetch)
	Port   string         // a port; a value (place, answer)
	Spawn  *pmiwire.Spawn // spawn: the request as the rank sent it
	Jobs   []JobRanks     // collective across jobs: its participants
	Owner  int            // place: the rank that put the key; spawn: the rank that asked
	Src    int            // fetch: the rank that put the key, or -1; rank data: the rank
	Wait   bool           // fetch: wait for the key to be put
	Once   bool           // publish: withdrawn at its first lookup (Name.Once)
	Linger time.Duration  // lookup: how long to wait for the name (Name.Wait)
	Found  bool           // answer
	Err    error          // answer
}

// Result is a delivered fence-or-allgather epoch, in epoch order, for the
// shared-memory front end to publish: a fence's KVs go to the node KVS,
// an allgather's Values to the result array, then the epoch is published
// (also when Err is set). An allgather's Values are published only when
// ShmEntered: ranks of the other front ends have them in their Reply, and
// an external front end's values (a PMIx node's collected data) may be
// larger than the segment's result entries.
type Result struct {
	Epoch      uint64
	Allgather  bool
	ShmEntered bool // some local rank entered the epoch over shared memory
	KVs        []KV
	Values     [][]byte
	Err        error
}

// Mark is a perf stamp to record: phase of global rank Rank.
type Mark struct {
	Phase string
	Rank  int
}

// Ready is what the shell has to do after a sequence of Steps, in this
// order: record Marks, deliver Replies (encode all of them before
// publishing Results: an allgather's values may be views of input slots
// that a rank reuses once its epoch is published), publish Results, report
// Events, make the Upstream calls, ask for the late job attributes in
// Wants (read for the first time), ask the external front end for the
// rank data in Asks (rankdata.go).
type Ready struct {
	Marks    []Mark
	Replies  []Reply
	Results  []Result
	Events   []Event
	Upstream []UpCall
	Wants    []string
	Asks     []Ask
}

// Empty reports whether rd has nothing to do.
func (rd *Ready) Empty() bool {
	return len(rd.Marks)+len(rd.Replies)+len(rd.Results)+len(rd.Events)+len(rd.Upstream)+len(rd.Wants)+len(rd.Asks) == 0
}

// rankState is one local rank as the core sees it.
type rankState struct {
	local, global, appnum int
	spoke                 bool // sent at least one request
	finalized             bool
	gone                  bool   // connection closed or process ended
	ended                 bool   // counted in Core.ended (finalized or gone)
	pending               []KV   // puts since the last world fence, in order (group barriers leave them)
	auto                  []bool // pending[i] is unhinted under PolicyAuto: the fence decides (takeAuto)
	collSeq               uint64 // fence/allgather epochs entered
	waitFor               uint64 // Block: the rank waits for its detached entries up to this epoch
	parked                int    // its requests in Core.waits (park; unpark takes them out)
	grouped               int    // barrier groups it is in (enterGroup; leaveGroup takes it out)
	ringSeq               uint64 // ring exchanges entered
	inRing                bool   // waiting for the answer of ring exchange ringSeq
	puts, putBytes        int    // put volume so far, against the quotas (limits.go)
}

// to is where a deferred reply goes.
type to struct {
	local int
	req   Req
	kind  ReplyKind
}

// Core is the agent's PMI semantics. See the comment at the top of
// core.go.
type Core struct {
	cfg       coreConfig
	ranks     []*rankState
	byGlobal  map[int]*rankState
	ended     int  // ranks finalized or gone
	closed    bool // Shutdown seen
	rd        Ready
	kvs       map[string]string // committed job KVS (visible to get)
	sparse    map[string]string // sparse puts, visible at once
	nodeAttr  map[string]string
	attrBytes int                 // key + value bytes in nodeAttr (MaxNodeAttrBytes)
	waits     map[string][]waiter // parked requests by "kvs:<key>" or "attr:<key>"
	// Counts the deadlock check reads at every entry into a wait, so
	// that it costs nothing per parked request or barrier group:
	// parkedLocal is the sum of rankState.parked, grouped of
	// rankState.grouped (the entries of every group).
	parkedLocal, grouped int
	fenceSeq             uint64 // completed world fences
	agSeq                uint64 // completed allgathers
	colls                map[uint64]*epochColl
	delivered            uint64 // epochs delivered, in order
	contributed          uint64 // the last epoch every local rank entered (they enter in order)
	groups               map[string]*group
	rings                map[uint64]*ringEpoch // ring exchanges in progress, by epoch
	ringSeq              uint64                // completed ring exchanges
	ringWaiting          int                   // ranks waiting in a ring exchange
	calls                map[uint64]to         // name and spawn calls waiting for the Upstream, by call ID
	callSeq              uint64
	late                 map[string]*lateAttr // late job attributes (jobattr.go)
	lateKeys             []string             // their keys, sorted

	// On-demand KVS (remote.go).
	remote       map[string]cached   // values fetched from other nodes
	cacheBytes   int                 // their keys' and values' bytes
	placedBytes  int                 // bytes of puts other nodes placed here
	fetches      map[fetchKey]*fetch // outstanding fetches, by what they fetch
	fetchByID    map[uint64]*fetch   // the same, by call ID
	fetchesSent  int                 // fetches started (Stats)
	coalesced    int                 // gets queued behind an outstanding fetch (Stats)
	served       int                 // gets served for other nodes (Stats)
	autoSparse   int                 // fences whose unhinted puts went sparse (Stats)
	placeRefused int                 // placed puts refused over the node's quota (Stats)

	// rankData are the rank-data requests on their way, by call ID
	// (rankdata.go).
	rankData map[uint64]*rankData

	// puts and putBytes are the node's put volume so far (limits.go).
	puts, putBytes int
}

// coreConfig is the part of Config the core needs.
type coreConfig struct {
	jobID            string
	size             int
	mapping          string
	universe         int
	ringOff, ringLen int // ring layout (Upstream.RingLayout)
	policy           KVSPolicy
}

// NewCore returns the core for cfg (validated by New) whose node sits in
// the job-wide ring at ringOffset among ringSize positions.
func NewCore(cfg *Config, ringOffset, ringSize int) *Core {
	c := &Core{
		cfg: coreConfig{jobID: cfg.JobID, size: cfg.Size, mapping: cfg.Mapping, universe: cfg.UniverseSize, ringOff: ringOffset, ringLen: ringSize,
			policy: cfg.KVS},
		byGlobal:  make(map[int]*rankState, len(cfg.Local)),
		kvs:       make(map[string]string),
		sparse:    make(map[string]string),
		nodeAttr:  make(map[string]string),
		waits:     make(map[string][]waiter),
		colls:     make(map[uint64]*epochColl),
		groups:    make(map[string]*group),
		rings:     make(map[uint64]*ringEpoch),
		calls:     make(map[uint64]to),
		late:      make(map[string]*lateAttr),
		remote:    make(map[string]cached),
		fetches:   make(map[fetchKey]*fetch),
		fetchByID: make(map[uint64]*fetch),
		rankData:  make(map[uint64]*rankData),
	}
	for _, kv := range cfg.Preput {
		c.kvs[kv.Key] = kv.Val
	}
	c.lateKeys = slices.Sorted(maps.Keys(cfg.LateAttrs))
	for _, k := range c.lateKeys {
		c.late[k] = &lateAttr{}
	}
	for i, g := range cfg.Local {
		app := 0
		if cfg.Appnum != nil {
			app = cfg.Appnum[i]
		}
		rs := &rankState{local: i, global: g, appnum: app}
		c.ranks = append(c.ranks, rs)
		c.byGlobal[g] = rs
	}
	return c
}

// Ready returns what the Steps since the last call ask for, and forgets
// it. The batch's slices belong to the caller.
func (c *Core) Ready() Ready {
	rd := c.rd
	c.rd = Ready{}
	return rd
}

// TakeReady is Ready without allocating: it appends what the Steps since
// the last call ask for to rd's slices (the caller's, reused turn after
// turn) and forgets it, keeping the core's own buffers for the next Steps.
func (c *Core) TakeReady(rd *Ready) {
	rd.Marks = append(rd.Marks, c.rd.Marks...)
	rd.Replies = append(rd.Replies, c.rd.Replies...)
	rd.Results = append(rd.Results, c.rd.Results...)
	rd.Events = append(rd.Events, c.rd.Events...)
	rd.Upstream = append(rd.Upstream, c.rd.Upstream...)
	rd.Wants = append(rd.Wants, c.rd.Wants...)
	rd.Asks = append(rd.Asks, c.rd.Asks...)
	c.rd.reset()
}

// reset empties rd, keeping its slices' capacity (and dropping what their
// elements held).
func (rd *Ready) reset() {
	clear(rd.Marks)
	clear(rd.Replies)
	clear(rd.Results)
	clear(rd.Events)
	clear(rd.Upstream)
	clear(rd.Wants)
	clear(rd.Asks)
	rd.Marks, rd.Replies, rd.Results = rd.Marks[:0], rd.Replies[:0], rd.Results[:0]
	rd.Events, rd.Upstream, rd.Wants, rd.Asks = rd.Events[:0], rd.Upstream[:0], rd.Wants[:0], rd.Asks[:0]
}

// Errors of Step: the operation breaks the protocol and changed nothing.
var (
	ErrNoRank      = errors.New("no such local rank")
	ErrEpochNumber = errors.New("collective epoch out of order")
)

// Step applies op. It fails only for an operation that breaks the
// protocol (its rank does not exist, a collective names the wrong
// epoch); the state is then unchanged.
func (c *Core) Step(op Op) error {
	switch o := op.(type) {
	case Spoke:
		_, err := c.rank(o.Local)
		return err
	case Init:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.mark(perf.PhaseInit, rs)
		c.rd.Events = append(c.rd.Events, Event{Kind: EventInit, Rank: rs.global})
	case Put:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		if err := c.chargePut(rs, o.Key, o.Val); err != nil {
			return err
		}
		c.put(rs, o.Key, o.Val, o.Hint)
		c.reply(to{o.Local, o.Req, ReplyPut}, Reply{})
	case Get:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.get(rs, o)
	case JobAttr:
		if _, err := c.rank(o.Local); err != nil {
			return err
		}
		if c.lateWait(o.Key, to{o.Local, o.Req, ReplyJobAttr}) {
			return nil
		}
		v, found := c.jobAttr(o.Key)
		if !found && o.KVS && !hasPMIPrefix(o.Key) {
			v, found = c.kvs[o.Key]
		}
		c.reply(to{o.Local, o.Req, ReplyJobAttr}, Reply{Found: found, Val: v})
	case PutNodeAttr:
		if _, err := c.rank(o.Local); err != nil {
			return err
		}
		if err := c.chargeNodeAttr(o.Key, o.Val); err != nil {
			c.reply(to{o.Local, o.Req, ReplyPutNodeAttr}, Reply{Err: err})
			return nil
		}
		c.nodeAttr[o.Key] = o.Val
		c.release("attr:"+o.Key, o.Val)
		c.reply(to{o.Local, o.Req, ReplyPutNodeAttr}, Reply{})
	case GetNodeAttr:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		t := to{o.Local, o.Req, ReplyGetNodeAttr}
		if v, ok := c.nodeAttr[o.Key]; ok {
			c.reply(t, Reply{Found: true, Val: v})
		} else if _, bad := checkNodeAttr(o.Key, ""); !o.Wait || bad != nil {
			// A key no put can make (checkNodeAttr) is never waited for.
			c.reply(t, Reply{})
		} else {
			c.park(rs, "attr:"+o.Key, t)
		}
	case Fence:
		rs, err := c.collRank(o.Local, o.Epoch)
		if err != nil {
			return err
		}
		c.enterEpoch(rs, kindFence, nil, o.Detached, to{o.Local, o.Req, ReplyFence})
	case Allgather:
		rs, err := c.collRank(o.Local, o.Epoch)
		if err != nil {
			return err
		}
		c.enterEpoch(rs, kindAllgather, o.Value, o.Detached, to{o.Local, o.Req, ReplyAllgather})
	case Block:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.block(rs, o.Until)
	case Barrier:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		if o.Members == nil {
			c.enterGroup(rs, o.Group, nil, to{o.Local, o.Req, ReplyBarrier})
			return nil
		}
		members := make([]bool, len(c.ranks))
		for _, m := range o.Members {
			if m < 0 || m >= len(c.ranks) {
				return fmt.Errorf("barrier member %d: %w", m, ErrNoRank)
			}
			members[m] = true
		}
		c.enterGroup(rs, o.Group, members, to{o.Local, o.Req, ReplyBarrier})
	case Ring:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.enterRing(rs, o.In, to{o.Local, o.Req, ReplyRing})
	case Name:
		if _, err := c.rank(o.Local); err != nil {
			return err
		}
		c.name(o)
	case Spawn:
		if _, err := c.rank(o.Local); err != nil {
			return err
		}
		c.spawn(o)
	case Abort:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.rd.Events = append(c.rd.Events, Event{Kind: EventAbort, Rank: rs.global, Code: o.Code, Msg: o.Msg})
	case End:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		c.rd.Events = append(c.rd.Events, Event{Kind: EventEnded, Rank: rs.global, Code: o.Code, Msg: o.Msg})
	case Finalize:
		rs, err := c.rank(o.Local)
		if err != nil {
			return err
		}
		if !rs.finalized {
			rs.finalized = true
			c.peerGone(rs, "finalized")
			c.mark(perf.PhaseFinalize, rs)
			c.rd.Events = append(c.rd.Events, Event{Kind: EventFinalized, Rank: rs.global})
		}
		c.reply(to{o.Local, o.Req, ReplyFinalize}, Reply{})
	case Gone:
		if o.Local < 0 || o.Local >= len(c.ranks) {
			return ErrNoRank
		}
		rs := c.ranks[o.Local]
		if rs.gone {
			return nil
		}
		rs.gone = true
		if !rs.finalized {
			c.peerGone(rs, o.Why)
			c.failRankData(rs.global, fmt.Errorf("rank %d %s: %w", rs.global, o.Why, ErrNoRankData))
		}
	case FenceDone:
		c.epochFinished(o.Epoch, kindFence, o.KVs, nil, o.Err)
	case AllgatherDone:
		c.epochFinished(o.Epoch, kindAllgather, nil, o.Values, o.Err)
	case RingEdgeDone:
		c.ringEdgeDone(o)
	case SetJobAttr:
		c.setLate(o.Key, o.Val)
	case NameDone:
		c.nameDone(o)
	case SpawnDone:
		c.spawnDone(o)
	case JobsColl:
		if _, err := c.rank(o.Local); err != nil {
			return err
		}
		c.jobsColl(o)
	case JobsCollDone:
		c.jobsCollDone(o)
	case JobLayout:
		c.jobLayout(o)
	case JobLayoutDone:
		c.jobLayoutDone(o)
	case ServeGet:
		c.serveGet(o)
	case PlaceKV:
		return c.placeKV(o)
	case FetchDone:
		c.fetchDone(o)
	case GetRankData:
		return c.getRankData(o)
	case ServeRankData:
		c.serveRankData(o)
	case RankDataDone:
		c.rankDataDone(o)
	case Shutdown:
		if !c.closed {
			c.closed = true
			err := errors.New("agent shutting down")
			c.failAll(err)
			c.failCalls(err)
			c.failLate(err)
			c.failFetches(err)
			c.failRankData(-1, err)
		}
	default:
		return fmt.Errorf("unknown operation %T", op)
	}
	return nil
}

// rank returns local rank i and notes that it spoke.
func (c *Core) rank(i int) (*rankState, error) {
	if i < 0 || i >= len(c.ranks) {
		return nil, fmt.Errorf("local rank %d of %d: %w", i, len(c.ranks), ErrNoRank)
	}
	rs := c.ranks[i]
	if !rs.spoke {
		rs.spoke = true
		c.mark(perf.PhaseFirstPMI, rs)
	}
	return rs, nil
}

// collRank is rank for a collective that names its epoch.
func (c *Core) collRank(i int, epoch uint64) (*rankState, error) {
	if i >= 0 && i < len(c.ranks) && epoch != 0 {
		if want := c.ranks[i].collSeq + 1; epoch != want {
			return nil, fmt.Errorf("%w: rank %d entered epoch %d, the agent expects %d", ErrEpochNumber, c.ranks[i].global, epoch, want)
		}
	}
	return c.rank(i)
}

func (c *Core) mark(phase string, rs *rankState) {
	c.rd.Marks = append(c.rd.Marks, Mark{phase, rs.global})
}

func (c *Core) reply(t to, r Reply) {
	r.Local, r.Req, r.Kind = t.local, t.req, t.kind
	c.rd.Replies = append(c.rd.Replies, r)
}

func (c *Core) up(u UpCall) { c.rd.Upstream = append(c.rd.Upstream, u) }

// jobAttr returns a job attribute served to both protocols.
func (c *Core) jobAttr(key string) (string, bool) {
	if la := c.late[key]; la != nil && la.set {
		return la.val, true
	}
	switch key {
	case "PMI_process_mapping":
		// One that cannot be represented is absent, as Hydra leaves it:
		// MPICH takes an empty value for a broken mapping and fails
		// MPI_Init, and finds the nodes itself when there is none.
		return c.cfg.mapping, c.cfg.mapping != ""
	case "universeSize", "PMI_universe_size":
		return strconv.Itoa(c.cfg.universe), true
	case AttrHwlocXML:
		return "unavailable", true
	}
	return "", false
}

func hasPMIPrefix(key string) bool { return len(key) >= 4 && key[:4] == "PMI_" }

// LocalOf returns the local index of global rank g, or -1.
func (c *Core) LocalOf(g int) int {
	if rs := c.byGlobal[g]; rs != nil {
		return rs.local
	}
	return -1
}

// RankStatus reports whether local rank i has spoken PMI and finalized.
func (c *Core) RankStatus(i int) (spoke, finalized bool) {
	rs := c.ranks[i]
	return rs.spoke, rs.finalized
}

// Stats returns counters of the core's work so far.
func (c *Core) Stats() Stats {
	s := Stats{Fences: c.fenceSeq, Rings: c.ringSeq, KVSKeys: len(c.kvs),
		Fetches: c.fetchesSent, Coalesced: c.coalesced, Served: c.served, CacheBytes: c.cacheBytes,
		AutoSparse: c.autoSparse, PlaceRefused: c.placeRefused}
	for _, rs := range c.ranks {
		if rs.finalized {
			s.Finished++
		}
	}
	return s
}
