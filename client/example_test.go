package client_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

// A rank exchanges its business card with every other rank. Under pmirun
// the result is read in place from shared memory; started on its own, as
// here, the program is a singleton, rank 0 of 1.
func ExampleClient_Allgather() {
	c, err := client.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Finalize()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	card := fmt.Appendf(nil, "rank=%d$port=%d$", c.Rank(), 40000+c.Rank())
	vals, err := c.Allgather(ctx, card)
	if err != nil {
		log.Fatal(err)
	}
	for r := range vals.Len() {
		fmt.Printf("%d: %s\n", r, vals.At(r)) // a view: copy what must outlive the next allgathers
	}
	// Output:
	// 0: rank=0$port=40000$
}

// An allgather overlapped with the rank's own work.
func ExampleClient_Iallgather() {
	c, err := client.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Finalize()
	ctx := context.Background()

	req := c.Iallgather([]byte(fmt.Sprint("addr-", c.Rank())))
	// ... set up local state while the agent gathers ...
	if err := req.Wait(ctx); err != nil {
		log.Fatal(err)
	}
	vals := req.Values()
	fmt.Println(vals.Len(), string(vals.At(0)))
	// Output:
	// 1 addr-0
}

// The PMI way: put, fence, get. A Sparse put is visible at once and read
// with FromRank; HintNone and Dense puts become visible after the fence.
func ExampleClient_Get() {
	c, err := client.Init()
	if err != nil {
		log.Fatal(err)
	}
	defer c.Finalize()
	ctx := context.Background()

	if err := c.Put(fmt.Sprint("card-", c.Rank()), []byte("tcp://node0:40000"), client.Dense); err != nil {
		log.Fatal(err)
	}
	if err := c.Fence(ctx); err != nil {
		log.Fatal(err)
	}
	v, err := c.Get(ctx, "card-0", client.FromRank(0))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(string(v))
	// Output:
	// tcp://node0:40000
}
