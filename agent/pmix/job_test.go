//go:build pmix

package pmix

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/tree"
)

// events records what the agent reports to its launcher (init,
// finalize, abort).
type events struct{ ch chan string }

func (e events) record(ev agent.Event) {
	r := string(rune('0' + ev.Rank))
	switch ev.Kind {
	case agent.EventInit:
		e.ch <- "init " + r
	case agent.EventFinalized:
		e.ch <- "finalized " + r
	case agent.EventAbort:
		e.ch <- "abort " + r + " " + ev.Msg
	}
}

// call hands r to j as a host callback would and waits for its result.
func call(t *testing.T, j *Job, r *request) result {
	t.Helper()
	ch := make(chan result, 1)
	r.done = func(res result) { ch <- res }
	if err := j.enqueue(r); err != nil {
		t.Fatalf("request %v refused: %v", r.kind, err)
	}
	select {
	case res := <-ch:
		return res
	case <-time.After(30 * time.Second):
		t.Fatalf("request %v not completed", r.kind)
	}
	return result{}
}

// The front end against a real agent (one node): each kind of host
// callback becomes its agent operation and completes with the agent's
// answer.
func TestJobRequests(t *testing.T) {
	ev := events{ch: make(chan string, 16)}
	a, err := agent.New(agent.Config{Size: 2, Local: []int{0, 1}, Events: ev.record})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-requests", Size: 2, Nodes: [][]int{{0, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	want := func(e string) {
		t.Helper()
		if got := <-ev.ch; got != e {
			t.Errorf("event %q, want %q", got, e)
		}
	}
	for r := range 2 {
		if res := call(t, j, &request{kind: reqConnected, rank: r}); res.err != nil {
			t.Fatalf("connected %d: %v", r, res.err)
		}
		want("init " + string(rune('0'+r)))
	}
	if res := call(t, j, &request{kind: reqConnected, rank: 5}); res.err == nil {
		t.Error("a rank the node does not serve connected")
	}
	// A fence with the node's data gets it back (one node: the job's data);
	// one without gets nothing; both are allgather epochs of the core.
	if res := call(t, j, &request{kind: reqFence, rank: -1, data: []byte("blob\x00data")}); res.err != nil || string(res.data) != "blob\x00data" {
		t.Errorf("fence with data: %q, %v", res.data, res.err)
	}
	if res := call(t, j, &request{kind: reqFence, rank: -1}); res.err != nil || len(res.data) != 0 {
		t.Errorf("fence without data: %q, %v", res.data, res.err)
	}
	if res := call(t, j, &request{kind: reqPublish, rank: 0, strs: []string{"svc", "port-1", "svc2", "port-2"}}); res.err != nil {
		t.Fatalf("publish: %v", res.err)
	}
	res := call(t, j, &request{kind: reqLookup, rank: 1, strs: []string{"nope", "svc2", "svc"}})
	if res.err != nil || len(res.found) != 4 || res.found[0] != "svc2" || res.found[1] != "port-2" || res.found[2] != "svc" || res.found[3] != "port-1" {
		t.Errorf("lookup: %q, %v", res.found, res.err)
	}
	if res := call(t, j, &request{kind: reqUnpublish, rank: 0, strs: []string{"svc"}}); res.err != nil {
		t.Errorf("unpublish: %v", res.err)
	}
	if res := call(t, j, &request{kind: reqLookup, rank: 1, strs: []string{"svc"}}); !errors.Is(res.err, errNotFound) {
		t.Errorf("lookup after unpublish: %q, %v; want errNotFound", res.found, res.err)
	}
	if res := call(t, j, &request{kind: reqPublish, rank: 0, strs: []string{"bad\x00name", "p"}}); res.err == nil {
		t.Error("a name with a NUL byte was published")
	}
	if res := call(t, j, &request{kind: reqAbort, rank: 1, code: 3, msg: "bye"}); res.err != nil {
		t.Errorf("abort: %v", res.err)
	}
	want("abort 1 bye")
	// A message over the bound is cut, and says so.
	if res := call(t, j, &request{kind: reqAbort, rank: 1, code: 3, msg: strings.Repeat("x", 5000)}); res.err != nil {
		t.Errorf("abort: %v", res.err)
	}
	want("abort 1 " + strings.Repeat("x", maxAbortMsg) + " [the first 1024 of 5000 bytes]")
	if res := call(t, j, &request{kind: reqFinalized, rank: 0}); res.err != nil {
		t.Errorf("finalized: %v", res.err)
	}
	want("finalized 0")
	if _, fin := a.RankStatus(0); !fin {
		t.Error("the agent does not count rank 0 finalized")
	}
}

// A fence whose peer is gone fails, as a PMI fence does; Close fails a
// fence still waiting and refuses later requests.
func TestJobFenceFailures(t *testing.T) {
	a, err := agent.New(agent.Config{Size: 3, Local: []int{0, 1}, Upstream: stuck{}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-failures", Size: 3, Nodes: [][]int{{0, 1}, {2}}})
	if err != nil {
		t.Fatal(err)
	}
	// The other node never answers (stuck): the fence waits until Close.
	ch := make(chan result, 1)
	if err := j.enqueue(&request{kind: reqFence, rank: -1, data: []byte("x"), done: func(r result) { ch <- r }}); err != nil {
		t.Fatalf("fence refused: %v", err)
	}
	select {
	case r := <-ch:
		t.Fatalf("fence completed without the other node: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	j.Close()
	select {
	case r := <-ch:
		if r.err == nil {
			t.Error("a fence pending at Close succeeded")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close left a fence pending")
	}
	if err := j.enqueue(&request{kind: reqConnected, rank: 0, done: func(result) {}}); !errors.Is(err, errJobClosed) {
		t.Errorf("a closed job's enqueue: %v, want errJobClosed", err)
	}

	// A local rank gone before the node's fence: the fence fails naming it.
	a2, err := agent.New(agent.Config{Size: 2, Local: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer a2.Close()
	j2, err := NewJob(Config{Agent: a2, Nspace: "job-gone", Size: 2, Nodes: [][]int{{0, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer j2.Close()
	a2.RankGone(1, "killed by signal 9")
	if res := call(t, j2, &request{kind: reqFence, rank: -1}); res.err == nil {
		t.Error("a fence with a dead local rank succeeded")
	} else if want := "rank 1"; !strings.Contains(res.err.Error(), want) {
		t.Errorf("fence error %q does not name %s", res.err, want)
	}
}

// stuck is an Upstream whose collectives never complete.
type stuck struct{ agent.Upstream }

func (stuck) Allgather(uint64, []tree.Entry, func([][]byte, error)) {}
func (stuck) RingLayout(local int) (int, int)                       { return 0, local }

// remoteData is an Upstream whose other node holds rank data: the
// ranks in data are answered (found or not), the others never.
type remoteData struct {
	*agent.Local
	data map[int]*string
}

func (u remoteData) FetchRankData(rank int, done func(string, bool, error)) {
	v, ok := u.data[rank]
	switch {
	case ok && v != nil:
		done(*v, true, nil)
	case ok:
		done("", false, nil)
	}
}

// A direct modex against a real agent and the real server library. On
// the requesting node: the rank's data comes back as the blob, a rank
// without data is not found, and a request whose PMIX_TIMEOUT passes
// fails with errTimeout. On the rank's node: the agent's request for a
// registered rank that never committed waits in the server library
// until the rank finalizes; it is then answered "not found", as is a
// request made after the rank finalized.
func TestJobDirectModex(t *testing.T) {
	blob := "kv\x00blob"
	up := remoteData{Local: agent.NewLocal(), data: map[int]*string{2: &blob, 3: nil}}
	a, err := agent.New(agent.Config{Size: 4, Local: []int{0, 1}, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-dmodex", Size: 4, Nodes: [][]int{{0, 1}, {2}, {3}}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()

	if res := call(t, j, &request{kind: reqDmodex, rank: 2}); res.err != nil || string(res.data) != blob {
		t.Errorf("direct modex of rank 2: %q, %v", res.data, res.err)
	}
	if res := call(t, j, &request{kind: reqDmodex, rank: 3}); !errors.Is(res.err, errNotFound) {
		t.Errorf("direct modex of rank 3, which has no data: %q, %v; want errNotFound", res.data, res.err)
	}
	if res := call(t, j, &request{kind: reqDmodex, rank: 4}); res.err == nil {
		t.Error("direct modex of rank 4 of 4 succeeded")
	}
	// Rank 2's node never answers now.
	delete(up.data, 2)
	start := time.Now()
	if res := call(t, j, &request{kind: reqDmodex, rank: 2, timeout: 200 * time.Millisecond}); !errors.Is(res.err, errTimeout) {
		t.Errorf("direct modex past its timeout: %q, %v; want errTimeout", res.data, res.err)
	} else if time.Since(start) < 200*time.Millisecond {
		t.Errorf("timed out after %v, before its 200 ms", time.Since(start))
	}

	// Rank 1's node: this one. Rank 1 never connected, so never
	// committed: the library holds the request.
	type answer struct {
		val   string
		found bool
		err   error
	}
	serve := func() chan answer {
		ch := make(chan answer, 1)
		a.ServeRankData(1, func(val string, found bool, err error) { ch <- answer{val, found, err} })
		return ch
	}
	before := serve()
	select {
	case an := <-before:
		t.Fatalf("rank data of a rank that did not commit: %+v", an)
	case <-time.After(300 * time.Millisecond):
	}
	if res := call(t, j, &request{kind: reqFinalized, rank: 1}); res.err != nil {
		t.Fatal(res.err)
	}
	for _, name := range []string{"before", "after"} {
		ch := before
		if name == "after" {
			ch = serve()
		}
		select {
		case an := <-ch:
			if an.found || an.err != nil {
				t.Errorf("request %s rank 1 finalized: %+v, want not found", name, an)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("request %s rank 1 finalized: not answered", name)
		}
	}
}

// A client asking for the data of one unknown namespace after another
// registers each (the launcher does not know it: it is registered
// without job data) up to maxForeign; past it, the request fails at once
// and nothing more is registered: the agent grew without bound.
func TestJobForeignBound(t *testing.T) {
	defer func(n int) { maxForeign = n }(maxForeign)
	maxForeign = 2
	a, err := agent.New(agent.Config{Size: 2, Local: []int{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-foreign", Size: 2, Nodes: [][]int{{0, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for i := range 3 {
		res := call(t, j, &request{kind: reqDmodex, rank: 0, job: fmt.Sprintf("made-up-%d", i)})
		if full := errors.Is(res.err, errForeignFull); res.err == nil || full != (i == 2) {
			t.Errorf("namespace %d: %v", i, res.err)
		}
	}
	registry.mu.Lock()
	n := len(registry.foreign)
	registry.mu.Unlock()
	if n != 2 {
		t.Errorf("%d namespaces of other jobs registered, want 2", n)
	}
}

// A publish the name service refuses fails with a bare PMIX_ERROR, so
// the job's log says why, once a job (a rank may publish in a loop).
func TestJobNamesSaid(t *testing.T) {
	var log bytes.Buffer
	a, err := agent.New(agent.Config{Size: 1, Local: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-names-said", Size: 1, Nodes: [][]int{{0}},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for range 2 {
		if res := call(t, j, &request{kind: reqPublish, rank: 0, strs: []string{"bad\x00name", "p"}}); res.err == nil {
			t.Fatal("a name with a NUL byte was published")
		}
	}
	if n := strings.Count(log.String(), "pmix: a client's publish failed"); n != 1 {
		t.Errorf("the log says %d times why a publish failed, want once:\n%s", n, log.String())
	}
}

// A collective across jobs the launcher refuses fails with a bare
// PMIX_ERROR, so the job's log says why, once a job.
func TestJobJobsCollSaid(t *testing.T) {
	var log bytes.Buffer
	a, err := agent.New(agent.Config{Size: 1, Local: []int{0}})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-jobs-said", Size: 1, Nodes: [][]int{{0}},
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	for range 2 {
		coll := agent.JobsColl{Kind: agent.JobsFence, Procs: []agent.JobRanks{{Job: "job-jobs-said", Ranks: []int{0}}, {Job: "made-up", Ranks: []int{0}}}}
		if res := call(t, j, &request{kind: reqJobs, rank: -1, jobs: coll}); res.err == nil {
			t.Fatal("a fence with a job that does not run succeeded")
		}
	}
	if n := strings.Count(log.String(), "pmix: a collective across jobs"); n != 1 {
		t.Errorf("the log says %d times why the collective failed, want once:\n%s", n, log.String())
	}
}

// spawner is an Upstream whose launcher records the spawn requests it is
// handed, and the ranks that asked, and answers each with a job id.
type spawner struct {
	*agent.Local
	reqs  chan *pmiwire.Spawn
	ranks chan int
}

func (u spawner) Spawn(req *pmiwire.Spawn, rank int, done func(string, error)) {
	u.reqs <- req
	u.ranks <- rank
	done("child-job", nil)
}

// PMIx's additions to the name service (Open MPI's connect/accept
// exchange): a lookup that waits is answered by the publish that brings
// its name, a name published once goes with its first lookup, and a
// wait that passes is "not found". A spawn reaches the launcher with its
// apps' arguments, environment and info, placed as any spawn.
func TestJobNamesAndSpawn(t *testing.T) {
	up := spawner{Local: agent.NewLocal(), reqs: make(chan *pmiwire.Spawn, 1), ranks: make(chan int, 1)}
	defer up.Close()
	a, err := agent.New(agent.Config{Size: 2, Local: []int{0, 1}, Upstream: up})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	j, err := NewJob(Config{Agent: a, Nspace: "job-spawn", Size: 2, Nodes: [][]int{{0, 1}}})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()

	waiting := make(chan result, 1)
	if err := j.enqueue(&request{kind: reqLookup, rank: 1, strs: []string{"port:accept"}, timeout: 30 * time.Second,
		done: func(r result) { waiting <- r }}); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-waiting:
		t.Fatalf("a waiting lookup answered before the publish: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
	if res := call(t, j, &request{kind: reqPublish, rank: 0, strs: []string{"port:accept", "0:1:2"}, once: true}); res.err != nil {
		t.Fatalf("publish: %v", res.err)
	}
	select {
	case r := <-waiting:
		if r.err != nil || len(r.found) != 2 || r.found[1] != "0:1:2" {
			t.Errorf("waiting lookup: %q, %v", r.found, r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the publish did not answer the waiting lookup")
	}
	if res := call(t, j, &request{kind: reqLookup, rank: 1, strs: []string{"port:accept"}}); !errors.Is(res.err, errNotFound) {
		t.Errorf("a name published once, found by a waiting lookup, found again: %q, %v", res.found, res.err)
	}
	start := time.Now()
	if res := call(t, j, &request{kind: reqLookup, rank: 1, strs: []string{"never"}, timeout: 200 * time.Millisecond}); !errors.Is(res.err, errNotFound) {
		t.Errorf("lookup past its wait: %q, %v; want errNotFound", res.found, res.err)
	}
	if d := time.Since(start); d < 200*time.Millisecond {
		t.Errorf("a lookup waiting 200ms answered after %v", d)
	}

	sp, err := parseApps([]string{"./prog", "3", "/work", "1", "child", "1", "OMPI_PARENT_PORT=p:1", "2", "pmix.mapby", "slot"}, 1)
	if err != nil {
		t.Fatal(err)
	}
	res := call(t, j, &request{kind: reqSpawn, rank: 1, spawn: sp})
	if res.err != nil || res.nspace != "child-job" {
		t.Fatalf("spawn: %q, %v", res.nspace, res.err)
	}
	got := <-up.reqs
	want := &pmiwire.Spawn{Cmds: []pmiwire.SpawnCmd{{Exe: "./prog", MaxProcs: 3, Args: []string{"child"}, Env: []string{"OMPI_PARENT_PORT=p:1"},
		Info: []pmiwire.Pair{{Key: "wdir", Val: "/work"}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("the launcher got %+v, want %+v", got, want)
	}
	if r := <-up.ranks; r != 1 {
		t.Errorf("the launcher was told rank %d asked, want 1 (the children's PMIX_PARENT_ID)", r)
	}
}
