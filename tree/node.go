package tree

import (
	"errors"
	"fmt"
)

// Errors of the state machine, wrapped with the details.
var (
	ErrStaleEpoch  = errors.New("message for a finished epoch")
	ErrFutureEpoch = errors.New("message for an epoch beyond the window")
	ErrDuplicate   = errors.New("duplicate contribution")
	ErrUnexpected  = errors.New("unexpected tree message")
)

// DefaultWindow is how many epochs of one kind may be open at a node at
// once when Config.Window is 0.
const DefaultWindow = 64

// Config places a Node in the tree.
type Config struct {
	Topology Topology
	Node     int    // this node's id
	Limits   Limits // for decoding and merging contributions
	// Window: an epoch at or beyond the oldest unfinished epoch + Window is
	// refused (ErrFutureEpoch), bounding what a node keeps. 0 means
	// DefaultWindow.
	Window uint64
}

// EventType says what an Event reports.
type EventType uint8

const (
	// EventGathered (root only): the complete merged result of an epoch.
	// Call Broadcast with it, or with a compressed form of it.
	EventGathered EventType = 1
	// EventDelivered: the broadcast result for this node's own use.
	EventDelivered EventType = 2
)

// Event is a result the caller acts on locally.
type Event struct {
	Type    EventType
	Kind    Kind
	Epoch   uint64
	Payload []byte
}

// Ready is what one call produced: messages to send and local events.
type Ready struct {
	Msgs   []Msg
	Events []Event
}

// phase of one epoch at one node.
type phase uint8

const (
	gathering phase = iota
	sentUp          // non-root: Up sent, waiting for Down
	gathered        // root: EventGathered given, waiting for Broadcast
)

// epoch is one open epoch of one kind at this node.
type epoch struct {
	phase   phase
	own     []byte // own contribution (nil until Contribute)
	hasOwn  bool
	parts   [][]byte // parts[c-lo]: Up payload of child c
	missing int      // children not yet heard from
}

// kindState is one kind's epochs at this node. Epochs below floor are
// finished; finished[e] marks finished epochs at or above floor.
type kindState struct {
	contributed uint64 // last epoch given to Contribute
	floor       uint64
	open        map[uint64]*epoch
	finished    map[uint64]bool
}

// Node is one agent's part of the tree collectives, for every kind and
// epoch.
type Node struct {
	cfg    Config
	parent int
	lo, hi int // children lo..hi-1
	kinds  [numKinds]kindState
}

// NewNode checks cfg and makes the node's state machine.
func NewNode(cfg Config) (*Node, error) {
	t := cfg.Topology
	if t.nodes == 0 || !t.valid(cfg.Node) {
		return nil, fmt.Errorf("make tree node %d: %w", cfg.Node, ErrTopology)
	}
	if err := cfg.Limits.validate(); err != nil {
		return nil, fmt.Errorf("make tree node %d: %w", cfg.Node, err)
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	n := &Node{cfg: cfg, parent: t.Parent(cfg.Node)}
	n.lo, n.hi = t.ChildRange(cfg.Node)
	for i := range n.kinds {
		n.kinds[i] = kindState{floor: 1, open: map[uint64]*epoch{}, finished: map[uint64]bool{}}
	}
	return n, nil
}

// Open is the number of epochs of kind k open at this node.
func (n *Node) Open(k Kind) int {
	if k != Fence && k != Allgather {
		return 0
	}
	return len(n.kinds[k].open)
}

// lookup finds or opens epoch e of kind k, refusing finished epochs and
// epochs beyond the window.
func (n *Node) lookup(k Kind, e uint64) (*kindState, *epoch, error) {
	if k != Fence && k != Allgather {
		return nil, nil, fmt.Errorf("%w: kind %v", ErrUnexpected, k)
	}
	ks := &n.kinds[k]
	switch {
	case e < ks.floor || ks.finished[e]:
		return nil, nil, fmt.Errorf("%w: %v epoch %d", ErrStaleEpoch, k, e)
	case e-ks.floor >= n.cfg.Window:
		return nil, nil, fmt.Errorf("%w: %v epoch %d, oldest unfinished %d, window %d", ErrFutureEpoch, k, e, ks.floor, n.cfg.Window)
	}
	ep := ks.open[e]
	if ep == nil {
		ep = &epoch{parts: make([][]byte, n.hi-n.lo), missing: n.hi - n.lo}
	}
	return ks, ep, nil
}

// Contribute gives this node's own contribution to epoch e of kind k (a
// KV set for Fence, an entry set for Allgather). Epochs must be
// contributed in order 1, 2, 3, ... The payload is validated at merge time.
func (n *Node) Contribute(k Kind, e uint64, payload []byte) (Ready, error) {
	ks, ep, err := n.lookup(k, e)
	if err == nil && e != ks.contributed+1 {
		err = fmt.Errorf("%w: %v epoch %d after %d", ErrUnexpected, k, e, ks.contributed)
	}
	if err == nil && ep.hasOwn {
		err = ErrDuplicate // unreachable while epochs go in order
	}
	if err != nil {
		return Ready{}, fmt.Errorf("contribute to %v epoch %d at node %d: %w", k, e, n.cfg.Node, err)
	}
	ks.contributed = e
	ep.own, ep.hasOwn = payload, true
	ks.open[e] = ep
	return n.advance(k, e, ep)
}

// Step takes one message from a neighbour in the tree.
func (n *Node) Step(m Msg) (Ready, error) {
	r, err := n.step(m)
	if err != nil {
		return Ready{}, fmt.Errorf("step tree node %d with %v %v epoch %d from node %d: %w", n.cfg.Node, m.Kind, m.Type, m.Epoch, m.From, err)
	}
	return r, nil
}

func (n *Node) step(m Msg) (Ready, error) {
	if m.To != n.cfg.Node {
		return Ready{}, fmt.Errorf("%w: addressed to node %d", ErrUnexpected, m.To)
	}
	ks, ep, err := n.lookup(m.Kind, m.Epoch)
	if err != nil {
		return Ready{}, err
	}
	switch m.Type {
	case Up:
		if m.From < n.lo || m.From >= n.hi {
			return Ready{}, fmt.Errorf("%w: node %d is not a child", ErrUnexpected, m.From)
		}
		if ep.phase != gathering || ep.parts[m.From-n.lo] != nil {
			return Ready{}, fmt.Errorf("%w: from child %d", ErrDuplicate, m.From)
		}
		p := m.Payload
		if p == nil {
			p = []byte{} // nil marks "not heard from"
		}
		ep.parts[m.From-n.lo] = p
		ep.missing--
		ks.open[m.Epoch] = ep
		return n.advance(m.Kind, m.Epoch, ep)
	case Down:
		if m.From != n.parent {
			return Ready{}, fmt.Errorf("%w: node %d is not the parent", ErrUnexpected, m.From)
		}
		if ep.phase != sentUp {
			return Ready{}, fmt.Errorf("%w: result before this node sent its contribution", ErrUnexpected)
		}
		return n.deliver(m.Kind, m.Epoch, m.Payload), nil
	}
	return Ready{}, fmt.Errorf("%w: type %v", ErrUnexpected, m.Type)
}

// advance merges epoch e once everything is in and sends it up (or, at
// the root, reports it gathered).
func (n *Node) advance(k Kind, e uint64, ep *epoch) (Ready, error) {
	if ep.phase != gathering || !ep.hasOwn || ep.missing > 0 {
		return Ready{}, nil
	}
	parts := append([][]byte{ep.own}, ep.parts...)
	merge := MergeEntries
	if k == Fence {
		merge = MergeKVs
	}
	merged, err := merge(nil, parts, n.cfg.Limits)
	if err != nil {
		return Ready{}, fmt.Errorf("gather %v epoch %d at node %d: %w", k, e, n.cfg.Node, err)
	}
	ep.own, ep.parts = nil, nil
	if n.parent < 0 {
		ep.phase = gathered
		return Ready{Events: []Event{{Type: EventGathered, Kind: k, Epoch: e, Payload: merged}}}, nil
	}
	ep.phase = sentUp
	return Ready{Msgs: []Msg{{Kind: k, Type: Up, Epoch: e, From: n.cfg.Node, To: n.parent, Payload: merged}}}, nil
}

// Broadcast (root only) sends the result of epoch e of kind k, as given
// (for example compressed), down the tree after EventGathered, and
// delivers it locally.
func (n *Node) Broadcast(k Kind, e uint64, payload []byte) (Ready, error) {
	_, ep, err := n.lookup(k, e)
	switch {
	case err != nil:
	case n.parent >= 0:
		err = fmt.Errorf("%w: not the root", ErrUnexpected)
	case ep.phase != gathered:
		err = fmt.Errorf("%w: epoch not gathered", ErrUnexpected)
	}
	if err != nil {
		return Ready{}, fmt.Errorf("broadcast %v epoch %d at node %d: %w", k, e, n.cfg.Node, err)
	}
	return n.deliver(k, e, payload), nil
}

// deliver forwards the result to every child, reports it locally and
// finishes the epoch.
func (n *Node) deliver(k Kind, e uint64, payload []byte) Ready {
	var r Ready
	if n.hi > n.lo {
		r.Msgs = make([]Msg, 0, n.hi-n.lo)
	}
	for c := n.lo; c < n.hi; c++ {
		r.Msgs = append(r.Msgs, Msg{Kind: k, Type: Down, Epoch: e, From: n.cfg.Node, To: c, Payload: payload})
	}
	r.Events = []Event{{Type: EventDelivered, Kind: k, Epoch: e, Payload: payload}}
	ks := &n.kinds[k]
	delete(ks.open, e)
	ks.finished[e] = true
	for ks.finished[ks.floor] {
		delete(ks.finished, ks.floor)
		ks.floor++
	}
	return r
}
