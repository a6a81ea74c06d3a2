package agent

import (
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/shm"
)

// FuzzTextRequests feeds arbitrary bytes to the agent's text front end,
// split between two ranks' connections (real socketpairs, replies read and
// discarded). Whatever arrives, the agent must not crash, must keep its
// goroutines accountable (Close returns), and must answer a well-formed
// request from the other rank afterwards unless that rank's own bytes broke
// its framing.
func FuzzTextRequests(f *testing.F) {
	for _, s := range []string{
		"cmd=init pmi_version=1 pmi_subversion=1\ncmd=put kvsname=job-1 key=k value=v\ncmd=barrier_in\n",
		"cmd=init pmi_version=1 pmi_subversion=1\ncmd=barrier_in group=0,1:t\ncmd=abort exitcode=256\n",
		"cmd=init pmi_version=2 pmi_subversion=0\n    26cmd=fullinit;pmirank=0;    32cmd=kvs-put;key=a\x00b;value=v;",
		"    21cmd=fullinit;pmirank=1;    38cmd=kvs-get;key=k;fastpmi-wait=TRUE;",
		"cmd=initack pmiid=1\ncmd=spawn nprocs=3\ncmd=publish_name service=s port=p\ncmd=lookup_name service=s\n",
		"cmd=init pmi_version=2 pmi_subversion=0\n    20cmd=ring;ring-count=x;",
		"\x00\xff garbage\n    -1",
	} {
		f.Add([]byte(s), byte(len(s)/2))
	}
	f.Fuzz(func(t *testing.T, in []byte, split byte) {
		a, cs, _ := newJob(t, 2, nil)
		done := make(chan struct{}, 2)
		for _, c := range cs {
			go func() { io.Copy(io.Discard, c.nc); done <- struct{}{} }()
		}
		k := min(int(split), len(in))
		cs[0].nc.Write(in[:k])
		cs[1].nc.Write(in[k:])
		time.Sleep(time.Millisecond)
		for _, c := range cs {
			c.nc.Close()
		}
		closeWithin(t, a, 5*time.Second)
		for range cs {
			<-done
		}
	})
}

// FuzzShmRequests feeds arbitrary records and stray stores to the agent's
// shared-memory front end: each record either pushes a request (any op,
// flags, epoch and payload) on a rank's request ring, or stores a byte
// anywhere in the segment — every byte of which a rank can write. The
// agent must not crash or hang, and Close must return.
//
// Record: kind (1 byte), then for a push: rank (1), op (2), flags (2),
// epoch (4), payload length (1), payload; for a store: offset (4), byte.
func FuzzShmRequests(f *testing.F) {
	rec := func(rank byte, op, flags uint16, epoch uint32, payload string) []byte {
		b := []byte{0, rank}
		b = binary.LittleEndian.AppendUint16(b, op)
		b = binary.LittleEndian.AppendUint16(b, flags)
		b = binary.LittleEndian.AppendUint32(b, epoch)
		b = append(b, byte(len(payload)))
		return append(b, payload...)
	}
	store := func(off uint32, v byte) []byte {
		return append(binary.LittleEndian.AppendUint32([]byte{1}, off), v)
	}
	cat := func(bs ...[]byte) []byte {
		var out []byte
		for _, b := range bs {
			out = append(out, b...)
		}
		return out
	}
	f.Add(cat(rec(0, shm.OpHello, 0, 0, ""), rec(0, shm.OpPut, 0, 0, string(shm.AppendPair(nil, "k", "v"))), rec(0, shm.OpFence, 0, 1, "")))
	f.Add(cat(rec(1, shm.OpHello, 0, 0, ""), rec(1, shm.OpRing, 0, 0, "x"), rec(0, shm.OpRing, 0, 0, "y")))
	f.Add(cat(rec(0, shm.OpAllgather, 0, 1, ""), store(4096, 0xff), rec(1, shm.OpGet, 1, 0, string(shm.AppendInt32(nil, 7, "k")))))
	f.Add(cat(store(132, 0), store(0, 1), rec(0, shm.OpAbort, 0, 0, string(shm.AppendInt32(nil, 256, "m")))))
	f.Add(cat(rec(0, shm.OpPublish, 0, 0, "\x05\x00"), rec(0, shm.OpFinalize, 0, 0, ""), rec(0, shm.OpLookup, 0, 0, "s")))
	f.Fuzz(func(t *testing.T, in []byte) {
		ev := &recEvents{}
		a, err := New(Config{JobID: "job-1", Size: 3, Local: []int{0, 1}, Events: ev.record})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		// A memfd segment, as ranks share it: the stray stores race with
		// the agent by design, which the race detector does not see in
		// mapped memory (a heap segment would report them).
		seg, err := shm.Create(shm.Params{LocalRanks: 2, WorldSize: 3, FirstEpoch: 1})
		if err != nil {
			t.Fatalf("create segment: %v", err)
		}
		seg.SetWaiter(shm.InProcessWaiter())
		mem := seg.Bytes()
		if err := a.AttachSegment(seg); err != nil {
			seg.Close()
			t.Fatal(err)
		}
		seq := uint32(0)
		le := binary.LittleEndian
		for len(in) > 0 {
			kind := in[0]
			in = in[1:]
			if kind&1 == 1 {
				if len(in) < 5 {
					break
				}
				mem[le.Uint32(in)%uint32(len(mem))] = in[4]
				in = in[5:]
				continue
			}
			if len(in) < 10 {
				break
			}
			r := seg.Rank(int(in[0] % 2))
			h := shm.Header{Op: le.Uint16(in[1:]), Flags: le.Uint16(in[3:]), Epoch: le.Uint32(in[5:])}
			n := min(int(in[9]), len(in)-10)
			payload := in[10 : 10+n]
			in = in[10+n:]
			seq++
			h.Seq = seq
			if h.Op == shm.OpAllgather {
				_ = r.SetSlot(h.Epoch, payload)
			}
			_ = r.Requests().Push(h, payload) // a full or broken ring refuses it
		}
		time.Sleep(time.Millisecond)
		closeWithin(t, a, 5*time.Second)
	})
}
