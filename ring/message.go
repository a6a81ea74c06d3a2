package ring

import (
	"errors"
	"fmt"
)

// Errors of Link.Recv and Link.Send. Each is wrapped with the details.
var (
	// ErrSequence: a side's Send or received epoch is not the one after
	// its last (a duplicate, a gap, epoch 0).
	ErrSequence = errors.New("ring message out of epoch order")
	// ErrFutureEpoch: a neighbour's message more than one epoch ahead of
	// this side's last Send.
	ErrFutureEpoch = errors.New("message for a later ring epoch")
	// ErrUnexpected: wrong sender, receiver, direction or mode.
	ErrUnexpected = errors.New("unexpected ring message")
	// ErrMismatch: the message's ring size or offset disagrees with the Map.
	ErrMismatch = errors.New("neighbour disagrees on ring offsets")
)

// CountMode says how a node learns the counts of the ranks before it. The
// only mode is CountsFromMap; the byte stays on the wire so that a peer
// speaking another mode is refused rather than misread.
type CountMode uint8

// CountsFromMap takes every count as 1 and offsets from the Map.
const CountsFromMap CountMode = 1

func (c CountMode) String() string {
	if c == CountsFromMap {
		return "from-map"
	}
	return fmt.Sprintf("CountMode(%d)", uint8(c))
}

// Dir is the direction a message travels on the ring.
type Dir uint8

const (
	// ToLeft goes to the left neighbour node and carries the sender's first
	// rank's Left value.
	ToLeft Dir = 1
	// ToRight goes to the right neighbour node and carries the sender's
	// last rank's Right value.
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

// Message is one inter-node ring message: one boundary value of one epoch.
//
// Offset is, for ToRight, the ring position just past the sender's last
// rank (the receiver's offset, or the ring size when the ring wraps to the
// head node) and, for ToLeft, the sender's own offset. Size is the ring
// size when HasSize is set; a Link always sets it and refuses a message
// without it.
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
