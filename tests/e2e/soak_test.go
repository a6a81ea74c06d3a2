package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// soakJobs is how many jobs TestSoak runs by default: 1,000, about two
// minutes with soakWorkers at a time on a 2-core machine. The race run of
// make test (which builds the same binaries, and races only this harness)
// runs every fault three times. FASTPMI_SOAK_JOBS=N runs N instead (a
// longer soak).
func soakJobs(t *testing.T) int {
	if s := os.Getenv("FASTPMI_SOAK_JOBS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FASTPMI_SOAK_JOBS=%q: want a positive number", s)
		}
		return v
	}
	if raceEnabled {
		return 3 * len(soakFaults)
	}
	return 1000
}

// soakWorkers is how many soak jobs run at once: the jobs mostly wait
// (for a fault, a timeout, a kill), and on a shared machine several
// jobs at once are also what a daemon or a busy node sees.
const soakWorkers = 4

// soakFault is one kind of job TestSoak draws: its pmirun arguments (after
// -n), the exit code it must end with (-2: any failure; -3: success, or
// any failure if the fault struck before the job ended) and a pattern of
// pmirun's message ("" for none). A fault with its own timeout may end by
// it; the others must end by their fault. strike, if set, is the fault the test
// itself injects while the job runs; it reports whether it struck.
type soakFault struct {
	name     string
	loopback bool // two loopback agents (pmid) instead of the fork bootstrap
	timeout  string
	args     func(r *rand.Rand, size int) []string
	strike   func(t *testing.T, r *rand.Rand, j *running) bool
	code     int
	msg      string
}

var soakFaults = []soakFault{
	{name: "ok", args: func(r *rand.Rand, size int) []string { return []string{prog("exit_early"), "ok"} }, code: 0},
	{name: "exit 3 before init", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "exit-before-init", n(r.IntN(size)), "3"}
	}, code: 3, msg: `\brank \d+ exited with code 3\b`},
	{name: "SIGKILL after put", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "kill-after-put", n(r.IntN(size))}
	}, code: 128 + 9, msg: `\brank \d+ killed by signal 9\b`},
	{name: "exit 0 after put", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "exit-after-put", n(r.IntN(size)), "0"}
	}, code: -2, msg: `\brank \d+\b`},
	{name: "no finalize", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "no-finalize", n(r.IntN(size)), n(r.IntN(200))}
	}, code: 1, msg: `\bexited with code 0 without calling PMI finalize\b`},
	{name: "PMI_FD closed", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "close-after-put", n(r.IntN(size))}
	}, code: -2, msg: `\brank \d+\b`},
	{name: "abort 256", args: func(r *rand.Rand, size int) []string { return []string{"bash", "-c", abortScript("256")} }, code: 1, msg: `\babort with exit code 256\b`},
	{name: "abort 0", args: func(r *rand.Rand, size int) []string { return []string{"bash", "-c", abortScript("0")} }, code: 1, msg: `\babort with exit code 0\b`},
	{name: "garbage", args: func(r *rand.Rand, size int) []string {
		return []string{"bash", "-c", `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD; if [ "$PMI_RANK" = 0 ]; then printf '\377\000garbage\n    -7' >&$PMI_FD; fi; sleep 20`}
	}, code: -2, msg: `\brank \d+\b`},
	{name: "stops reading, floods", timeout: "2s", args: func(r *rand.Rand, size int) []string {
		// Rank 0 enters the barrier, then floods requests without ever
		// reading: it stalls itself, so --timeout ends the job, or its
		// reply queue overflows first and it fails; the other ranks are
		// answered either way.
		return []string{"bash", "-c", `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD
if [ "$PMI_RANK" = 0 ]; then printf 'cmd=barrier_in\n' >&$PMI_FD; yes 'cmd=get_maxes' >&$PMI_FD; fi
printf 'cmd=barrier_in\n' >&$PMI_FD; read -r l <&$PMI_FD; echo "released $PMI_RANK $l"; sleep 30`}
	}, code: -2, msg: `timed out after 2s|\brank 0 broke the PMI protocol: stopped reading its PMI replies\b`},
	{name: "rank SIGKILLed at a random phase", args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "ok"}
	}, strike: func(t *testing.T, r *rand.Rand, j *running) bool {
		return strikeAfter(r, 8*time.Millisecond, func() int { return pick(r, soakProcs(j.marker, "/exit_early")) })
	}, code: -3, msg: `\brank \d+\b`},
	{name: "agent SIGKILLed at a random phase", loopback: true, args: func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "ok"}
	}, strike: func(t *testing.T, r *rand.Rand, j *running) bool {
		return strikeAfter(r, 60*time.Millisecond, func() int {
			if agents := soakProcs(j.marker, "/pmid"); len(agents) == 2 {
				return pick(r, agents)
			}
			return 0
		})
	}, code: -3, msg: `\bnode \d+\b.*\b(lost|exited before connecting)\b|\brank \d+\b`},
	{name: "shm scribbler", args: func(r *rand.Rand, size int) []string {
		return []string{prog("scribbler"), "-target", n(r.IntN(size)), "-seed", n(r.IntN(1000)), "-stores", n(1 + r.IntN(128))}
	}, code: -2, msg: `\brank \d+ (exited|broke the PMI protocol|killed)|PMI protocol error`},
}

// soakBound is how soon every soak job must end: the 2 s --timeout of the
// flooding jobs plus generous slack for a loaded machine.
const soakBound = 20 * time.Second

// soakTimeout is the --timeout of the soak's jobs that must end by their
// fault: far above what they take, so a job that only --timeout ended is
// caught as one whose fault went unnoticed.
const soakTimeout = "10s"

// TestSoak runs soakJobs jobs, soakWorkers at a time, each with the next
// fault in turn and its rank, phase and details drawn at random (a rank
// exiting, killed at a random phase, closing PMI, aborting with an
// out-of-range code, sending garbage, stopping reading while flooding,
// scribbling over shared memory; an agent killed at a random phase), and
// checks that every job ends within soakBound with its verdict, leaves no
// process behind (run's survivor check) and that the test process's
// descriptors do not grow.
func TestSoak(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	fds0 := openFDs(t)
	jobs := soakJobs(t)
	var (
		mu     sync.Mutex
		count  = map[string]int{}
		struck = map[string]int{}
		worst  time.Duration
	)
	next := make(chan int)
	var wg sync.WaitGroup
	for range soakWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				f := soakFaults[i%len(soakFaults)]
				t.Run(fmt.Sprintf("job%d", i), func(t *testing.T) {
					r := rand.New(rand.NewPCG(seed, uint64(i)))
					hit, elapsed := soakJob(t, r, f)
					mu.Lock()
					defer mu.Unlock()
					count[f.name]++
					if hit {
						struck[f.name]++
					}
					worst = max(worst, elapsed)
				})
			}
		}()
	}
	for i := range jobs {
		next <- i
	}
	close(next)
	wg.Wait()
	if fds := openFDs(t); fds > fds0+4 {
		t.Errorf("the test process holds %d descriptors after %d jobs, %d before", fds, jobs, fds0)
	}
	t.Logf("%d jobs, faults %v, injected while running %v, slowest %v", jobs, count, struck, worst)
}

// soakJob runs one job of fault f and checks its verdict; it reports
// whether f's strike hit the job and how long the job took.
func soakJob(t *testing.T, r *rand.Rand, f soakFault) (hit bool, elapsed time.Duration) {
	size := 2 + r.IntN(3)
	timeout := soakTimeout
	if f.timeout != "" {
		timeout = f.timeout
	}
	args := []string{"--timeout", timeout, "-n", n(size)}
	if f.loopback {
		args = append([]string{"--bootstrap", "loopback", "--nodes", "2"}, args...)
	}
	j := start(t, job{args: append(args, f.args(r, size)...), timeout: 60 * time.Second, markAgents: f.loopback})
	if f.strike != nil {
		hit = f.strike(t, r, j)
	}
	res := j.wait()
	switch {
	case f.code == -3 && res.code == 0:
		res.wantRankLines(t, size, func(rank int) string { return fmt.Sprintf("early ok rank %d", rank) })
	case f.code == -3 || f.code == -2:
		if res.code == 0 {
			t.Errorf("%s: exit code 0 for a failed job\n%s", f.name, res)
		}
		res.wantMessage(t, f.msg)
	default:
		if res.code != f.code {
			t.Errorf("%s: exit code %d, want %d\n%s", f.name, res.code, f.code, res)
		}
		if f.msg != "" {
			res.wantMessage(t, f.msg)
		}
	}
	if f.timeout == "" && res.code == ExitTimeoutCode {
		t.Errorf("%s: ended by --timeout, not by its fault\n%s", f.name, res)
	}
	if f.name == "stops reading, floods" {
		res.wantRankLines(t, size-1, func(rank int) string { return fmt.Sprintf("released %d cmd=barrier_out rc=0", rank+1) })
	}
	res.wantFaster(t, soakBound)
	return hit, res.elapsed
}

// strikeAfter waits (up to 10 s) until target names a process, then for
// a random time below spread, and SIGKILLs the process target names then
// (0: none, the job moved on); it reports whether a kill was sent.
func strikeAfter(r *rand.Rand, spread time.Duration, target func() int) bool {
	for deadline := time.Now().Add(10 * time.Second); target() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	time.Sleep(time.Duration(r.Int64N(int64(spread))))
	pid := target()
	return pid != 0 && sys.SignalProcess(pid, sys.SIGKILL) == nil
}

// soakProcs lists the job's processes whose program path ends in suffix.
func soakProcs(marker, suffix string) []int {
	var out []int
	for _, pid := range marked(marker) {
		if args := cmdline(pid); len(args) > 0 && strings.HasSuffix(args[0], suffix) {
			out = append(out, pid)
		}
	}
	slices.Sort(out)
	return out
}

// pick returns one of pids at random, or 0 when there are none.
func pick(r *rand.Rand, pids []int) int {
	if len(pids) == 0 {
		return 0
	}
	return pids[r.IntN(len(pids))]
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
