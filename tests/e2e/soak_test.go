package e2e

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"
)

// soakJobs is how many jobs TestSoak runs by default: every fault three
// times, well under a minute on a loaded 2-core machine.
// FASTPMI_SOAK_JOBS=N runs N instead (a long soak).
func soakJobs(t *testing.T) int {
	if s := os.Getenv("FASTPMI_SOAK_JOBS"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 1 {
			t.Fatalf("FASTPMI_SOAK_JOBS=%q: want a positive number", s)
		}
		return v
	}
	return 3 * len(soakFaults)
}

// soakFault is one kind of job TestSoak draws: its pmirun arguments (after
// -n), the exit code it must end with and a pattern of pmirun's message
// ("" for none).
type soakFault struct {
	name string
	args func(r *rand.Rand, size int) []string
	code int
	msg  string
}

var soakFaults = []soakFault{
	{"ok", func(r *rand.Rand, size int) []string { return []string{prog("exit_early"), "ok"} }, 0, ""},
	{"exit 3 before init", func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "exit-before-init", n(r.IntN(size)), "3"}
	}, 3, `\brank \d+ exited with code 3\b`},
	{"SIGKILL after put", func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "kill-after-put", n(r.IntN(size))}
	}, 128 + 9, `\brank \d+ killed by signal 9\b`},
	{"exit 0 after put", func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "exit-after-put", n(r.IntN(size)), "0"}
	}, -2, `\brank \d+\b`},
	{"no finalize", func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "no-finalize", n(r.IntN(size)), n(r.IntN(200))}
	}, 1, `\bexited with code 0 without calling PMI finalize\b`},
	{"PMI_FD closed", func(r *rand.Rand, size int) []string {
		return []string{prog("exit_early"), "close-after-put", n(r.IntN(size))}
	}, -2, `\brank \d+\b`},
	{"abort 256", func(r *rand.Rand, size int) []string { return []string{"bash", "-c", abortScript("256")} }, 1, `\babort with exit code 256\b`},
	{"abort 0", func(r *rand.Rand, size int) []string { return []string{"bash", "-c", abortScript("0")} }, 1, `\babort with exit code 0\b`},
	{"garbage", func(r *rand.Rand, size int) []string {
		return []string{"bash", "-c", `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD; if [ "$PMI_RANK" = 0 ]; then printf '\377\000garbage\n    -7' >&$PMI_FD; fi; sleep 20`}
	}, -2, `\brank \d+\b`},
	{"stops reading, floods", func(r *rand.Rand, size int) []string {
		// Rank 0 enters the barrier, then floods requests without ever
		// reading: it stalls itself, so only --timeout ends the job; the
		// other ranks are answered.
		return []string{"bash", "-c", `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD
if [ "$PMI_RANK" = 0 ]; then printf 'cmd=barrier_in\n' >&$PMI_FD; yes 'cmd=get_maxes' >&$PMI_FD; fi
printf 'cmd=barrier_in\n' >&$PMI_FD; read -r l <&$PMI_FD; echo "released $PMI_RANK $l"; sleep 30`}
	}, ExitTimeoutCode, `timed out after 4s`},
	{"shm scribbler", func(r *rand.Rand, size int) []string {
		return []string{prog("scribbler"), "-target", n(r.IntN(size)), "-seed", n(r.IntN(1000)), "-stores", n(1 + r.IntN(128))}
	}, -2, `\brank \d+ (exited|sent malformed|killed)|PMI protocol error`},
}

// soakBound is how soon every soak job must end: the 4 s --timeout of the
// flooding jobs plus generous slack for a loaded machine.
const soakBound = 20 * time.Second

// TestSoak runs soakJobs jobs, each with the next fault in turn and its
// rank and details drawn at random (a rank
// exiting, killed, closing PMI, aborting with an out-of-range code,
// sending garbage, stopping reading while flooding, scribbling over shared
// memory), and checks that every job ends within soakBound with its
// verdict, leaves no process behind (run's survivor check) and that the
// test process's descriptors do not grow.
func TestSoak(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	r := rand.New(rand.NewPCG(seed, 17))
	fds0 := openFDs(t)
	count := map[string]int{}
	var worst time.Duration
	jobs := soakJobs(t)
	for i := range jobs {
		f := soakFaults[i%len(soakFaults)]
		size := 2 + r.IntN(3)
		args := append([]string{"--timeout", "4s", "-n", n(size)}, f.args(r, size)...)
		res := run(t, job{args: args, timeout: 60 * time.Second})
		count[f.name]++
		switch {
		case f.code == -2 && res.code == 0:
			t.Errorf("job %d (%s): exit code 0 for a failed job\n%s", i, f.name, res)
		case f.code != -2 && res.code != f.code:
			t.Errorf("job %d (%s): exit code %d, want %d\n%s", i, f.name, res.code, f.code, res)
		}
		if f.code != ExitTimeoutCode && res.code == ExitTimeoutCode {
			t.Errorf("job %d (%s) was ended by --timeout, not by its fault\n%s", i, f.name, res)
		}
		if f.msg != "" {
			res.wantMessage(t, f.msg)
		}
		if f.name == "stops reading, floods" {
			res.wantRankLines(t, size-1, func(rank int) string { return fmt.Sprintf("released %d cmd=barrier_out rc=0", rank+1) })
		}
		res.wantFaster(t, soakBound)
		worst = max(worst, res.elapsed)
	}
	if fds := openFDs(t); fds > fds0+4 {
		t.Errorf("the test process holds %d descriptors after %d jobs, %d before", fds, jobs, fds0)
	}
	t.Logf("%d jobs, faults %v, slowest %v", jobs, count, worst)
}

func openFDs(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(es)
}
