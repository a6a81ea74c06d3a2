package netio

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// benchBackends runs fn for each backend side by side, so one
// `go test -bench .` compares them.
func benchBackends(b *testing.B, fn func(b *testing.B, backend string)) {
	for _, be := range []string{BackendNet, BackendUring} {
		b.Run(be, func(b *testing.B) {
			if be == BackendUring {
				if ok, why := probeUring(); !ok {
					b.Skip("io_uring unavailable: " + why)
				}
			}
			fn(b, be)
		})
	}
}

// BenchmarkLatency: ping-pong of small frames between two agents over
// loopback; ns/op is one round trip.
func BenchmarkLatency(b *testing.B) {
	benchBackends(b, func(b *testing.B, be string) {
		for _, size := range []int{64, 4096} {
			b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
				client, server := pair(b, be, nil)
				ctx := context.Background()
				go func() {
					for {
						f, err := server.Recv(ctx)
						if err != nil {
							return
						}
						if server.Send(ctx, f) != nil {
							return
						}
					}
				}()
				f := Frame{Type: 1, Payload: make([]byte, size)}
				for range 100 { // warm up
					client.Send(ctx, f)
					client.Recv(ctx)
				}
				start := time.Now()
				for b.Loop() {
					if err := client.Send(ctx, f); err != nil {
						b.Fatal(err)
					}
					if _, err := client.Recv(ctx); err != nil {
						b.Fatal(err)
					}
				}
				rtt := time.Since(start) / time.Duration(b.N)
				b.ReportMetric(float64(rtt.Nanoseconds())/2000, "us/one-way")
			})
		}
	})
}

// BenchmarkThroughput: one agent streams frames to another over loopback.
func BenchmarkThroughput(b *testing.B) {
	benchBackends(b, func(b *testing.B, be string) {
		for _, size := range []int{256, 64 << 10, 1 << 20} {
			b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
				client, server := pair(b, be, nil)
				ctx := context.Background()
				f := Frame{Type: 1, Payload: make([]byte, size)}
				b.SetBytes(int64(size))
				b.ResetTimer()
				errc := make(chan error, 1)
				n := b.N
				go func() {
					for range n {
						if _, err := server.Recv(ctx); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				start := time.Now()
				for range n {
					if err := client.Send(ctx, f); err != nil {
						b.Fatal(err)
					}
				}
				if err := <-errc; err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(n)/time.Since(start).Seconds(), "frames/s")
			})
		}
	})
}

// BenchmarkTransportNewClose: a transport made and closed, as every node
// of a job does once (a daemon once per job): with io_uring, the ring, its
// provided buffers and its watcher.
func BenchmarkTransportNewClose(b *testing.B) {
	benchBackends(b, func(b *testing.B, be string) {
		secret := []byte("0123456789abcdef0123456789abcdef")
		for b.Loop() {
			tr, err := New(Config{Backend: be, Secret: secret})
			if err != nil {
				b.Fatal(err)
			}
			if err := tr.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
