package agent

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/fastpmi/fastpmi/shm"
)

// A fence with data collected per node (PMIx's): the first local rank
// carries the node's data, the others nothing, and the first rank's reply
// holds every node's data in rank order. The data may be far longer than
// a shared-memory result entry: no rank reads it there, so the agent does
// not write it there (a node on a segment used to log a failed write for
// every such fence).
func TestNodeAllgather(t *testing.T) {
	var log bytes.Buffer
	a, err := New(Config{JobID: "job-1", Size: 2, Local: []int{0, 1}, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	seg, err := shm.Create(shm.Params{LocalRanks: 2, WorldSize: 2, FirstEpoch: 1})
	if err != nil {
		t.Fatalf("create segment: %v", err)
	}
	if err := a.AttachSegment(seg); err != nil {
		seg.Close()
		t.Fatal(err)
	}
	ext := newAskLog()
	if err := a.AttachExternal(ext); err != nil {
		t.Fatal(err)
	}
	blob := bytes.Repeat([]byte("node data\x00"), 4*seg.Params().MaxValue/10)
	ops := NodeAllgather(2, Req{Via: ViaExternal, ID: 7}, blob)
	if len(ops) != 2 {
		t.Fatalf("%d operations for 2 local ranks", len(ops))
	}
	if err := a.StepExternal(ops...); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		rp := nextOf(t, ext.replies, "reply")
		data, completes := NodeData(rp)
		switch {
		case rp.Local != i || rp.Req.ID != 7 || rp.Err != nil:
			t.Errorf("reply %d: %+v", i, rp)
		case completes != (i == 0):
			t.Errorf("reply of local rank %d completes the fence: %v", i, completes)
		case i == 0 && !bytes.Equal(data, blob):
			t.Errorf("node data of %d bytes back, want the %d sent", len(data), len(blob))
		}
	}
	// A fence without data: the same path, nothing back.
	if err := a.StepExternal(NodeAllgather(2, Req{Via: ViaExternal, ID: 8}, nil)...); err != nil {
		t.Fatal(err)
	}
	if data, completes := NodeData(nextOf(t, ext.replies, "reply")); !completes || len(data) != 0 {
		t.Errorf("fence without data: %q back (completes %v)", data, completes)
	}
	nextOf(t, ext.replies, "reply")
	if log.Len() != 0 {
		t.Errorf("agent logged:\n%s", log.String())
	}
}
