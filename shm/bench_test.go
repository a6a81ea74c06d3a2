package shm

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"
	"time"
)

const benchTimeout = 30 * time.Second

// pingPongChild answers every response with a request, rounds times.
func pingPongChild(r *Rank, rounds int) error { return rankPingPong(r, rounds, benchTimeout) }

// rankPingPong is the rank's side of a ping-pong: it answers every
// response with a request, rounds times, each wait bounded by timeout.
func rankPingPong(r *Rank, rounds int, timeout time.Duration) error {
	req, resp := r.Requests(), r.Responses()
	for k := range rounds {
		if err := resp.Wait(timeout); err != nil {
			return fmt.Errorf("round %d: %w", k, err)
		}
		m, err := resp.Peek()
		if err != nil {
			return err
		}
		h := m.Header
		resp.Release()
		if err := req.Push(h, nil); err != nil {
			return fmt.Errorf("round %d: %w", k, err)
		}
	}
	return nil
}

// agentPingPong is the agent's side of b.N rounds with local rank 0: it
// pushes a response and waits for the rank's request, each wait bounded
// by timeout; peer reports how the rank's side ended.
func agentPingPong(b *testing.B, a *Agent, timeout time.Duration, peer <-chan error) {
	in, out := a.Requests(0), a.Responses(0)
	ready := make([]int, 0, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for k := range b.N {
		if err := out.Push(Header{Seq: uint32(k)}, nil); err != nil {
			b.Fatal(err)
		}
		if err := a.Wait(timeout); err != nil {
			b.Fatal(err)
		}
		ready = a.TakeReady(ready[:0])
		m, err := in.Peek()
		if err != nil || m.Seq != uint32(k) {
			b.Fatalf("round %d: %+v %v", k, m.Header, err)
		}
		in.Release()
	}
	b.StopTimer()
	if err := <-peer; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPingPong measures a hand-off round trip between two processes
// through the rings: the agent (this process) pushes a response, the rank
// (a child process) waits for it and pushes a request back, the agent
// waits for that. "futex" sleeps at once on both sides (the futex floor);
// "spin" busy-waits first, which pays only with a free CPU for each side.
func BenchmarkPingPong(b *testing.B) {
	for _, mode := range []struct {
		name  string
		spins int
	}{{"futex", 0}, {"spin", 1 << 20}} {
		b.Run(mode.name, func(b *testing.B) {
			seg, err := Create(Params{LocalRanks: 1, KVSCapacity: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer seg.Close()
			seg.SetWaiter(SpinWaiter(mode.spins))
			exits := startChildren(b, seg, "pingpong", 1,
				envRounds+"="+strconv.Itoa(b.N), envSpin+"="+strconv.Itoa(mode.spins))
			agentPingPong(b, seg.Agent(), benchTimeout, exits)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(2*b.N), "ns/handoff")
		})
	}
}

// BenchmarkRing measures the SPSC ring: "push+pop" is one goroutine
// pushing and popping a 64-byte message (the pure cost); "2goroutines"
// has a producer and a consumer goroutine over a heap segment.
func BenchmarkRing(b *testing.B) {
	payload := make([]byte, 64)
	b.Run("push+pop", func(b *testing.B) {
		seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
		if err != nil {
			b.Fatal(err)
		}
		p, c := seg.Rank(0).Requests(), seg.Agent().Requests(0)
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		for k := range b.N {
			if err := p.Push(Header{Op: 1, Seq: uint32(k)}, payload); err != nil {
				b.Fatal(err)
			}
			m, err := c.Peek()
			if err != nil || m.Seq != uint32(k) {
				b.Fatal(err)
			}
			c.Release()
		}
	})
	b.Run("2goroutines", func(b *testing.B) {
		seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
		if err != nil {
			b.Fatal(err)
		}
		seg.SetWaiter(NewWaiter(2))
		p, c := seg.Rank(0).Requests(), seg.Agent().Requests(0)
		errc := make(chan error, 1)
		b.SetBytes(int64(len(payload)))
		b.ReportAllocs()
		b.ResetTimer()
		go func() {
			for k := range b.N {
				if err := p.PushWait(Header{Op: 1, Seq: uint32(k)}, payload, benchTimeout); err != nil {
					errc <- err
					return
				}
			}
			errc <- nil
		}()
		for k := range b.N {
			if err := c.Wait(benchTimeout); err != nil {
				b.Fatal(err)
			}
			m, err := c.Peek()
			if err != nil || m.Seq != uint32(k) {
				b.Fatalf("message %d: %+v %v", k, m.Header, err)
			}
			c.Release()
		}
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	})
}

// allgatherValueLen is the value size of the allgather benchmark, a
// typical MPICH business card.
const allgatherValueLen = 256

// allgatherChild runs rounds+1 allgather rounds as local rank r: write its
// value into its slot, request the epoch, wait for it, read every entry in
// place and check its first bytes.
func allgatherChild(r *Rank, rounds int) error {
	p := r.s.Params().WorldSize
	req := r.Requests()
	for e := range uint32(rounds + 1) {
		buf := r.SlotBuf(e)
		binary.LittleEndian.PutUint32(buf, uint32(r.Index())^e)
		if err := r.CommitSlot(e, allgatherValueLen); err != nil {
			return err
		}
		if err := req.PushWait(Header{Op: opGather, Epoch: e}, nil, benchTimeout); err != nil {
			return fmt.Errorf("epoch %d: %w", e, err)
		}
		if err := r.WaitEpoch(e, benchTimeout); err != nil {
			return fmt.Errorf("epoch %d: %w", e, err)
		}
		for g := range p {
			v, err := r.Result(g, e)
			if err != nil {
				return fmt.Errorf("epoch %d entry %d: %w", e, g, err)
			}
			if len(v) != allgatherValueLen || binary.LittleEndian.Uint32(v) != uint32(g)^e {
				return fmt.Errorf("epoch %d entry %d: wrong value", e, g)
			}
		}
	}
	return nil
}

// BenchmarkAllgather measures one allgather round over the per-node path
// with P rank processes on this node (real processes, futex waiting when
// they outnumber the CPUs): every rank writes a 256-byte value into its
// slot and pushes a request; the agent waits for all P, copies each slot
// into the result array, publishes the epoch; every rank waits for it and
// reads all P entries in place.
func BenchmarkAllgather(b *testing.B) {
	for _, p := range []int{2, 8, 16, 64} {
		b.Run("P="+strconv.Itoa(p), func(b *testing.B) {
			seg, err := Create(Params{LocalRanks: p, MaxValue: allgatherValueLen, KVSCapacity: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer seg.Close()
			exits := startChildren(b, seg, "allgather", p, envRounds+"="+strconv.Itoa(b.N))
			a := seg.Agent()
			ready := make([]int, 0, p)
			b.ReportAllocs()
			for e := range uint32(b.N + 1) {
				if e == 1 {
					b.ResetTimer() // round 0 includes the children's start-up
				}
				for got := 0; got < p; {
					if err := a.Wait(benchTimeout); err != nil {
						b.Fatalf("epoch %d: %d of %d requests: %v", e, got, p, err)
					}
					ready = a.TakeReady(ready[:0]) // every ring is scanned below
					for i := range p {
						c := a.Requests(i)
						for {
							m, err := c.Peek()
							if err == ErrEmpty {
								break
							}
							if err != nil || m.Epoch != e {
								b.Fatalf("rank %d: %+v %v", i, m.Header, err)
							}
							c.Release()
							got++
						}
					}
				}
				for i := range p {
					v, err := a.Slot(i, e)
					if err != nil {
						b.Fatal(err)
					}
					if err := a.SetResult(i, e, v); err != nil {
						b.Fatal(err)
					}
				}
				a.Publish(e)
			}
			b.StopTimer()
			for range p {
				if err := <-exits; err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*p), "ns/rank")
		})
	}
}
