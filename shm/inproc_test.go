package shm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// parkedNow is the number of in-process sleepers registered in the
// process's park table.
func parkedNow() int {
	n := 0
	for i := range parkTable {
		n += int(parkTable[i].n.Load())
	}
	return n
}

// checkParkerIdle fails unless p's channel is empty, as it must be
// whenever its owner is outside wait.
func checkParkerIdle(t *testing.T, what string, p *parker) {
	t.Helper()
	if len(p.ch) != 0 {
		t.Fatalf("%s: a wake-up token is left in the parker", what)
	}
}

// Operations of the ping-pong test's requests.
const (
	opPingData  = 1 // answered with the same header and payload
	opPingEpoch = 2 // Epoch: published once every rank asked for it
	opPingDone  = 3 // the rank is finished; no answer
)

// TestInProcessPingPong runs many goroutine ranks through one heap segment
// with InProcessWaiter, all of them sleeping without any time bound but
// their context's: each rank sends bursts of requests larger than its
// request ring (so it also sleeps as a producer), waits for every echo
// (checked by sequence number and payload), and every few bursts waits
// for an epoch that the agent publishes once all ranks asked for it. The
// agent sleeps on its doorbell between sweeps. A missed wake-up leaves a
// party asleep until its context or the agent's 10 s idle limit ends the
// test. "views" gives every rank goroutine its own Attach view of the
// memory, so sleepers and signallers meet only by the word's address.
func TestInProcessPingPong(t *testing.T) {
	for _, views := range []bool{false, true} {
		name := "one-segment"
		if views {
			name = "views"
		}
		t.Run(name, func(t *testing.T) { testInProcessPingPong(t, views) })
	}
	if n := parkedNow(); n != 0 {
		t.Fatalf("%d in-process sleepers left registered", n)
	}
}

func testInProcessPingPong(t *testing.T, views bool) {
	ranks, bursts := 64, 150
	if raceEnabled || testing.Short() {
		ranks, bursts = 16, 60
	}
	const (
		burst      = 12 // requests in flight per rank: more than the request ring holds
		epochEvery = 5  // bursts between epochs
		e0         = ^uint32(0) - 3
	)
	seg, err := NewHeap(Params{
		LocalRanks: ranks, KVSCapacity: 1, RequestRingBytes: 256, ResponseRingBytes: 512,
		FirstEpoch: e0, RingBase: ^uint64(0) - 319,
	})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(InProcessWaiter())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	var wg sync.WaitGroup
	errs := make(chan error, ranks+1)
	for i := range ranks {
		s := seg
		if views {
			if s, err = Attach(seg.Bytes()); err != nil {
				t.Fatal(err)
			}
			s.SetWaiter(InProcessWaiter())
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pingPongRank(ctx, s.Rank(i), bursts, burst, epochEvery, e0); err != nil {
				errs <- fmt.Errorf("rank %d: %w", i, err)
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := pingPongAgent(seg.Agent(), ranks); err != nil {
			errs <- fmt.Errorf("agent: %w", err)
			cancel()
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	checkParkerIdle(t, "agent", &seg.Agent().park)
	for i := range ranks {
		checkParkerIdle(t, "rank epoch", &seg.Rank(i).park)
	}
	counts := []*atomic.Uint32{seg.u32(offAgentSleepers), seg.u32(offEpochSleepers)}
	for i := range ranks {
		counts = append(counts, seg.u32(seg.ctrl(i)+ctlRankSleepers))
	}
	for _, c := range counts {
		if n := c.Load(); n != 0 {
			t.Fatalf("sleeper count %d after the run", n)
		}
	}
}

func pingPongRank(ctx context.Context, r *Rank, bursts, burst, epochEvery int, e0 uint32) error {
	req, resp := r.Requests(), r.Responses()
	var payload [8]byte
	seq := uint32(0)
	epoch := e0
	for b := range bursts {
		first := seq
		for range burst {
			binary.LittleEndian.PutUint32(payload[:], uint32(r.Index()))
			binary.LittleEndian.PutUint32(payload[4:], seq)
			if err := req.PushWait(Header{Op: opPingData, Seq: seq}, payload[:], 10*time.Second); err != nil {
				return fmt.Errorf("burst %d: push %d: %w", b, seq, err)
			}
			seq++
		}
		for want := first; want != seq; want++ {
			if err := resp.WaitContext(ctx); err != nil {
				return fmt.Errorf("burst %d: wait for echo %d: %w", b, want, err)
			}
			m, err := resp.Peek()
			if err != nil {
				return err
			}
			if m.Seq != want || len(m.Payload) != 8 || binary.LittleEndian.Uint32(m.Payload) != uint32(r.Index()) ||
				binary.LittleEndian.Uint32(m.Payload[4:]) != want {
				return fmt.Errorf("burst %d: echo %+v %x, want seq %d", b, m.Header, m.Payload, want)
			}
			resp.Release()
		}
		if b%epochEvery == epochEvery-1 {
			epoch++
			if err := req.PushWait(Header{Op: opPingEpoch, Epoch: epoch}, nil, 10*time.Second); err != nil {
				return err
			}
			if err := r.WaitEpochContext(ctx, epoch); err != nil {
				return fmt.Errorf("epoch %d: %w", epoch, err)
			}
		}
	}
	return req.PushWait(Header{Op: opPingDone}, nil, 10*time.Second)
}

func pingPongAgent(a *Agent, ranks int) error {
	asked := map[uint32]int{}
	done := 0
	var ready []int
	for done < ranks {
		if err := a.Wait(10 * time.Second); err != nil {
			return fmt.Errorf("%d of %d ranks done, none heard from for 10 s: %w", done, ranks, err)
		}
		ready = a.TakeReady(ready[:0])
		for _, i := range ready {
			c := a.Requests(i)
			for {
				m, err := c.Peek()
				if errors.Is(err, ErrEmpty) {
					break
				}
				if err != nil {
					return err
				}
				switch m.Op {
				case opPingData:
					// Rank's burst fits its response ring: Push never waits.
					if err := a.Responses(i).Push(m.Header, m.Payload); err != nil {
						return fmt.Errorf("echo to rank %d: %w", i, err)
					}
				case opPingEpoch:
					if asked[m.Epoch]++; asked[m.Epoch] == ranks {
						delete(asked, m.Epoch)
						a.Publish(m.Epoch)
					}
				case opPingDone:
					done++
				default:
					return fmt.Errorf("rank %d: op %d", i, m.Op)
				}
				c.Release()
			}
		}
	}
	return nil
}

// TestWaitContext checks that a wait with a context returns its error
// promptly once it is cancelled or its deadline passes, for in-process and
// futex sleepers, that the condition wins over an ended context, and that
// a cancelled in-process sleeper leaves nothing registered.
func TestWaitContext(t *testing.T) {
	for _, w := range []struct {
		name  string
		w     Waiter
		limit time.Duration // how late the wait may notice the end of its context
	}{{"inproc", InProcessWaiter(), 500 * time.Millisecond}, {"futex", Waiter{}, ctxSlice + 500*time.Millisecond}} {
		t.Run(w.name, func(t *testing.T) {
			seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1, FirstEpoch: 1})
			if err != nil {
				t.Fatal(err)
			}
			seg.SetWaiter(w.w)
			r := seg.Rank(0)
			waits := map[string]func(context.Context) error{
				"response": r.Responses().WaitContext,
				"epoch":    func(ctx context.Context) error { return r.WaitEpochContext(ctx, 5) },
			}
			for what, wait := range waits {
				// Cancelled while asleep.
				ctx, cancel := context.WithCancel(context.Background())
				start := time.Now() // before the timer: it cannot fire earlier than 20ms after this
				time.AfterFunc(20*time.Millisecond, cancel)
				if err := wait(ctx); !errors.Is(err, context.Canceled) {
					t.Fatalf("%s: cancelled wait returned %v", what, err)
				}
				if el := time.Since(start); el < 20*time.Millisecond || el > 20*time.Millisecond+w.limit {
					t.Fatalf("%s: cancelled wait returned after %v", what, el)
				}
				// Deadline.
				ctx, cancel = context.WithTimeout(context.Background(), 30*time.Millisecond)
				start = time.Now()
				if err := wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s: wait past its deadline returned %v", what, err)
				}
				cancel()
				if el := time.Since(start); el > 30*time.Millisecond+w.limit {
					t.Fatalf("%s: deadline noticed after %v", what, el)
				}
				// Already cancelled.
				if err := wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s: wait with an ended context returned %v", what, err)
				}
			}
			if n := parkedNow(); n != 0 {
				t.Fatalf("%d in-process sleepers left registered", n)
			}
			checkParkerIdle(t, "response", &r.Responses().park)
			checkParkerIdle(t, "epoch", &r.park)
			if seg.u32(offEpochSleepers).Load() != 0 {
				t.Fatal("epoch sleeper count not restored")
			}

			// The condition wins over an ended context, and a wake-up
			// wakes a wait with a live one.
			ended, cancel := context.WithCancel(context.Background())
			cancel()
			a := seg.Agent()
			if err := a.Responses(0).Push(Header{Op: 1}, nil); err != nil {
				t.Fatal(err)
			}
			if err := r.Responses().WaitContext(ended); err != nil {
				t.Fatalf("wait for a waiting message with an ended context: %v", err)
			}
			r.Responses().Peek()
			r.Responses().Release()
			woke := make(chan error, 1)
			go func() { woke <- r.WaitEpochContext(context.Background(), 5) }()
			time.Sleep(10 * time.Millisecond)
			a.Publish(5)
			select {
			case err := <-woke:
				if err != nil {
					t.Fatal(err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("epoch wait not woken by Publish")
			}
		})
	}
}

// TestInProcessWakeRacesCancel races a signal against the cancellation of
// an in-process sleeper, many times: whichever wins, the sleeper returns
// promptly, takes any token the signal sent, and leaves nothing
// registered, so the next wait sleeps instead of waking spuriously at
// once with a stale token.
func TestInProcessWakeRacesCancel(t *testing.T) {
	seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(InProcessWaiter())
	a, r := seg.Agent(), seg.Rank(0)
	resp := r.Responses()
	sleepers := seg.u32(seg.ctrl(0) + ctlRankSleepers)
	rounds := 2000
	if raceEnabled || testing.Short() {
		rounds = 300
	}
	var got, cancelled int
	for k := range rounds {
		ctx, cancel := context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() { res <- resp.WaitContext(ctx) }()
		if k%4 != 0 { // else the race starts while the sleeper registers
			for sleepers.Load() == 0 {
				runtime.Gosched()
			}
		}
		go0 := make(chan struct{})
		pushed := make(chan error, 1)
		go func() {
			<-go0
			if k%2 == 0 {
				runtime.Gosched()
			}
			pushed <- a.Responses(0).Push(Header{Seq: uint32(k)}, nil)
		}()
		close(go0)
		if k%2 == 1 {
			runtime.Gosched()
		}
		cancel()
		if err := <-pushed; err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-res:
			switch {
			case err == nil:
				got++
			case errors.Is(err, context.Canceled):
				cancelled++
			default:
				t.Fatalf("round %d: %v", k, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: sleeper neither woken nor cancelled", k)
		}
		cancel()
		if _, err := resp.Peek(); err != nil {
			t.Fatalf("round %d: %v", k, err)
		}
		resp.Release()
		checkParkerIdle(t, fmt.Sprintf("round %d", k), &resp.park)
		if n := parkedNow(); n != 0 {
			t.Fatalf("round %d: %d sleepers left registered", k, n)
		}
	}
	t.Logf("%d woken, %d cancelled", got, cancelled)
}

// TestInProcessWaitAllocs checks that in-process sleeping allocates
// nothing once the handles made their parkers: a round trip in which the
// rank sleeps with a context and the agent with a finite timeout (so on
// its reused timer).
func TestInProcessWaitAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	seg.SetWaiter(InProcessWaiter())
	a, r := seg.Agent(), seg.Rank(0)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	echo := make(chan error, 1)
	go func() {
		req, resp := r.Requests(), r.Responses()
		for {
			if err := resp.WaitContext(ctx); err != nil {
				echo <- nil // cancelled: the test is over
				return
			}
			m, err := resp.Peek()
			if err != nil {
				echo <- err
				return
			}
			h := m.Header
			resp.Release()
			if err := req.Push(h, nil); err != nil {
				echo <- err
				return
			}
		}
	}()
	in, out := a.Requests(0), a.Responses(0)
	var ready [1]int
	k := uint32(0)
	roundTrip := func() {
		k++
		if err := out.Push(Header{Seq: k}, nil); err != nil {
			t.Fatal(err)
		}
		for {
			m, err := in.Peek()
			if err == nil {
				if m.Seq != k {
					t.Fatalf("echo %d, want %d", m.Seq, k)
				}
				in.Release()
				return
			}
			if err := a.Wait(10 * time.Second); err != nil {
				t.Fatal(err)
			}
			a.TakeReady(ready[:0])
		}
	}
	roundTrip() // makes the parkers and the timer
	if n := testing.AllocsPerRun(2000, roundTrip); n != 0 {
		t.Fatalf("%v allocations per in-process round trip", n)
	}
	cancel()
	if err := <-echo; err != nil {
		t.Fatal(err)
	}
}
