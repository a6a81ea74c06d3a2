package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"
)

// The cross-process stress test: stressRanks children each push
// stressMsgs messages through their request ring; the test process is the
// agent and checks every sequence number, length and checksum. Rings are
// small (lots of wrap-around, full rings, sleeping producers), their
// counters start just below 2^64, sequence numbers just below 2^32, and the
// two closing allgather epochs straddle 2^32.
const (
	stressRanks   = 32
	stressMsgs    = 1 << 15 // per rank: 32 × 32768 = 1,048,576 messages
	stressRing    = 4096
	stressSeq0    = ^uint32(0) - 1000
	stressEpoch0  = ^uint32(0)        // epochs 2^32-1 and 0
	stressBase    = ^uint64(0) - 5007 // record-aligned, 5008 bytes below 2^64
	opData        = 1
	opDone        = 2
	opGather      = 3
	opAck         = 4
	stressTimeout = 20 * time.Second
)

// stressPayload fills b with message k of rank i and returns its length:
// an 8-byte FNV-1a checksum of the data, then 0-55 data bytes.
func stressPayload(b []byte, i int, seq uint32) int {
	n := 8 + int(seq*31+uint32(i))%56
	for j := 8; j < n; j++ {
		b[j] = byte(seq*7 + uint32(j)*13 + uint32(i))
	}
	binary.LittleEndian.PutUint64(b, fnv1a(b[8:n]))
	return n
}

func gatherValue(g int, epoch uint32) []byte {
	return []byte(fmt.Sprintf("rank %d epoch %d", g, epoch))
}

func stressChild(r *Rank) error {
	var buf [64]byte
	req := r.Requests()
	for k := range uint32(stressMsgs) {
		seq := stressSeq0 + k
		n := stressPayload(buf[:], r.Index(), seq)
		if err := req.PushWait(Header{Op: opData, Seq: seq}, buf[:n], stressTimeout); err != nil {
			return fmt.Errorf("push message %d: %w", k, err)
		}
	}
	binary.LittleEndian.PutUint32(buf[:], stressMsgs)
	if err := req.PushWait(Header{Op: opDone}, buf[:4], stressTimeout); err != nil {
		return fmt.Errorf("push done: %w", err)
	}
	resp := r.Responses()
	if err := resp.Wait(stressTimeout); err != nil {
		return fmt.Errorf("wait for ack: %w", err)
	}
	m, err := resp.Peek()
	if err != nil {
		return fmt.Errorf("read ack: %w", err)
	}
	if m.Op != opAck || len(m.Payload) != 4 || binary.LittleEndian.Uint32(m.Payload) != stressMsgs {
		return fmt.Errorf("ack %+v %x: agent did not verify all %d messages", m.Header, m.Payload, stressMsgs)
	}
	resp.Release()
	for k := range uint32(2) {
		e := stressEpoch0 + k
		if err := r.SetSlot(e, gatherValue(r.Index(), e)); err != nil {
			return err
		}
		if err := req.PushWait(Header{Op: opGather, Epoch: e}, nil, stressTimeout); err != nil {
			return fmt.Errorf("push gather %d: %w", e, err)
		}
		if err := r.WaitEpoch(e, stressTimeout); err != nil {
			return fmt.Errorf("wait for epoch %d: %w", e, err)
		}
		for g := range r.s.Params().WorldSize {
			v, err := r.Result(g, e)
			if err != nil {
				return fmt.Errorf("result %d of epoch %d: %w", g, e, err)
			}
			if string(v) != string(gatherValue(g, e)) {
				return fmt.Errorf("result %d of epoch %d is %q", g, e, v)
			}
		}
	}
	return nil
}

func TestCrossProcessStress(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("cross-process stress: skipped in -short and -race runs (the race detector cannot see mmap'd memory)")
	}
	seg, err := Create(Params{
		LocalRanks: stressRanks, MaxValue: 64, RequestRingBytes: stressRing, ResponseRingBytes: minRingBytes,
		KVSCapacity: 1, FirstEpoch: stressEpoch0, RingBase: stressBase,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer seg.Close()
	if cpus := onlineCPUs(); stressRanks+1 > cpus && seg.waiter.Spins() != 0 {
		t.Fatalf("waiter spins with %d parties on %d cpus", stressRanks+1, cpus)
	}
	start := time.Now()
	exits := startChildren(t, seg, "stress", stressRanks)
	a := seg.Agent()

	next := make([]uint32, stressRanks) // next expected sequence number per rank
	for i := range next {
		next[i] = stressSeq0
	}
	var verified, wakes int
	var ready []int
	finished, exited := 0, 0
	gathered := map[uint32]int{}
	epoch := stressEpoch0
	for exited < stressRanks {
		select {
		case err := <-exits:
			if err != nil {
				t.Fatal(err)
			}
			exited++
			continue
		default:
		}
		if err := a.Wait(100 * time.Millisecond); err != nil && !errors.Is(err, ErrTimeout) {
			t.Fatal(err)
		} else if err != nil && time.Since(start) > 3*stressTimeout {
			t.Fatalf("agent stalled: verified %d, next %v", verified, next)
		}
		wakes++
		// Only the rings the ready bitmap names, as the agent does: a
		// missed mark stalls the test.
		ready = a.TakeReady(ready[:0])
		for _, i := range ready {
			c := a.Requests(i)
			for {
				m, err := c.Peek()
				if err == ErrEmpty {
					break
				}
				if err != nil {
					t.Fatalf("rank %d: %v", i, err)
				}
				switch m.Op {
				case opData:
					if m.Seq != next[i] {
						t.Fatalf("rank %d: sequence %d, want %d", i, m.Seq, next[i])
					}
					var want [64]byte
					n := stressPayload(want[:], i, m.Seq)
					if len(m.Payload) != n || binary.LittleEndian.Uint64(m.Payload) != fnv1a(m.Payload[8:]) ||
						string(m.Payload) != string(want[:n]) {
						t.Fatalf("rank %d seq %d: payload %x, want %x", i, m.Seq, m.Payload, want[:n])
					}
					next[i]++
					verified++
				case opDone:
					got := next[i] - stressSeq0
					if binary.LittleEndian.Uint32(m.Payload) != got {
						t.Fatalf("rank %d sent %d messages, agent saw %d", i, binary.LittleEndian.Uint32(m.Payload), got)
					}
					var ack [4]byte
					binary.LittleEndian.PutUint32(ack[:], got)
					if err := a.Responses(i).PushWait(Header{Op: opAck}, ack[:], stressTimeout); err != nil {
						t.Fatal(err)
					}
					finished++
				case opGather:
					gathered[m.Epoch]++
				default:
					t.Fatalf("rank %d: unexpected op %d", i, m.Op)
				}
				c.Release()
			}
		}
		if gathered[epoch] == stressRanks {
			for i := range stressRanks {
				v, err := a.Slot(i, epoch)
				if err != nil {
					t.Fatalf("slot %d epoch %d: %v", i, epoch, err)
				}
				if err := a.SetResult(i, epoch, v); err != nil {
					t.Fatal(err)
				}
			}
			a.Publish(epoch)
			epoch++
		}
	}
	if verified != stressRanks*stressMsgs || finished != stressRanks || epoch != 1 { // 2^32-1, then 0, next 1
		t.Fatalf("verified %d messages, %d ranks finished, next epoch %d", verified, finished, epoch)
	}
	for i := range stressRanks {
		if st, pid := a.RankState(i); st != RankFinalized || pid == 0 {
			t.Errorf("rank %d: state %d pid %d", i, st, pid)
		}
	}
	el := time.Since(start)
	t.Logf("%d messages from %d processes in %v (%.0f ns/message), agent woke %d times",
		verified, stressRanks, el.Round(time.Millisecond), float64(el.Nanoseconds())/float64(verified), wakes)
}
