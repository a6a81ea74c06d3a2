package ring

import (
	"errors"
	"fmt"
)

// Errors of the state machines. Each is wrapped with the details.
var (
	ErrStaleEpoch  = errors.New("message for an earlier ring epoch")
	ErrFutureEpoch = errors.New("message for a later ring epoch")
	ErrDuplicate   = errors.New("duplicate ring message")
	ErrUnexpected  = errors.New("unexpected ring message") // wrong sender, receiver, direction or mode
	ErrMismatch    = errors.New("neighbour disagrees on ring offsets")
	ErrCounts      = errors.New("ring counts do not match the count mode")
	ErrNotDone     = errors.New("ring epoch not finished")
)

// CountMode says how a node learns the counts of the nodes before it.
type CountMode uint8

const (
	// CountsFromMap takes every count as 1 and offsets from the Map.
	CountsFromMap CountMode = 1
	// CountsChained passes prefix sums and the ring size along the ring.
	CountsChained CountMode = 2
)

func (c CountMode) String() string {
	switch c {
	case CountsFromMap:
		return "from-map"
	case CountsChained:
		return "chained"
	}
	return fmt.Sprintf("CountMode(%d)", uint8(c))
}

// Dir is the direction a message travels on the ring.
type Dir uint8

const (
	// ToLeft goes to the left neighbour node and carries the sender's first
	// entry's Left value.
	ToLeft Dir = 1
	// ToRight goes to the right neighbour node and carries the sender's
	// last entry's Right value.
	ToRight Dir = 2
)

func (d Dir) String() string {
	switch d {
	case ToLeft:
		return "to-left"
	case ToRight:
		return "to-right"
	}
	return fmt.Sprintf("Dir(%d)", uint8(d))
}

// Entry is one local rank's contribution, in local order.
type Entry struct {
	Count       uint32 // 1 for PMIX_Ring
	Left, Right string // values for the left and right neighbours
}

// Result is one local rank's answer.
type Result struct {
	Position uint64 // ring position (ring-count in the reply)
	Size     uint64 // ring size, the sum of all counts
	Left     string // Right value of the previous process in the ring
	Right    string // Left value of the next process in the ring
}

// Outcome is the node-level answer: where the node's first entry sits,
// the ring size, and the two values that came from the neighbour nodes.
type Outcome struct {
	Offset      uint64 // ring position of the node's first entry
	Size        uint64
	LeftOfFirst string // left value of the first entry (left neighbour's last Right)
	RightOfLast string // right value of the last entry (right neighbour's first Left)
}

// Message is one inter-node ring message.
//
// Offset is, for ToRight, the ring position just past the sender's last
// entry (the receiver's offset, or the ring size when the ring wraps to the
// head node) and, for ToLeft, the sender's own offset. Size is the ring
// size when HasSize is set.
type Message struct {
	Epoch    uint64
	From, To int // node ids
	Dir      Dir
	Mode     CountMode
	Offset   uint64
	Size     uint64
	HasSize  bool
	Value    string
}

// Config places a Node in the job.
type Config struct {
	Map   *Map
	Node  int    // this node's id in Map
	Epoch uint64 // ring epoch number
	Mode  CountMode
}

// Node is one node's part of one ring epoch. Use New, then Start, then
// Step for each message from a neighbour node until Done.
type Node struct {
	cfg         Config
	entries     []Entry
	count       uint64 // sum of local counts
	left, right int    // neighbour nodes
	head, tail  bool   // first / last node holding ranks

	offset, size         uint64
	haveOffset, haveSize bool
	leftVal, rightVal    string // LeftOfFirst, RightOfLast
	haveLeft, haveRight  bool   // a ToRight (from left) / ToLeft (from right) arrived
	sentLeft, sentRight  bool
	started              bool
}

// New makes the node's state machine for one epoch. entries are the
// node's local ranks' contributions in local order, one per rank of the
// node in the Map; New keeps the slice.
func New(cfg Config, entries []Entry) (*Node, error) {
	m := cfg.Map
	switch {
	case m == nil:
		return nil, errors.New("make ring node: no map")
	case cfg.Node < 0 || cfg.Node >= m.Nodes():
		return nil, fmt.Errorf("make ring node %d: %w: %d nodes", cfg.Node, ErrMap, m.Nodes())
	case len(m.Ranks(cfg.Node)) == 0:
		return nil, fmt.Errorf("make ring node %d: %w: node holds no ranks", cfg.Node, ErrMap)
	case len(entries) != len(m.Ranks(cfg.Node)):
		return nil, fmt.Errorf("make ring node %d: %w: %d entries for %d local ranks", cfg.Node, ErrMap, len(entries), len(m.Ranks(cfg.Node)))
	case cfg.Mode != CountsFromMap && cfg.Mode != CountsChained:
		return nil, fmt.Errorf("make ring node %d: %w: unknown mode %v", cfg.Node, ErrCounts, cfg.Mode)
	}
	n := &Node{cfg: cfg, entries: entries}
	for i, e := range entries {
		if cfg.Mode == CountsFromMap && e.Count != 1 {
			return nil, fmt.Errorf("make ring node %d: %w: entry %d has count %d, mode %v needs 1", cfg.Node, ErrCounts, i, e.Count, cfg.Mode)
		}
		n.count += uint64(e.Count)
	}
	n.left, n.right = m.Neighbours(cfg.Node)
	n.head, n.tail = cfg.Node == m.head(), cfg.Node == m.tail()
	if cfg.Mode == CountsFromMap {
		n.offset, n.haveOffset = uint64(m.Offset(cfg.Node)), true
		n.size, n.haveSize = uint64(m.Size()), true
	} else if n.head {
		n.offset, n.haveOffset = 0, true
	}
	n.learnSize()
	if n.left == cfg.Node { // the ring closes on this node
		n.leftVal, n.haveLeft = entries[len(entries)-1].Right, true
		n.rightVal, n.haveRight = entries[0].Left, true
		n.sentLeft, n.sentRight = true, true
	}
	return n, nil
}

// learnSize: the tail knows the size as soon as it knows its offset.
func (n *Node) learnSize() {
	if n.tail && n.haveOffset && !n.haveSize {
		n.size, n.haveSize = n.offset+n.count, true
	}
}

// Start returns the messages the node can send at once: both in
// CountsFromMap mode, the head's two in CountsChained mode, none on a
// one-node ring. Later calls return nil.
func (n *Node) Start() []Message {
	if n.started {
		return nil
	}
	n.started = true
	return n.ready(nil)
}

// ready appends the messages that became sendable.
func (n *Node) ready(out []Message) []Message {
	if !n.sentRight && n.haveOffset {
		n.sentRight = true
		out = append(out, n.msg(n.right, ToRight, n.offset+n.count, n.entries[len(n.entries)-1].Right))
	}
	if !n.sentLeft && n.haveOffset && (n.haveSize || n.head) {
		n.sentLeft = true
		out = append(out, n.msg(n.left, ToLeft, n.offset, n.entries[0].Left))
	}
	return out
}

func (n *Node) msg(to int, d Dir, off uint64, v string) Message {
	return Message{
		Epoch: n.cfg.Epoch, From: n.cfg.Node, To: to, Dir: d, Mode: n.cfg.Mode,
		Offset: off, Size: n.size, HasSize: n.haveSize, Value: v,
	}
}

// Step takes one message from a neighbour node and returns the messages
// that became sendable. A message that does not fit (other epoch, wrong
// sender, duplicate, disagreeing offsets) is refused with an error and
// changes nothing.
func (n *Node) Step(m Message) ([]Message, error) {
	if err := n.check(m); err != nil {
		return nil, fmt.Errorf("step ring node %d epoch %d with %v from node %d: %w", n.cfg.Node, n.cfg.Epoch, m.Dir, m.From, err)
	}
	if m.Dir == ToRight {
		n.leftVal, n.haveLeft = m.Value, true
		if n.head {
			n.setSize(m.Offset)
		} else {
			n.offset, n.haveOffset = m.Offset, true
		}
	} else {
		n.rightVal, n.haveRight = m.Value, true
	}
	if m.HasSize {
		n.setSize(m.Size)
	}
	n.learnSize()
	if !n.started {
		return nil, nil
	}
	return n.ready(nil), nil
}

func (n *Node) setSize(s uint64) { n.size, n.haveSize = s, true }

// check validates m against the node's view without changing anything.
func (n *Node) check(m Message) error {
	switch {
	case m.Epoch < n.cfg.Epoch:
		return fmt.Errorf("%w: epoch %d", ErrStaleEpoch, m.Epoch)
	case m.Epoch > n.cfg.Epoch:
		return fmt.Errorf("%w: epoch %d", ErrFutureEpoch, m.Epoch)
	case m.To != n.cfg.Node:
		return fmt.Errorf("%w: addressed to node %d", ErrUnexpected, m.To)
	case m.Mode != n.cfg.Mode:
		return fmt.Errorf("%w: mode %v, want %v", ErrUnexpected, m.Mode, n.cfg.Mode)
	case m.Dir == ToRight && m.From != n.left, m.Dir == ToLeft && m.From != n.right:
		return fmt.Errorf("%w: sender is not the neighbour (left %d, right %d)", ErrUnexpected, n.left, n.right)
	case m.Dir != ToRight && m.Dir != ToLeft:
		return fmt.Errorf("%w: direction %v", ErrUnexpected, m.Dir)
	case m.Dir == ToRight && n.haveLeft, m.Dir == ToLeft && n.haveRight:
		return ErrDuplicate
	}
	// Offsets the message implies, checked against what this node knows.
	if m.HasSize && n.haveSize && m.Size != n.size {
		return fmt.Errorf("%w: size %d, want %d", ErrMismatch, m.Size, n.size)
	}
	size, haveSize := n.size, n.haveSize
	if m.HasSize {
		size, haveSize = m.Size, true
	}
	switch {
	case m.Dir == ToRight && n.head:
		// The tail's end is the ring size.
		if haveSize && m.Offset != size {
			return fmt.Errorf("%w: tail ends at %d, size %d", ErrMismatch, m.Offset, size)
		}
		if m.HasSize && m.Size != m.Offset {
			return fmt.Errorf("%w: tail ends at %d, says size %d", ErrMismatch, m.Offset, m.Size)
		}
	case m.Dir == ToRight:
		if n.haveOffset && m.Offset != n.offset {
			return fmt.Errorf("%w: offset %d, want %d", ErrMismatch, m.Offset, n.offset)
		}
		if haveSize && (m.Offset > size || n.count > size-m.Offset) {
			return fmt.Errorf("%w: offset %d + %d past size %d", ErrMismatch, m.Offset, n.count, size)
		}
	case m.Dir == ToLeft && n.tail:
		if m.Offset != 0 {
			return fmt.Errorf("%w: head at offset %d", ErrMismatch, m.Offset)
		}
	case m.Dir == ToLeft:
		if n.haveOffset && m.Offset != n.offset+n.count {
			return fmt.Errorf("%w: right neighbour at %d, want %d", ErrMismatch, m.Offset, n.offset+n.count)
		}
		if n.cfg.Mode == CountsChained && !m.HasSize {
			return fmt.Errorf("%w: no ring size", ErrMismatch)
		}
	}
	return nil
}

// Done reports whether the node has its whole answer. A Done node has sent
// both its messages.
func (n *Node) Done() bool {
	return n.started && n.haveLeft && n.haveRight && n.haveOffset && n.haveSize && n.sentLeft && n.sentRight
}

// Outcome is the node-level answer, or ErrNotDone.
func (n *Node) Outcome() (Outcome, error) {
	if !n.Done() {
		return Outcome{}, fmt.Errorf("read ring node %d epoch %d: %w", n.cfg.Node, n.cfg.Epoch, ErrNotDone)
	}
	return Outcome{Offset: n.offset, Size: n.size, LeftOfFirst: n.leftVal, RightOfLast: n.rightVal}, nil
}

// Results appends every local entry's answer, in local order, to dst.
func (n *Node) Results(dst []Result) ([]Result, error) {
	o, err := n.Outcome()
	if err != nil {
		return dst, err
	}
	return Resolve(dst, o, n.entries), nil
}

// Resolve turns a node-level Outcome into every local entry's answer, in
// local order, appended to dst.
func Resolve(dst []Result, o Outcome, entries []Entry) []Result {
	pos := o.Offset
	for i, e := range entries {
		r := Result{Position: pos, Size: o.Size, Left: o.LeftOfFirst, Right: o.RightOfLast}
		if i > 0 {
			r.Left = entries[i-1].Right
		}
		if i < len(entries)-1 {
			r.Right = entries[i+1].Left
		}
		dst = append(dst, r)
		pos += uint64(e.Count)
	}
	return dst
}
