package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestHeapNode runs a whole node over a heap segment with goroutines, so
// the race detector checks every publication edge (run it with -race):
// each rank goroutine owns its own Segment attached to the same buffer,
// sends data messages (checked by sequence and checksum), asks for
// responses, and runs allgather+fence epochs across the 2^32 wrap while
// the agent fills remote entries of a larger world, puts KVS keys and
// publishes.
func TestHeapNode(t *testing.T) {
	for _, w := range []struct {
		name string
		w    Waiter
	}{{"sleep", Waiter{}}, {"spin", SpinWaiter(defaultSpins)}} {
		t.Run(w.name, func(t *testing.T) { testHeapNode(t, w.w) })
	}
}

const (
	opEcho = 5
	opPut  = 6
)

func testHeapNode(t *testing.T, w Waiter) {
	const (
		nlocal = 5
		world  = 12 // global ranks nlocal..world-1 live on "other nodes"
		msgs   = 3000
		epochs = 40
		e0     = ^uint32(0) - 20
	)
	timeout := 20 * time.Second
	seg, err := NewHeap(Params{
		LocalRanks: nlocal, WorldSize: world, MaxValue: 48, RequestRingBytes: 512, ResponseRingBytes: 256,
		KVSCapacity: nlocal * epochs, KVSKeyMax: 16, FirstEpoch: e0, RingBase: ^uint64(0) - 255,
	})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(w)
	key := func(i int, e uint32) []byte { return []byte(fmt.Sprintf("k%d.%d", i, e)) }
	val := func(i int, e uint32) []byte { return []byte(fmt.Sprintf("value of %d in %d", i, e)) }

	var wg sync.WaitGroup
	errs := make(chan error, nlocal)
	for i := range nlocal {
		view, err := Attach(seg.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		view.SetWaiter(w)
		r := view.Rank(i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- heapRank(r, msgs, epochs, e0, world, key, val, timeout)
		}()
	}

	a := seg.Agent()
	var ready []int
	next := make([]uint32, nlocal)
	gathered := map[uint32]int{}
	pending := map[uint32][][2][]byte{} // KVS puts waiting for their fence
	epoch, end := e0, e0
	end += epochs // wraps past 2^32
	for epoch != end {
		if err := a.Wait(timeout); err != nil {
			t.Fatalf("agent wait at epoch %d: %v", epoch, err)
		}
		// Only the marked rings have requests; all are scanned anyway, to
		// check that no marked ring is ever missed.
		ready = a.TakeReady(ready[:0])
		for i := range nlocal {
			c := a.Requests(i)
			for {
				m, err := c.Peek()
				if err == ErrEmpty {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				switch m.Op {
				case opData:
					if m.Seq != next[i] || binary.LittleEndian.Uint64(m.Payload) != fnv1a(m.Payload[8:]) {
						t.Fatalf("rank %d: message %d (want %d) fails its checksum", i, m.Seq, next[i])
					}
					next[i]++
				case opEcho:
					if err := a.Responses(i).PushWait(Header{Op: opEcho, Seq: m.Seq}, m.Payload, timeout); err != nil {
						t.Fatal(err)
					}
				case opPut:
					k := int(m.Flags)
					pending[m.Epoch] = append(pending[m.Epoch], [2][]byte{m.Payload[:k:k], append([]byte(nil), m.Payload[k:]...)})
				case opGather:
					gathered[m.Epoch]++
				}
				c.Release()
			}
		}
		if gathered[epoch] < nlocal {
			continue
		}
		for i := range nlocal {
			v, err := a.Slot(i, epoch)
			if err != nil {
				t.Fatalf("slot %d epoch %d: %v", i, epoch, err)
			}
			if err := a.SetResult(i, epoch, v); err != nil {
				t.Fatal(err)
			}
		}
		for g := nlocal; g < world; g++ { // what the tree broadcast would bring
			b, _ := a.ResultBuf(g, epoch)
			n := copy(b, gatherValue(g, epoch))
			if err := a.CommitResult(g, epoch, n); err != nil {
				t.Fatal(err)
			}
		}
		for _, kv := range pending[epoch] {
			if err := a.KVSPut(kv[0], kv[1], epoch); err != nil {
				t.Fatalf("put %q: %v", kv[0], err)
			}
		}
		delete(pending, epoch)
		delete(gathered, epoch)
		a.Publish(epoch)
		epoch++
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	for i := range nlocal {
		if next[i] != msgs {
			t.Errorf("rank %d: agent saw %d messages, want %d", i, next[i], msgs)
		}
	}
	if a.KVSLen() != nlocal*epochs {
		t.Errorf("kvs holds %d entries, want %d", a.KVSLen(), nlocal*epochs)
	}
}

// heapRank is one rank of TestHeapNode. Per epoch it sends a share of its
// data messages, an echo request (and checks the echo), a put, then its
// allgather value; it waits for the epoch and checks every result entry
// and every key put so far by any rank.
func heapRank(r *Rank, msgs, epochs int, e0 uint32, world int, key func(int, uint32) []byte, val func(int, uint32) []byte, timeout time.Duration) error {
	i := r.Index()
	r.Announce()
	req, resp := r.Requests(), r.Responses()
	var buf [40]byte
	seq := uint32(0)
	for k := range uint32(epochs) {
		e := e0 + k
		for ; int(seq) < msgs*int(k+1)/epochs; seq++ {
			n := 8 + int(seq)%32
			for j := 8; j < n; j++ {
				buf[j] = byte(seq) ^ byte(j)
			}
			binary.LittleEndian.PutUint64(buf[:], fnv1a(buf[8:n]))
			if err := req.PushWait(Header{Op: opData, Seq: seq}, buf[:n], timeout); err != nil {
				return fmt.Errorf("rank %d message %d: %w", i, seq, err)
			}
		}
		echo := []byte(fmt.Sprintf("echo %d %d", i, e))
		if err := req.PushWait(Header{Op: opEcho, Seq: e}, echo, timeout); err != nil {
			return err
		}
		if err := resp.Wait(timeout); err != nil {
			return fmt.Errorf("rank %d: wait for echo: %w", i, err)
		}
		m, err := resp.Peek()
		if err != nil || m.Seq != e || string(m.Payload) != string(echo) {
			return fmt.Errorf("rank %d: echo %+v %q %v", i, m.Header, m.Payload, err)
		}
		resp.Release()
		kv := append(key(i, e), val(i, e)...)
		if err := req.PushWait(Header{Op: opPut, Flags: uint16(len(key(i, e))), Epoch: e}, kv, timeout); err != nil {
			return err
		}
		if err := r.SetSlot(e, gatherValue(i, e)); err != nil {
			return err
		}
		if _, err := r.Result(0, e); !errors.Is(err, ErrNotPublished) {
			return fmt.Errorf("rank %d: result of unpublished epoch %d: %v", i, e, err)
		}
		if err := req.PushWait(Header{Op: opGather, Epoch: e}, nil, timeout); err != nil {
			return err
		}
		if err := r.WaitEpoch(e, timeout); err != nil {
			return fmt.Errorf("rank %d: wait for epoch %d: %w", i, e, err)
		}
		for g := range world {
			v, err := r.Result(g, e)
			if err != nil || string(v) != string(gatherValue(g, e)) {
				return fmt.Errorf("rank %d: result %d of epoch %d: %q %v", i, g, e, v, err)
			}
		}
		if k > 0 { // e-1 lives in the other buffer and stays intact until this rank requests e+1
			if v, err := r.Result(0, e-1); err != nil || string(v) != string(gatherValue(0, e-1)) {
				return fmt.Errorf("rank %d: result of epoch %d: %q %v", i, e-1, v, err)
			}
		}
		if k > 1 { // e-2 shared e's buffer and is gone
			if _, err := r.Result(0, e-2); !errors.Is(err, ErrStale) {
				return fmt.Errorf("rank %d: result of epoch %d: %v, want ErrStale", i, e-2, err)
			}
		}
		for j := range r.s.Params().LocalRanks {
			v, ok := r.Lookup(key(j, e))
			if !ok || string(v) != string(val(j, e)) {
				return fmt.Errorf("rank %d: lookup %q after epoch %d: %q %v", i, key(j, e), e, v, ok)
			}
		}
		if _, ok := r.Lookup(key(i, e+1)); ok {
			return fmt.Errorf("rank %d: lookup of a key not yet put succeeded", i)
		}
	}
	if int(seq) != msgs {
		return fmt.Errorf("rank %d sent %d messages", i, seq)
	}
	r.SetState(RankFinalized)
	return nil
}
