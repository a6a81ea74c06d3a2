package launch

import (
	"encoding/json"
	"fmt"
	"time"
)

// Frame types between pmirun (the root) and the node agents (pmid), and
// between agents. Control messages (rare: a few per rank per job) are
// JSON; collective messages carry the tree and ring packages' binary
// encodings unchanged.
const (
	frameHello     uint16 = 1  // agent → root: helloMsg
	frameTable     uint16 = 2  // root → agent: tableMsg, once every agent said hello
	frameEvent     uint16 = 3  // agent → root: eventMsg (rank init, finalize, exit, abort, ...)
	frameKill      uint16 = 4  // root → agent: killMsg, end the job
	frameSignal    uint16 = 5  // root → agent: signalMsg, forward to ranks
	frameName      uint16 = 6  // agent → root: nameMsg request; root → agent: nameMsg response
	frameTree      uint16 = 7  // tree.Msg (fence and allgather gather/broadcast)
	frameRing      uint16 = 8  // ring.Message between ring neighbours
	frameLink      uint16 = 9  // agent → agent: linkMsg, first frame of a peer link
	frameDone      uint16 = 10 // agent → root: every local rank has been reaped
	frameHeartbeat uint16 = 11 // both ways, while idle
)

// helloMsg is an agent's first frame to the root.
type helloMsg struct {
	Node   int    `json:"node"`
	Addr   string `json:"addr"` // where its peers dial it
	Host   string `json:"host"`
	PID    int    `json:"pid"`
	NetBE  string `json:"netio"`
	Ranks  int    `json:"ranks"`
	Reason string `json:"reason,omitempty"`
}

// tableMsg gives every agent the addresses of all agents.
type tableMsg struct {
	Addrs []string `json:"addrs"`
}

// Event kinds reported by agents.
const (
	evkInit     = "init"
	evkFinal    = "finalized"
	evkExit     = "exit"
	evkAbort    = "abort"
	evkLost     = "lost"     // PMI connection closed before finalize, process still running
	evkProtocol = "protocol" // malformed PMI
	evkStartErr = "start"    // could not start the rank
)

// eventMsg reports something about one rank to the root.
type eventMsg struct {
	Kind  string `json:"kind"`
	Rank  int    `json:"rank"`
	Code  int    `json:"code,omitempty"`
	Sig   int    `json:"sig,omitempty"`
	Msg   string `json:"msg,omitempty"`
	Spoke bool   `json:"spoke,omitempty"`
	Fin   bool   `json:"fin,omitempty"`
}

type killMsg struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}

type signalMsg struct {
	Sig int `json:"sig"`
}

// nameMsg is a name-service request (Op set) or response (Op empty).
type nameMsg struct {
	ID   uint64 `json:"id"`
	Op   string `json:"op,omitempty"` // "publish", "unpublish", "lookup"
	Name string `json:"name,omitempty"`
	Port string `json:"port,omitempty"`
	Err  string `json:"err,omitempty"`
	// NotFound marks a lookup or unpublish of an unknown name.
	NotFound bool `json:"notfound,omitempty"`
}

type linkMsg struct {
	From int `json:"from"`
}

func encode(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("encode %T: %v", v, err)) // only our own plain structs
	}
	return b
}

func decode(b []byte, v any) error {
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("decode %T: %w", v, err)
	}
	return nil
}

// heartbeat is how often an idle link carries a heartbeat; a link silent
// for NetTimeout is declared dead.
const heartbeat = 250 * time.Millisecond
