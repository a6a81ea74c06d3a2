// Command jobinfo is an e2e test rank for the Go client under any
// launcher: it prints one line
//
//	jobinfo rank=R size=N jobid=J transport=T ring=P left=L right=R
//
// after a Ring exchange of the value "v<rank>", and exits 1 if the ring's
// neighbours are not the ranks before and after its position.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := client.Init()
	if err != nil {
		fmt.Fprintf(os.Stderr, "jobinfo: %v\n", err)
		os.Exit(1)
	}
	info := c.Info()
	res, err := c.Ring(ctx, fmt.Appendf(nil, "v%d", info.Rank))
	if err != nil {
		fmt.Fprintf(os.Stderr, "jobinfo: rank %d: ring: %v\n", info.Rank, err)
		os.Exit(1)
	}
	fmt.Printf("jobinfo rank=%d size=%d jobid=%s transport=%s ring=%d left=%s right=%s\n",
		info.Rank, info.Size, info.JobID, info.Transport, res.Rank, res.Left, res.Right)
	if err := c.Finalize(); err != nil {
		fmt.Fprintf(os.Stderr, "jobinfo: %v\n", err)
		os.Exit(1)
	}
}
