package agent

import (
	"fmt"
	"testing"
	"time"
)

func ringReq(c *wireClient, i, round int) {
	c.v2(fmt.Sprintf("cmd=ring;ring-count=1;ring-left=L%d.%d;ring-right=R%d.%d;", i, round, i, round))
}

// expectRing reads rank i's answer in a ring of n on one node.
func expectRing(c *wireClient, i, n, round int) {
	l, r := (i+n-1)%n, (i+1)%n
	c.expect(fmt.Sprintf("cmd=ring-response;rc=0;ring-count=%d;ring-left=R%d.%d;ring-right=L%d.%d;", i, l, round, r, round))
}

// A rank is answered as soon as both its neighbours entered, not when the
// whole node has; so a rank can be a ring ahead of the others.
func TestRingAnswersWhenNeighboursEnter(t *testing.T) {
	a, cs, _ := newJob(t, 4, nil)
	initV2(t, cs)
	for i := range 3 {
		ringReq(cs[i], i, 1)
	}
	// Rank 1's neighbours (0, 2) are in: answered. Ranks 0 and 2 wait for
	// rank 3 (rank 0's left neighbour wraps to it).
	expectRing(cs[1], 1, 4, 1)
	cs[0].noReply(30 * time.Millisecond)
	cs[2].noReply(0)
	// Rank 1 enters the second ring while the first is in progress.
	ringReq(cs[1], 1, 2)
	cs[1].noReply(30 * time.Millisecond)
	ringReq(cs[3], 3, 1)
	for _, i := range []int{0, 2, 3} {
		expectRing(cs[i], i, 4, 1)
	}
	if got := a.Stats().Rings; got != 1 {
		t.Fatalf("completed rings %d, want 1", got)
	}
	for _, i := range []int{0, 2, 3} {
		ringReq(cs[i], i, 2)
	}
	for i, c := range cs {
		expectRing(c, i, 4, 2)
	}
	if got := a.Stats().Rings; got != 2 {
		t.Fatalf("completed rings %d, want 2", got)
	}
}

// One local rank: its left and right neighbours are itself.
func TestRingOneRank(t *testing.T) {
	_, cs, _ := newJob(t, 1, nil)
	initV2(t, cs)
	for round := 1; round <= 3; round++ {
		ringReq(cs[0], 0, round)
		expectRing(cs[0], 0, 1, round)
	}
}

func TestRingRejects(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	cs[0].v2("cmd=ring;ring-count=2;ring-left=a;ring-right=a;")
	cs[0].expect("cmd=ring-response;rc=-1;errmsg=ring-count 2: only 1 is supported (every PMIX_Ring process counts 1);")
	ringReq(cs[0], 0, 1)
	ringReq(cs[0], 0, 1)
	cs[0].expect("cmd=ring-response;rc=-1;errmsg=rank 0 entered ring 1 twice;")
	ringReq(cs[1], 1, 1)
	expectRing(cs[0], 0, 2, 1)
	expectRing(cs[1], 1, 2, 1)
}

// A rank that exits fails the ranks waiting for it, including those that
// would have been answered by neighbours that did enter.
func TestRingFailsWhenPeerGone(t *testing.T) {
	a, cs, _ := newJob(t, 3, nil)
	initV2(t, cs)
	ringReq(cs[0], 0, 1)
	ringReq(cs[1], 1, 1)
	cs[0].noReply(30 * time.Millisecond)
	a.RankGone(2, "exited with code 1")
	for _, c := range cs[:2] {
		c.expect("cmd=ring-response;rc=-1;errmsg=ring cannot complete: rank 2 exited with code 1;")
	}
	// A later entry into a ring the gone rank never entered fails at once.
	ringReq(cs[0], 0, 2)
	cs[0].expect("cmd=ring-response;rc=-1;errmsg=ring cannot complete: rank 2 has exited;")
}

// Every rank of one node in a ring that cannot close because one rank
// waits elsewhere is a deadlock, reported rather than hung.
func TestRingDeadlock(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	ringReq(cs[0], 0, 1)
	cs[1].v2("cmd=kvs-fence;")
	got := cs[0].read()
	want := "cmd=ring-response;rc=-1;errmsg=deadlock: every live rank waits (rank 0 in ring, rank 1 in fence);"
	if got != want {
		t.Fatalf("ring reply %q, want %q", got, want)
	}
	cs[1].expect("cmd=kvs-fence-response;rc=-1;errmsg=deadlock: every live rank waits (rank 0 in ring, rank 1 in fence);")
}
