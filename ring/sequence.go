package ring

import "fmt"

// Sequence runs consecutive ring epochs 1, 2, 3, ... on one node. It holds
// messages for the epoch after the current one (a neighbour can be at most
// one epoch ahead: it cannot finish an epoch without this node's messages)
// and replays them when that epoch starts. Anything older is ErrStaleEpoch,
// anything further ahead ErrFutureEpoch. Held messages are checked when
// replayed, so Start reports a bad one; any error ends the ring (the
// caller fails the job).
type Sequence struct {
	cfg  Config // Map, Node, Mode; Epoch is the current or last epoch
	cur  *Node  // nil between epochs
	held []Message
}

// NewSequence prepares cfg.Node's ring epochs; cfg.Epoch is ignored.
func NewSequence(cfg Config) *Sequence {
	cfg.Epoch = 0
	return &Sequence{cfg: cfg}
}

// Epoch is the current epoch, or the last finished one between epochs.
func (s *Sequence) Epoch() uint64 { return s.cfg.Epoch }

// Start begins the next epoch with the node's entries and returns the
// messages to send. It fails while an epoch is running.
func (s *Sequence) Start(entries []Entry) ([]Message, error) {
	if s.cur != nil && !s.cur.Done() {
		return nil, fmt.Errorf("start ring epoch %d on node %d: epoch %d: %w", s.cfg.Epoch+1, s.cfg.Node, s.cfg.Epoch, ErrNotDone)
	}
	cfg := s.cfg
	cfg.Epoch++
	n, err := New(cfg, entries)
	if err != nil {
		return nil, err
	}
	s.cfg, s.cur = cfg, n
	held := s.held
	s.held = nil
	for _, m := range held {
		if _, err := n.Step(m); err != nil {
			return nil, err
		}
	}
	return n.Start(), nil
}

// Step takes a message from a neighbour node and returns the messages that
// became sendable.
func (s *Sequence) Step(m Message) ([]Message, error) {
	running := s.cur != nil && !s.cur.Done()
	next := s.cfg.Epoch + 1
	if m.Epoch == next {
		if len(s.held) >= 2 {
			return nil, fmt.Errorf("hold ring message for epoch %d on node %d: %w: more than two", m.Epoch, s.cfg.Node, ErrDuplicate)
		}
		s.held = append(s.held, m)
		return nil, nil
	}
	if !running || m.Epoch != s.cfg.Epoch {
		which := ErrStaleEpoch
		if m.Epoch > next {
			which = ErrFutureEpoch
		}
		return nil, fmt.Errorf("step ring node %d at epoch %d: %w: epoch %d", s.cfg.Node, s.cfg.Epoch, which, m.Epoch)
	}
	return s.cur.Step(m)
}

// Done reports whether the current epoch has its answer.
func (s *Sequence) Done() bool { return s.cur != nil && s.cur.Done() }

// Node is the current epoch's state machine (nil before the first Start).
func (s *Sequence) Node() *Node { return s.cur }
