package pmiwire

import (
	"strings"
	"testing"
)

// benchValue is the size of a typical MPICH business card after hex
// encoding, as put and fetched at start-up.
var benchValue = strings.Repeat("2F6465762F73686D", 16)

var benchRequestsV2 = []struct {
	name  string
	frame string
}{
	{"kvs-get", frameV2("cmd=kvs-get;jobid=kvs_20002_1_2043883746_vm;srcid=-1;key=P1-businesscard;", false)},
	{"kvs-put", frameV2("cmd=kvs-put;key=P0-businesscard;value="+benchValue+";", false)},
	{"fullinit", frameV2("cmd=fullinit;pmijobid=5.0;pmirank=0;threaded=FALSE;", true)},
}

// BenchmarkDecodeV2 decodes one PMI-2 request per operation, fed whole as
// a read of the connection would deliver it.
func BenchmarkDecodeV2(b *testing.B) {
	for _, bc := range benchRequestsV2 {
		b.Run(bc.name, func(b *testing.B) {
			frame := []byte(bc.frame)
			var d Decoder
			b.SetBytes(int64(len(frame)))
			b.ReportAllocs()
			for b.Loop() {
				d.Feed(frame)
				m, ok, err := d.Next()
				if !ok || err != nil || m.Cmd == "" {
					b.Fatal(ok, err)
				}
			}
		})
	}
}

// BenchmarkDecodeV2Pipelined decodes a burst of 64 requests delivered by
// one read.
func BenchmarkDecodeV2Pipelined(b *testing.B) {
	var burst []byte
	for i := 0; i < 64; i++ {
		burst = append(burst, benchRequestsV2[i%len(benchRequestsV2)].frame...)
	}
	var d Decoder
	b.SetBytes(int64(len(burst)))
	b.ReportAllocs()
	for b.Loop() {
		d.Feed(burst)
		for n := 0; n < 64; n++ {
			if _, ok, err := d.Next(); !ok || err != nil {
				b.Fatal(ok, err)
			}
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*64), "ns/request")
}

// BenchmarkEncodeV2 formats the responses the agent sends most, into a
// reused buffer.
func BenchmarkEncodeV2(b *testing.B) {
	b.Run("kvs-get-response", func(b *testing.B) {
		fields := []Pair{{Key: "rc", Val: "0"}, {Key: "found", Val: "TRUE"}, {Key: "value", Val: benchValue}}
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = AppendV2(buf[:0], "kvs-get-response", fields...)
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("kvs-put-response/Resp", func(b *testing.B) {
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = NewResp(V2, "kvs-put-response").AddInt("rc", 0).Append(buf[:0])
		}
		b.SetBytes(int64(len(buf)))
	})
	b.Run("fullinit-response/Resp", func(b *testing.B) {
		var buf []byte
		b.ReportAllocs()
		for b.Loop() {
			buf = NewResp(V2, "fullinit-response").AddInt("rc", 0).AddInt("pmi-version", 2).AddInt("pmi-subversion", 0).
				AddInt("rank", 12).AddInt("size", 64).AddInt("appnum", 0).AddBool("debugged", false).
				AddBool("pmiverbose", false).Append(buf[:0])
		}
		b.SetBytes(int64(len(buf)))
	})
}

// BenchmarkDecodeV1 decodes a PMI-1 put, the line MPICH sends most.
func BenchmarkDecodeV1(b *testing.B) {
	line := []byte("cmd=put kvsname=kvs_24478_0_1410923783_vm key=-allgather-shm-1-0 value=" + benchValue + "\n")
	var d Decoder
	b.SetBytes(int64(len(line)))
	b.ReportAllocs()
	for b.Loop() {
		d.Feed(line)
		if _, ok, err := d.Next(); !ok || err != nil {
			b.Fatal(ok, err)
		}
	}
}

// BenchmarkEncodeV1 formats a PMI-1 get_result into a reused buffer.
func BenchmarkEncodeV1(b *testing.B) {
	fields := []Pair{{Key: "rc", Val: "0"}, {Key: "value", Val: benchValue}}
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendV1(buf[:0], "get_result", fields...)
	}
	b.SetBytes(int64(len(buf)))
}
