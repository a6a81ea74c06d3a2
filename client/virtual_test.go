package client_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/shm"
)

// miniAgent serves the virtual ranks of a heap segment the way the node
// agent's shared-memory loop does (sleep on the doorbell, drain the rings
// of the ranks marked ready, answer on their response rings), but only for
// what the tests and benchmarks ask: hello, ring (answered at once:
// position = local rank, both neighbours' values = the rank's own), fence
// (published once every rank asked) and finalize. Stop it with close.
type miniAgent struct {
	seg  *shm.Segment
	stop atomic.Bool
	done chan error
}

func startMiniAgent(seg *shm.Segment) *miniAgent {
	m := &miniAgent{seg: seg, done: make(chan error, 1)}
	go func() { m.done <- m.serve() }()
	return m
}

func (m *miniAgent) serve() error {
	a := m.seg.Agent()
	size := uint32(m.seg.Params().WorldSize)
	var ready []int
	var out []byte
	fences := map[uint32]uint32{} // ranks that asked for each fence epoch
	for !m.stop.Load() {
		did := false
		ready = a.TakeReady(ready[:0])
		for _, i := range ready {
			c := a.Requests(i)
			for {
				req, err := c.Peek()
				if errors.Is(err, shm.ErrEmpty) {
					break
				}
				if err != nil {
					return fmt.Errorf("rank %d: %w", i, err)
				}
				did = true
				out = out[:0]
				switch req.Op {
				case shm.OpHello, shm.OpBlock: // no response; this agent has no deadlock check
				case shm.OpFence:
					if fences[req.Epoch]++; fences[req.Epoch] == size {
						delete(fences, req.Epoch)
						a.Publish(req.Epoch)
					}
				case shm.OpRing:
					out = shm.AppendRing(out, uint32(i), size, string(req.Payload), string(req.Payload))
					fallthrough
				case shm.OpFinalize:
					if err := a.Responses(i).Push(shm.Header{Op: req.Op, Seq: req.Seq}, out); err != nil {
						return fmt.Errorf("rank %d: respond: %w", i, err)
					}
				default:
					return fmt.Errorf("rank %d: unexpected op %d", i, req.Op)
				}
				c.Release()
			}
		}
		if !did {
			if err := a.Wait(-1); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *miniAgent) close() error {
	m.stop.Store(true)
	m.seg.Agent().Kick()
	return <-m.done
}

// newVirtualRanks makes a heap segment with InProcessWaiter and p virtual
// ranks of it.
func newVirtualRanks(tb testing.TB, p int) (*shm.Segment, []*client.Client) {
	tb.Helper()
	seg, err := shm.NewHeap(shm.Params{LocalRanks: p, WorldSize: p, KVSCapacity: 1})
	if err != nil {
		tb.Fatal(err)
	}
	seg.SetWaiter(shm.InProcessWaiter())
	clients := make([]*client.Client, p)
	for i := range p {
		c, err := client.NewPlayed(seg, client.Info{Rank: i, Size: p, LocalRank: i, LocalSize: p})
		if err != nil {
			tb.Fatal(err)
		}
		clients[i] = c
	}
	return seg, clients
}

// TestVirtualPingPong runs many virtual ranks through the real client
// against one agent goroutine, every wait unbounded but for the context
// (no timer): a wake-up missed by a rank or by the agent ends the test
// with the context's deadline instead of a result.
func TestVirtualPingPong(t *testing.T) {
	p, ops := 128, 200
	if testing.Short() {
		p, ops = 32, 50
	}
	seg, clients := newVirtualRanks(t, p)
	ag := startMiniAgent(seg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, p)
	for i, c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range ops {
				val := []byte(strconv.Itoa(i) + "/" + strconv.Itoa(k))
				res, err := c.Ring(ctx, val)
				if err != nil {
					errs <- fmt.Errorf("rank %d op %d: %w", i, k, err)
					return
				}
				if res.Rank != i || res.Size != p || string(res.Left) != string(val) || string(res.Right) != string(val) {
					errs <- fmt.Errorf("rank %d op %d: %+v", i, k, res)
					return
				}
			}
			if err := c.Finalize(); err != nil {
				errs <- fmt.Errorf("rank %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := ag.close(); err != nil {
		t.Fatal(err)
	}
}

// TestVirtualCancel checks that a virtual rank waiting for an agent that
// does not answer returns promptly once its context is cancelled or its
// deadline passes, both for a response (Ring) and for a collective
// (Fence), and that the client still works afterwards.
func TestVirtualCancel(t *testing.T) {
	seg, clients := newVirtualRanks(t, 1)
	c := clients[0]
	within := func(what string, limit time.Duration, f func() error, want error) {
		t.Helper()
		start := time.Now()
		err := f()
		if !errors.Is(err, want) {
			t.Fatalf("%s: %v, want %v", what, err, want)
		}
		if el := time.Since(start); el > limit {
			t.Fatalf("%s: returned after %v", what, el)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	within("cancelled ring", time.Second, func() error { _, err := c.Ring(ctx, []byte("v")); return err }, context.Canceled)
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	within("fence past its deadline", time.Second, func() error { return c.Fence(ctx) }, context.DeadlineExceeded)

	// The unanswered requests are still in the ring; the agent answers
	// them now, and the client goes on (its fence completes).
	ag := startMiniAgent(seg)
	if err := c.Fence(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Ring(context.Background(), []byte("w")); err != nil {
		t.Fatal(err)
	}
	if err := c.Finalize(); err != nil {
		t.Fatal(err)
	}
	if err := ag.close(); err != nil {
		t.Fatal(err)
	}
}

// agentView reads the requests of local rank 0 of a virtual segment that
// no agent serves, as the agent would, for tests that check what the
// client sends.
type agentView struct {
	t *testing.T
	a *shm.Agent
}

// request is what the tests compare of one.
type request struct {
	op, flags uint16
	epoch     uint32
}

// next returns the rank's next request other than its hello, waiting
// for it at most 5 s.
func (v agentView) next() request {
	v.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m, err := v.a.Requests(0).Peek()
		if err == nil {
			r := request{m.Op, m.Flags, m.Epoch}
			v.a.Requests(0).Release()
			if r.op == shm.OpHello {
				continue
			}
			return r
		}
		if !errors.Is(err, shm.ErrEmpty) || time.Now().After(deadline) {
			v.t.Fatalf("no request: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
}

// want fails the test unless the rank's next request is op with flags
// for epoch.
func (v agentView) want(op, flags uint16, epoch uint32) {
	v.t.Helper()
	if r := v.next(); r != (request{op, flags, epoch}) {
		v.t.Fatalf("request %+v, want %s flags %d epoch %d", r, shm.OpName(op), flags, epoch)
	}
}

// TestDetachedWaitsAreTold checks what the agent's deadlock check learns
// over shared memory: Iallgather and Ifence start detached collectives,
// Fence does not; a Wait that must wait says so first (an OpBlock naming
// its epoch), and so does an Iallgather waiting for the result slot of an
// earlier one; a wait cut short by its context says that the rank waits
// for nothing any more (an OpBlock of epoch 0).
func TestDetachedWaitsAreTold(t *testing.T) {
	seg, clients := newVirtualRanks(t, 1)
	c := clients[0]
	a := seg.Agent()
	want := agentView{t, a}.want
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}

	c.Iallgather([]byte("a"))
	want(shm.OpAllgather, shm.CollDetached, 1)
	f := c.Ifence()
	want(shm.OpFence, shm.CollDetached, 2)
	if err := f.Wait(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ifence's wait: %v, want its deadline", err)
	}
	want(shm.OpBlock, 0, 2) // waits for the fence
	want(shm.OpBlock, 0, 0) // and gave up
	if err := c.Fence(short()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fence: %v, want its deadline", err)
	}
	want(shm.OpFence, 0, 3) // the agent counts it waiting from the start
	want(shm.OpBlock, 0, 0)

	// Epoch 4 takes epoch 2's result slot: the rank waits for it.
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Iallgather([]byte("d"))
	}()
	want(shm.OpBlock, 0, 2)
	a.Publish(2) // lets it go on (it then fails: the test wrote no results)
	<-done
}

// TestTestDoesNotBlock: Test reports at once while another goroutine
// waits for the request (it waited for that Wait to end, which here is
// never: the test publishes the fence only once Test has answered).
func TestTestDoesNotBlock(t *testing.T) {
	seg, clients := newVirtualRanks(t, 1)
	c := clients[0]
	v := agentView{t, seg.Agent()}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := c.Ifence()
	v.want(shm.OpFence, shm.CollDetached, 1)
	waited := make(chan error, 1)
	go func() { waited <- f.Wait(ctx) }()
	v.want(shm.OpBlock, 0, 1) // the Wait has the client and sleeps
	tested := make(chan bool, 1)
	go func() { tested <- f.Test() }()
	select {
	case done := <-tested:
		if done {
			t.Fatal("Test reports an unpublished fence done")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Test blocked while another goroutine waits for the request")
	}
	seg.Agent().Publish(1)
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
	if !f.Test() {
		t.Fatal("Test reports a completed fence not done")
	}
}
