package shm

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkInProcessRoundTrip measures one request/response round trip
// between two goroutines through a heap segment with InProcessWaiter, the
// path of the scale benchmark's virtual ranks: the agent (this goroutine)
// pushes a response and sleeps on its doorbell, the rank goroutine sleeps
// on its response ring, takes the response and pushes a request back.
// "unbounded" waits without a timeout; "timeout" gives every wait a finite
// bound, as a caller that must notice cancellation by polling would.
func BenchmarkInProcessRoundTrip(b *testing.B) {
	for _, mode := range []struct {
		name    string
		timeout time.Duration
	}{{"unbounded", -1}, {"timeout", time.Minute}} {
		b.Run(mode.name, func(b *testing.B) {
			seg, err := NewHeap(Params{LocalRanks: 1, KVSCapacity: 1})
			if err != nil {
				b.Fatal(err)
			}
			seg.SetWaiter(InProcessWaiter())
			a, r := seg.Agent(), seg.Rank(0)
			in, out := a.Requests(0), a.Responses(0)
			errc := make(chan error, 1)
			go func() {
				req, resp := r.Requests(), r.Responses()
				for k := range b.N {
					if err := resp.Wait(mode.timeout); err != nil {
						errc <- fmt.Errorf("round %d: %w", k, err)
						return
					}
					m, err := resp.Peek()
					if err != nil {
						errc <- err
						return
					}
					h := m.Header
					resp.Release()
					if err := req.Push(h, nil); err != nil {
						errc <- fmt.Errorf("round %d: %w", k, err)
						return
					}
				}
				errc <- nil
			}()
			ready := make([]int, 0, 1)
			b.ReportAllocs()
			b.ResetTimer()
			for k := range b.N {
				if err := out.Push(Header{Seq: uint32(k)}, nil); err != nil {
					b.Fatal(err)
				}
				if err := a.Wait(mode.timeout); err != nil {
					b.Fatal(err)
				}
				ready = a.TakeReady(ready[:0])
				m, err := in.Peek()
				if err != nil || m.Seq != uint32(k) {
					b.Fatalf("round %d: %+v %v", k, m.Header, err)
				}
				in.Release()
			}
			b.StopTimer()
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
		})
	}
}
