package client_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/shm"
)

// BenchmarkVirtualRanks measures the per-operation cost of virtual ranks:
// p goroutines of this process, each a client.NewPlayed rank of one heap
// segment with InProcessWaiter, do ring exchanges (request, response)
// against one agent goroutine, as pmid's virtual ranks do against the
// node agent. The b.N operations are spread over the p ranks; ns/rank-op
// is wall time per operation, cpu-ns/rank-op the process's CPU time per
// operation (on a machine with fewer CPUs than runnable goroutines, the
// figure that bounds how many ranks one machine can play).
func BenchmarkVirtualRanks(b *testing.B) {
	for _, p := range []int{1, 16, 256} {
		b.Run("p="+strconv.Itoa(p), func(b *testing.B) {
			seg, err := shm.NewHeap(shm.Params{LocalRanks: p, WorldSize: p, KVSCapacity: 1})
			if err != nil {
				b.Fatal(err)
			}
			seg.SetWaiter(shm.InProcessWaiter())
			ag := startMiniAgent(seg)
			clients := make([]*client.Client, p)
			for i := range p {
				c, err := client.NewPlayed(seg, client.Info{Rank: i, Size: p, LocalRank: i, LocalSize: p})
				if err != nil {
					b.Fatal(err)
				}
				clients[i] = c
			}
			perRank := (b.N + p - 1) / p
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := make(chan struct{})
			errs := make(chan error, p)
			var wg sync.WaitGroup
			for i, c := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					val := []byte("rank" + strconv.Itoa(i))
					for k := range perRank {
						res, err := c.Ring(ctx, val)
						if err != nil {
							errs <- fmt.Errorf("rank %d op %d: %w", i, k, err)
							return
						}
						if res.Rank != i || res.Size != p || string(res.Left) != string(val) {
							errs <- fmt.Errorf("rank %d op %d: %+v", i, k, res)
							return
						}
					}
				}()
			}
			cpu0, err := cpuNanos(os.Getpid())
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			close(start)
			wg.Wait()
			b.StopTimer()
			cpu1, err := cpuNanos(os.Getpid())
			if err != nil {
				b.Fatal(err)
			}
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			for _, c := range clients {
				if err := c.Finalize(); err != nil {
					b.Fatal(err)
				}
			}
			if err := ag.close(); err != nil {
				b.Fatal(err)
			}
			ops := float64(perRank * p)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/ops, "ns/rank-op")
			b.ReportMetric(float64(cpu1-cpu0)/ops, "cpu-ns/rank-op")
		})
	}
}
