package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// kvsCase is one kvsprog run: its pattern and flags, and pmirun's KVS
// options.
type kvsCase struct {
	name string
	opts []string // pmirun's
	args []string // kvsprog's
}

// kvsCases are the on-demand KVS's access patterns: each hint, put
// before and after the get, same node and other node (block placement,
// two ranks per node: one neighbour local, one remote), names given or
// not, fence or none.
func kvsCases(strategy string) []kvsCase {
	s := []string{"--get-strategy", strategy}
	cs := []kvsCase{
		{"sparse/neighbours", s, []string{"-pattern", "neighbours", "-hint", "sparse"}},
		{"sparse/neighbours/src", s, []string{"-pattern", "neighbours", "-hint", "sparse", "-src"}},
		{"sparse/neighbours/fence", s, []string{"-pattern", "neighbours", "-hint", "sparse", "-fence"}},
		{"sparse/get-before-put", s, []string{"-pattern", "late", "-hint", "sparse"}},
		{"sparse/get-before-put/src", s, []string{"-pattern", "late", "-hint", "sparse", "-src"}},
		{"sparse/stale", s, []string{"-pattern", "stale", "-hint", "sparse"}},
		{"sparse/bcast", s, []string{"-pattern", "bcast", "-hint", "sparse"}},
		{"dense/bcast/fence", s, []string{"-pattern", "bcast", "-hint", "dense", "-fence"}},
		{"dense/stale", s, []string{"-pattern", "stale", "-hint", "dense"}},
		{"none/neighbours/kvs=sparse", append([]string{"--kvs", "sparse"}, s...), []string{"-pattern", "neighbours", "-hint", "none"}},
		{"none/neighbours/fence/kvs=auto", s, []string{"-pattern", "neighbours", "-hint", "none", "-fence"}},
		{"missing", s, []string{"-pattern", "missing"}},
		{"missing/src", s, []string{"-pattern", "missing", "-src"}},
	}
	// A tree of width 2 over 4 nodes has agents between nodes and pmirun:
	// Tree forwards puts and gets through them (and their fences wait for
	// what they forward).
	deep := append([]string{"--tree-width", "2"}, s...)
	cs = append(cs,
		kvsCase{"deep/sparse/neighbours", deep, []string{"-pattern", "neighbours", "-hint", "sparse"}},
		kvsCase{"deep/sparse/get-before-put", deep, []string{"-pattern", "late", "-hint", "sparse"}},
		kvsCase{"deep/sparse/stale", deep, []string{"-pattern", "stale", "-hint", "sparse"}},
	)
	return cs
}

var strategies = []string{"direct", "dkvs", "tree"}

// Every strategy, hint and order over loopback agents on both backends:
// the values read are checked by every rank (kvsprog).
func TestLoopbackKVS(t *testing.T) {
	for _, be := range backends {
		for _, st := range strategies {
			for _, tc := range kvsCases(st) {
				t.Run(be+"/"+st+"/"+tc.name, func(t *testing.T) {
					args := append(append(append([]string{}, tc.opts...), "-n", "8", prog("kvsprog")), tc.args...)
					r := run(t, loopbackJob(hostCount, be, args...))
					r.wantCode(t, 0)
					r.wantOneLine(t, `^kvsprog ok: `)
				})
			}
		}
	}
}

// The same on 4 test hosts: the research's sparse pattern and a get
// before its put, per strategy and backend.
func TestNetnsKVS(t *testing.T) {
	cl := newCluster(t)
	for _, be := range backends {
		for _, st := range strategies {
			for _, tc := range kvsCases(st)[:5] {
				t.Run(be+"/"+st+"/"+tc.name, func(t *testing.T) {
					args := append(append(append([]string{}, tc.opts...), "-n", "8", prog("kvsprog")), tc.args...)
					r := run(t, cl.job(be, args...))
					r.wantCode(t, 0)
					r.wantOneLine(t, `^kvsprog ok: `)
				})
			}
		}
	}
}

// Node coalescing: 16 ranks per node ask for one key that the last rank
// puts late; each node sends one request for it, the rest queue behind.
func TestKVSCoalescing(t *testing.T) {
	const nodes, ppn = 4, 16
	for _, st := range strategies {
		t.Run(st, func(t *testing.T) {
			r := run(t, loopbackJob(nodes, "net", "--verbose", "--get-strategy", st, "-n", n(nodes*ppn), prog("kvsprog"), "-pattern", "late"))
			r.wantCode(t, 0)
			for i, c := range r.counters(t, nodes) {
				// The putter's node answers its own waiting ranks too
				// through one fetch (released by the put).
				if c["kvs.fetches"] != 1 {
					t.Errorf("node %d: %d fetches for one key read by %d local ranks; want 1 (counters %v)", i, c["kvs.fetches"], ppn, c)
				}
				if want := int64(ppn - 1); i < nodes-1 && c["kvs.coalesced"] != want {
					t.Errorf("node %d: %d gets queued behind the fetch; want %d", i, c["kvs.coalesced"], want)
				}
			}
		})
	}
}

// Direct with the source rank named: a get for a key of another node
// goes to the source rank's node, never to a hash owner or up the tree.
// With block placement, two ranks per node, every rank has one neighbour
// on another node: each node serves exactly the gets for its own ranks'
// keys from the neighbouring nodes (under DKVS the keys' hash owners
// would serve them).
func TestKVSDirectServesSource(t *testing.T) {
	const ranks, ppn = 8, 2
	want := make([]int64, hostCount)
	for r := range ranks {
		for _, nb := range []int{(r + ranks - 1) % ranks, (r + 1) % ranks} {
			if src := nb / ppn; src != r/ppn {
				want[src]++
			}
		}
	}
	r := run(t, loopbackJob(hostCount, "net", "--verbose", "--get-strategy", "direct", "-n", n(ranks), prog("kvsprog"), "-pattern", "neighbours", "-src"))
	r.wantCode(t, 0)
	for i, c := range r.counters(t, hostCount) {
		if got := c["kvs.gets.served"]; got != want[i] {
			t.Errorf("node %d served %d gets of other nodes; want %d (its ranks' keys, asked by the neighbouring nodes)", i, got, want[i])
		}
	}
}

// A real libpmi2 program (PMI2_KVS_Get with src_pmi_id) under --kvs
// sparse: its keys are fetched on demand from other nodes.
func TestKVSLibpmi2Sparse(t *testing.T) {
	for _, st := range strategies {
		t.Run(st, func(t *testing.T) {
			j := loopbackJob(hostCount, "net", "--verbose", "--kvs", "sparse", "--get-strategy", st, "-n", "8", prog("pmi2_test"))
			j.env = []string{"EXPECT_NNODES=4", "EXPECT_PLACEMENT=block", "PMI2_TEST_ALARM=30"}
			r := run(t, j)
			r.wantCode(t, 0)
			r.wantPMI2(t, 8, hostCount, false)
			sent := int64(0)
			for _, c := range r.counters(t, hostCount) {
				sent += c["kvs.fetches.sent"]
			}
			if sent == 0 {
				t.Errorf("no get went to another node under --kvs sparse")
			}
		})
	}
}

// MPICH (PMI-1, unmodified) under each policy: correct whatever travels
// with the fence.
func TestKVSPoliciesMPICH(t *testing.T) {
	for _, pol := range []string{"dense", "sparse", "auto"} {
		t.Run(pol, func(t *testing.T) {
			r := run(t, loopbackJob(hostCount, "net", "--kvs", pol, "-n", "16", prog("mpi_allreduce")))
			r.wantCode(t, 0)
			r.wantAllreduce(t, 16)
		})
	}
}

// A PMI-1.2 node barrier (PMI_Barrier_group(PMI_GROUP_NODE)) shows the
// node's puts on the node; the world barrier after it carries them to
// the other nodes all the same (the node barrier kept them from the
// fence: a get of another node's key answered rc=4 after it). A group
// barrier of ranks on several nodes is refused at once, as documented.
func TestKVSNodeBarrierThenWorld(t *testing.T) {
	const script = `pmi() { printf '%s\n' "$1" >&$PMI_FD; read -r l <&$PMI_FD; }
pmi 'cmd=init pmi_version=1 pmi_subversion=1'
pmi 'cmd=get_my_kvsname'; kvs=${l##*kvsname=}
pmi "cmd=put kvsname=$kvs key=k$PMI_RANK value=v$PMI_RANK"
pmi 'cmd=barrier_in group=NODE:7'
pmi 'cmd=barrier_in'
for r in 0 1 2 3; do pmi "cmd=get kvsname=$kvs key=k$r"; echo "$PMI_RANK ${l#cmd=get_result }"; done
pmi 'cmd=barrier_in group=0,1,2,3:8'; echo "$PMI_RANK ${l%% msg=*}"
pmi 'cmd=finalize'`
	r := run(t, loopbackJob(2, "net", "-n", "4", "bash", "-c", script))
	r.wantCode(t, 0)
	want := map[string]int{}
	for rank := range 4 {
		for key := range 4 {
			want[fmt.Sprintf("%d rc=0 value=v%d", rank, key)]++
		}
		// A barrier of a rank list spanning nodes is refused (README).
		want[fmt.Sprintf("%d cmd=barrier_out rc=-1", rank)]++
	}
	r.wantLines(t, want)
}

// The rank that would put a key other ranks wait for dies first: the
// job ends, naming it, and no waiting get hangs.
func TestKVSOwnerDies(t *testing.T) {
	for _, st := range strategies {
		t.Run(st, func(t *testing.T) {
			r := run(t, loopbackJob(hostCount, "net", "--get-strategy", st, "-n", "8", prog("kvsprog"), "-pattern", "late-die"))
			if r.code == 0 {
				t.Fatalf("job exited 0\n%s", r)
			}
			if !regexp.MustCompile(`rank 7 on node 3 \(127\.0\.0\.1\) exited with code 3`).MatchString(strings.Join(r.pmirunLines(), "\n")) {
				t.Errorf("pmirun does not name rank 7, its node and its exit code\n%s", r)
			}
		})
	}
}

// Every rank of the job waits — half in a fence, half for a key nobody
// puts — on different nodes: pmirun reports the deadlock, naming who
// waits for what, instead of hanging.
func TestKVSDeadlock(t *testing.T) {
	for _, st := range strategies {
		t.Run(st, func(t *testing.T) {
			r := run(t, loopbackJob(hostCount, "net", "--get-strategy", st, "-n", "8", prog("kvsprog"), "-pattern", "deadlock"))
			if r.code == 0 {
				t.Fatalf("job exited 0\n%s", r)
			}
			if !regexp.MustCompile(`deadlock: every live rank of the job waits .*rank \d+ in get of never-put`).MatchString(strings.Join(r.pmirunLines(), "\n")) {
				t.Errorf("pmirun does not report the deadlock naming a waiting get\n%s", r)
			}
			if r.elapsed > 20*time.Second {
				t.Errorf("the deadlock took %v to report", r.elapsed)
			}
		})
	}
}

// The ranks of one node finalize without a fence the other node's ranks
// wait in: the fence can never complete, and pmirun ends the job as a
// deadlock naming that node, instead of hanging.
func TestKVSDeadlockFenceNodeDone(t *testing.T) {
	r := run(t, loopbackJob(2, "net", "--cyclic", "-n", "4", prog("kvsprog"), "-pattern", "skipfence"))
	if r.code == 0 {
		t.Fatalf("job exited 0\n%s", r)
	}
	if !regexp.MustCompile(`deadlock: every live rank of the job waits \(rank \d+ in fence.*\), in collective 1 among others, which the ranks of node 1 \(\S+\) never entered`).MatchString(strings.Join(r.pmirunLines(), "\n")) {
		t.Errorf("pmirun does not report the fence node 1 never entered\n%s", r)
	}
	if r.elapsed > 20*time.Second {
		t.Errorf("the deadlock took %v to report", r.elapsed)
	}
}

// A rank that started an Iallgather or Ifence and works on is not stuck:
// the deadlock check must not end the job while the others wait for the
// key it puts after its work, nor after its Wait was cut short; once it
// waits, a real deadlock still fails at once. Over shared memory and over
// the text protocol.
func TestKVSDetachedNotStuck(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []string
	}{{"shm", nil}, {"pmi2", []string{"--no-shm"}}} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(tc.opts, "-n", "3", prog("kvsprog"), "-pattern", "detached")
			r := run(t, job{args: args, timeout: 60 * time.Second})
			r.wantCode(t, 0)
			r.wantOneLine(t, `^kvsprog ok: detached, 3 ranks$`)
		})
	}
}

// Bad options are refused before anything starts.
func TestKVSBadOptions(t *testing.T) {
	for _, args := range [][]string{{"--kvs", "lazy"}, {"--get-strategy", "gossip"}} {
		r := run(t, job{args: append(args, "-n", "1", "true")})
		if r.code != 2 || !strings.Contains(r.stderr, args[1]) {
			t.Errorf("pmirun %v: exit %d; want 2 and a message naming %q\n%s", args, r.code, args[1], r)
		}
	}
}
