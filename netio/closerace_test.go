package netio

import (
	"context"
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestCloseRace is the shutdown of a job's agents: two transports with a
// few connections both ways (a tree link and two ring links), each end
// receiving in a loop and exchanging a few frames, then one side closes
// its connections and its transport at the moment the other side closes
// its transport. Every Close must return promptly; a lost wake-up of the
// io_uring reaper used to leave Transport.Close waiting for completions
// nobody reaped.
func TestCloseRace(t *testing.T) {
	iters := 60
	if testing.Short() {
		iters = 10
	}
	forEachBackend(t, func(t *testing.T, be string) {
		for i := range iters {
			closeRaceOnce(t, be, i)
		}
	})
}

func closeRaceOnce(t *testing.T, be string, iter int) {
	mod := func(c *Config) { c.Linger = 500 * time.Millisecond }
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	a := newTestTransport(t, be, mod)
	b := newTestTransport(t, be, mod)
	la, err := a.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := b.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Three links: b dials a twice (tree and left ring link), a dials b
	// once (right ring link).
	var aConns, bConns []Conn
	link := func(from Transport, to Listener) (dialed, accepted Conn) {
		acc := make(chan Conn, 1)
		go func() {
			c, err := to.Accept(ctx)
			if err != nil {
				t.Errorf("accept: %v", err)
			}
			acc <- c
		}()
		d, err := from.Dial(ctx, to.Addr().String())
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c := <-acc
		if c == nil {
			t.FailNow()
		}
		return d, c
	}
	for range 2 {
		d, c := link(b, la)
		bConns, aConns = append(bConns, d), append(aConns, c)
	}
	d, c := link(a, lb)
	aConns, bConns = append(aConns, d), append(bConns, c)

	// Every connection has a receive loop; a's loops echo.
	var loops sync.WaitGroup
	got := make(chan struct{}, 64)
	for _, c := range aConns {
		loops.Go(func() {
			for {
				f, err := c.Recv(context.Background())
				if err != nil {
					return
				}
				c.Send(context.Background(), f)
			}
		})
	}
	for _, c := range bConns {
		loops.Go(func() {
			for {
				if _, err := c.Recv(context.Background()); err != nil {
					return
				}
				got <- struct{}{}
			}
		})
	}
	const frames = 3
	for _, c := range bConns {
		for j := range frames {
			if err := c.Send(ctx, Frame{Type: 1, Epoch: uint64(j), Payload: []byte("card")}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range frames * len(bConns) {
		select {
		case <-got:
		case <-ctx.Done():
			t.Fatalf("iteration %d: echoes did not come back", iter)
		}
	}

	// b closes its sockets while a closes its transport; both sides
	// still have frames in flight.
	for _, c := range aConns {
		c.Send(ctx, Frame{Type: 2, Payload: []byte("last")})
	}
	start := make(chan struct{})
	var closers sync.WaitGroup
	for _, c := range bConns {
		closers.Go(func() {
			<-start
			c.Send(context.Background(), Frame{Type: 3})
			c.Close()
		})
	}
	closers.Go(func() {
		<-start
		b.Close()
	})
	closers.Go(func() {
		<-start
		a.Close()
	})
	done := make(chan struct{})
	go func() {
		closers.Wait()
		loops.Wait()
		close(done)
	}()
	close(start)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		buf := make([]byte, 1<<20)
		t.Fatalf("iteration %d: close did not return within 5s:\n%s", iter, buf[:runtime.Stack(buf, true)])
	}
}
