package shm

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"time"
)

// Ring records. A record is a 16-byte header and its payload, padded to
// 16 bytes; records never wrap: when one does not fit before the end of the
// data area the producer first writes a pad record covering the rest, so
// every payload is contiguous and can be read in place.
const (
	msgLen       = 0  // uint32: payload length in bytes
	msgOp        = 4  // uint16: operation (OpPad marks padding)
	msgFlags     = 6  // uint16
	msgSeq       = 8  // uint32: sender's sequence number (free-running, wraps)
	msgEpoch     = 12 // uint32: collective epoch, if any
	MsgHeaderLen = 16 // bytes of record header
	recordAlign  = 16 // record sizes are multiples of this, so a tail gap is always ≥ one header
)

// OpPad is the reserved operation code of pad records; Commit refuses it.
const OpPad uint16 = 0xffff

var _ = [1]struct{}{}[MsgHeaderLen-msgEpoch-4] // header fields end at MsgHeaderLen
var _ = [1]struct{}{}[MsgHeaderLen%recordAlign]

// Header is the fixed part of a ring message.
type Header struct {
	Op    uint16
	Flags uint16
	Seq   uint32
	Epoch uint32
}

// Msg is a message read from a ring. Payload is a view into the ring's
// shared memory, valid until the consumer's next Release.
type Msg struct {
	Header
	Payload []byte
}

// A Producer is the writing end of a single-producer single-consumer ring
// of variable-length records in shared memory. Exactly one goroutine of
// one process may use a given ring's Producer.
//
// The ring's two counters are free-running byte positions that wrap at
// 2^64; position x lives at data[x & mask]. Bytes in [head, tail) belong to
// the consumer, the rest to the producer.
type Producer struct {
	data []byte
	mask uint64
	// tail is the producer's position. Its Store (in Commit) publishes the
	// records written before it; it pairs with the consumer's Load in Peek.
	tail *atomic.Uint64
	// head is the consumer's position. Its Load (in fits) pairs with the
	// consumer's Store in Release: bytes before it are free to overwrite.
	head *atomic.Uint64

	// Local to the producer.
	pos       uint64 // equals tail: only this producer stores tail
	headCache uint64 // last loaded head; refreshed only when the ring looks full
	pad       uint64 // pending reservation: pad bytes before its record
	resv      uint64 // pending reservation: payload bytes reserved, plus one (0: none)

	self   event   // what the producer sleeps on while the ring is full
	peer   event   // signalled after Commit: the consumer may be asleep
	waiter *Waiter // the segment's waiting policy
	park   parker  // the producer's in-process wake-up channel (InProcessWaiter)

	// A request ring marks its rank in the agent's ready bitmap after each
	// Commit (nil for response rings): the Or follows the tail Store, so
	// an agent that takes the bit sees the record.
	ready    *atomic.Uint64
	readyBit uint64
}

// MaxPayload is the largest payload the ring accepts: half the ring less a
// header, so that a record plus a pad always fits in an empty ring.
func (p *Producer) MaxPayload() int { return len(p.data)/2 - MsgHeaderLen }

// Reserve returns a view of n payload bytes in the ring for the caller to
// fill before Commit. It returns ErrFull when the consumer has not yet
// freed enough space, ErrTooLarge when n exceeds MaxPayload, and ErrCorrupt
// when the consumer's counter is impossible. A second Reserve replaces the
// first.
func (p *Producer) Reserve(n int) ([]byte, error) {
	if n < 0 || n > p.MaxPayload() {
		return nil, ErrTooLarge
	}
	if p.pos%recordAlign != 0 {
		return nil, fmt.Errorf("%w: producer position %d is not record-aligned", ErrCorrupt, p.pos)
	}
	rec := alignUp(MsgHeaderLen+uint64(n), recordAlign)
	off := p.pos & p.mask
	var pad uint64
	if room := uint64(len(p.data)) - off; room < rec {
		pad = room
	}
	if err := p.fits(pad + rec); err != nil {
		return nil, err
	}
	p.pad, p.resv = pad, uint64(n)+1
	start := (p.pos+pad)&p.mask + MsgHeaderLen
	return p.data[start : start+uint64(n) : start+uint64(n)], nil
}

// fits reports whether need bytes are free, loading head only when the
// cached value says they are not.
func (p *Producer) fits(need uint64) error {
	size := uint64(len(p.data))
	if p.pos-p.headCache <= size && size-(p.pos-p.headCache) >= need {
		return nil
	}
	p.headCache = p.head.Load()
	used := p.pos - p.headCache // wraps correctly: both are free-running
	if used > size {
		return fmt.Errorf("%w: consumer at %d, producer at %d", ErrCorrupt, p.headCache, p.pos)
	}
	if size-used < need {
		return ErrFull
	}
	return nil
}

// Commit publishes the reserved record with header h and the first n bytes
// of the reserved payload (n may be less than reserved), then wakes the
// consumer if it announced it is asleep.
func (p *Producer) Commit(h Header, n int) error {
	if p.resv == 0 {
		return fmt.Errorf("commit message: nothing reserved")
	}
	if n < 0 || uint64(n) >= p.resv {
		return fmt.Errorf("commit message: %d bytes, %d reserved", n, p.resv-1)
	}
	if h.Op == OpPad {
		return fmt.Errorf("commit message: op %#x is reserved for padding", OpPad)
	}
	if p.pad > 0 {
		putHeader(p.data[p.pos&p.mask:], uint32(p.pad-MsgHeaderLen), Header{Op: OpPad})
	}
	start := (p.pos + p.pad) & p.mask
	putHeader(p.data[start:], uint32(n), h)
	p.pos += p.pad + alignUp(MsgHeaderLen+uint64(n), recordAlign)
	p.pad, p.resv = 0, 0
	p.tail.Store(p.pos) // publishes the pad, header and payload bytes above
	if p.ready != nil {
		p.ready.Or(p.readyBit)
	}
	p.peer.signal()
	return nil
}

// Push copies payload into the ring as one message; ErrFull if there is no
// room now.
func (p *Producer) Push(h Header, payload []byte) error {
	b, err := p.Reserve(len(payload))
	if err != nil {
		return err
	}
	copy(b, payload)
	return p.Commit(h, len(payload))
}

// PushWait is Push that waits (spinning or sleeping, per the segment's
// Waiter) while the ring is full, at most timeout (negative: no bound).
func (p *Producer) PushWait(h Header, payload []byte, timeout time.Duration) error {
	err := p.Push(h, payload)
	if err != ErrFull {
		return err
	}
	need := alignUp(MsgHeaderLen+uint64(len(payload)), recordAlign)
	if room := uint64(len(p.data)) - p.pos&p.mask; room < need {
		need += room
	}
	ready := func() bool { return p.fits(need) != ErrFull }
	if err := p.waiter.wait(p.self, ready, &p.park, context.Background(), timeout); err != nil {
		return err
	}
	return p.Push(h, payload)
}

func putHeader(b []byte, n uint32, h Header) {
	le := binary.LittleEndian
	le.PutUint32(b[msgLen:], n)
	le.PutUint16(b[msgOp:], h.Op)
	le.PutUint16(b[msgFlags:], h.Flags)
	le.PutUint32(b[msgSeq:], h.Seq)
	le.PutUint32(b[msgEpoch:], h.Epoch)
}

// A Consumer is the reading end of a single-producer single-consumer ring
// (see Producer). Exactly one goroutine of one process may use it.
type Consumer struct {
	data []byte
	mask uint64
	// head is the consumer's position. Its Store (in Release) hands the
	// bytes before it back to the producer; it pairs with the producer's
	// Load in fits.
	head *atomic.Uint64
	// tail is the producer's position. Its Load (in Peek) pairs with the
	// producer's Store in Commit: records before it are fully written.
	tail *atomic.Uint64

	// Local to the consumer.
	pos       uint64 // equals head: only this consumer stores head
	tailCache uint64 // last loaded tail; refreshed only when the ring looks empty
	cur       uint64 // bytes the peeked message spans (pad included); 0 if none

	self   event   // what the consumer sleeps on while the ring is empty
	peer   event   // signalled after Release: the producer may wait for room
	waiter *Waiter // the segment's waiting policy
	park   parker  // the consumer's in-process wake-up channel (InProcessWaiter)
}

// Peek returns the oldest unreleased message without consuming it, ErrEmpty
// if there is none, or an error wrapping ErrCorrupt if the producer wrote
// an impossible record or counter (the ring cannot be read further).
// Peeking again before Release returns the same message.
func (c *Consumer) Peek() (Msg, error) {
	if c.pos == c.tailCache {
		c.tailCache = c.tail.Load()
		if c.pos == c.tailCache {
			return Msg{}, ErrEmpty
		}
	}
	size := uint64(len(c.data))
	avail := c.tailCache - c.pos
	if avail > size || c.pos%recordAlign != 0 || avail%recordAlign != 0 {
		return Msg{}, fmt.Errorf("%w: producer at %d, consumer at %d", ErrCorrupt, c.tailCache, c.pos)
	}
	le := binary.LittleEndian
	off := c.pos & c.mask // a multiple of recordAlign, so a header fits before the end
	var skip uint64
	if le.Uint16(c.data[off+msgOp:]) == OpPad {
		room := size - off
		if uint64(le.Uint32(c.data[off+msgLen:]))+MsgHeaderLen != room || room >= avail {
			return Msg{}, fmt.Errorf("%w: bad pad record at %d", ErrCorrupt, c.pos)
		}
		skip, off, avail = room, 0, avail-room
	}
	n := uint64(le.Uint32(c.data[off+msgLen:]))
	if n > size/2 {
		return Msg{}, fmt.Errorf("%w: %d-byte message at %d", ErrCorrupt, n, c.pos+skip)
	}
	rec := alignUp(MsgHeaderLen+n, recordAlign)
	if rec > avail || off+rec > size {
		return Msg{}, fmt.Errorf("%w: %d-byte message overruns the ring at %d", ErrCorrupt, n, c.pos+skip)
	}
	c.cur = skip + rec
	m := Msg{Header: Header{
		Op:    le.Uint16(c.data[off+msgOp:]),
		Flags: le.Uint16(c.data[off+msgFlags:]),
		Seq:   le.Uint32(c.data[off+msgSeq:]),
		Epoch: le.Uint32(c.data[off+msgEpoch:]),
	}}
	if m.Op == OpPad {
		return Msg{}, fmt.Errorf("%w: two pad records at %d", ErrCorrupt, c.pos+skip)
	}
	start := off + MsgHeaderLen
	m.Payload = c.data[start : start+n : start+n]
	return m, nil
}

// Release consumes the message returned by the last Peek, invalidating its
// Payload, and wakes the producer if it announced it is asleep.
func (c *Consumer) Release() {
	if c.cur == 0 {
		return
	}
	c.pos += c.cur
	c.cur = 0
	c.head.Store(c.pos) // hands the released bytes back; pairs with the producer's head.Load
	c.peer.signal()
}

// Len reports the bytes (records and padding) waiting in the ring.
func (c *Consumer) Len() int {
	return int(min(c.tail.Load()-c.pos, uint64(len(c.data))))
}

// nonEmpty reports whether a record is waiting, refreshing tailCache.
func (c *Consumer) nonEmpty() bool {
	if c.pos != c.tailCache {
		return true
	}
	c.tailCache = c.tail.Load()
	return c.pos != c.tailCache
}

// Wait returns when a message is waiting, or ErrTimeout after timeout
// (negative: no bound), spinning or sleeping per the segment's Waiter.
func (c *Consumer) Wait(timeout time.Duration) error {
	return c.waiter.wait(c.self, c.nonEmpty, &c.park, context.Background(), timeout)
}

// WaitContext returns nil when a message is waiting, or ctx.Err() once
// ctx is done. With InProcessWaiter it sleeps on ctx.Done() and its
// parker, with no timer; a futex sleeper wakes at least every 100 ms (and
// at ctx's deadline) to check ctx.
func (c *Consumer) WaitContext(ctx context.Context) error {
	return c.waiter.wait(c.self, c.nonEmpty, &c.park, ctx, -1)
}
