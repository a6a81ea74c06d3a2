package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Virtual ranks: each agent plays its ranks as goroutines that use the
// real shared-memory client (the scale benchmark's ranks). Every workload
// checks its own results; the tests check rank 0's report and the message
// counts: one tree message per node per collective, exactly two ring
// messages per node per ring. The ranks' timestamp exchange after the
// timed rounds is one more allgather, which each node books again under
// "stamps." and which the counts leave out.

// virtualLine is global rank 0's report of a virtual job.
var virtualLine = regexp.MustCompile(`^fastpmi-scale op=([\w-]+) P=(\d+) local=(\d+) rounds=(\d+) median_us=[0-9.]+ min_us=[0-9.]+ `)

// stampPrefix is launch.StampCounterPrefix.
const stampPrefix = "stamps."

// checkSpanTail checks the job-wide round times on a report line: present,
// positive, and tail ≤ span (the median and the minimum of tails are at
// most those of spans, since every round's tail is at most its span).
func checkSpanTail(t *testing.T, line string) {
	t.Helper()
	us := lineUs(t, line)
	for _, k := range []string{"span_median_us", "span_min_us", "tail_median_us", "tail_min_us", "tail_max_us"} {
		if v, ok := us[k]; !ok || v <= 0 {
			t.Errorf("report %q: %s missing or not positive", line, k)
		}
	}
	switch {
	case us["tail_min_us"] > us["tail_median_us"] || us["tail_median_us"] > us["tail_max_us"]:
		t.Errorf("report %q: tail min, median, max out of order", line)
	case us["tail_median_us"] > us["span_median_us"] || us["tail_min_us"] > us["span_min_us"]:
		t.Errorf("report %q: tail above span", line)
	case us["span_min_us"] > us["span_median_us"]:
		t.Errorf("report %q: span min above median", line)
	}
}

// lineUs reads the microsecond fields of a report line.
func lineUs(t *testing.T, line string) map[string]float64 {
	t.Helper()
	us := map[string]float64{}
	for _, f := range strings.Fields(line) {
		if k, v, ok := strings.Cut(f, "="); ok && strings.HasSuffix(k, "_us") {
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Errorf("report %q: %s: %v", line, k, err)
			}
			us[k] = x
		}
	}
	return us
}

// virtualReport is rank 0's one report line of a virtual job, checked
// against the job (op, P, local ranks, rounds) and by checkSpanTail.
func virtualReport(t *testing.T, r result, op string, nodes, ppn, rounds int) string {
	t.Helper()
	ls := lines(r.stdout)
	if len(ls) != 1 {
		t.Fatalf("want one report line from rank 0\n%s", r)
	}
	m := virtualLine.FindStringSubmatch(ls[0])
	if m == nil || m[1] != op || m[2] != n(nodes*ppn) || m[3] != n(ppn) || m[4] != n(rounds) {
		t.Fatalf("report %q: want op=%s P=%d local=%d rounds=%d\n%s", ls[0], op, nodes*ppn, ppn, rounds, r)
	}
	checkSpanTail(t, ls[0])
	return ls[0]
}

func TestVirtualRanks(t *testing.T) {
	const nodes, ppn, rounds = 4, 8, 5
	ops := rounds + 1 // one warm-up round
	for _, be := range backends {
		for _, op := range []string{"allgather", "fence", "ring", "iallgather", "pmix-fence"} {
			t.Run(be+"/"+op, func(t *testing.T) {
				r := run(t, loopbackJob(nodes, be, "--verbose", "-n", n(nodes*ppn), "--virtual", op,
					"--virtual-rounds", n(rounds), "true"))
				r.wantCode(t, 0)
				virtualReport(t, r, op, nodes, ppn, rounds)
				for i, c := range r.counters(t, nodes) {
					if c == nil {
						continue
					}
					tree, ring := int64(ops), int64(0)
					if op == "ring" {
						tree, ring = 0, int64(2*ops)
					}
					// The exchange is one allgather: one tree message
					// per node (every node is a leaf of pmirun here).
					if s := c[stampPrefix+"tree.msgs.sent"]; s != 1 || c[stampPrefix+"bcast.bytes.raw"] <= 0 {
						t.Errorf("node %d booked %d tree messages and %d raw bytes to the timestamp exchange, want 1 and some\n%s",
							i, s, c[stampPrefix+"bcast.bytes.raw"], r)
					}
					if got := c["tree.msgs.sent"] - c[stampPrefix+"tree.msgs.sent"]; got != tree || c["ring.msgs.sent"] != ring || c["ring.msgs.recv"] != ring {
						t.Errorf("node %d sent %d tree and %d ring messages (received %d) for %d %s rounds; want %d and %d\n%s",
							i, got, c["ring.msgs.sent"], c["ring.msgs.recv"], ops, op, tree, ring, r)
					}
					// Every local rank's timed rounds, and at most its
					// warm-up round too, fall in the node's CPU window.
					if cpu, rr := c["virtual.cpu.ns"], c["virtual.cpu.rank.rounds"]; cpu <= 0 || rr < int64(ppn*rounds) || rr > int64(ppn*ops) {
						t.Errorf("node %d booked %dns of CPU over %d rank rounds; want some over %d to %d\n%s",
							i, cpu, rr, ppn*rounds, ppn*ops, r)
					}
					if op == "ring" && c["bcast.bytes.in"] != c[stampPrefix+"bcast.bytes.in"] {
						t.Errorf("node %d received %d broadcast bytes in a ring job, %d of them for the timestamp exchange; want only those\n%s",
							i, c["bcast.bytes.in"], c[stampPrefix+"bcast.bytes.in"], r)
					}
				}
			})
		}
	}
}

// An unknown workload is refused before anything starts.
func TestVirtualUnknownWorkload(t *testing.T) {
	r := run(t, job{args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "4", "--virtual", "nosuch", "true"}, timeout: 20 * time.Second})
	if r.code == 0 {
		t.Fatalf("exit 0 for an unknown virtual workload\n%s", r)
	}
	r.wantMessage(t, `invalid --virtual "nosuch"`)
}

// pmibench -scale runs virtual jobs over both backends and reports each
// operation's time and message counts.
func TestScaleBenchmark(t *testing.T) {
	js := filepath.Join(t.TempDir(), "scale.json")
	cmd := exec.Command(prog("pmibench"), "-scale", "-nodes", "2,4", "-ppn", "4", "-ops", "allgather,ring",
		"-rounds", "3", "-netio", "net,uring", "-net-timeout", "10s", "-timeout", "60s", "-pmirun", pmirun(), "-json", js)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("pmibench -scale: %v\n%s", err, out)
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Op       string             `json:"op"`
			Nodes    int                `json:"nodes"`
			Backend  string             `json:"netio"`
			Err      string             `json:"error"`
			Median   int64              `json:"median_ns"`
			SpanMed  int64              `json:"span_median_ns"`
			SpanMin  int64              `json:"span_min_ns"`
			TailMed  int64              `json:"tail_median_ns"`
			TailMin  int64              `json:"tail_min_ns"`
			TailMax  int64              `json:"tail_max_ns"`
			CPURound int64              `json:"cpu_rank_round_ns"`
			Counters []map[string]int64 `json:"node_counters"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	if len(rep.Results) != 2*2*2 {
		t.Fatalf("%d results, want 8 (2 sizes x 2 ops x 2 backends)\n%s\n%s", len(rep.Results), out, b)
	}
	for _, r := range rep.Results {
		if r.Err != "" || r.Median <= 0 || len(r.Counters) != r.Nodes {
			t.Errorf("%s K=%d over %s: error %q, median %dns, %d counter sets\n%s", r.Op, r.Nodes, r.Backend, r.Err, r.Median, len(r.Counters), out)
			continue
		}
		if r.TailMin <= 0 || r.TailMin > r.TailMed || r.TailMed > r.TailMax || r.TailMed > r.SpanMed || r.TailMin > r.SpanMin {
			t.Errorf("%s K=%d over %s: tail min %d median %d max %d, span min %d median %d (ns): want 0 < tail ≤ span",
				r.Op, r.Nodes, r.Backend, r.TailMin, r.TailMed, r.TailMax, r.SpanMin, r.SpanMed)
		}
		if r.CPURound <= 0 {
			t.Errorf("%s K=%d over %s: no CPU per rank round", r.Op, r.Nodes, r.Backend)
		}
		if r.Op == "ring" {
			for i, c := range r.Counters {
				if c["ring.msgs.sent"] != 2*4 { // 3 rounds + 1 warm-up
					t.Errorf("ring K=%d over %s: node %d sent %d ring messages, want 8", r.Nodes, r.Backend, i, c["ring.msgs.sent"])
				}
			}
		}
	}
	if !regexp.MustCompile(`(?m)^P = 8$`).Match(out) || !regexp.MustCompile(`(?m)^P = 16$`).Match(out) {
		t.Errorf("no table for P = 8 and P = 16\n%s", out)
	}
	if !regexp.MustCompile(`net tail +uring tail +net span +uring span +net CPU/rank/round +uring CPU/rank/round`).Match(out) {
		t.Errorf("no tail, span and CPU columns\n%s", out)
	}
}

// A late-arrival job: every round starts with a barrier, after which
// global rank 0 waits before it enters, so that it enters last in every
// round. Its report says so.
func TestVirtualLate(t *testing.T) {
	const nodes, ppn, rounds = 4, 8, 3
	lateLine := regexp.MustCompile(` late_us=30000\.0 .* late_last=(\d+) late_gap_min_us=(-?[0-9.]+)$`)
	for _, op := range []string{"ring", "allgather"} {
		t.Run(op, func(t *testing.T) {
			r := run(t, loopbackJob(nodes, "net", "-n", n(nodes*ppn), "--virtual", op,
				"--virtual-rounds", n(rounds), "--virtual-late", "30ms", "true"))
			r.wantCode(t, 0)
			ls := lines(r.stdout)
			if len(ls) != 1 {
				t.Fatalf("want one report line from rank 0\n%s", r)
			}
			checkSpanTail(t, ls[0])
			m := lateLine.FindStringSubmatch(ls[0])
			if m == nil {
				t.Fatalf("report %q: no late_us=30000.0, late_last and late_gap_min_us\n%s", ls[0], r)
			}
			// Rank 0 entered after every other rank in every round.
			if gap, _ := strconv.ParseFloat(m[2], 64); m[1] != n(rounds) || gap <= 0 {
				t.Errorf("report %q: rank 0 entered last in %s of %d rounds, by at least %sµs; want all", ls[0], m[1], rounds, m[2])
			}
		})
	}
	r := run(t, job{args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "4", "--virtual-late", "5ms", "true"}, timeout: 20 * time.Second})
	if r.code == 0 {
		t.Fatalf("exit 0 for --virtual-late without --virtual\n%s", r)
	}
	r.wantMessage(t, "--virtual-late needs --virtual")
}

// The KVS workloads with 256 goroutine ranks per node. The dense key
// read by every rank of a node costs that node one remote request per
// round (node coalescing, and the cache behind it); the research's two
// patterns and an MPI start-up under each policy check every value.
func TestVirtualKVS(t *testing.T) {
	const nodes, ppn, rounds = 4, 256, 3
	ops := rounds + 1
	t.Run("coalescing", func(t *testing.T) {
		r := run(t, loopbackJob(nodes, "net", "--verbose", "--get-strategy", "direct", "-n", n(nodes*ppn),
			"--virtual", "kvs-dense-od", "--virtual-rounds", n(rounds), "true"))
		r.wantCode(t, 0)
		for i, c := range r.counters(t, nodes) {
			// One request per round for rank 0's key, none on rank 0's
			// own node.
			least, most := int64(ops), int64(ops)
			if i == 0 {
				least, most = 0, 0
			}
			if got := c["kvs.fetches.sent"]; got < least || got > most {
				t.Errorf("node %d sent %d requests for %d rounds of one key read by its %d ranks; want %d..%d\n%s", i, got, ops, ppn, least, most, r)
			}
		}
	})
	for _, tc := range [][]string{
		{"--get-strategy", "dkvs", "--virtual", "kvs-sparse-od"},
		{"--get-strategy", "tree", "--virtual", "kvs-sparse-od"},
		{"--virtual", "kvs-sparse"},
		{"--kvs", "sparse", "--virtual", "kvs-cards"},
		{"--kvs", "auto", "--virtual", "kvs-cards"},
	} {
		t.Run(strings.Join(tc, " "), func(t *testing.T) {
			args := append(append([]string{}, tc...), "-n", n(nodes*64), "--virtual-rounds", n(rounds), "true")
			r := run(t, loopbackJob(nodes, "net", args...))
			r.wantCode(t, 0)
			if ls := lines(r.stdout); len(ls) != 1 || !virtualLine.MatchString(ls[0]) {
				t.Errorf("want one report line from rank 0\n%s", r)
			}
		})
	}
}
