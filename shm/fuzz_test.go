package shm

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// fuzzMaxSegment bounds the segments the fuzzer may make the test allocate.
const fuzzMaxSegment = 4 << 20

// FuzzOpenHeader feeds arbitrary header bytes to the validation every
// rank runs on the segment it maps (Attach is OpenFile after the mmap).
// The buffer is as long as the header claims (bounded), so valid-looking
// headers get past the size check. A header that passes must describe
// exactly the layout its sizes compute, and every accessor must stay in
// bounds on whatever bytes follow. Seeds are in testdata/fuzz/FuzzOpenHeader.
func FuzzOpenHeader(f *testing.F) {
	f.Fuzz(func(t *testing.T, hdr []byte) {
		hdr = hdr[:min(len(hdr), headerBytes)]
		size := uint64(headerBytes)
		if len(hdr) >= hdrTotal+8 {
			if c := binary.LittleEndian.Uint64(hdr[hdrTotal:]); c >= headerBytes && c <= fuzzMaxSegment {
				size = c
			}
		}
		buf := alignedBytes(int(size))
		copy(buf, hdr)
		s, err := Attach(buf)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "attach segment: ") {
				t.Fatalf("error %q lacks its operation", err)
			}
			return
		}
		l, err := computeLayout(s.Params())
		if err != nil {
			t.Fatalf("accepted params that do not lay out: %v", err)
		}
		var again [hdrFieldsEnd]byte
		l.writeHeader(again[:])
		if !bytes.Equal(again[:], buf[:hdrFieldsEnd]) {
			t.Fatalf("accepted a header that differs from its own layout:\n%x\n%x", buf[:hdrFieldsEnd], again)
		}
		if l.total != uint64(len(s.Bytes())) {
			t.Fatalf("layout of %d bytes accepted over %d", l.total, len(s.Bytes()))
		}
		// Whatever the bytes after the header hold, no accessor may fault.
		a := s.Agent()
		for i := range s.Params().LocalRanks {
			r := s.Rank(i)
			_, _ = a.Requests(i).Peek()
			_, _ = r.Responses().Peek()
			_ = r.Requests().Push(Header{Op: 1}, []byte("x"))
			_, _ = a.Slot(i, 1)
			_ = r.SetSlot(0, []byte("y"))
		}
		_, _ = s.Rank(0).Result(s.Params().WorldSize-1, 0)
		_, _ = s.Rank(0).Lookup([]byte("key"))
		_ = a.KVSPut([]byte("k"), []byte("v"), 0)
	})
}
