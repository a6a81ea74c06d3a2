package shm

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/bits"
	"sync/atomic"
	"time"
)

// An Agent is the node agent's handle on a segment: it consumes every
// local rank's request ring, produces their response rings, reads their
// input slots, writes the allgather result array and the KVS, and
// publishes collective epochs. All methods except Kick must be called from
// one goroutine.
type Agent struct {
	s    *Segment
	req  []Consumer // req[i]: rank i → agent
	resp []Producer // resp[i]: agent → rank i

	doorbell event          // the agent sleeps here; ranks and Kick signal it
	epochEv  event          // ranks sleep here for Publish
	epoch    *atomic.Uint32 // published epoch; Store in Publish pairs with the Load in Rank.WaitEpoch, Rank.Result and Rank.Lookup
	park     parker         // Wait's in-process wake-up channel (InProcessWaiter)

	kvsN    int    // KVS entries inserted; only the agent goroutine touches it
	kvsUsed uint64 // KVS arena bytes in use; likewise
	// index is the agent's own copy of the KVS hash index (ownIndex),
	// made on first use; indexFresh says the view laid the segment out,
	// so the copy starts empty. Only the agent goroutine touches them.
	index      []uint32
	indexFresh bool

	header []byte // the header fields as this view found them; see CheckHeader

	// kicked is process-local: Kick stores true, then signals the doorbell;
	// Wait's condition consumes it with CompareAndSwap. It publishes
	// nothing but itself.
	kicked atomic.Bool

	// took says TakeReady found a rank since the last Wait; only the
	// agent goroutine touches it.
	took bool

	// parked is the agent's place in a Sleeper's bed (Park): the agent
	// goroutine sets it up before parking, the bed hands it back.
	parked parked
}

func newAgent(s *Segment) *Agent {
	n := s.l.localRanks
	a := &Agent{
		s: s, req: make([]Consumer, n), resp: make([]Producer, n),
		doorbell: s.doorbell(), epochEv: s.epochEvent(), epoch: s.u32(offEpoch),
	}
	for i := range n {
		c := s.ctrl(i)
		rq, rs := s.reqRing(i), s.respRing(i)
		a.req[i] = Consumer{
			data: rq, mask: uint64(len(rq) - 1),
			head: s.u64(c + ctlReqHead), tail: s.u64(c + ctlReqTail),
			self: a.doorbell, peer: s.rankEvent(i), waiter: &s.waiter,
		}
		a.resp[i] = Producer{
			data: rs, mask: uint64(len(rs) - 1),
			tail: s.u64(c + ctlRespTail), head: s.u64(c + ctlRespHead),
			self: a.doorbell, peer: s.rankEvent(i), waiter: &s.waiter,
		}
	}
	a.load()
	return a
}

// load takes the header, the local ring positions and the KVS count from
// shared memory (once the header is written or validated).
func (a *Agent) load() {
	a.header = bytes.Clone(a.s.mem[:hdrFieldsEnd])
	for i := range a.req {
		a.req[i].pos = a.req[i].head.Load()
		a.req[i].tailCache = a.req[i].pos
		a.resp[i].pos = a.resp[i].tail.Load()
		a.resp[i].headCache = a.resp[i].head.Load()
	}
	a.kvsN = int(a.s.u32(offKVSCount).Load())
	a.kvsUsed = uint64(a.s.u32(offKVSArenaUsed).Load())
}

// Requests returns the ring on which local rank i sends requests, or nil
// if i is out of range.
func (a *Agent) Requests(i int) *Consumer {
	if uint(i) >= uint(len(a.req)) {
		return nil
	}
	return &a.req[i]
}

// Responses returns the ring on which the agent answers local rank i, or
// nil if i is out of range.
func (a *Agent) Responses(i int) *Producer {
	if uint(i) >= uint(len(a.resp)) {
		return nil
	}
	return &a.resp[i]
}

// Wait returns when some request ring holds a message or Kick was called
// since the last Wait; ErrTimeout after timeout (negative: no bound). The
// agent sleeps on one doorbell word for all its ranks; a rank rings it only
// when the agent has announced that it sleeps (see event). It spins first,
// as the segment's waiter allows, only if TakeReady found a rank since the
// last Wait (a rank that just made a request often makes another soon);
// otherwise it sleeps at once, so that the periodic wake-up of an idle
// agent costs one check, not a spin: a node of many idle jobs (a spawn
// storm's children, a daemon's) has as many such agents.
func (a *Agent) Wait(timeout time.Duration) error {
	w := a.s.waiter
	if !a.took {
		w.spins = 0
	}
	a.took = false
	return w.wait(a.doorbell, a.pending, &a.park, context.Background(), timeout)
}

// SleepPrepare is Wait split in two, for an agent that sleeps elsewhere:
// in a Sleeper's bed (Park), or in io_uring's FUTEX_WAIT on the doorbell
// submitted together with the agent's socket operations. It announces the agent asleep and returns the
// doorbell word and the value to wait on. If ready is true, work is already
// pending and the caller must not sleep. Either way, call SleepDone once
// awake (or at once when ready), then drain the request rings.
func (a *Agent) SleepPrepare() (word *uint32, val uint32, ready bool) {
	val = a.doorbell.word.Load()
	a.doorbell.sleepers.Add(1) // before the check: see event
	return futexAddr(a.doorbell.word), val, a.pending()
}

// SleepDone ends the sleep SleepPrepare announced.
func (a *Agent) SleepDone() { a.doorbell.sleepers.Add(^uint32(0)) }

// pending is Wait's condition: a kick, or a rank marked ready.
func (a *Agent) pending() bool {
	if a.kicked.Load() && a.kicked.CompareAndSwap(true, false) {
		return true
	}
	for w := range readyWords(len(a.req)) {
		if a.s.readyWord(int(w)*64).Load() != 0 {
			return true
		}
	}
	return false
}

// TakeReady appends to dst the local ranks that committed requests since
// they were last taken, and clears their marks; the caller then drains
// those ranks' request rings. A rank that commits again meanwhile is
// marked again, so no request is missed; a mark may find its ring already
// drained.
func (a *Agent) TakeReady(dst []int) []int {
	n, had := len(a.req), len(dst)
	for w := range readyWords(n) {
		set := a.s.readyWord(int(w) * 64).Swap(0)
		for set != 0 {
			i := int(w)*64 + bits.TrailingZeros64(set)
			set &= set - 1
			if i < n {
				dst = append(dst, i)
			}
		}
	}
	if len(dst) > had {
		a.took = true
	}
	return dst
}

// Kick makes the agent's current or next Wait return. Any goroutine of the
// agent process may call it (a network completion, a child exit). It
// wakes the doorbell unconditionally: the sleepers word that lets ranks
// skip the wake lives in memory every rank can write, and a stray store
// there must not keep the agent asleep.
func (a *Agent) Kick() {
	a.kicked.Store(true)
	a.doorbell.wake()
}

// CheckHeader reports whether the segment's header still holds the
// fields the agent's view was made from (ErrCorrupt if not). The header
// is read-only once the segment is shared, but every rank maps it
// writable; the agent's own geometry never depends on it, so this is a
// diagnosis, not a defence.
func (a *Agent) CheckHeader() error {
	if !bytes.Equal(a.s.mem[:hdrFieldsEnd], a.header) {
		return fmt.Errorf("%w: the segment header (magic, version, sizes, offsets) was overwritten", ErrCorrupt)
	}
	return nil
}

// Slot returns local rank i's input value for epoch, a view into shared
// memory. It is ErrStale unless the rank wrote the slot for this epoch. The
// view is stable from the rank's request for epoch until the agent
// publishes it (the rank writes the slot again only after that); the agent
// must finish reading it before Publish(epoch).
func (a *Agent) Slot(i int, epoch uint32) ([]byte, error) {
	if uint(i) >= uint(len(a.req)) {
		return nil, ErrRange
	}
	return a.s.epochValue(a.s.slotOff(i, epoch), epoch)
}

// ResultBuf returns the MaxValue-byte buffer of global rank g's result
// entry for epoch, to fill in place (a decompressor writes straight into
// it), then CommitResult. Buffers alternate by epoch parity: the agent may
// write epoch e only once every local rank has requested epoch e, because
// ranks may still read epoch e-2's entries in the same buffer until then.
func (a *Agent) ResultBuf(g int, epoch uint32) ([]byte, error) {
	if uint(g) >= uint(a.s.l.worldSize) {
		return nil, ErrRange
	}
	off := a.s.resultOff(g, epoch) + resData
	return a.s.mem[off : off+uint64(a.s.l.maxValue) : off+uint64(a.s.l.maxValue)], nil
}

// CommitResult records that global rank g's entry for epoch holds n bytes.
// The entry becomes visible to ranks with Publish(epoch).
func (a *Agent) CommitResult(g int, epoch uint32, n int) error {
	if uint(g) >= uint(a.s.l.worldSize) {
		return ErrRange
	}
	if uint(n) > uint(a.s.l.maxValue) {
		return ErrTooLarge
	}
	off := a.s.resultOff(g, epoch)
	le := binary.LittleEndian
	le.PutUint32(a.s.mem[off+resLen:], uint32(n))
	le.PutUint32(a.s.mem[off+resEpoch:], epoch)
	return nil
}

// SetResult copies v into global rank g's entry for epoch (ResultBuf,
// copy, CommitResult).
func (a *Agent) SetResult(g int, epoch uint32, v []byte) error {
	b, err := a.ResultBuf(g, epoch)
	if err != nil {
		return err
	}
	if len(v) > len(b) {
		return ErrTooLarge
	}
	copy(b, v)
	return a.CommitResult(g, epoch, len(v))
}

// Publish makes epoch the last completed collective epoch: every result
// entry and KVS entry the agent wrote for it becomes visible, and ranks
// waiting in WaitEpoch wake (one futex wake for all of them, and only if
// any sleeps). Epochs must be published in order.
func (a *Agent) Publish(epoch uint32) {
	a.epoch.Store(epoch) // publishes the plain result and KVS writes above
	a.epochEv.signal()
}

// Epoch returns the last published epoch.
func (a *Agent) Epoch() uint32 { return a.epoch.Load() }

// RankState returns the state local rank i announced and its process id.
func (a *Agent) RankState(i int) (RankState, int) {
	if uint(i) >= uint(len(a.req)) {
		return RankAbsent, 0
	}
	c := a.s.ctrl(i)
	st := RankState(a.s.u32(c + ctlRankState).Load()) // pairs with Rank.SetState's Store; makes the pid visible
	return st, int(a.s.u32(c + ctlRankPID).Load())
}
