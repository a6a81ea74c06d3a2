package shm

import (
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
			errc := make(chan error, 1)
			go func() { errc <- rankPingPong(seg.Rank(0), b.N, mode.timeout) }()
			agentPingPong(b, seg.Agent(), mode.timeout, errc)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/roundtrip")
		})
	}
}
