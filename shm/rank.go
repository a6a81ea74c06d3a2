package shm

import (
	"context"
	"encoding/binary"
	"os"
	"sync/atomic"
	"time"
)

// RankState is what a rank announces about itself in its control block.
type RankState uint32

// Rank states, in the order a rank goes through them.
const (
	RankAbsent    RankState = iota // not yet attached
	RankAttached                   // mapped the segment (Announce)
	RankFinalized                  // finished cleanly
	RankAborted                    // gave up; the agent ends the job
)

// A Rank is local rank i's handle on a segment: it produces its request
// ring, consumes its response ring, writes its input slot, and reads the
// result array and the KVS in place. All methods must be called from one
// goroutine.
type Rank struct {
	s    *Segment
	i    int
	req  Producer // rank → agent
	resp Consumer // agent → rank

	epochEv event          // sleeps here in WaitEpoch
	park    parker         // WaitEpoch's in-process wake-up channel (InProcessWaiter)
	epoch   *atomic.Uint32 // published epoch; Load pairs with Agent.Publish's Store
	state   *atomic.Uint32 // RankState; Store publishes the pid
	pid     *atomic.Uint32
}

func newRank(s *Segment, i int) *Rank {
	c := s.ctrl(i)
	self := s.rankEvent(i)
	rq, rs := s.reqRing(i), s.respRing(i)
	r := &Rank{
		s: s, i: i,
		req: Producer{
			data: rq, mask: uint64(len(rq) - 1),
			tail: s.u64(c + ctlReqTail), head: s.u64(c + ctlReqHead),
			self: self, peer: s.doorbell(), waiter: &s.waiter,
			ready: s.readyWord(i), readyBit: 1 << (i % 64),
		},
		resp: Consumer{
			data: rs, mask: uint64(len(rs) - 1),
			head: s.u64(c + ctlRespHead), tail: s.u64(c + ctlRespTail),
			self: self, peer: s.doorbell(), waiter: &s.waiter,
		},
		epochEv: s.epochEvent(), epoch: s.u32(offEpoch),
		state: s.u32(c + ctlRankState), pid: s.u32(c + ctlRankPID),
	}
	r.load()
	return r
}

// load takes the local ring positions from shared memory.
func (r *Rank) load() {
	r.req.pos = r.req.tail.Load()
	r.req.headCache = r.req.head.Load()
	r.resp.pos = r.resp.head.Load()
	r.resp.tailCache = r.resp.pos
}

// Index returns the local rank number.
func (r *Rank) Index() int { return r.i }

// Requests returns the ring on which this rank sends requests.
func (r *Rank) Requests() *Producer { return &r.req }

// Responses returns the ring on which the agent answers this rank.
func (r *Rank) Responses() *Consumer { return &r.resp }

// Announce tells the agent this rank is up: its process id, then
// RankAttached.
func (r *Rank) Announce() {
	r.pid.Store(uint32(os.Getpid()))
	r.SetState(RankAttached)
}

// SetState announces a state to the agent.
func (r *Rank) SetState(st RankState) {
	r.state.Store(uint32(st)) // publishes the pid stored before it; pairs with Agent.RankState's Load
}

// SlotBuf returns the MaxValue-byte input slot for epoch, to fill in place
// before CommitSlot. Slots alternate by epoch parity: the rank may write
// epoch e's slot only after epoch e-2 is published (so at most two
// collectives are in flight), and must not touch it again until e is.
func (r *Rank) SlotBuf(epoch uint32) []byte {
	off := r.s.slotOff(r.i, epoch) + slotData
	return r.s.mem[off : off+uint64(r.s.l.maxValue) : off+uint64(r.s.l.maxValue)]
}

// CommitSlot records that the slot for epoch holds n bytes. The agent sees
// them once it reads the request this rank pushes next (the ring's tail
// store publishes the slot).
func (r *Rank) CommitSlot(epoch uint32, n int) error {
	if uint(n) > uint(r.s.l.maxValue) {
		return ErrTooLarge
	}
	off := r.s.slotOff(r.i, epoch)
	le := binary.LittleEndian
	le.PutUint32(r.s.mem[off+slotLen:], uint32(n))
	le.PutUint32(r.s.mem[off+slotEpoch:], epoch)
	return nil
}

// SetSlot copies v into the slot for epoch (SlotBuf, copy, CommitSlot).
func (r *Rank) SetSlot(epoch uint32, v []byte) error {
	if len(v) > r.s.l.maxValue {
		return ErrTooLarge
	}
	copy(r.SlotBuf(epoch), v)
	return r.CommitSlot(epoch, len(v))
}

// Epoch returns the last epoch the agent published.
func (r *Rank) Epoch() uint32 { return r.epoch.Load() }

// WaitEpoch returns once the agent has published epoch (or a later one);
// ErrTimeout after timeout (negative: no bound).
func (r *Rank) WaitEpoch(epoch uint32, timeout time.Duration) error {
	ready := func() bool { return reached(r.epoch.Load(), epoch) }
	return r.s.waiter.wait(r.epochEv, ready, &r.park, context.Background(), timeout)
}

// WaitEpochContext returns nil once the agent has published epoch (or a
// later one), or ctx.Err() once ctx is done; it waits as
// Consumer.WaitContext does.
func (r *Rank) WaitEpochContext(ctx context.Context, epoch uint32) error {
	ready := func() bool { return reached(r.epoch.Load(), epoch) }
	return r.s.waiter.wait(r.epochEv, ready, &r.park, ctx, -1)
}

// Result returns global rank g's allgather value for epoch as a view into
// shared memory, without copying. It is ErrNotPublished before the agent
// published epoch and ErrStale if g's entry was not written for epoch. The
// view stays valid until this rank requests epoch+2 (the agent then reuses
// the buffer) or the segment is closed; copy what must live longer.
func (r *Rank) Result(g int, epoch uint32) ([]byte, error) {
	if uint(g) >= uint(r.s.l.worldSize) {
		return nil, ErrRange
	}
	if !reached(r.epoch.Load(), epoch) { // pairs with Publish: the entry below is complete
		return nil, ErrNotPublished
	}
	return r.s.epochValue(r.s.resultOff(g, epoch), epoch)
}
