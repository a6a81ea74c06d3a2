package shm

import (
	"encoding/binary"
	"fmt"
	"math/bits"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// Identity of the layout. A segment whose header carries another magic or
// version is refused by Attach, Open and OpenFile.
const (
	// Magic is the first 8 bytes of every segment: "fpmi-shm" read as a
	// little-endian uint64.
	Magic uint64 = 0x6d68732d696d7066
	// LayoutVersion changes whenever any offset or record format below
	// changes, or the request protocol (proto.go) gains what the other
	// side would refuse; agent and ranks must agree on it exactly. 3:
	// OpBlock and CollDetached.
	LayoutVersion uint32 = 3
)

// Alignment units.
const (
	// CacheLine is the unit of false-sharing avoidance: words written by
	// different processes never share one.
	CacheLine = 64
	// lineGap separates the rank-written and agent-written halves of a
	// control block: two lines, because x86's adjacent-line prefetcher
	// pulls 128-byte pairs and would otherwise couple them.
	lineGap = 2 * CacheLine
	// regionAlign aligns every region to 4 KiB so pre-faulting one region
	// (and the sparseness of another) never spills across region borders.
	regionAlign = 4096
	// headerBytes is the header region: header fields plus the agent's and
	// the epoch's cache lines, padded to one region.
	headerBytes = regionAlign
)

// Header field offsets (plain fields, little-endian, written once by the
// creator before the segment is shared, then read-only).
const (
	hdrMagic         = 0   // uint64: Magic
	hdrVersion       = 8   // uint32: LayoutVersion
	hdrHeaderBytes   = 12  // uint32: headerBytes
	hdrTotal         = 16  // uint64: total segment length in bytes
	hdrLocalRanks    = 24  // uint32: Params.LocalRanks
	hdrWorldSize     = 28  // uint32: Params.WorldSize
	hdrMaxValue      = 32  // uint32: Params.MaxValue
	hdrReqRingBytes  = 36  // uint32: Params.RequestRingBytes
	hdrRespRingBytes = 40  // uint32: Params.ResponseRingBytes
	hdrKVSCapacity   = 44  // uint32: Params.KVSCapacity
	hdrKVSKeyMax     = 48  // uint32: Params.KVSKeyMax
	hdrKVSBuckets    = 52  // uint32: buckets in the KVS hash index (power of two)
	hdrCtrlOff       = 56  // uint64: offset of the control blocks
	hdrRingOff       = 64  // uint64: offset of the ring data
	hdrSlotOff       = 72  // uint64: offset of the input slots
	hdrResultOff     = 80  // uint64: offset of the allgather result array
	hdrKVSIndexOff   = 88  // uint64: offset of the KVS hash index
	hdrKVSEntryOff   = 96  // uint64: offset of the KVS entries
	hdrCtrlStride    = 104 // uint32: bytes per control block
	hdrRingStride    = 108 // uint32: bytes of ring data per local rank
	hdrSlotBytes     = 112 // uint32: bytes per input slot (one parity)
	hdrResultStride  = 116 // uint32: bytes per result entry
	hdrKVSEntryBytes = 120 // uint32: bytes per KVS entry
	hdrKVSArenaPages = 124 // uint32: KVS arena size in regionAlign pages
	hdrFieldsEnd     = 128
)

// Shared words in the header region (atomics, native byte order). Each
// group sits on its own cache line because different parties write them.
const (
	// Agent doorbell line: ranks bump the doorbell, the agent counts itself
	// asleep. See event for the protocol.
	offDoorbell      = 128 // uint32 futex word: bumped by a rank (or the agent's own Kick) to wake the agent
	offAgentSleepers = 132 // uint32: 1 while the agent is inside a doorbell wait, else 0
	// Epoch line: the agent publishes a collective epoch, ranks sleep on it.
	offEpoch         = 256 // uint32: last published collective epoch (agent stores, ranks load)
	offEpochWake     = 260 // uint32 futex word: bumped by the agent when it wakes epoch sleepers
	offEpochSleepers = 264 // uint32: number of ranks inside an epoch wait
	offKVSCount      = 268 // uint32: entries in the KVS (agent stores after each insert; informational)
	offKVSArenaUsed  = 272 // uint32: KVS arena bytes in use (agent stores after each insert; informational)
)

// Control block of one local rank: two halves, each written by one party.
const (
	// Rank half (written only by the rank).
	ctlReqTail      = 0  // uint64: request-ring producer position (rank stores, agent loads)
	ctlRespHead     = 8  // uint64: response-ring consumer position (rank stores, agent loads)
	ctlRankSleepers = 16 // uint32: 1 while the rank is inside a wait on its wake word
	ctlRankState    = 20 // uint32: RankState (rank stores, agent loads)
	ctlRankPID      = 24 // uint32: the rank's process id, stored before RankAttached
	// Agent half (written only by the agent).
	ctlReqHead  = lineGap + 0  // uint64: request-ring consumer position (agent stores, rank loads)
	ctlRespTail = lineGap + 8  // uint64: response-ring producer position (agent stores, rank loads)
	ctlRankWake = lineGap + 16 // uint32 futex word: bumped by the agent to wake the rank
	ctrlStride  = 2 * lineGap
)

// Input slot (one per local rank and epoch parity): a small header, then
// the value bytes.
const (
	slotLen   = 0 // uint32: value length (plain; published by the request that names the epoch)
	slotEpoch = 4 // uint32: epoch the value belongs to
	slotData  = 8 // MaxValue bytes
)

// Allgather result entry (one per global rank and epoch parity).
const (
	resLen   = 0 // uint32: value length (plain; published by the epoch word)
	resEpoch = 4 // uint32: epoch the value belongs to
	resData  = 8 // MaxValue bytes
)

// Slots and result entries share one header, read by Segment.epochValue.
var _ = [1]struct{}{}[(slotLen^resLen)|(slotEpoch^resEpoch)|(slotData^resData)]

// KVS entry. Entries are append-only and immutable once their index bucket
// is published; each names its key and value bytes in the arena, which is
// append-only too, so an entry costs its own size, not the maxima.
const (
	kvsEpoch      = 0  // uint32: fence epoch that made the entry visible
	kvsKeyLen     = 4  // uint32
	kvsValLen     = 8  // uint32
	kvsHash       = 12 // uint32: low 32 bits of the key's FNV-1a hash
	kvsData       = 16 // uint64: arena offset of the key bytes, the value bytes follow
	kvsEntryBytes = 24
	kvsDataAlign  = 8 // arena allocations start 8-byte aligned
)

// Limits that keep every size and offset far from overflow.
const (
	maxLocalRanks = 1 << 16
	maxWorldSize  = 1 << 24
	maxValueBytes = 1 << 20
	minRingBytes  = 256
	maxRingBytes  = 1 << 26
	maxKVSEntries = 1 << 24
	maxKVSKeyMax  = 1 << 12
	maxKVSArena   = 1 << 31 // offKVSArenaUsed is a uint32
	maxTotal      = 1 << 40
)

// Compile-time checks that the layout constants agree with each other. A
// "_ uint = a - b" constant fails the build if a < b; a "[x]" index into a
// one-element array fails it unless x == 0.
const (
	_ uint = hdrFieldsEnd - (hdrKVSArenaPages + 4)            // header fields end by hdrFieldsEnd
	_ uint = offDoorbell - hdrFieldsEnd                       // the doorbell line follows the fields
	_ uint = offDoorbell + CacheLine - (offAgentSleepers + 4) // doorbell words share one line
	_ uint = offEpoch - (offDoorbell + lineGap)               // the epoch line is a line pair away
	_ uint = offEpoch + CacheLine - (offKVSArenaUsed + 4)     // epoch words share one line
	_ uint = headerBytes - (offEpoch + CacheLine)             // all of it inside the header region
	_ uint = CacheLine - (ctlRankPID + 4)                     // the rank half is one line
	_ uint = lineGap + CacheLine - (ctlRankWake + 4)          // the agent half is one line
)

var (
	_ = [1]struct{}{}[offDoorbell%CacheLine+offEpoch%CacheLine]                // lines start on lines
	_ = [1]struct{}{}[ctlReqTail%8+ctlRespHead%8+ctlReqHead%8+ctlRespTail%8]   // 64-bit atomics 8-byte aligned
	_ = [1]struct{}{}[ctrlStride%CacheLine+headerBytes%regionAlign+slotData%8] // strides keep that alignment
	_ = [1]struct{}{}[offDoorbell%4+offEpoch%4+offEpochWake%4+ctlRankWake%4]   // futex words 4-byte aligned
)

// Default sizes used when a Params field is zero.
const (
	DefaultMaxValue    = pmiwire.ValLenMax // the PMI value limit
	DefaultRingBytes   = 16 << 10
	DefaultKVSCapacity = 1024
	// DefaultKVSArenaPerEntry sizes the arena when Params.KVSArenaBytes is
	// zero: bytes per entry of capacity, enough for an MPICH business card
	// and its key several times over (unused arena is never touched).
	DefaultKVSArenaPerEntry = 256
	DefaultKVSKeyMax        = pmiwire.KeyLenMax // the PMI key limit
)

// Params sizes a segment. Zero fields take the defaults above, except
// LocalRanks, which is required, and WorldSize, which defaults to
// LocalRanks.
type Params struct {
	LocalRanks        int // ranks on this node; control blocks, rings and slots are per local rank
	WorldSize         int // P: entries in the allgather result array, indexed by global rank
	MaxValue          int // maximum value bytes per slot, result entry and KVS entry
	RequestRingBytes  int // data bytes per request ring, a power of two
	ResponseRingBytes int // data bytes per response ring, a power of two
	KVSCapacity       int // maximum KVS entries
	KVSKeyMax         int // maximum KVS key bytes
	KVSArenaBytes     int // bytes for KVS keys and values, rounded up to 4 KiB; at least one maximal key and value

	// Starting values, for tests that preset counters near wrap-around.
	// They are not part of the layout and are not stored in the header.
	FirstEpoch uint32 // first collective epoch; the epoch word starts at FirstEpoch-1
	RingBase   uint64 // initial position of every ring's counters; a multiple of 16
}

// validate fills defaults and rejects sizes the layout cannot hold.
func (p Params) validate() (Params, error) {
	if p.MaxValue == 0 {
		p.MaxValue = DefaultMaxValue
	}
	if p.RequestRingBytes == 0 {
		p.RequestRingBytes = DefaultRingBytes
	}
	if p.ResponseRingBytes == 0 {
		p.ResponseRingBytes = DefaultRingBytes
	}
	if p.KVSCapacity == 0 {
		p.KVSCapacity = DefaultKVSCapacity
	}
	if p.KVSKeyMax == 0 {
		p.KVSKeyMax = DefaultKVSKeyMax
	}
	if p.WorldSize == 0 {
		p.WorldSize = p.LocalRanks
	}
	if p.KVSArenaBytes == 0 && p.KVSCapacity > 0 && p.KVSCapacity <= maxKVSEntries {
		p.KVSArenaBytes = p.KVSCapacity * DefaultKVSArenaPerEntry
	}
	minArena := alignUp(uint64(max(p.KVSKeyMax, 0))+uint64(max(p.MaxValue, 0)), kvsDataAlign)
	if uint64(max(p.KVSArenaBytes, 0)) < minArena {
		p.KVSArenaBytes = int(minArena)
	}
	p.KVSArenaBytes = int(alignUp(uint64(max(p.KVSArenaBytes, 0)), regionAlign))
	switch {
	case p.LocalRanks < 1 || p.LocalRanks > maxLocalRanks:
		return p, fmt.Errorf("%d local ranks, want 1..%d", p.LocalRanks, maxLocalRanks)
	case p.WorldSize < p.LocalRanks || p.WorldSize > maxWorldSize:
		return p, fmt.Errorf("world size %d, want %d..%d", p.WorldSize, p.LocalRanks, maxWorldSize)
	case p.MaxValue < 1 || p.MaxValue > maxValueBytes:
		return p, fmt.Errorf("max value %d bytes, want 1..%d", p.MaxValue, maxValueBytes)
	case !validRing(p.RequestRingBytes):
		return p, fmt.Errorf("request ring %d bytes, want a power of two in %d..%d", p.RequestRingBytes, minRingBytes, maxRingBytes)
	case !validRing(p.ResponseRingBytes):
		return p, fmt.Errorf("response ring %d bytes, want a power of two in %d..%d", p.ResponseRingBytes, minRingBytes, maxRingBytes)
	case p.KVSCapacity < 1 || p.KVSCapacity > maxKVSEntries:
		return p, fmt.Errorf("kvs capacity %d, want 1..%d", p.KVSCapacity, maxKVSEntries)
	case p.KVSKeyMax < 1 || p.KVSKeyMax > maxKVSKeyMax:
		return p, fmt.Errorf("kvs key max %d bytes, want 1..%d", p.KVSKeyMax, maxKVSKeyMax)
	case p.KVSArenaBytes > maxKVSArena:
		return p, fmt.Errorf("kvs arena %d bytes, want at most %d", p.KVSArenaBytes, maxKVSArena)
	case p.RingBase%recordAlign != 0:
		return p, fmt.Errorf("ring base %d is not a multiple of %d", p.RingBase, recordAlign)
	}
	return p, nil
}

func validRing(n int) bool {
	return n >= minRingBytes && n <= maxRingBytes && n&(n-1) == 0
}

// layout is the computed geometry of a segment. Every field is derived
// from the sizes by computeLayout; the header stores them all so that a
// reader can check that creator and reader computed the same thing.
type layout struct {
	localRanks, worldSize, maxValue int
	reqRing, respRing               int
	kvsCap, kvsKeyMax, kvsBuckets   int
	kvsArena                        uint64 // arena bytes, a multiple of regionAlign

	ctrlOff, readyOff, ringOff, slotOff, resultOff, kvsIndexOff, kvsEntryOff, kvsArenaOff uint64
	ringStride, slotBytes, resultStride                                                   uint64
	resultBufBytes                                                                        uint64 // one parity's result entries, region-aligned
	total                                                                                 uint64
}

// computeLayout lays the regions out in order: header, control blocks,
// rings, slots, results (two parities), KVS index, KVS entries, KVS arena. The limits
// checked by validate keep every product below 2^63; maxTotal bounds the
// sum.
func computeLayout(p Params) (layout, error) {
	l := layout{
		localRanks: p.LocalRanks, worldSize: p.WorldSize, maxValue: p.MaxValue,
		reqRing: p.RequestRingBytes, respRing: p.ResponseRingBytes,
		kvsCap: p.KVSCapacity, kvsKeyMax: p.KVSKeyMax, kvsArena: uint64(p.KVSArenaBytes),
	}
	l.kvsBuckets = 1 << bits.Len(uint(2*p.KVSCapacity-1)) // ≥ 2×capacity keeps probes short
	n := uint64(p.LocalRanks)
	l.ringStride = uint64(p.RequestRingBytes + p.ResponseRingBytes)
	l.slotBytes = alignUp(slotData+uint64(p.MaxValue), CacheLine)
	l.resultStride = alignUp(resData+uint64(p.MaxValue), 8)
	l.resultBufBytes = alignUp(uint64(p.WorldSize)*l.resultStride, regionAlign)

	off := uint64(headerBytes)
	l.ctrlOff = off
	l.readyOff = off + n*ctrlStride // the ready bitmap closes the control region
	off = alignUp(l.readyOff+8*readyWords(p.LocalRanks), regionAlign)
	l.ringOff = off
	off = alignUp(off+n*l.ringStride, regionAlign)
	l.slotOff = off
	off = alignUp(off+n*2*l.slotBytes, regionAlign)
	l.resultOff = off
	off += 2 * l.resultBufBytes
	l.kvsIndexOff = off
	off = alignUp(off+uint64(l.kvsBuckets)*4, regionAlign)
	l.kvsEntryOff = off
	off = alignUp(off+uint64(p.KVSCapacity)*kvsEntryBytes, regionAlign)
	l.kvsArenaOff = off
	off += l.kvsArena
	l.total = off
	if l.total > maxTotal {
		return l, fmt.Errorf("segment of %d bytes exceeds the %d-byte limit", l.total, uint64(maxTotal))
	}
	return l, nil
}

func alignUp(v, a uint64) uint64 { return (v + a - 1) &^ (a - 1) }

// readyWords is the size of the ready bitmap in uint64 words: one bit per
// local rank, set by the rank after it commits a request (Producer.Commit)
// and taken by the agent (Agent.TakeReady), so the agent visits only the
// request rings that have something.
func readyWords(localRanks int) uint64 { return uint64(localRanks+63) / 64 }

// writeHeader stores l's header fields into b (at least hdrFieldsEnd bytes).
func (l *layout) writeHeader(b []byte) {
	le := binary.LittleEndian
	le.PutUint64(b[hdrMagic:], Magic)
	le.PutUint32(b[hdrVersion:], LayoutVersion)
	le.PutUint32(b[hdrHeaderBytes:], headerBytes)
	le.PutUint64(b[hdrTotal:], l.total)
	le.PutUint32(b[hdrLocalRanks:], uint32(l.localRanks))
	le.PutUint32(b[hdrWorldSize:], uint32(l.worldSize))
	le.PutUint32(b[hdrMaxValue:], uint32(l.maxValue))
	le.PutUint32(b[hdrReqRingBytes:], uint32(l.reqRing))
	le.PutUint32(b[hdrRespRingBytes:], uint32(l.respRing))
	le.PutUint32(b[hdrKVSCapacity:], uint32(l.kvsCap))
	le.PutUint32(b[hdrKVSKeyMax:], uint32(l.kvsKeyMax))
	le.PutUint32(b[hdrKVSBuckets:], uint32(l.kvsBuckets))
	le.PutUint64(b[hdrCtrlOff:], l.ctrlOff)
	le.PutUint64(b[hdrRingOff:], l.ringOff)
	le.PutUint64(b[hdrSlotOff:], l.slotOff)
	le.PutUint64(b[hdrResultOff:], l.resultOff)
	le.PutUint64(b[hdrKVSIndexOff:], l.kvsIndexOff)
	le.PutUint64(b[hdrKVSEntryOff:], l.kvsEntryOff)
	le.PutUint32(b[hdrCtrlStride:], ctrlStride)
	le.PutUint32(b[hdrRingStride:], uint32(l.ringStride))
	le.PutUint32(b[hdrSlotBytes:], uint32(l.slotBytes))
	le.PutUint32(b[hdrResultStride:], uint32(l.resultStride))
	le.PutUint32(b[hdrKVSEntryBytes:], kvsEntryBytes)
	le.PutUint32(b[hdrKVSArenaPages:], uint32(l.kvsArena/regionAlign))
}

// readHeader validates the header at the start of a segment of size bytes
// (b holds at least the header fields) and returns its layout. It trusts
// nothing: the sizes are re-validated, the layout is recomputed from them,
// and every stored offset and stride must equal the recomputed one, so a
// layout that passes lies entirely inside the segment.
func readHeader(b []byte, size uint64) (layout, error) {
	if len(b) < hdrFieldsEnd || size < headerBytes {
		return layout{}, fmt.Errorf("segment of %d bytes is shorter than its %d-byte header", size, headerBytes)
	}
	le := binary.LittleEndian
	if m := le.Uint64(b[hdrMagic:]); m != Magic {
		return layout{}, fmt.Errorf("bad magic %#x, want %#x", m, Magic)
	}
	if v := le.Uint32(b[hdrVersion:]); v != LayoutVersion {
		return layout{}, fmt.Errorf("layout version %d, want %d", v, LayoutVersion)
	}
	if h := le.Uint32(b[hdrHeaderBytes:]); h != headerBytes {
		return layout{}, fmt.Errorf("header of %d bytes, want %d", h, headerBytes)
	}
	p := Params{
		LocalRanks:        int(le.Uint32(b[hdrLocalRanks:])),
		WorldSize:         int(le.Uint32(b[hdrWorldSize:])),
		MaxValue:          int(le.Uint32(b[hdrMaxValue:])),
		RequestRingBytes:  int(le.Uint32(b[hdrReqRingBytes:])),
		ResponseRingBytes: int(le.Uint32(b[hdrRespRingBytes:])),
		KVSCapacity:       int(le.Uint32(b[hdrKVSCapacity:])),
		KVSKeyMax:         int(le.Uint32(b[hdrKVSKeyMax:])),
		KVSArenaBytes:     int(le.Uint32(b[hdrKVSArenaPages:])) * regionAlign,
	}
	if p.LocalRanks == 0 || p.WorldSize == 0 || p.MaxValue == 0 || p.RequestRingBytes == 0 ||
		p.ResponseRingBytes == 0 || p.KVSCapacity == 0 || p.KVSKeyMax == 0 || p.KVSArenaBytes == 0 {
		return layout{}, fmt.Errorf("header has a zero size field")
	}
	p, err := p.validate()
	if err != nil {
		return layout{}, fmt.Errorf("header sizes: %w", err)
	}
	l, err := computeLayout(p)
	if err != nil {
		return layout{}, fmt.Errorf("header sizes: %w", err)
	}
	stored := [...]struct {
		name      string
		got, want uint64
	}{
		{"total length", le.Uint64(b[hdrTotal:]), l.total},
		{"kvs buckets", uint64(le.Uint32(b[hdrKVSBuckets:])), uint64(l.kvsBuckets)},
		{"control offset", le.Uint64(b[hdrCtrlOff:]), l.ctrlOff},
		{"ring offset", le.Uint64(b[hdrRingOff:]), l.ringOff},
		{"slot offset", le.Uint64(b[hdrSlotOff:]), l.slotOff},
		{"result offset", le.Uint64(b[hdrResultOff:]), l.resultOff},
		{"kvs index offset", le.Uint64(b[hdrKVSIndexOff:]), l.kvsIndexOff},
		{"kvs entry offset", le.Uint64(b[hdrKVSEntryOff:]), l.kvsEntryOff},
		{"control stride", uint64(le.Uint32(b[hdrCtrlStride:])), ctrlStride},
		{"ring stride", uint64(le.Uint32(b[hdrRingStride:])), l.ringStride},
		{"slot size", uint64(le.Uint32(b[hdrSlotBytes:])), l.slotBytes},
		{"result stride", uint64(le.Uint32(b[hdrResultStride:])), l.resultStride},
		{"kvs entry size", uint64(le.Uint32(b[hdrKVSEntryBytes:])), kvsEntryBytes},
		{"kvs arena size", uint64(le.Uint32(b[hdrKVSArenaPages:])) * regionAlign, l.kvsArena},
	}
	for _, f := range stored {
		if f.got != f.want {
			return layout{}, fmt.Errorf("header %s %d, layout computes %d", f.name, f.got, f.want)
		}
	}
	if l.total != size {
		return layout{}, fmt.Errorf("header says %d bytes, segment has %d", l.total, size)
	}
	return l, nil
}

// ResidentBytes is how much memory a segment made with p takes before any
// key is put: everything before the KVS entries, which Create pre-faults
// (control blocks, slots, both result buffers) or ranks fault in as they
// use them (their rings). A launcher compares it with the memory
// available before it starts a job.
func ResidentBytes(p Params) (uint64, error) {
	l, err := layoutOf(p)
	return l.kvsEntryOff, err
}

// layoutOf validates p and lays a segment out.
func layoutOf(p Params) (layout, error) {
	p, err := p.validate()
	if err != nil {
		return layout{}, err
	}
	return computeLayout(p)
}
