// Command multiprog is an e2e test rank that drives many back-to-back
// collectives across nodes and checks that they never cross:
//
//	multiprog [-rounds N] [-rings K]
//
// Each round r puts a key, then starts an Iallgather, an Ifence and (once
// the first allgather is read) a second Iallgather, all with values unique
// to the round and rank, so a result delivered to the wrong epoch shows as
// a wrong value. Every tenth round also gets a neighbour's key put in that
// round. After the rounds it does K ring exchanges, each with its own
// values, and checks that positions form a permutation and that left and
// right are the values of the neighbouring positions (read back through
// an allgather). Rank 0 prints one summary line; any mismatch goes to
// stderr and exits 1.
//
//	multiprog -late D
//
// instead has every rank but 0 finalize and exit at once, while rank 0
// waits D and then publishes, looks up and unpublishes a name through
// pmirun: the nodes whose ranks are all done must not take the job's
// links down with them.
package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

func main() {
	rounds := flag.Int("rounds", 200, "rounds of Iallgather+Ifence+Iallgather")
	rings := flag.Int("rings", 1, "ring exchanges after the rounds")
	late := flag.Duration("late", 0, "only: rank 0 uses the name service this long after the others finalized")
	flag.Parse()
	run := func() error { return run(*rounds, *rings) }
	if *late > 0 {
		run = func() error { return lateNames(*late) }
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "multiprog: %v\n", err)
		os.Exit(1)
	}
}

func val(kind string, round, rank int) []byte {
	return fmt.Appendf(nil, "%s/round=%d/rank=%d/%s", kind, round, rank, bytes.Repeat([]byte{byte('a' + (round+rank)%26)}, (round*7+rank)%40))
}

func checkAll(v client.Values, n int, what string, want func(r int) []byte) error {
	if v.Len() != n {
		return fmt.Errorf("%s: %d values for %d ranks", what, v.Len(), n)
	}
	for r := range n {
		if got := v.At(r); !bytes.Equal(got, want(r)) {
			return fmt.Errorf("%s: value of rank %d is %q, want %q", what, r, got, want(r))
		}
	}
	return nil
}

func run(rounds, rings int) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	me, n := c.Rank(), c.Size()
	for i := range rounds {
		key := "r" + strconv.Itoa(i) + "-" + strconv.Itoa(me)
		if err := c.Put(key, val("kvs", i, me), client.Dense); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		ra := c.Iallgather(val("a", i, me))
		rf := c.Ifence()
		if err := ra.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: first allgather: %w", i, err)
		}
		if err := checkAll(ra.Values(), n, fmt.Sprintf("round %d first allgather", i), func(r int) []byte { return val("a", i, r) }); err != nil {
			return err
		}
		rb := c.Iallgather(val("b", i, me))
		// Complete the fence and the second allgather in either order.
		first, second := rf, rb
		if i%2 == 1 {
			first, second = rb, rf
		}
		if err := first.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if err := second.Wait(ctx); err != nil {
			return fmt.Errorf("round %d: %w", i, err)
		}
		if err := checkAll(rb.Values(), n, fmt.Sprintf("round %d second allgather", i), func(r int) []byte { return val("b", i, r) }); err != nil {
			return err
		}
		if i%10 == 0 {
			src := (me + 1 + i) % n
			k := "r" + strconv.Itoa(i) + "-" + strconv.Itoa(src)
			v, err := c.Get(ctx, k, client.FromRank(src))
			if err != nil {
				return fmt.Errorf("round %d: %w", i, err)
			}
			if want := val("kvs", i, src); !bytes.Equal(v, want) {
				return fmt.Errorf("round %d: get %s is %q, want %q", i, k, v, want)
			}
		}
	}
	for k := range rings {
		rr, err := c.Ring(ctx, val("ring", k, me))
		if err != nil {
			return fmt.Errorf("ring %d: %w", k, err)
		}
		if rr.Size != n || rr.Rank < 0 || rr.Rank >= n {
			return fmt.Errorf("ring %d: position %d of %d in a job of %d", k, rr.Rank, rr.Size, n)
		}
		// Who holds which position: allgather the positions.
		left, right := append([]byte(nil), rr.Left...), append([]byte(nil), rr.Right...)
		pos, err := c.Allgather(ctx, []byte(strconv.Itoa(rr.Rank)))
		if err != nil {
			return fmt.Errorf("ring %d: %w", k, err)
		}
		at := make([]int, n) // position → rank
		seen := make([]bool, n)
		for r := range n {
			p, err := strconv.Atoi(string(pos.At(r)))
			if err != nil || p < 0 || p >= n || seen[p] {
				return fmt.Errorf("ring %d: rank %d has position %q: not a permutation", k, r, pos.At(r))
			}
			seen[p] = true
			at[p] = r
		}
		if want := val("ring", k, at[(rr.Rank+n-1)%n]); !bytes.Equal(left, want) {
			return fmt.Errorf("ring %d: at position %d left is %q, want %q", k, rr.Rank, left, want)
		}
		if want := val("ring", k, at[(rr.Rank+1)%n]); !bytes.Equal(right, want) {
			return fmt.Errorf("ring %d: at position %d right is %q, want %q", k, rr.Rank, right, want)
		}
	}
	if err := c.Finalize(); err != nil {
		return err
	}
	if me == 0 {
		fmt.Printf("multiprog ok: %d ranks, %d rounds, %d rings in %v\n", n, rounds, rings, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func lateNames(wait time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		return err
	}
	if c.Rank() != 0 {
		return c.Finalize()
	}
	time.Sleep(wait)
	if err := c.Publish(ctx, "late-service", "port-42"); err != nil {
		return fmt.Errorf("publish after the other ranks ended: %w", err)
	}
	port, err := c.Lookup(ctx, "late-service")
	if err != nil || port != "port-42" {
		return fmt.Errorf("lookup after the other ranks ended: %q, %v", port, err)
	}
	if err := c.Unpublish(ctx, "late-service"); err != nil {
		return fmt.Errorf("unpublish after the other ranks ended: %w", err)
	}
	if err := c.Finalize(); err != nil {
		return err
	}
	fmt.Printf("multiprog late names ok: %d ranks\n", c.Size())
	return nil
}
