// Command hello is fastpmi's Go example rank: run it under pmirun,
//
//	pmirun -n 8 ./hello
//
// Every rank does an Allgather, a Ring exchange, and an Iallgather that it
// overlaps with some work of its own, then a put / fence / get of its
// neighbour's key; it checks every value it receives and exits non-zero on
// any mismatch. Rank 0 prints one summary line. It runs over shared memory
// under pmirun, over PMI-2 under another launcher, and as a singleton on
// its own.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "hello: %v\n", err)
		os.Exit(1)
	}
}

// card is the value rank r contributes: something shaped like an MPI
// business card.
func card(r int, round string) []byte {
	return fmt.Appendf(nil, "%s#rank=%d$host=node0$port=%d$", round, r, 40000+r)
}

func run() error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	info := c.Info()
	me, n := info.Rank, info.Size
	tInit := time.Since(start)

	// Allgather: every rank's card, read in place.
	t0 := time.Now()
	vals, err := c.Allgather(ctx, card(me, "ag"))
	if err != nil {
		return err
	}
	if vals.Len() != n {
		return fmt.Errorf("allgather returned %d values for %d ranks", vals.Len(), n)
	}
	for r := range n {
		if got := vals.At(r); !bytes.Equal(got, card(r, "ag")) {
			return fmt.Errorf("allgather value of rank %d is %q", r, got)
		}
	}
	tAg := time.Since(t0)

	// Ring: neighbours' values.
	t0 = time.Now()
	rr, err := c.Ring(ctx, card(me, "ring"))
	if err != nil {
		return err
	}
	if rr.Size != n || rr.Rank < 0 || rr.Rank >= n {
		return fmt.Errorf("ring position %d of %d in a job of %d", rr.Rank, rr.Size, n)
	}
	// Positions follow rank order on one node.
	left, right := (rr.Rank+n-1)%n, (rr.Rank+1)%n
	if !bytes.Equal(rr.Left, card(left, "ring")) || !bytes.Equal(rr.Right, card(right, "ring")) {
		return fmt.Errorf("ring neighbours %q %q", rr.Left, rr.Right)
	}
	tRing := time.Since(t0)

	// Iallgather overlapped with work.
	t0 = time.Now()
	req := c.Iallgather(card(me, "iag"))
	work := sha256.Sum256(card(me, "work"))
	for range 2000 {
		work = sha256.Sum256(work[:])
	}
	if err := req.Wait(ctx); err != nil {
		return err
	}
	iv := req.Values()
	for r := range n {
		if got := iv.At(r); !bytes.Equal(got, card(r, "iag")) {
			return fmt.Errorf("iallgather value of rank %d is %q", r, got)
		}
	}
	tIag := time.Since(t0)

	// Put / fence / get of the right neighbour's key.
	if err := c.Put("key-"+strconv.Itoa(me), card(me, "kvs"), client.Dense); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	nb := (me + 1) % n
	v, err := c.Get(ctx, "key-"+strconv.Itoa(nb), client.FromRank(nb))
	if err != nil {
		return err
	}
	if !bytes.Equal(v, card(nb, "kvs")) {
		return fmt.Errorf("get of rank %d's key is %q", nb, v)
	}
	if err := c.Finalize(); err != nil {
		return err
	}
	if me == 0 {
		fmt.Printf("hello: %d ranks over %s verified allgather, ring, iallgather, put/fence/get; rank 0: init %v, allgather %v, ring %v, iallgather+work %v, total %v\n",
			n, info.Transport, round(tInit), round(tAg), round(tRing), round(tIag), round(time.Since(start)))
	}
	return nil
}

func round(d time.Duration) time.Duration {
	if d > time.Millisecond {
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}
