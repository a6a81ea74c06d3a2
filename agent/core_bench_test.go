package agent

import (
	"fmt"
	"testing"

	"github.com/fastpmi/fastpmi/pmiwire"
)

// BenchmarkParkedGets times one entry into a wait, which runs the
// deadlock check, while rank 0 of a three-rank node has many gets parked
// (a client may park up to MaxPendingPerConn): a waiting get of rank 1
// and the sparse put of rank 2 (which runs) that answers it. The check
// should not cost more with more parked requests.
func BenchmarkParkedGets(b *testing.B) {
	for _, parked := range []int{16, 4096} {
		b.Run(fmt.Sprintf("parked=%d", parked), func(b *testing.B) {
			cfg := Config{JobID: "j", Size: 3, Local: []int{0, 1, 2}}
			c := NewCore(&cfg, 0, 3)
			id := uint64(0)
			step := func(op Op) {
				if err := c.Step(op); err != nil {
					b.Fatal(err)
				}
			}
			for i := range parked {
				id++
				step(Get{Local: 0, Req: Req{ID: id}, Key: fmt.Sprintf("never-%d", i), Wait: true, Src: -1})
			}
			c.Ready()
			keys := make([]string, b.N) // each put once: a get of one put already is answered at once
			for i := range keys {
				keys[i] = fmt.Sprintf("k%d", i)
			}
			b.ResetTimer()
			for _, k := range keys {
				id++
				step(Get{Local: 1, Req: Req{ID: id}, Key: k, Wait: true, Src: -1})
				id++
				step(Put{Local: 2, Req: Req{ID: id}, Key: k, Val: "v", Hint: pmiwire.HintSparse})
				if rd := c.Ready(); len(rd.Replies) != 2 || rd.Replies[0].Err != nil {
					b.Fatalf("%d replies, the first %+v; want the get's and the put's", len(rd.Replies), rd.Replies[0])
				}
			}
		})
	}
}
