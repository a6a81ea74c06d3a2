package agent

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

// A collective across jobs is a deferred call: the node's entry goes to
// the Upstream as one UpJobs call, whose answer (every node's data)
// answers the entry; a refused framing is answered at once; Shutdown
// fails an entry still waiting.
func TestJobsColl(t *testing.T) {
	cfg := Config{JobID: "j", Size: 4, Local: []int{0, 1}}
	c := NewCore(&cfg, 0, 2)
	procs := []JobRanks{{Job: "j"}, {Job: "j-1", Ranks: []int{0, 2}}}
	if err := c.Step(JobsColl{Local: 0, Req: Req{ID: 1}, Kind: JobsFence, Procs: procs, Data: []byte("node\x00data")}); err != nil {
		t.Fatal(err)
	}
	rd := c.Ready()
	if len(rd.Upstream) != 1 || len(rd.Replies) != 0 {
		t.Fatalf("ready %+v, want one Upstream call and no reply", rd)
	}
	u := rd.Upstream[0]
	if u.Kind != UpJobs || u.Name != JobsFence || !reflect.DeepEqual(u.Jobs, procs) || u.Port != "node\x00data" {
		t.Fatalf("call %+v", u)
	}
	c.Step(JobsCollDone{ID: u.ID, Data: []byte("all\x00data")})
	rd = c.Ready()
	if len(rd.Replies) != 1 || rd.Replies[0].Kind != ReplyJobs || rd.Replies[0].Val != "all\x00data" || rd.Replies[0].Err != nil || rd.Replies[0].Req.ID != 1 {
		t.Fatalf("replies %+v", rd.Replies)
	}
	c.Step(JobsCollDone{ID: u.ID, Data: []byte("again")})
	if rd := c.Ready(); len(rd.Replies) != 0 {
		t.Errorf("a second answer replied again: %+v", rd.Replies)
	}

	for _, bad := range []struct {
		o    JobsColl
		want string
	}{
		{JobsColl{Kind: "barrier", Procs: procs}, "unknown kind"},
		{JobsColl{Kind: JobsConnect}, "0 jobs"},
		{JobsColl{Kind: JobsConnect, Procs: []JobRanks{{Job: "j"}, {Job: "j"}}}, "named twice"},
		{JobsColl{Kind: JobsConnect, Procs: []JobRanks{{Job: "j", Ranks: []int{-1}}}}, "rank -1"},
	} {
		bad.o.Req = Req{ID: 2}
		if err := c.Step(bad.o); err != nil {
			t.Fatal(err)
		}
		rd := c.Ready()
		if len(rd.Upstream) != 0 || len(rd.Replies) != 1 || !errors.Is(rd.Replies[0].Err, ErrJobsColl) || !strings.Contains(rd.Replies[0].Err.Error(), bad.want) {
			t.Errorf("%+v: ready %+v, want a reply saying %q", bad.o, rd, bad.want)
		}
	}
	if err := c.Step(JobsColl{Local: 2, Kind: JobsConnect, Procs: procs}); !errors.Is(err, ErrNoRank) {
		t.Errorf("entry of local rank 2 of 2: %v", err)
	}

	c.Step(JobsColl{Local: 1, Req: Req{ID: 3}, Kind: JobsDisconnect, Procs: procs})
	c.Ready()
	c.Step(Shutdown{})
	if rd := c.Ready(); len(rd.Replies) != 1 || rd.Replies[0].Req.ID != 3 || rd.Replies[0].Err == nil {
		t.Errorf("shutdown: replies %+v, want the waiting entry failed", rd.Replies)
	}
}

// A rank of another job of the run is fetched through the Upstream by
// job and rank, whatever this job's size; its answer answers the request.
func TestJobRankData(t *testing.T) {
	cfg := Config{JobID: "j", Size: 2, Local: []int{0, 1}}
	c := NewCore(&cfg, 0, 1)
	if err := c.Step(GetRankData{Req: Req{ID: 7}, Rank: 5, Job: "j-1"}); err != nil {
		t.Fatal(err)
	}
	rd := c.Ready()
	if len(rd.Upstream) != 1 || rd.Upstream[0].Kind != UpRankData || rd.Upstream[0].Name != "j-1" || rd.Upstream[0].Src != 5 || len(rd.Asks) != 0 {
		t.Fatalf("ready %+v, want one UpRankData call for rank 5 of j-1", rd)
	}
	c.Step(RankDataDone{ID: rd.Upstream[0].ID, Found: true, Val: "card"})
	if rd := c.Ready(); len(rd.Replies) != 1 || rd.Replies[0].Req.ID != 7 || !rd.Replies[0].Found || rd.Replies[0].Val != "card" {
		t.Fatalf("replies %+v", rd.Replies)
	}
	// This job named as the other: a rank of this job, checked as such.
	if err := c.Step(GetRankData{Req: Req{ID: 8}, Rank: 5, Job: "j"}); !errors.Is(err, ErrNoRank) {
		t.Errorf("rank 5 of this job of 2: %v", err)
	}
	if err := c.Step(GetRankData{Req: Req{ID: 9}, Rank: -1, Job: "j-1"}); !errors.Is(err, ErrNoRank) {
		t.Errorf("rank -1 of another job: %v", err)
	}
}

// Where another job runs is asked of the Upstream by name and answered
// with its layout; a job without a name, and a layout that does not
// describe a job (no ranks, a rank twice or missing, a node unnamed), is
// an error.
func TestJobLayout(t *testing.T) {
	cfg := Config{JobID: "j", Size: 2, Local: []int{0, 1}}
	c := NewCore(&cfg, 0, 1)
	ask := func(id uint64, job string) uint64 {
		t.Helper()
		c.Step(JobLayout{Req: Req{ID: id}, Job: job})
		rd := c.Ready()
		if len(rd.Upstream) != 1 || rd.Upstream[0].Kind != UpJobLayout || rd.Upstream[0].Name != job {
			t.Fatalf("ready %+v, want one UpJobLayout call for %s", rd, job)
		}
		return rd.Upstream[0].ID
	}
	good := &Layout{Size: 3, Hosts: []string{"a", "b"}, Nodes: [][]int{{2, 0}, {1}}}
	c.Step(JobLayoutDone{ID: ask(4, "j-1"), Layout: good})
	if rd := c.Ready(); len(rd.Replies) != 1 || rd.Replies[0].Kind != ReplyLayout || rd.Replies[0].Layout != good ||
		rd.Replies[0].Req.ID != 4 || rd.Replies[0].Local != -1 || rd.Replies[0].Err != nil {
		t.Fatalf("replies %+v", rd.Replies)
	}
	for _, bad := range []*Layout{
		nil,
		{},
		{Size: 2, Hosts: []string{"a"}, Nodes: [][]int{{0, 1}, {}}},
		{Size: 2, Hosts: []string{"a", "b"}, Nodes: [][]int{{0, 1}, {}}},
		{Size: 2, Hosts: []string{"a", ""}, Nodes: [][]int{{0}, {1}}},
		{Size: 2, Hosts: []string{"a", "b"}, Nodes: [][]int{{0}, {0}}},
		{Size: 2, Hosts: []string{"a", "b"}, Nodes: [][]int{{0}, {2}}},
		{Size: 3, Hosts: []string{"a", "b"}, Nodes: [][]int{{0}, {1}}},
		{Size: 1 << 40, Hosts: []string{"a"}, Nodes: [][]int{{0}}}, // refused before anything that large is made
	} {
		c.Step(JobLayoutDone{ID: ask(5, "j-2"), Layout: bad})
		if rd := c.Ready(); len(rd.Replies) != 1 || !errors.Is(rd.Replies[0].Err, ErrJobsColl) || rd.Replies[0].Layout != nil {
			t.Errorf("layout %+v: %+v", bad, rd.Replies)
		}
	}
	c.Step(JobLayoutDone{ID: ask(7, "j-3"), Err: errors.New("job j-3 is not running")})
	if rd := c.Ready(); len(rd.Replies) != 1 || rd.Replies[0].Err == nil || rd.Replies[0].Found {
		t.Errorf("a failed call: %+v", rd.Replies)
	}
	c.Step(JobLayout{Req: Req{ID: 6}})
	if rd := c.Ready(); len(rd.Upstream) != 0 || len(rd.Replies) != 1 || !errors.Is(rd.Replies[0].Err, ErrJobsColl) {
		t.Errorf("a job without a name: %+v", rd)
	}
}
