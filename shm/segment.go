package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"unsafe"

	mmap "github.com/edsrzf/mmap-go"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// Errors. Hot-path functions return these sentinels unwrapped (no
// allocation); set-up functions wrap them.
var (
	ErrEmpty        = errors.New("ring is empty")
	ErrFull         = errors.New("ring is full")
	ErrTooLarge     = errors.New("value or message too large")
	ErrCorrupt      = errors.New("shared memory corrupt")
	ErrTimeout      = errors.New("wait timed out")
	ErrStale        = errors.New("entry belongs to another epoch")
	ErrNotPublished = errors.New("epoch not yet published")
	ErrRange        = errors.New("index out of range")
	ErrKVSFull      = errors.New("kvs table is full")
	ErrKeyExists    = errors.New("kvs key already exists")
)

// A Segment is one mapping of a node's shared segment, in the agent or in
// a rank, or a heap buffer laid out the same way. It owns the mapping (and,
// for the creator, the memfd) until Close.
type Segment struct {
	mem []byte // the whole segment
	l   layout
	p   Params // sizes (starting values only in the creator)

	// Set once at construction; nil for heap-backed segments.
	file    *os.File  // memfd, creator only
	mapping mmap.MMap // the mapping, unmapped by Close
	// populating is the creator's pre-fault of the mapping running
	// alongside the segment's use (prefault); Close waits for it before
	// unmapping.
	populating sync.WaitGroup

	// waiter is read by every wait; SetWaiter must happen before the
	// segment is used by other goroutines.
	waiter Waiter

	agent *Agent
	ranks []*Rank

	closeOnce sync.Once
	closeErr  error
}

// Create makes a new segment for a node agent: an anonymous memfd (nothing
// in /dev/shm) of the computed size, its size sealed, mapped shared,
// initialised, and the regions every job uses pre-faulted (first touch of
// fresh shared memory costs ~3 µs per 4 KiB page, far more than the copies
// that fill it): all but the rings and the KVS entries. A rank's rings
// are used only if it speaks over shared memory, and then mostly their
// first pages; pre-faulting them made 2 MiB at 64 ranks for jobs whose
// ranks speak the text protocol. The pre-fault runs on while the caller
// starts the ranks: the segment is ready to use when Create returns. Hand
// File() to each rank process, for example with exec.Cmd.ExtraFiles.
func Create(p Params) (*Segment, error) {
	p, err := p.validate()
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	l, err := computeLayout(p)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	if uint64(int(l.total)) != l.total {
		return nil, fmt.Errorf("create segment: %d bytes do not fit this address space", l.total)
	}
	f, err := sys.MemfdCreate("fastpmi-shm")
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	if err := f.Truncate(int64(l.total)); err != nil {
		f.Close()
		return nil, fmt.Errorf("create segment: size memfd: %w", err)
	}
	if err := sys.SealSize(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("create segment: %w", err)
	}
	m, err := mmap.MapRegion(f, int(l.total), mmap.RDWR, 0, 0)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("create segment: map memfd: %w", err)
	}
	s := newSegment(m, l, p)
	s.file, s.mapping = f, m
	s.prefault(m[:l.ringOff], m[l.slotOff:l.kvsEntryOff])
	s.init(p)
	return s, nil
}

// prefault makes every page of the regions resident and writable. Where
// the kernel has MADV_POPULATE_WRITE it does so in the background: the
// advice only maps pages, never writes them, so ranks may use the segment
// meanwhile (a page they touch first is simply theirs to fault). Else it
// writes one byte per page now, while the segment is still private to its
// creator and the writes race with nobody.
func (s *Segment) prefault(regions ...[]byte) {
	if !sys.CanPopulateWrite() {
		for _, b := range regions {
			for i := 0; i < len(b); i += regionAlign {
				b[i] = 0
			}
		}
		return
	}
	s.populating.Go(func() {
		for _, b := range regions {
			_ = sys.PopulateWrite(b) // failing, it leaves each page to fault on its first touch
		}
	})
}

// Open maps the segment whose descriptor a rank inherited (fd, as passed
// by the agent). It takes ownership of fd and closes it once the mapping
// exists (the mapping keeps the memory alive).
func Open(fd uintptr) (*Segment, error) {
	f := os.NewFile(fd, "fastpmi-shm")
	if f == nil {
		return nil, fmt.Errorf("map segment: invalid descriptor %d", fd)
	}
	defer f.Close()
	return OpenFile(f)
}

// OpenFile maps the segment in f and validates its header: magic, layout
// version, sizes, every offset, and the total length against the file's
// size. f stays the caller's; it may be closed once OpenFile returns.
func OpenFile(f *os.File) (*Segment, error) {
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("map segment: %w", err)
	}
	size := fi.Size()
	if size < headerBytes || size > maxTotal || int64(int(size)) != size {
		return nil, fmt.Errorf("map segment: file of %d bytes cannot hold a segment", size)
	}
	m, err := mmap.MapRegion(f, int(size), mmap.RDWR, 0, 0)
	if err != nil {
		return nil, fmt.Errorf("map segment: %w", err)
	}
	l, err := readHeader(m, uint64(size))
	if err != nil {
		m.Unmap()
		return nil, fmt.Errorf("map segment: %w", err)
	}
	s := newSegment(m, l, paramsOf(l))
	s.mapping = m
	return s, nil
}

// FromBytes lays a new segment out in buf, a heap buffer whose first byte
// is 64-byte aligned and which is at least Size(p) long: the same
// algorithms as a memfd segment, visible to the race detector, for tests
// and for goroutine-only setups. Attach a second Segment to the same
// buffer to play the other side.
func FromBytes(buf []byte, p Params) (*Segment, error) {
	p, err := p.validate()
	if err != nil {
		return nil, fmt.Errorf("lay out segment: %w", err)
	}
	l, err := computeLayout(p)
	if err != nil {
		return nil, fmt.Errorf("lay out segment: %w", err)
	}
	if err := checkBuf(buf, l.total); err != nil {
		return nil, fmt.Errorf("lay out segment: %w", err)
	}
	s := newSegment(buf[:l.total:l.total], l, p)
	s.init(p)
	return s, nil
}

// NewHeap allocates a suitably aligned heap buffer and lays a segment out
// in it (see FromBytes). Bytes returns the buffer for Attach.
func NewHeap(p Params) (*Segment, error) {
	n, err := Size(p)
	if err != nil {
		return nil, fmt.Errorf("lay out segment: %w", err)
	}
	return FromBytes(alignedBytes(n), p)
}

// Attach validates the header of a segment already laid out in buf (a
// heap buffer from FromBytes, or any bytes: the validation trusts nothing)
// and returns a Segment over it.
func Attach(buf []byte) (*Segment, error) {
	l, err := readHeader(buf, uint64(len(buf)))
	if err != nil {
		return nil, fmt.Errorf("attach segment: %w", err)
	}
	if err := checkBuf(buf, l.total); err != nil {
		return nil, fmt.Errorf("attach segment: %w", err)
	}
	return newSegment(buf, l, paramsOf(l)), nil
}

// Size returns the byte length of a segment with sizes p.
func Size(p Params) (int, error) {
	l, err := layoutOf(p)
	if err != nil {
		return 0, err
	}
	if uint64(int(l.total)) != l.total {
		return 0, fmt.Errorf("%d bytes do not fit this address space", l.total)
	}
	return int(l.total), nil
}

func checkBuf(buf []byte, total uint64) error {
	if uint64(len(buf)) < total {
		return fmt.Errorf("buffer of %d bytes, layout needs %d", len(buf), total)
	}
	if uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%CacheLine != 0 {
		return fmt.Errorf("buffer is not %d-byte aligned", CacheLine)
	}
	return nil
}

// alignedBytes returns n zero bytes starting on a cache line.
func alignedBytes(n int) []byte {
	b := make([]byte, n+CacheLine)
	skip := (CacheLine - int(uintptr(unsafe.Pointer(unsafe.SliceData(b)))%CacheLine)) % CacheLine
	return b[skip : skip+n : skip+n]
}

func paramsOf(l layout) Params {
	return Params{
		LocalRanks: l.localRanks, WorldSize: l.worldSize, MaxValue: l.maxValue,
		RequestRingBytes: l.reqRing, ResponseRingBytes: l.respRing,
		KVSCapacity: l.kvsCap, KVSKeyMax: l.kvsKeyMax, KVSArenaBytes: int(l.kvsArena),
	}
}

// init writes the header and the starting values of a fresh segment. It
// runs before the segment is shared, so plain and atomic stores alike are
// published by whatever shares it (fork/exec, or the goroutine start).
func (s *Segment) init(p Params) {
	s.l.writeHeader(s.mem)
	s.u32(offEpoch).Store(p.FirstEpoch - 1)
	for i := range s.l.localRanks {
		c := s.ctrl(i)
		for _, off := range [...]uint64{ctlReqTail, ctlRespHead, ctlReqHead, ctlRespTail} {
			s.u64(c + off).Store(p.RingBase)
		}
	}
	s.agent.load()
	s.agent.indexFresh = true // the index is all zero, and nobody else has it yet
	for _, r := range s.ranks {
		r.load()
	}
	// Tag every slot and result entry with an epoch of the other parity,
	// which no epoch stored there can equal: unwritten entries read as
	// ErrStale, never as empty values. This also touches every page.
	le := binary.LittleEndian
	for i := range s.l.localRanks {
		for parity := range uint64(2) {
			le.PutUint32(s.mem[s.slotOff(i, uint32(parity))+slotEpoch:], uint32(parity^1))
		}
	}
	for parity := range uint64(2) {
		for g := range s.l.worldSize {
			le.PutUint32(s.mem[s.resultOff(g, uint32(parity))+resEpoch:], uint32(parity^1))
		}
	}
}

// newSegment builds the Segment and its role handles over mem, whose
// header has been validated or is about to be written for l.
func newSegment(mem []byte, l layout, p Params) *Segment {
	s := &Segment{mem: mem, l: l, p: p, waiter: NewWaiter(l.localRanks + 1)}
	s.agent = newAgent(s)
	s.ranks = make([]*Rank, l.localRanks)
	for i := range s.ranks {
		s.ranks[i] = newRank(s, i)
	}
	return s
}

// Params returns the segment's sizes (defaults filled in).
func (s *Segment) Params() Params { return s.p }

// File returns the memfd of a segment made by Create, for handing to rank
// processes; nil for opened and heap-backed segments. It stays owned by
// the Segment.
func (s *Segment) File() *os.File { return s.file }

// Bytes returns the whole segment's memory (for Attach in tests and
// diagnostics).
func (s *Segment) Bytes() []byte { return s.mem }

// SetWaiter replaces the waiting policy (NewWaiter(LocalRanks+1) by
// default). Call it before the segment's handles are used.
func (s *Segment) SetWaiter(w Waiter) { s.waiter = w }

// Agent returns the agent's handle. There is one per Segment; only the
// agent process uses it, from one goroutine (Kick excepted).
func (s *Segment) Agent() *Agent { return s.agent }

// Rank returns the handle of local rank i, or nil if i is out of range.
// There is one per Segment and local rank; only rank i's process uses it,
// from one goroutine.
func (s *Segment) Rank(i int) *Rank {
	if uint(i) >= uint(len(s.ranks)) {
		return nil
	}
	return s.ranks[i]
}

// Close unmaps the segment and, for the creator, closes the memfd. Ranks
// that mapped the segment keep their mappings. Every view returned by the
// segment and its handles becomes invalid: touching one faults. Close is
// idempotent; later calls return the first call's result.
func (s *Segment) Close() error {
	s.closeOnce.Do(func() {
		s.populating.Wait()
		if s.mapping != nil {
			if err := s.mapping.Unmap(); err != nil {
				s.closeErr = fmt.Errorf("unmap segment: %w", err)
			}
		}
		if s.file != nil {
			if err := s.file.Close(); err != nil && s.closeErr == nil {
				s.closeErr = fmt.Errorf("close segment memfd: %w", err)
			}
		}
		s.mem = nil
	})
	return s.closeErr
}

// Geometry helpers. Indices are checked by the callers; offsets cannot
// overflow because computeLayout bounded the total.

func (s *Segment) u32(off uint64) *atomic.Uint32 {
	b := s.mem[off : off+4]
	return (*atomic.Uint32)(unsafe.Pointer(&b[0]))
}

func (s *Segment) u64(off uint64) *atomic.Uint64 {
	b := s.mem[off : off+8]
	return (*atomic.Uint64)(unsafe.Pointer(&b[0]))
}

func (s *Segment) ctrl(i int) uint64 { return s.l.ctrlOff + uint64(i)*ctrlStride }

// readyWord is the ready-bitmap word holding local rank i's bit.
func (s *Segment) readyWord(i int) *atomic.Uint64 { return s.u64(s.l.readyOff + 8*uint64(i/64)) }

func (s *Segment) reqRing(i int) []byte {
	off := s.l.ringOff + uint64(i)*s.l.ringStride
	return s.mem[off : off+uint64(s.l.reqRing) : off+uint64(s.l.reqRing)]
}

func (s *Segment) respRing(i int) []byte {
	off := s.l.ringOff + uint64(i)*s.l.ringStride + uint64(s.l.reqRing)
	return s.mem[off : off+uint64(s.l.respRing) : off+uint64(s.l.respRing)]
}

func (s *Segment) slotOff(i int, epoch uint32) uint64 {
	return s.l.slotOff + (2*uint64(i)+uint64(epoch&1))*s.l.slotBytes
}

func (s *Segment) resultOff(g int, epoch uint32) uint64 {
	return s.l.resultOff + uint64(epoch&1)*s.l.resultBufBytes + uint64(g)*s.l.resultStride
}

// Shared events.

func (s *Segment) doorbell() event {
	return event{word: s.u32(offDoorbell), sleepers: s.u32(offAgentSleepers), w: &s.waiter}
}

func (s *Segment) epochEvent() event {
	return event{word: s.u32(offEpochWake), sleepers: s.u32(offEpochSleepers), w: &s.waiter}
}

func (s *Segment) rankEvent(i int) event {
	c := s.ctrl(i)
	return event{word: s.u32(c + ctlRankWake), sleepers: s.u32(c + ctlRankSleepers), w: &s.waiter}
}

// reached reports whether epoch counter cur has reached want, with both
// free-running and wrapping at 2^32 (valid while they are less than 2^31
// apart).
func reached(cur, want uint32) bool { return int32(cur-want) >= 0 }

// epochValue reads the value of the entry at off, an input slot or a
// result entry (both are length, epoch, then the bytes; layout.go), if it
// holds epoch: ErrStale if it holds another, ErrCorrupt if its length is
// past MaxValue.
func (s *Segment) epochValue(off uint64, epoch uint32) ([]byte, error) {
	le := binary.LittleEndian
	if le.Uint32(s.mem[off+resEpoch:]) != epoch {
		return nil, ErrStale
	}
	n := uint64(le.Uint32(s.mem[off+resLen:]))
	if n > uint64(s.l.maxValue) {
		return nil, ErrCorrupt
	}
	return s.mem[off+resData : off+resData+n : off+resData+n], nil
}
