package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// The research's figures (pmibench -paper) as virtual workloads: each
// exchanges the research's key and value and checks what it got; those
// that compute do so in every round for --virtual-work, so no round (and
// no rank's round, the tail) is shorter than the work.

// paperWork is the workloads that compute, and their work in these tests.
var paperWork = map[string]bool{
	"paper-ifence-sleep": true, "paper-ifence-spin": true, "paper-iallgather-sleep": true, "paper-iallgather-spin": true,
	"paper-init-fence": true, "paper-init-allgather": true, "paper-init-iallgather": true,
}

const paperWorkTime = 20 * time.Millisecond

func TestVirtualPaperWorkloads(t *testing.T) {
	const nodes, ppn, rounds = 2, 8, 3
	ops := rounds + 1           // one warm-up round
	cpu := map[string]float64{} // agents' CPU per rank round
	for _, op := range []string{
		"paper-fence", "paper-ifence", "paper-allgather", "paper-iallgather",
		"paper-ifence-sleep", "paper-ifence-spin", "paper-iallgather-sleep", "paper-iallgather-spin",
		"paper-init-fence", "paper-init-allgather", "paper-init-iallgather",
	} {
		t.Run(op, func(t *testing.T) {
			args := []string{"--verbose", "-n", n(nodes * ppn), "--virtual", op, "--virtual-rounds", n(rounds)}
			if paperWork[op] {
				args = append(args, "--virtual-work", paperWorkTime.String())
			}
			r := run(t, loopbackJob(nodes, "net", append(args, "true")...))
			r.wantCode(t, 0)
			line := virtualReport(t, r, op, nodes, ppn, rounds)
			us := lineUs(t, line)
			if w := float64(paperWorkTime / time.Microsecond); paperWork[op] && (us["min_us"] < w || us["tail_min_us"] < w) {
				t.Errorf("report %q: a round of %vµs or a tail of %vµs, shorter than the %v of work", line, us["min_us"], us["tail_min_us"], paperWorkTime)
			}
			var used, rr int64
			for i, c := range r.counters(t, nodes) {
				if c == nil {
					continue
				}
				// One tree collective per round: a fence or an allgather.
				if got := c["tree.msgs.sent"] - c[stampPrefix+"tree.msgs.sent"]; got != int64(ops) {
					t.Errorf("node %d sent %d tree messages for %d %s rounds, want %d\n%s", i, got, ops, op, ops, r)
				}
				used, rr = used+c["virtual.cpu.ns"], rr+c["virtual.cpu.rank.rounds"]
			}
			if rr > 0 {
				cpu[op] = float64(used) / float64(rr)
			}
		})
	}
	// Spinning burns CPU where sleeping leaves it idle (by a margin
	// that holds on a loaded machine, where a spinning agent gets only
	// its share of the CPUs).
	for _, x := range []string{"ifence", "iallgather"} {
		spin, sleep := cpu["paper-"+x+"-spin"], cpu["paper-"+x+"-sleep"]
		if spin > 0 && sleep > 0 && spin < 1.5*sleep {
			t.Errorf("%s: %.0fns of CPU per rank round spinning, %.0fns sleeping; want spinning to burn more", x, spin, sleep)
		}
	}
}

// --virtual-work goes with the workloads that compute, and only them.
func TestVirtualWorkFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--virtual", "paper-ifence-sleep"}, "needs a virtual work duration"},
		{[]string{"--virtual", "allgather", "--virtual-work", "5ms"}, `workload "allgather" does no work`},
		{[]string{"--virtual-work", "5ms"}, "--virtual-work needs --virtual"},
		{[]string{"--virtual", "paper-init-fence", "--virtual-work", "0"}, "--virtual-work"},
		{[]string{"--virtual", "paper-init-fence", "--virtual-work", "2m"}, "want 0 to 1m0s"},
	} {
		args := append([]string{"--bootstrap", "loopback", "--nodes", "2", "-n", "4"}, c.args...)
		r := run(t, job{args: append(args, "true"), timeout: 20 * time.Second})
		if r.code == 0 {
			t.Errorf("%q: exit 0\n%s", c.args, r)
			continue
		}
		r.wantMessage(t, regexp.QuoteMeta(c.msg))
	}
}

// pmibench -paper runs every figure's jobs at one small size: the
// overlap jobs compute for the blocking exchange's median measured just
// before, the MPI_Init jobs for -work; it prints a table per figure and
// draws each.
func TestPaperBenchmark(t *testing.T) {
	dir := t.TempDir()
	js, plots := filepath.Join(dir, "paper.json"), filepath.Join(dir, "plots")
	cmd := exec.Command(prog("pmibench"), "-paper", "-nodes", "2", "-ppn", "4", "-rounds", "3", "-work", "5ms",
		"-net-timeout", "10s", "-timeout", "60s", "-pmirun", pmirun(), "-json", js, "-plot", plots, "-markdown")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("pmibench -paper: %v\n%s\n%s", err, out, stderr.String())
	}
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Results []struct {
			Op     string `json:"op"`
			Nodes  int    `json:"nodes"`
			PPN    int    `json:"ppn"`
			Work   int64  `json:"work_ns"`
			Err    string `json:"error"`
			Median int64  `json:"median_ns"`
		} `json:"results"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatalf("%s: %v", js, err)
	}
	if len(rep.Results) != 11 {
		t.Fatalf("%d results, want 11 (one size, 11 workloads)\n%s", len(rep.Results), stderr.String())
	}
	median := map[string]int64{}
	for _, r := range rep.Results {
		if r.Err != "" || r.Median <= 0 || r.Nodes != 2 || r.PPN != 4 {
			t.Errorf("%s: error %q, median %dns, K=%d PPN=%d", r.Op, r.Err, r.Median, r.Nodes, r.PPN)
		}
		median[r.Op] = r.Median
	}
	for _, r := range rep.Results {
		var want int64
		switch {
		case strings.HasPrefix(r.Op, "paper-init-"):
			want = int64(5 * time.Millisecond)
		case strings.HasPrefix(r.Op, "paper-ifence-"):
			want = median["paper-fence"]
		case strings.HasPrefix(r.Op, "paper-iallgather-"):
			want = median["paper-allgather"]
		}
		if r.Work != want {
			t.Errorf("%s computed for %dns, want %dns", r.Op, r.Work, want)
		}
	}
	for _, title := range []string{"Figure 9 / Table II", "Figure 10", "Figure 11", "Figure 12"} {
		if !strings.Contains(string(out), title) {
			t.Errorf("no %s table\n%s", title, out)
		}
	}
	if !regexp.MustCompile(`\| +8 \| +2×4 \| +[0-9.]+[mµ]?s \| +[0-9.]+[mµ]?s \| +[0-9.]+ \|`).Match(out) {
		t.Errorf("no figure 9 row for P = 8 with two times and their ratio\n%s", out)
	}
	for f := 9; f <= 12; f++ {
		for _, ext := range []string{".png", ".svg"} {
			if st, err := os.Stat(filepath.Join(plots, "paper-fig"+n(f)+ext)); err != nil || st.Size() == 0 {
				t.Errorf("figure %d%s: %v", f, ext, err)
			}
		}
	}
}
