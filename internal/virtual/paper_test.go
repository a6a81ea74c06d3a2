package virtual

import (
	"context"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// Every workload the root may name is played here, and the ones that
// compute are exactly node.VirtualWorkWorkloads.
func TestWorkloadsMatchSpec(t *testing.T) {
	played := slices.Sorted(maps.Keys(workloads))
	for name := range workWorkloads {
		if _, dup := workloads[name]; dup {
			t.Errorf("workload %q both with and without work", name)
		}
		played = append(played, name)
	}
	for name := range pmixWorkloads {
		if _, dup := workloads[name]; dup {
			t.Errorf("workload %q both on shared memory and on the played PMIx server", name)
		}
		played = append(played, name)
	}
	slices.Sort(played)
	if want := slices.Sorted(slices.Values(node.VirtualWorkloads)); !slices.Equal(played, want) {
		t.Errorf("plays %v, node.VirtualWorkloads %v", played, want)
	}
	if got, want := slices.Sorted(maps.Keys(workWorkloads)), slices.Sorted(slices.Values(node.VirtualWorkWorkloads)); !slices.Equal(got, want) {
		t.Errorf("workloads that compute %v, node.VirtualWorkWorkloads %v", got, want)
	}
}

// workload refuses work where a workload does none, and wants it where
// it does.
func TestWorkloadWork(t *testing.T) {
	for _, c := range []struct {
		name string
		work time.Duration
		err  string // "" = accepted
	}{
		{"allgather", 0, ""},
		{"paper-fence", 0, ""},
		{"paper-iallgather-spin", 5 * time.Millisecond, ""},
		{"paper-init-iallgather", time.Millisecond, ""},
		{"paper-iallgather-spin", 0, "needs a virtual work duration"},
		{"paper-init-fence", 0, "needs a virtual work duration"},
		{"paper-fence", time.Millisecond, "does no work"},
		{"ring", time.Millisecond, "does no work"},
		{"paper-ifence-sleep", -time.Millisecond, "want 0 to"},
		{"paper-ifence-sleep", node.MaxVirtualWork + 1, "want 0 to"},
		{"nosuch", 0, "unknown workload"},
	} {
		round, err := workload(c.name, c.work)
		switch {
		case c.err == "" && (err != nil || round == nil):
			t.Errorf("workload(%q, %v): %v, want a round", c.name, c.work, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("workload(%q, %v): error %v, want one saying %q", c.name, c.work, err, c.err)
		}
	}
}

// The research's Table I lengths: a 9-byte key, an 18-byte value, each
// rank's and round's its own.
func TestPaperKeyValue(t *testing.T) {
	seen := map[string]bool{}
	for _, r := range []int{0, 1, 16383, 999999} {
		if k := paperKey(r); len(k) != paperKeyLen {
			t.Errorf("key of rank %d: %q, %d bytes, want %d", r, k, len(k), paperKeyLen)
		}
		for _, k := range []int{0, 1, 7} {
			v := paperValue(r, k)
			if len(v) != paperValueLen {
				t.Errorf("value of rank %d round %d: %q, %d bytes, want %d", r, k, v, len(v), paperValueLen)
			}
			if seen[string(v)] {
				t.Errorf("value %q of rank %d round %d repeats another's", v, r, k)
			}
			seen[string(v)] = true
		}
	}
}

// spinFor burns CPU for its wall-clock bound and no longer (the bound
// is generous: other tests share the machine), and ends early when its
// context is cancelled.
func TestSpinFor(t *testing.T) {
	const d = 100 * time.Millisecond
	cpu0, cerr := sys.ProcessCPUNanos()
	start := time.Now()
	if err := spinFor(context.Background(), d); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if took < d || took > d+2*time.Second {
		t.Errorf("spun %v, want %v (and not much more)", took, d)
	}
	if cpu1, err := sys.ProcessCPUNanos(); cerr == nil && err == nil && time.Duration(cpu1-cpu0) < d/50 {
		// On a loaded machine the spinning goroutine gets only a share
		// of a CPU (bounded generously: other tests share it); a sleep
		// would use next to none.
		t.Errorf("spinning %v used %v of CPU", took, time.Duration(cpu1-cpu0))
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start = time.Now()
	if err := spinFor(ctx, time.Minute); err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("cancelled spin: %v after %v, want the context's error at once", err, time.Since(start))
	}
	start = time.Now()
	if err := sleepFor(ctx, time.Minute); err == nil || time.Since(start) > 10*time.Second {
		t.Errorf("cancelled sleep: %v after %v, want the context's error at once", err, time.Since(start))
	}
}
