// Command jobinfo is an e2e test rank for the Go client under any
// launcher: it prints one line
//
//	jobinfo rank=R size=N jobid=J transport=T ring=P left=L right=R allgather=ok
//
// after a Ring exchange of the value "v<rank>" and an Allgather of the
// largest value (1024 bytes, NUL bytes among them), and exits 1 if the
// ring's neighbours are not the ranks before and after its position or a
// rank's value is not what it sent.
package main

import (
	"bytes"
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
	vals, err := c.Allgather(ctx, bigValue(info.Rank))
	if err != nil {
		fmt.Fprintf(os.Stderr, "jobinfo: rank %d: allgather: %v\n", info.Rank, err)
		os.Exit(1)
	}
	for r := range info.Size {
		if !bytes.Equal(vals.At(r), bigValue(r)) {
			fmt.Fprintf(os.Stderr, "jobinfo: rank %d: allgather: rank %d's value is %d bytes, not what it sent\n", info.Rank, r, len(vals.At(r)))
			os.Exit(1)
		}
	}
	fmt.Printf("jobinfo rank=%d size=%d jobid=%s transport=%s ring=%d left=%s right=%s allgather=ok\n",
		info.Rank, info.Size, info.JobID, info.Transport, res.Rank, res.Left, res.Right)
	if err := c.Finalize(); err != nil {
		fmt.Fprintf(os.Stderr, "jobinfo: %v\n", err)
		os.Exit(1)
	}
}

// bigValue is rank r's allgather value: 1024 bytes, NUL bytes among them.
func bigValue(r int) []byte {
	v := make([]byte, 1024)
	for i := range v {
		v[i] = byte(r*7 + i)
	}
	return v
}
