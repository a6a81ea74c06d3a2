package ring

import (
	"errors"
	"fmt"
)

// Link is a node's two ring links, where every count is 1
// (CountsFromMap). A Link sends each boundary value the moment its rank
// enters, without waiting for the node's other ranks: the node's first
// rank's Left value to the left neighbour node (ToLeft) and its last
// rank's Right value to the right one (ToRight), two messages per node and
// epoch. The agent answers every rank whose two neighbours are known, so
// the node's ranks, and the node's two sides, may be in different epochs.
//
// Each side carries its epochs in order: the side's boundary rank enters
// epoch after epoch (Send), and the neighbour's messages arrive epoch after
// epoch on one connection (Recv). A neighbour is at most one epoch ahead of
// the side: its boundary rank cannot leave epoch e before this side's
// value of e reached it. So Recv accepts exactly the epoch after the last
// one received, at most one past the last one sent, and holds that one
// value until Send; anything else is refused.
//
// On a ring that closes on this node (one node holds every rank) both
// sides face the node itself: Send's message is addressed to this node and
// goes straight back into Recv; nothing crosses the network.
//
// A Link is used by one goroutine.
type Link struct {
	m                   *Map
	node, left, right   int
	head, tail          bool
	offset, count, size uint64
	sides               [2]linkSide // by side: sideLeft, sideRight
}

// linkSide is one side's sequence of epochs.
type linkSide struct {
	sent, got uint64 // last epoch sent, last epoch received
	held      string // the received value of epoch sent+1, when got > sent
}

const (
	sideLeft  = 0 // sends ToLeft, receives ToRight
	sideRight = 1 // sends ToRight, receives ToLeft
)

// NewLink makes node's ring links in m.
func NewLink(m *Map, node int) (*Link, error) {
	switch {
	case m == nil:
		return nil, errors.New("make ring link: no map")
	case node < 0 || node >= m.Nodes():
		return nil, fmt.Errorf("make ring link for node %d: %w: %d nodes", node, ErrMap, m.Nodes())
	}
	l := &Link{m: m, node: node, head: node == m.head(), tail: node == m.tail()}
	l.left, l.right = m.Neighbours(node)
	l.offset, l.count, l.size = uint64(m.Offset(node)), uint64(len(m.Ranks(node))), uint64(m.Size())
	return l, nil
}

// Offset is the ring position of the node's first rank; Size the ring's.
func (l *Link) Offset() int { return int(l.offset) }

// Size is the ring size: every rank of the job.
func (l *Link) Size() int { return int(l.size) }

func sideOf(d Dir) int {
	if d == ToLeft {
		return sideLeft
	}
	return sideRight
}

// Send records that the boundary rank of the side d sends on (ToLeft: the
// node's first rank, ToRight: its last) entered epoch with value, and
// returns the message for the neighbour node. If the neighbour's value for
// that epoch already arrived, Send returns it too (ok). Epochs of a side
// must follow each other.
func (l *Link) Send(d Dir, epoch uint64, value string) (m Message, got string, ok bool, err error) {
	if d != ToLeft && d != ToRight {
		return Message{}, "", false, fmt.Errorf("ring link of node %d: %w: direction %v", l.node, ErrUnexpected, d)
	}
	s := &l.sides[sideOf(d)]
	if epoch != s.sent+1 {
		return Message{}, "", false, fmt.Errorf("ring link of node %d: %w: %v for epoch %d after %d", l.node, ErrSequence, d, epoch, s.sent)
	}
	s.sent = epoch
	m = Message{Epoch: epoch, From: l.node, Mode: CountsFromMap, Dir: d, Size: l.size, HasSize: true, Value: value}
	if d == ToLeft {
		m.To, m.Offset = l.left, l.offset
	} else {
		m.To, m.Offset = l.right, l.offset+l.count
	}
	if s.got == epoch {
		got, ok, s.held = s.held, true, ""
	}
	return m, got, ok, nil
}

// Recv checks a message from a neighbour node. It returns the side the
// value answers (ToLeft: the node's first rank's left neighbour, which
// came from the left node; ToRight: the last rank's right neighbour) and
// whether that side has already sent the epoch (deliver); otherwise the
// Link holds the value for Send.
func (l *Link) Recv(m Message) (side Dir, deliver bool, err error) {
	if err := l.check(m); err != nil {
		return 0, false, fmt.Errorf("ring link of node %d: %v epoch %d from node %d: %w", l.node, m.Dir, m.Epoch, m.From, err)
	}
	side = ToRight
	if m.Dir == ToRight { // from the left neighbour: for the first rank
		side = ToLeft
	}
	s := &l.sides[sideOf(side)]
	switch {
	case m.Epoch != s.got+1:
		return 0, false, fmt.Errorf("ring link of node %d: %w: %v epoch %d from node %d after epoch %d", l.node, ErrSequence, m.Dir, m.Epoch, m.From, s.got)
	case m.Epoch > s.sent+1:
		return 0, false, fmt.Errorf("ring link of node %d: %w: %v epoch %d from node %d, this side is at epoch %d", l.node, ErrFutureEpoch, m.Dir, m.Epoch, m.From, s.sent)
	}
	s.got = m.Epoch
	if m.Epoch <= s.sent {
		return side, true, nil
	}
	s.held = m.Value
	return side, false, nil
}

// check validates m's addressing and offsets against the map.
func (l *Link) check(m Message) error {
	switch {
	case m.To != l.node:
		return fmt.Errorf("%w: addressed to node %d", ErrUnexpected, m.To)
	case m.Mode != CountsFromMap:
		return fmt.Errorf("%w: mode %v, want %v", ErrUnexpected, m.Mode, CountsFromMap)
	case m.Dir != ToRight && m.Dir != ToLeft:
		return fmt.Errorf("%w: direction %v", ErrUnexpected, m.Dir)
	case m.Dir == ToRight && m.From != l.left, m.Dir == ToLeft && m.From != l.right:
		return fmt.Errorf("%w: sender is not the neighbour (left %d, right %d)", ErrUnexpected, l.left, l.right)
	case !m.HasSize || m.Size != l.size:
		return fmt.Errorf("%w: size %d (given %v), want %d", ErrMismatch, m.Size, m.HasSize, l.size)
	}
	var want uint64
	switch {
	case m.Dir == ToRight && l.head:
		want = l.size // the tail ends where the ring wraps
	case m.Dir == ToRight:
		want = l.offset
	case l.tail:
		want = 0 // from the head
	default:
		want = l.offset + l.count
	}
	if m.Offset != want {
		return fmt.Errorf("%w: offset %d, want %d", ErrMismatch, m.Offset, want)
	}
	return nil
}
