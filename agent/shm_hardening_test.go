package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/shm"
)

// shmJob is an agent of size ranks, all on shared memory (a real memfd
// segment, futex waiting), with recorded events.
func shmJob(t *testing.T, size int) (*Agent, *shm.Segment, *recEvents) {
	t.Helper()
	ev := &recEvents{}
	local := make([]int, size)
	for i := range local {
		local[i] = i
	}
	a, err := New(Config{JobID: "job-1", Size: size, Local: local, Events: ev.record})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	seg, err := shm.Create(shm.Params{LocalRanks: size, WorldSize: size, FirstEpoch: 1})
	if err != nil {
		t.Fatalf("create segment: %v", err)
	}
	if err := a.AttachSegment(seg); err != nil {
		seg.Close()
		t.Fatal(err)
	}
	return a, seg, ev
}

// The ring value limit is the text path's: a longer value is refused with
// an error response, not passed on to the neighbour.
func TestShmRingValueLimit(t *testing.T) {
	a, seg, _ := shmJob(t, 1)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	seq := r.push(shm.OpRing, []byte(strings.Repeat("x", pmiwire.ValLenMax+1)))
	r.expect(shm.OpRing, seq, shm.StatusError, "ring value longer than 1024 bytes")
	seq = r.push(shm.OpRing, []byte("ok"))
	c := r.r.Responses()
	if err := c.Wait(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	m, _ := c.Peek()
	if m.Seq != seq || m.Flags != shm.StatusOK {
		t.Fatalf("ring of a short value answered %+v", m.Header)
	}
	c.Release()
	_ = a
}

// A rank that stops reading its response ring is failed with a message
// naming it once the ring is full; the agent goes on serving the others.
func TestShmResponseRingFullFailsRank(t *testing.T) {
	_, seg, ev := shmJob(t, 2)
	r0 := &shmRank{t: t, r: seg.Rank(0)}
	r1 := &shmRank{t: t, r: seg.Rank(1)}
	r0.push(shm.OpHello, nil)
	r1.push(shm.OpHello, nil)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ev.mu.Lock()
		n := len(ev.protos)
		ev.mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no protocol error for a rank that never reads its responses")
		}
		r0.seq++
		err := r0.r.Requests().Push(shm.Header{Op: shm.OpJobAttr, Seq: r0.seq}, []byte("PMI_process_mapping"))
		if errors.Is(err, shm.ErrFull) {
			time.Sleep(time.Millisecond)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	got := ev.waitProtocolErrors(t, time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "0: ") || !strings.Contains(got[0], "stopped reading") {
		t.Fatalf("protocol errors %q, want one for rank 0 saying it stopped reading", got)
	}
	seq := r1.push(shm.OpJobAttr, []byte("no-such-attr"))
	r1.expect(shm.OpJobAttr, seq, shm.StatusNotFound, "")
}

// offAgentSleepers is the agent-sleepers word of the segment header
// (shm/layout.go): ranks ring the doorbell only while it is non-zero.
const offAgentSleepers = 132

// A stray store of 0 into the agent-sleepers word, a word every rank can
// write, neither hangs Close nor stops the agent: requests are still
// answered (the agent's doorbell wait is bounded) and Close ends.
func TestShmSleepersWordZeroed(t *testing.T) {
	a, seg, _ := shmJob(t, 1)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	time.Sleep(50 * time.Millisecond) // the agent is asleep
	w := seg.Bytes()[offAgentSleepers:]
	binary.NativeEndian.PutUint32(w, 0)
	seq := r.push(shm.OpJobAttr, []byte("no-such-attr"))
	r.expect(shm.OpJobAttr, seq, shm.StatusNotFound, "")
	time.Sleep(50 * time.Millisecond)
	binary.NativeEndian.PutUint32(w, 0)
	closeWithin(t, a, 5*time.Second)
}

// A rewritten segment header is detected: the job ends with a protocol
// error that names the damage (no rank can be blamed for it).
func TestShmHeaderRewritten(t *testing.T) {
	_, seg, ev := shmJob(t, 2)
	r := &shmRank{t: t, r: seg.Rank(0)}
	r.push(shm.OpHello, nil)
	b := seg.Bytes()
	for i := range 128 {
		b[i] = 0xa5
	}
	got := ev.waitProtocolErrors(t, 5*time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "-1: ") || !strings.Contains(got[0], "header") {
		t.Fatalf("protocol errors %q, want one about the segment header", got)
	}
}

// A rank on shared memory that leaves more requests waiting for an answer
// than a text connection may (MaxPendingPerConn: here waiting gets of keys
// nobody puts) is failed with a protocol error naming it, instead of
// growing the agent's memory without bound (on a daemon, at every other
// job's expense); the other rank is still served.
func TestShmPendingLimit(t *testing.T) {
	_, seg, ev := shmJob(t, 2)
	r0 := &shmRank{t: t, r: seg.Rank(0)}
	r1 := &shmRank{t: t, r: seg.Rank(1)}
	r0.push(shm.OpHello, nil)
	r1.push(shm.OpHello, nil)
	for k := range MaxPendingPerConn + 1 {
		r0.seq++
		h := shm.Header{Op: shm.OpGet, Flags: shm.GetWait, Seq: r0.seq}
		p := shm.AppendInt32(nil, -1, fmt.Sprintf("never-%d", k))
		if err := r0.r.Requests().PushWait(h, p, 5*time.Second); err != nil {
			t.Fatalf("push waiting get %d: %v", k, err)
		}
	}
	got := ev.waitProtocolErrors(t, 5*time.Second)
	if len(got) != 1 || !strings.HasPrefix(got[0], "0: ") || !strings.Contains(got[0], "more than 4096 requests waiting for an answer") {
		t.Fatalf("protocol errors %q, want one for rank 0 over the pending limit", got)
	}
	seq := r1.push(shm.OpJobAttr, []byte("no-such-attr"))
	r1.expect(shm.OpJobAttr, seq, shm.StatusNotFound, "")
}
