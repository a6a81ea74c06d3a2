package agent

import (
	"errors"
	"strings"
	"testing"
)

// askLog is an external front end that records the core's requests for
// rank data and the replies it gets.
type askLog struct {
	asks    chan Ask
	replies chan Reply
}

func newAskLog() *askLog { return &askLog{asks: make(chan Ask, 8), replies: make(chan Reply, 8)} }

func (l *askLog) Reply(r Reply)                   { l.replies <- r }
func (l *askLog) AskRankData(id uint64, rank int) { l.asks <- Ask{ID: id, Rank: rank} }

// rankDataUp answers FetchRankData from a table of ranks' data; a rank
// missing from it is never answered.
type rankDataUp struct {
	*Local
	data  map[int]string
	asked chan int
}

func (u rankDataUp) FetchRankData(rank int, done func(string, bool, error)) {
	u.asked <- rank
	if v, ok := u.data[rank]; ok {
		done(v, true, nil)
	}
}

func nextOf[T any](t *testing.T, ch chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	default:
		t.Fatalf("no %s", what)
	}
	var zero T
	return zero
}

// Rank data through the agent: a rank of another node is fetched from
// it (the Upstream), one of this node is asked of the external front
// end, whose answer (bytes of any value) completes the request; a rank
// that ended before its front end answered fails it, as Shutdown fails
// every request still waiting.
func TestRankData(t *testing.T) {
	up := rankDataUp{Local: NewLocal(), data: map[int]string{2: "blob\x00\xff of 2"}, asked: make(chan int, 8)}
	a, err := New(Config{Size: 4, Local: []int{0, 1}, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ext := newAskLog()
	if err := a.AttachExternal(ext); err != nil {
		t.Fatal(err)
	}
	req := func(id uint64) Req { return Req{Via: ViaExternal, ID: id} }

	// Another node's rank: fetched from there.
	if err := a.StepExternal(GetRankData{Req: req(1), Rank: 2}); err != nil {
		t.Fatal(err)
	}
	if r := nextOf(t, up.asked, "fetch of rank 2"); r != 2 {
		t.Errorf("fetched rank %d, want 2", r)
	}
	if rp := nextOf(t, ext.replies, "reply"); rp.Req.ID != 1 || rp.Kind != ReplyGet || rp.Local != -1 || !rp.Found || rp.Val != "blob\x00\xff of 2" || rp.Err != nil {
		t.Errorf("reply %+v", rp)
	}

	// This node's rank: asked of the front end, for this node and for
	// another node's request alike.
	if err := a.StepExternal(GetRankData{Req: req(2), Rank: 1}); err != nil {
		t.Fatal(err)
	}
	ask := nextOf(t, ext.asks, "ask for rank 1")
	served := make(chan string, 1)
	a.ServeRankData(0, func(val string, found bool, err error) { served <- val })
	ask0 := nextOf(t, ext.asks, "ask for rank 0")
	if ask.Rank != 1 || ask0.Rank != 0 {
		t.Fatalf("asks %+v %+v", ask, ask0)
	}
	if err := a.StepExternal(RankDataDone{ID: ask.ID, Found: true, Val: "one"}); err != nil {
		t.Fatal(err)
	}
	if rp := nextOf(t, ext.replies, "reply"); rp.Req.ID != 2 || !rp.Found || rp.Val != "one" {
		t.Errorf("reply %+v", rp)
	}
	a.StepExternal(RankDataDone{ID: ask0.ID, Found: true, Val: "zero"})
	if v := nextOf(t, served, "answer to the other node"); v != "zero" {
		t.Errorf("served %q", v)
	}
	// A second answer to the same request changes nothing.
	a.StepExternal(RankDataDone{ID: ask0.ID, Found: true, Val: "again"})
	if len(ext.replies) != 0 || len(served) != 0 {
		t.Error("a request was answered twice")
	}

	// Not found is an answer, not an error; data over the bound is one.
	a.StepExternal(GetRankData{Req: req(3), Rank: 1})
	a.StepExternal(RankDataDone{ID: nextOf(t, ext.asks, "ask").ID})
	if rp := nextOf(t, ext.replies, "reply"); rp.Found || rp.Err != nil {
		t.Errorf("not found: %+v", rp)
	}
	a.StepExternal(GetRankData{Req: req(4), Rank: 1})
	a.StepExternal(RankDataDone{ID: nextOf(t, ext.asks, "ask").ID, Found: true, Val: strings.Repeat("x", MaxRankDataBytes+1)})
	if rp := nextOf(t, ext.replies, "reply"); !errors.Is(rp.Err, ErrQuota) {
		t.Errorf("oversized data: %+v", rp)
	}

	// A rank outside the job is a protocol error; one of another node
	// asked here is answered with an error.
	if err := a.StepExternal(GetRankData{Req: req(5), Rank: 4}); !errors.Is(err, ErrNoRank) {
		t.Errorf("rank 4 of 4: %v", err)
	}
	errc := make(chan error, 1)
	a.ServeRankData(3, func(_ string, _ bool, err error) { errc <- err })
	if err := nextOf(t, errc, "answer"); err == nil {
		t.Error("data of another node's rank served here")
	}

	// The rank ends (without finalizing) before its front end answered:
	// the request fails, and so does a later one. A finalized rank is
	// still asked: its front end holds its data.
	a.StepExternal(GetRankData{Req: req(6), Rank: 1})
	nextOf(t, ext.asks, "ask")
	a.step(Gone{Local: 1, Why: "killed by signal 9"})
	if rp := nextOf(t, ext.replies, "reply"); rp.Req.ID != 6 || !errors.Is(rp.Err, ErrNoRankData) || !strings.Contains(rp.Err.Error(), "rank 1 killed") {
		t.Errorf("rank gone: %+v", rp)
	}
	a.StepExternal(GetRankData{Req: req(7), Rank: 1})
	if rp := nextOf(t, ext.replies, "reply"); !errors.Is(rp.Err, ErrNoRankData) {
		t.Errorf("rank gone before: %+v", rp)
	}
	a.StepExternal(Finalize{Local: 0, Req: req(8)})
	nextOf(t, ext.replies, "finalize reply")
	a.step(Gone{Local: 0, Why: "exited"})
	a.StepExternal(GetRankData{Req: req(9), Rank: 0})
	nextOf(t, ext.asks, "ask for finalized rank 0")

	// Shutdown fails what waits: that ask, and a fetch never answered.
	a.StepExternal(GetRankData{Req: req(10), Rank: 3})
	nextOf(t, up.asked, "fetch of rank 3")
	a.Close()
	ids := map[uint64]bool{}
	for range 2 {
		rp := nextOf(t, ext.replies, "reply at close")
		if rp.Err == nil {
			t.Errorf("request %d answered without error at close", rp.Req.ID)
		}
		ids[rp.Req.ID] = true
	}
	if !ids[9] || !ids[10] {
		t.Errorf("close failed %v, want 9 and 10", ids)
	}
}

// Without an external front end, another node's request for rank data
// is answered with an error at once.
func TestRankDataNoExternal(t *testing.T) {
	a, err := New(Config{Size: 2, Local: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	errc := make(chan error, 1)
	a.ServeRankData(0, func(_ string, _ bool, err error) { errc <- err })
	if err := nextOf(t, errc, "answer"); !errors.Is(err, ErrNoExternal) {
		t.Errorf("answer %v, want ErrNoExternal", err)
	}
}

// Once the agent closed (every rank of its node ended; the node stays
// to serve its placed keys until the job ends), another node's request
// for a finalized rank's data is answered with an error at once: the
// closed front end drops every ask, and the request waited for ever
// (a PMIx client's get of a peer on a node whose ranks all exited).
func TestRankDataAfterClose(t *testing.T) {
	a, err := New(Config{Size: 2, Local: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	ext := newAskLog()
	if err := a.AttachExternal(ext); err != nil {
		t.Fatal(err)
	}
	a.StepExternal(Init{Local: 0})
	a.StepExternal(Finalize{Local: 0, Req: Req{Via: ViaExternal}})
	a.Close()
	errc := make(chan error, 1)
	a.ServeRankData(0, func(_ string, _ bool, err error) { errc <- err })
	if err := nextOf(t, errc, "answer after close"); !errors.Is(err, ErrNoRankData) {
		t.Errorf("answer %v, want ErrNoRankData", err)
	}
	if len(ext.asks) != 0 {
		t.Error("the closed front end was asked")
	}
}
