package shm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"
)

// ringPair returns both ends of local rank 0's request ring in a heap
// segment whose counters start at base.
func ringPair(t *testing.T, ringBytes int, base uint64) (*Producer, *Consumer, *Segment) {
	t.Helper()
	seg, err := NewHeap(Params{LocalRanks: 1, RequestRingBytes: ringBytes, KVSCapacity: 1, RingBase: base})
	if err != nil {
		t.Fatal(err)
	}
	return seg.Rank(0).Requests(), seg.Agent().Requests(0), seg
}

// TestRingDifferential pushes and pops random-sized messages in random
// interleavings and compares the ring with a naive slice queue, with the
// counters starting 2 KiB below 2^64 so they wrap early.
func TestRingDifferential(t *testing.T) {
	for _, size := range []int{minRingBytes, 1024, 4096} {
		p, c, _ := ringPair(t, size, ^uint64(0)-2047)
		rng := rand.New(rand.NewPCG(uint64(size), 1))
		var model [][]byte
		var seq uint32 = ^uint32(0) - 100
		pads, fulls := 0, 0
		for step := range 200000 {
			if rng.IntN(2) == 0 {
				n := rng.IntN(p.MaxPayload() + 1)
				if rng.IntN(4) != 0 {
					n = rng.IntN(40)
				}
				msg := make([]byte, n)
				for j := range msg {
					msg[j] = byte(rng.Uint32())
				}
				before := p.pos & p.mask
				err := p.Push(Header{Op: uint16(n), Flags: 7, Seq: seq, Epoch: uint32(step)}, msg)
				if errors.Is(err, ErrFull) {
					fulls++
					// ErrFull must mean the record (and its pad) really does not fit.
					rec := alignUp(MsgHeaderLen+uint64(n), recordAlign)
					if room := uint64(size) - before; room < rec {
						rec += room
					}
					if free := uint64(size) - (p.pos - c.pos); free >= rec {
						t.Fatalf("step %d: ErrFull with %d bytes free for a %d-byte record", step, free, rec)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d: push %d bytes: %v", step, n, err)
				}
				if p.pos&p.mask < before && p.pos&p.mask != 0 {
					pads++
				}
				model = append(model, msg)
				seq++
				continue
			}
			m, err := c.Peek()
			if len(model) == 0 {
				if err != ErrEmpty {
					t.Fatalf("step %d: peek on empty ring: %+v %v", step, m, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: peek: %v", step, err)
			}
			want := model[0]
			if int(m.Op) != len(want) || m.Flags != 7 || !bytes.Equal(m.Payload, want) {
				t.Fatalf("step %d: got op %d %x, want %d %x", step, m.Op, m.Payload, len(want), want)
			}
			if m2, _ := c.Peek(); m2.Seq != m.Seq {
				t.Fatalf("second peek returned another message")
			}
			c.Release()
			model = model[1:]
		}
		if c.pos < 1<<20 {
			t.Fatalf("ring %d: consumer at %d: counters did not wrap", size, c.pos)
		}
		if pads == 0 || fulls == 0 {
			t.Fatalf("ring %d: %d pad records, %d full rings: test exercised too little", size, pads, fulls)
		}
	}
}

func TestRingLimits(t *testing.T) {
	p, c, _ := ringPair(t, minRingBytes, 0)
	if p.MaxPayload() != minRingBytes/2-MsgHeaderLen {
		t.Fatalf("max payload %d", p.MaxPayload())
	}
	if _, err := p.Reserve(p.MaxPayload() + 1); err != ErrTooLarge {
		t.Fatalf("oversized reserve: %v", err)
	}
	if err := p.Commit(Header{}, 0); err == nil {
		t.Fatal("commit without reservation succeeded")
	}
	b, err := p.Reserve(10)
	if err != nil {
		t.Fatal(err)
	}
	copy(b, "0123456789")
	if err := p.Commit(Header{Op: OpPad}, 4); err == nil {
		t.Fatal("commit with the pad op succeeded")
	}
	if err := p.Commit(Header{Op: 1}, 11); err == nil {
		t.Fatal("commit beyond the reservation succeeded")
	}
	if err := p.Commit(Header{Op: 1}, 4); err != nil { // shrink to 4 bytes
		t.Fatal(err)
	}
	m, err := c.Peek()
	if err != nil || string(m.Payload) != "0123" {
		t.Fatalf("peek after shrunk commit: %q %v", m.Payload, err)
	}
	c.Release()
	c.Release() // a second Release without Peek is a no-op
	if n := c.Len(); n != 0 {
		t.Fatalf("len %d after release", n)
	}
	// Fill the ring exactly, then one more byte does not fit.
	for i := range minRingBytes / 32 {
		if err := p.Push(Header{Op: 1}, make([]byte, 16)); err != nil {
			t.Fatalf("push %d: %v", i, err)
		}
	}
	if err := p.Push(Header{Op: 1}, nil); err != ErrFull {
		t.Fatalf("push into a full ring: %v", err)
	}
}

// TestRingCorrupt checks that impossible records and counters written by
// a misbehaving peer are reported, never followed out of bounds.
func TestRingCorrupt(t *testing.T) {
	cases := []struct {
		name  string
		wreck func(p *Producer, c *Consumer)
	}{
		{"tail too far", func(p *Producer, c *Consumer) { p.tail.Store(c.pos + 2*minRingBytes) }},
		{"tail misaligned", func(p *Producer, c *Consumer) { p.tail.Store(c.pos + 8) }},
		{"length too big", func(p *Producer, c *Consumer) { binary.LittleEndian.PutUint32(p.data[msgLen:], 1<<30) }},
		{"length past tail", func(p *Producer, c *Consumer) { binary.LittleEndian.PutUint32(p.data[msgLen:], 100) }},
		{"bad pad", func(p *Producer, c *Consumer) { binary.LittleEndian.PutUint16(p.data[msgOp:], OpPad) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, c, _ := ringPair(t, minRingBytes, 0)
			if err := p.Push(Header{Op: 1}, []byte("hello")); err != nil {
				t.Fatal(err)
			}
			tc.wreck(p, c)
			if _, err := c.Peek(); !errors.Is(err, ErrCorrupt) {
				t.Fatalf("peek: %v, want ErrCorrupt", err)
			}
		})
	}
	p, _, _ := ringPair(t, minRingBytes, 0)
	p.head.Store(p.pos + 4*minRingBytes) // consumer claims to be ahead of the producer
	p.headCache = p.pos - minRingBytes   // force a reload
	if err := p.Push(Header{Op: 1}, make([]byte, 100)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("push with an impossible head: %v", err)
	}
}
