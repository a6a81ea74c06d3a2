package agent

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/pmiwire"
)

// wireClient speaks raw bytes to the agent over a real socketpair.
type wireClient struct {
	t  *testing.T
	nc net.Conn
	br *bufio.Reader
}

func newJob(t *testing.T, size int, mut func(*Config)) (*Agent, []*wireClient, *recEvents) {
	t.Helper()
	ev := &recEvents{}
	local := make([]int, size)
	for i := range local {
		local[i] = i
	}
	cfg := Config{JobID: "job-1", Size: size, Local: local, Mapping: fmt.Sprintf("(vector,(0,1,%d))", size), Events: ev.record}
	if mut != nil {
		mut(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	var cs []*wireClient
	for i := range local {
		agentEnd, rankEnd, err := sys.Socketpair("test")
		if err != nil {
			t.Fatal(err)
		}
		ac, err := net.FileConn(agentEnd)
		agentEnd.Close()
		if err != nil {
			t.Fatal(err)
		}
		rc, err := net.FileConn(rankEnd)
		rankEnd.Close()
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Serve(i, ac); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rc.Close() })
		cs = append(cs, &wireClient{t: t, nc: rc, br: bufio.NewReader(rc)})
	}
	return a, cs, ev
}

func (c *wireClient) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.nc, s); err != nil {
		c.t.Fatal(err)
	}
}

func (c *wireClient) v1(s string) { c.send(s + "\n") }
func (c *wireClient) v2(s string) {
	c.send(string(pmiwireHeader(len(s))) + s)
}

func pmiwireHeader(n int) []byte { return []byte(fmt.Sprintf("%6d", n)) }

// read returns the next response, PMI-1 line (without LF) or PMI-2 body.
func (c *wireClient) read() string {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	peek, err := c.br.Peek(4)
	if err != nil {
		c.t.Fatalf("read response: %v", err)
	}
	if string(peek) == "cmd=" {
		line, err := c.br.ReadString('\n')
		if err != nil {
			c.t.Fatalf("read response: %v", err)
		}
		return strings.TrimSuffix(line, "\n")
	}
	hdr := make([]byte, 6)
	if _, err := io.ReadFull(c.br, hdr); err != nil {
		c.t.Fatal(err)
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(hdr)))
	if err != nil {
		c.t.Fatalf("bad header %q", hdr)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(c.br, body); err != nil {
		c.t.Fatal(err)
	}
	return string(body)
}

func (c *wireClient) expect(want string) {
	c.t.Helper()
	if got := c.read(); got != want {
		c.t.Fatalf("response\n got: %q\nwant: %q", got, want)
	}
}

// noReply checks that nothing arrives for d (a deferred reply).
func (c *wireClient) noReply(d time.Duration) {
	c.t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(d))
	if _, err := c.br.Peek(1); err == nil {
		c.t.Fatalf("unexpected early response")
	}
	c.nc.SetReadDeadline(time.Time{})
}

type recEvents struct {
	mu     sync.Mutex
	inits  []int
	fins   []int
	aborts []string
	discs  []int
	protos []string // "rank: error" of each protocol error
}

// waitDisconnects waits until exactly n disconnect events arrived, failing the
// test after d.
func (e *recEvents) waitDisconnects(t *testing.T, n int, d time.Duration) {
	t.Helper()
	if got := e.waitCount(func() int { return len(e.discs) }, n, d); got != n {
		t.Fatalf("%d disconnect events after %v, want %d", got, d, n)
	}
}

// waitFinalized waits until n finalize events arrived, failing the test
// after d.
func (e *recEvents) waitFinalized(t *testing.T, n int, d time.Duration) {
	t.Helper()
	if got := e.waitCount(func() int { return len(e.fins) }, n, d); got < n {
		t.Fatalf("%d finalize events after %v, want %d", got, d, n)
	}
}

// waitCount polls count (under e.mu) until it reaches n or d passes, and
// returns its last value.
func (e *recEvents) waitCount(count func() int, n int, d time.Duration) int {
	deadline := time.Now().Add(d)
	for {
		e.mu.Lock()
		got := count()
		e.mu.Unlock()
		if got >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// record is the agent's Config.Events.
func (e *recEvents) record(ev Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch ev.Kind {
	case EventInit:
		e.inits = append(e.inits, ev.Rank)
	case EventFinalized:
		e.fins = append(e.fins, ev.Rank)
	case EventDisconnected:
		e.discs = append(e.discs, ev.Rank)
	case EventAbort:
		e.aborts = append(e.aborts, fmt.Sprintf("%d:%d:%s", ev.Rank, ev.Code, ev.Msg))
	case EventProtocol:
		e.protos = append(e.protos, fmt.Sprintf("%d: %s", ev.Rank, ev.Msg))
	}
}

func TestPMI1Conversation(t *testing.T) {
	_, cs, ev := newJob(t, 2, nil)
	for i, c := range cs {
		c.v1("cmd=init pmi_version=1 pmi_subversion=1")
		c.expect("cmd=response_to_init rc=0 pmi_version=1 pmi_subversion=2")
		c.v1("cmd=get_maxes")
		c.expect("cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024")
		c.v1("cmd=get_appnum")
		c.expect("cmd=appnum rc=0 appnum=0")
		c.v1("cmd=get_universe_size")
		c.expect("cmd=universe_size rc=0 size=-1")
		c.v1("cmd=get_my_kvsname")
		c.expect("cmd=my_kvsname rc=0 kvsname=job-1")
		c.v1("cmd=get kvsname=job-1 key=PMI_process_mapping")
		c.expect("cmd=get_result rc=0 value=(vector,(0,1,2))")
		c.v1(fmt.Sprintf("cmd=put kvsname=job-1 key=bc-%d value=addr=%d", i, i))
		c.expect("cmd=put_result rc=0")
	}
	// Not visible before the barrier.
	cs[0].v1("cmd=get kvsname=job-1 key=bc-1")
	cs[0].expect("cmd=get_result rc=4 msg=key_bc-1_not_found")
	cs[0].v1("cmd=barrier_in")
	cs[0].noReply(50 * time.Millisecond)
	cs[1].v1("cmd=barrier_in")
	cs[0].expect("cmd=barrier_out rc=0")
	cs[1].expect("cmd=barrier_out rc=0")
	for i, c := range cs {
		c.v1(fmt.Sprintf("cmd=get kvsname=job-1 key=bc-%d", 1-i))
		c.expect(fmt.Sprintf("cmd=get_result rc=0 value=addr=%d", 1-i))
		c.v1("cmd=finalize")
		c.expect("cmd=finalize_ack rc=0")
	}
	// Events are reported after the replies are written.
	ev.waitFinalized(t, 2, 5*time.Second)
	ev.mu.Lock()
	defer ev.mu.Unlock()
	if len(ev.inits) != 2 || len(ev.fins) != 2 {
		t.Fatalf("events: inits %v finalized %v", ev.inits, ev.fins)
	}
}

func TestPMI1Errors(t *testing.T) {
	_, cs, _ := newJob(t, 1, func(c *Config) { c.UniverseSize = 16 })
	c := cs[0]
	c.v1("cmd=init pmi_version=3 pmi_subversion=0")
	c.expect("cmd=response_to_init rc=-1 msg=unsupported_PMI_version_3.0_(supported:_1.1,_1.2,_2.0) pmi_version=1 pmi_subversion=2")
	c.v1("cmd=init pmi_version=1 pmi_subversion=1")
	c.read()
	c.v1("cmd=get_universe_size")
	c.expect("cmd=universe_size rc=0 size=16")
	c.v1("cmd=put kvsname=job-1 key=" + strings.Repeat("k", 65) + " value=v")
	c.expect("cmd=put_result rc=5 msg=key_longer_than_64_bytes")
	c.v1("cmd=put kvsname=job-1 key=k value=" + strings.Repeat("v", 1025))
	c.expect("cmd=put_result rc=7 msg=value_longer_than_1024_bytes")
	c.v1("cmd=put kvsname=job-1 key=PMI_x value=v")
	c.expect("cmd=put_result rc=4 msg=key_PMI_x_is_reserved_for_the_launcher")
	c.v1("cmd=put kvsname=other key=k value=v")
	c.expect(`cmd=put_result rc=3 msg=unknown_kvsname_"other"_(this_job_is_"job-1")`)
	c.v1("cmd=frobnicate x=1")
	c.expect(`cmd=frobnicate_result rc=-1 msg=unknown_command_"frobnicate"`)
	c.v1("cmd=create_kvs")
	c.expect("cmd=newkvs rc=-1 msg=create_kvs_is_not_supported")
	c.v1("cmd=barrier_in group=bogus")
	c.expect(`cmd=barrier_out rc=3 msg=bad_barrier_group_"bogus"_(want_<group>:<tag>)`)
	c.v1("cmd=publish_name service=svc port=p1")
	c.expect("cmd=publish_result rc=0")
	c.v1("cmd=publish_name service=svc port=p2")
	c.expect(`cmd=publish_result rc=-1 msg=publish_"svc":_service_name_already_published`)
	c.v1("cmd=lookup_name service=svc")
	c.expect("cmd=lookup_result rc=0 port=p1")
	c.v1("cmd=unpublish_name service=svc")
	c.expect("cmd=unpublish_result rc=0")
	c.v1("cmd=lookup_name service=svc")
	c.expect(`cmd=lookup_result rc=-1 msg=lookup_"svc":_service_name_not_published`)
	// A spawn block is consumed whole and answered once: a job without a
	// launcher (agent.Local) refuses it.
	c.send("mcmd=spawn\nnprocs=2\nexecname=/bin/a b\ntotspawns=1\nspawnssofar=1\nargcnt=1\narg1=x y\ninfo_num=0\nendcmd\n")
	got := c.read()
	if !strings.HasPrefix(got, "cmd=spawn_result rc=-1 msg=spawn_needs_a_launcher") {
		t.Fatalf("spawn reply %q", got)
	}
	c.v1("cmd=get_appnum")
	c.expect("cmd=appnum rc=0 appnum=0")
}

// PMI-1 fields are separated by spaces alone, as Hydra and Slurm read
// them: a value holding a tab or a CR is stored and answered whole (it was
// cut at the tab, the put answered rc=0).
func TestPMI1ValueWithTabAndCR(t *testing.T) {
	_, cs, _ := newJob(t, 1, nil)
	c := cs[0]
	c.v1("cmd=init pmi_version=1 pmi_subversion=1")
	c.read()
	c.v1("cmd=put kvsname=job-1 key=t value=a\tb\rc")
	c.expect("cmd=put_result rc=0")
	c.v1("cmd=barrier_in")
	c.expect("cmd=barrier_out rc=0")
	c.v1("cmd=get kvsname=job-1 key=t")
	c.expect("cmd=get_result rc=0 value=a\tb\rc")
	c.v2("cmd=kvs-get;key=t;")
	c.expect("cmd=kvs-get-response;rc=0;found=TRUE;value=a\tb\rc;")
}

// A mapping that cannot be represented ("") is an absent attribute, in
// both protocols, as Hydra leaves it (it was answered empty, which MPICH
// takes for a broken mapping).
func TestUnrepresentableMappingAbsent(t *testing.T) {
	_, cs, _ := newJob(t, 2, func(c *Config) { c.Mapping = "" })
	cs[0].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[0].read()
	cs[0].v1("cmd=get kvsname=job-1 key=PMI_process_mapping")
	cs[0].expect("cmd=get_result rc=4 msg=key_PMI_process_mapping_not_found")
	cs[1].v1("cmd=init pmi_version=2 pmi_subversion=0")
	cs[1].read()
	cs[1].v2("cmd=fullinit;pmirank=1;")
	cs[1].read()
	cs[1].v2("cmd=info-getjobattr;key=PMI_process_mapping;")
	cs[1].expect("cmd=info-getjobattr-response;rc=0;found=FALSE;")
}

// A waiting read of a key no put can make is answered not found at once:
// it waited until the job's other ranks were done, then failed as a
// deadlock.
func TestWaitForImpossibleKey(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	c := cs[1]
	c.v1("cmd=init pmi_version=2 pmi_subversion=0")
	c.read()
	c.v2("cmd=fullinit;pmirank=1;")
	c.read()
	c.v2("cmd=info-getnodeattr;wait=TRUE;")
	c.expect("cmd=info-getnodeattr-response;rc=0;found=FALSE;")
	c.v2("cmd=kvs-get;key=PMI_nothing;fastpmi-wait=TRUE;")
	c.expect("cmd=kvs-get-response;rc=0;found=FALSE;")
}

func TestPMI12GroupBarriers(t *testing.T) {
	_, cs, _ := newJob(t, 3, nil)
	for _, c := range cs {
		c.v1("cmd=init pmi_version=1 pmi_subversion=2")
		c.read()
	}
	cs[0].v1("cmd=put kvsname=job-1 key=a value=1")
	cs[0].read()
	cs[0].v1("cmd=barrier_in group=0,2:77")
	cs[2].v1("cmd=barrier_in group=0,2:77")
	cs[0].expect("cmd=barrier_out rc=0 tag=77")
	cs[2].expect("cmd=barrier_out rc=0 tag=77")
	cs[2].v1("cmd=get kvsname=job-1 key=a")
	cs[2].expect("cmd=get_result rc=0 value=1")
	cs[1].v1("cmd=barrier_in group=0,2:5")
	cs[1].expect("cmd=barrier_out rc=-1 msg=rank_1_is_not_a_member_of_barrier_group_0,2:5 tag=5")
	for _, c := range cs {
		c.v1("cmd=barrier_in group=WORLD:9")
	}
	for _, c := range cs {
		c.expect("cmd=barrier_out rc=0 tag=9")
	}
	for _, c := range cs {
		c.v1("cmd=barrier_in group=NODE:3")
	}
	for _, c := range cs {
		c.expect("cmd=barrier_out rc=0 tag=3")
	}
}

func TestPMI2Conversation(t *testing.T) {
	_, cs, _ := newJob(t, 3, func(c *Config) { c.UniverseSize = 8 })
	for i, c := range cs {
		c.v1("cmd=init pmi_version=2 pmi_subversion=0")
		c.expect("cmd=response_to_init rc=0 pmi_version=2 pmi_subversion=0")
		if i == 0 { // MPICH's short form, right-aligned header
			c.v2("cmd=fullinit;pmirank=0;")
		} else { // Slurm's form, left-aligned header
			body := fmt.Sprintf("cmd=fullinit;pmijobid=job-1;pmirank=%d;threaded=FALSE;", i)
			c.send(fmt.Sprintf("%-6d%s", len(body), body))
		}
		c.expect(fmt.Sprintf("cmd=fullinit-response;rc=0;pmi-version=2;pmi-subversion=0;rank=%d;size=3;appnum=0;debugged=FALSE;pmiverbose=FALSE;fastpmi=1;", i))
		c.v2("cmd=job-getid;thrid=0x77;")
		c.expect("cmd=job-getid-response;rc=0;thrid=0x77;jobid=job-1;")
		c.v2(fmt.Sprintf("cmd=kvs-put;key=k%d;value=v%d=x/y:z;", i, i))
		c.expect("cmd=kvs-put-response;rc=0;")
	}
	cs[0].v2("cmd=info-getjobattr;key=PMI_process_mapping;")
	cs[0].expect("cmd=info-getjobattr-response;rc=0;found=TRUE;value=(vector,(0,1,3));")
	cs[0].v2("cmd=info-getjobattr;key=universeSize;")
	cs[0].expect("cmd=info-getjobattr-response;rc=0;found=TRUE;value=8;")
	cs[0].v2("cmd=info-getjobattr;key=nope;")
	cs[0].expect("cmd=info-getjobattr-response;rc=0;found=FALSE;")

	// Node attributes: a waiting get is answered by the put.
	cs[1].v2("cmd=info-getnodeattr;key=nk;wait=TRUE;")
	cs[1].noReply(50 * time.Millisecond)
	cs[2].v2("cmd=info-getnodeattr;key=nk;wait=FALSE;")
	cs[2].expect("cmd=info-getnodeattr-response;rc=0;found=FALSE;")
	cs[0].v2("cmd=info-putnodeattr;key=nk;value=nv;")
	cs[0].expect("cmd=info-putnodeattr-response;rc=0;")
	cs[1].expect("cmd=info-getnodeattr-response;rc=0;found=TRUE;value=nv;")

	for _, c := range cs {
		c.v2("cmd=kvs-fence;")
	}
	for _, c := range cs {
		c.expect("cmd=kvs-fence-response;rc=0;")
	}
	for i, c := range cs {
		for j := range cs {
			if i == 0 {
				c.v2(fmt.Sprintf("cmd=kvs-get;jobid=job-1;srcid=%d;key=k%d;", j, j))
			} else {
				c.v2(fmt.Sprintf("cmd=kvs-get;jobid=;srcid=-1;key=k%d;", j))
			}
			c.expect(fmt.Sprintf("cmd=kvs-get-response;rc=0;found=TRUE;value=v%d=x/y:z;", j))
		}
		c.v2("cmd=kvs-get;key=-NONEXIST-KEY;")
		c.expect("cmd=kvs-get-response;rc=0;found=FALSE;")
	}
	// Ring: positions follow rank order on one node; neighbours wrap.
	for i, c := range cs {
		c.v2(fmt.Sprintf("cmd=ring;ring-count=1;ring-left=L%d;ring-right=R%d;thrid=t%d;", i, i, i))
	}
	for i, c := range cs {
		l, r := (i+2)%3, (i+1)%3
		c.expect(fmt.Sprintf("cmd=ring-response;rc=0;thrid=t%d;ring-count=%d;ring-left=R%d;ring-right=L%d;", i, i, l, r))
	}
	cs[0].v2("cmd=name-publish;name=svc;port=tag#0$;infokeycount=0;")
	cs[0].expect("cmd=name-publish-response;rc=0;")
	cs[1].v2("cmd=name-lookup;name=svc;")
	cs[1].expect("cmd=name-lookup-response;rc=0;value=tag#0$;port=tag#0$;")
	cs[1].v2("cmd=no-such-thing;thrid=9;")
	cs[1].expect(`cmd=no-such-thing-response;rc=-1;thrid=9;errmsg=unknown command "no-such-thing";`)
	cs[1].v2("cmd=kvs-put;noequals;")
	cs[1].expect("cmd=kvs-put-response;rc=3;errmsg=pmiwire: malformed PMI-2 \"kvs-put\" request: field without '=';")
	cs[2].v2("cmd=job-connect;jobid=x;")
	cs[2].expect("cmd=job-connect-response;rc=-1;errmsg=job-connect is not supported;")
	for _, c := range cs {
		c.v2("cmd=finalize;")
		c.expect("cmd=finalize-response;rc=0;")
	}
}

// A fence that a finalized rank never entered fails instead of hanging.
func TestFenceFailsWhenPeerFinalizes(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	for _, c := range cs {
		c.v1("cmd=init pmi_version=1 pmi_subversion=1")
		c.read()
	}
	cs[0].v1("cmd=barrier_in")
	cs[0].noReply(30 * time.Millisecond)
	cs[1].v1("cmd=finalize")
	cs[1].expect("cmd=finalize_ack rc=0")
	cs[0].expect("cmd=barrier_out rc=-1 msg=fence_cannot_complete:_rank_1_finalized")
}

// A rank whose connection closes fails the collectives waiting for it.
func TestFenceFailsWhenPeerGone(t *testing.T) {
	a, cs, ev := newJob(t, 3, nil)
	for _, c := range cs {
		c.v1("cmd=init pmi_version=2 pmi_subversion=0")
		c.read()
	}
	cs[0].v2("cmd=fullinit;pmirank=0;")
	cs[0].read()
	cs[0].v2("cmd=kvs-fence;")
	cs[0].noReply(30 * time.Millisecond)
	cs[2].nc.Close()
	// The lost connection alone does not fail the fence: the launcher
	// learns how the process ended and decides (RankGone).
	cs[0].noReply(50 * time.Millisecond)
	a.RankGone(2, "exited with code 3")
	got := cs[0].read()
	if got != "cmd=kvs-fence-response;rc=-1;errmsg=fence cannot complete: rank 2 exited with code 3;" {
		t.Fatalf("got %q", got)
	}
	ev.waitDisconnects(t, 1, 2*time.Second)
}

// An abort whose body does not parse (MPICH does not escape a ';' in its
// message; a NUL byte) still aborts, with the exit code read before the
// fault and the message saying what was wrong; it gets no reply.
func TestMalformedAbort(t *testing.T) {
	for _, c := range []struct {
		send func(*wireClient)
		want string
	}{
		{func(c *wireClient) {
			initV2(t, []*wireClient{c})
			c.v2("cmd=abort;exitcode=7;message=Fatal error in PMPI_Send: Invalid rank; aborting job;")
		}, "0:7:Fatal error in PMPI_Send: Invalid rank (the rest of the abort request was malformed: field without '=')"},
		{func(c *wireClient) {
			c.v1("cmd=init pmi_version=1 pmi_subversion=1")
			c.read()
			c.v1("cmd=abort exitcode=5 message=a\x00b")
		}, `0:5:(its abort request was malformed: NUL byte in field "message")`},
	} {
		_, cs, ev := newJob(t, 1, nil)
		c.send(cs[0])
		cs[0].noReply(50 * time.Millisecond)
		deadline := time.Now().Add(2 * time.Second)
		for {
			ev.mu.Lock()
			got := append([]string(nil), ev.aborts...)
			ev.mu.Unlock()
			if len(got) == 1 && got[0] == c.want {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("aborts %q, want [%q]", got, c.want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Init after finalize is refused (it answered rc=0 to a rank that stayed
// finalized), on both wire protocols.
func TestInitAfterFinalize(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	cs[0].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[0].read()
	cs[0].v1("cmd=finalize")
	cs[0].expect("cmd=finalize_ack rc=0")
	cs[0].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[0].expect("cmd=response_to_init rc=1 msg=rank_0_already_finalized")
	cs[1].v1("cmd=init pmi_version=2 pmi_subversion=0")
	cs[1].read()
	cs[1].v2("cmd=fullinit;pmirank=1;")
	cs[1].read()
	cs[1].v2("cmd=finalize;")
	cs[1].expect("cmd=finalize-response;rc=0;")
	cs[1].v2("cmd=fullinit;pmirank=1;")
	cs[1].expect("cmd=fullinit-response;rc=1;errmsg=rank 1 already finalized;")
}

func TestAbortAndIsworld(t *testing.T) {
	_, cs, ev := newJob(t, 2, nil)
	cs[0].v1("cmd=init pmi_version=2 pmi_subversion=0")
	cs[0].read()
	cs[0].v2("cmd=fullinit;pmirank=0;")
	cs[0].read()
	cs[0].v2("cmd=abort;isworld=FALSE;msg=only me;")
	cs[1].v1("cmd=init pmi_version=1 pmi_subversion=1")
	cs[1].read()
	cs[1].v1("cmd=abort exitcode=7 message=abort")
	deadline := time.Now().Add(2 * time.Second)
	for {
		ev.mu.Lock()
		got := append([]string(nil), ev.aborts...)
		ev.mu.Unlock()
		if len(got) == 1 {
			if got[0] != "1:7:abort" {
				t.Fatalf("aborts %v", got)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("aborts %v", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Requests split byte by byte and several in one write are all served.
func TestFraming(t *testing.T) {
	_, cs, _ := newJob(t, 1, nil)
	c := cs[0]
	msg := "cmd=init pmi_version=2 pmi_subversion=0\n"
	for i := 0; i < len(msg); i++ {
		c.send(msg[i : i+1])
	}
	c.read()
	b := pmiwire.AppendRequestV2(nil, "fullinit", pmiwire.Pair{Key: "pmirank", Val: "0"})
	b = pmiwire.AppendRequestV2(b, "job-getid")
	b = pmiwire.AppendRequestV2(b, "kvs-get", pmiwire.Pair{Key: "key", Val: "PMI_process_mapping"})
	c.send(string(b))
	c.read()
	c.expect("cmd=job-getid-response;rc=0;jobid=job-1;")
	c.expect("cmd=kvs-get-response;rc=0;found=TRUE;value=(vector,(0,1,1));")
}

func TestUnboundConnectionBindsByInitack(t *testing.T) {
	a, err := New(Config{JobID: "j", Size: 2, Local: []int{0, 1}, Mapping: "(vector,(0,1,2))"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	s1, s2 := mustPair(t)
	if err := a.ServeUnbound(s1); err != nil {
		t.Fatal(err)
	}
	c := &wireClient{t: t, nc: s2, br: bufio.NewReader(s2)}
	c.v1("cmd=get_maxes")
	c.expect("cmd=maxes rc=1 msg=connection_not_bound_to_a_rank:_send_initack_or_fullinit_first")
	c.v1("cmd=initack pmiid=1")
	c.expect("cmd=initack rc=0")
	c.expect("cmd=set size=2")
	c.expect("cmd=set rank=1")
	c.expect("cmd=set debug=0")
	s3, s4 := mustPair(t)
	a.ServeUnbound(s3)
	c2 := &wireClient{t: t, nc: s4, br: bufio.NewReader(s4)}
	c2.v1("cmd=initack pmiid=1")
	c2.expect("cmd=initack rc=3 msg=rank_1_is_already_connected")
}

func mustPair(t *testing.T) (net.Conn, net.Conn) {
	a, b, err := sys.Socketpair("t")
	if err != nil {
		t.Fatal(err)
	}
	ca, err := net.FileConn(a)
	a.Close()
	if err != nil {
		t.Fatal(err)
	}
	cb, err := net.FileConn(b)
	b.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return ca, cb
}

func TestTextAllgather(t *testing.T) {
	_, cs, _ := newJob(t, 3, nil)
	for i, c := range cs {
		c.v1("cmd=init pmi_version=2 pmi_subversion=0")
		c.read()
		c.v2(fmt.Sprintf("cmd=fullinit;pmirank=%d;", i))
		c.read()
	}
	for round := 1; round <= 3; round++ {
		for i, c := range cs {
			c.v2(fmt.Sprintf("cmd=fastpmi-allgather;value=r%d;;x%d;", round, i))
		}
		for _, c := range cs {
			c.expect(fmt.Sprintf("cmd=fastpmi-allgather-response;rc=0;epoch=%d;size=3;v0=r%d;;x0;v1=r%d;;x1;v2=r%d;;x2;", round, round, round, round))
		}
	}
	// A value holding a NUL byte comes hex-encoded (valenc=hex); the
	// ranks that say hex=TRUE get every value so (enc=hex), the others
	// the values as they are.
	cs[0].v2("cmd=fastpmi-allgather;value=610062;valenc=hex;hex=TRUE;")
	cs[1].v2("cmd=fastpmi-allgather;value=b;valenc=raw;hex=TRUE;")
	cs[2].v2("cmd=fastpmi-allgather;value=c;")
	cs[0].expect("cmd=fastpmi-allgather-response;rc=0;epoch=4;size=3;enc=hex;v0=610062;v1=62;v2=63;")
	cs[1].expect("cmd=fastpmi-allgather-response;rc=0;epoch=4;size=3;enc=hex;v0=610062;v1=62;v2=63;")
	cs[2].expect("cmd=fastpmi-allgather-response;rc=0;epoch=4;size=3;v0=a\x00b;v1=b;v2=c;")
	// No NUL byte: no hex, whoever asks.
	for i, c := range cs {
		c.v2(fmt.Sprintf("cmd=fastpmi-allgather;value=v%d;hex=TRUE;", i))
	}
	for _, c := range cs {
		c.expect("cmd=fastpmi-allgather-response;rc=0;epoch=5;size=3;v0=v0;v1=v1;v2=v2;")
	}
	cs[0].v2("cmd=fastpmi-allgather;value=zz;valenc=hex;")
	cs[0].expect("cmd=fastpmi-allgather-response;rc=3;errmsg=value: valenc=hex: encoding/hex: invalid byte: U+007A 'z';")
}

// The text protocol's detached collectives and fastpmi-block: a rank in
// an Ifence it does not wait for is not stuck; fastpmi-block waiting=TRUE
// makes it so (the deadlock check then fails the waiting get and the
// fence), and bad fields are refused with their thrid, never answered as
// another request.
func TestTextDetachedAndBlock(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	cs[0].v2("cmd=kvs-fence;fastpmi-detached=TRUE;thrid=1;")
	cs[1].v2("cmd=kvs-get;jobid=;srcid=-1;key=k;fastpmi-wait=TRUE;thrid=2;")
	cs[0].v2("cmd=kvs-put;key=k;value=v;fastpmi-hint=sparse;thrid=3;")
	cs[0].expect("cmd=kvs-put-response;rc=0;thrid=3;")
	cs[1].expect("cmd=kvs-get-response;rc=0;thrid=2;found=TRUE;value=v;")
	cs[1].v2("cmd=kvs-fence;thrid=4;")
	cs[0].expect("cmd=kvs-fence-response;rc=0;thrid=1;")
	cs[1].expect("cmd=kvs-fence-response;rc=0;thrid=4;")

	cs[0].v2("cmd=kvs-fence;fastpmi-detached=TRUE;thrid=5;")
	cs[1].v2("cmd=kvs-get;jobid=;srcid=-1;key=never;fastpmi-wait=TRUE;thrid=6;")
	cs[0].v2("cmd=fastpmi-block;waiting=TRUE;thrid=7;")
	const dl = "deadlock: every live rank waits (rank 0 in fence, rank 1 in get of never)"
	cs[1].expect("cmd=kvs-get-response;rc=-1;thrid=6;errmsg=" + dl + ";")
	cs[0].expect("cmd=kvs-fence-response;rc=-1;thrid=5;errmsg=" + dl + ";")

	cs[0].v2("cmd=fastpmi-block;waiting=maybe;thrid=8;")
	cs[0].expect(`cmd=fastpmi-block-response;rc=3;thrid=8;errmsg=fastpmi-block: waiting="maybe": want TRUE or FALSE;`)
	cs[0].v2("cmd=kvs-fence;fastpmi-detached=yes;thrid=9;")
	cs[0].expect(`cmd=kvs-fence-response;rc=3;thrid=9;errmsg=fastpmi-detached="yes": want TRUE or FALSE;`)
}

func initV2(t *testing.T, cs []*wireClient) {
	t.Helper()
	for i, c := range cs {
		c.v1("cmd=init pmi_version=2 pmi_subversion=0")
		c.read()
		c.v2(fmt.Sprintf("cmd=fullinit;pmirank=%d;", i))
		c.read()
	}
}

// Sparse puts are visible at once; a waiting get is answered by a late
// sparse put or by the fence that commits a dense put.
func TestSparsePutAndWaitingGet(t *testing.T) {
	_, cs, _ := newJob(t, 3, nil)
	initV2(t, cs)
	cs[0].v2("cmd=kvs-put;key=s;value=sv;fastpmi-hint=sparse;")
	cs[0].expect("cmd=kvs-put-response;rc=0;")
	cs[1].v2("cmd=kvs-get;key=s;")
	cs[1].expect("cmd=kvs-get-response;rc=0;found=TRUE;value=sv;")

	cs[1].v2("cmd=kvs-get;key=late;fastpmi-wait=TRUE;")
	cs[1].noReply(30 * time.Millisecond)
	cs[2].v2("cmd=kvs-put;key=late;value=lv;fastpmi-hint=sparse;")
	cs[2].expect("cmd=kvs-put-response;rc=0;")
	cs[1].expect("cmd=kvs-get-response;rc=0;found=TRUE;value=lv;")

	cs[2].v2("cmd=kvs-get;key=d;fastpmi-wait=TRUE;")
	cs[2].noReply(30 * time.Millisecond)
	cs[0].v2("cmd=kvs-put;key=d;value=dv;fastpmi-hint=dense;")
	cs[0].expect("cmd=kvs-put-response;rc=0;")
	cs[2].noReply(30 * time.Millisecond) // dense: not before the fence
	cs[0].v2("cmd=kvs-fence;")
	cs[1].v2("cmd=kvs-fence;")
	// Rank 2 is parked in its get: every live rank waits and nothing can
	// progress, so everyone gets a deadlock error rather than a hang.
	for _, c := range cs {
		got := c.read()
		if !strings.Contains(got, "rc=-1;") || !strings.Contains(got, "deadlock: every live rank waits (rank 0 in fence, rank 1 in fence, rank 2 in get of d)") {
			t.Fatalf("got %q", got)
		}
	}
}

func TestWaitingGetReleasedByFence(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	cs[0].v2("cmd=kvs-put;key=k;value=v;")
	cs[0].read()
	cs[0].v2("cmd=kvs-fence;")
	cs[0].noReply(20 * time.Millisecond)
	cs[1].v2("cmd=kvs-fence;")
	cs[0].read()
	cs[1].read()
	cs[1].v2("cmd=kvs-get;key=k;fastpmi-wait=TRUE;")
	cs[1].expect("cmd=kvs-get-response;rc=0;found=TRUE;value=v;")
	// The -NONEXIST-KEY barrier probe never waits.
	cs[1].v2("cmd=kvs-get;key=-NONEXIST-KEY;fastpmi-wait=TRUE;")
	cs[1].expect("cmd=kvs-get-response;rc=0;found=FALSE;")
}

func TestNodeAttrDeadlock(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	cs[0].v2("cmd=info-getnodeattr;key=x;wait=TRUE;")
	cs[0].noReply(20 * time.Millisecond)
	cs[1].v2("cmd=info-getnodeattr;key=y;wait=TRUE;")
	for _, c := range cs {
		got := c.read()
		if !strings.HasPrefix(got, "cmd=info-getnodeattr-response;rc=-1;errmsg=deadlock: every live rank waits") {
			t.Fatalf("got %q", got)
		}
	}
}

// Fences and allgathers share one epoch sequence; ranks that disagree on
// the next collective get an error, not a hang.
func TestEpochKindMismatch(t *testing.T) {
	_, cs, _ := newJob(t, 2, nil)
	initV2(t, cs)
	cs[0].v2("cmd=kvs-fence;")
	cs[1].v2("cmd=fastpmi-allgather;value=x;")
	// The two connections are served concurrently: whichever request the
	// agent takes second is the one that disagrees, and both ranks get
	// that one verdict.
	wants := []string{
		"errmsg=rank 1 entered allgather as collective 1 while other ranks entered fence;",
		"errmsg=rank 0 entered fence as collective 1 while other ranks entered allgather;",
	}
	var want string
	for _, c := range cs {
		got := c.read()
		if want == "" {
			for _, w := range wants {
				if strings.HasSuffix(got, w) {
					want = w
				}
			}
		}
		if !strings.Contains(got, "rc=-1;") || want == "" || !strings.HasSuffix(got, want) {
			t.Fatalf("got %q, want rc=-1 and one verdict of %q", got, wants)
		}
	}
	// Both skip the failed epoch and go on together.
	cs[0].v2("cmd=fastpmi-allgather;value=a;")
	cs[1].v2("cmd=fastpmi-allgather;value=b;")
	for _, c := range cs {
		c.expect("cmd=fastpmi-allgather-response;rc=0;epoch=2;size=2;v0=a;v1=b;")
	}
}
