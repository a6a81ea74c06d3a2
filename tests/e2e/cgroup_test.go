package e2e

import (
	"bufio"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Limits a container or a batch job sets through control groups, which
// RLIMIT_NPROC and /proc/meminfo do not show: pmirun refuses a job they
// cannot hold at once, naming the cgroup, and a start-up that runs out of
// processes midway ends with a message naming the rank, never a Go runtime
// abort.

// testCgroup makes a cgroup of controller for one test, sets its files,
// and returns the prefix that runs pmirun inside it. Cleanup kills what
// is left in it and removes it. Like the test hosts, it needs root and
// fails, never skips, where it cannot be made.
func testCgroup(t *testing.T, controller string, set func(v2 bool) map[string]string) (dir string, wrap []string) {
	t.Helper()
	mount, v2 := cgroupMount(t, controller)
	dir = filepath.Join(mount, "fastpmi-test-"+strconv.Itoa(os.Getpid())+"-"+strings.ReplaceAll(t.Name(), "/", "-"))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("make a %s cgroup (the test needs root and cgroups): %v", controller, err)
	}
	t.Cleanup(func() {
		for range 50 {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil {
					if p, err := os.FindProcess(pid); err == nil {
						p.Kill()
					}
				}
			}
			if os.Remove(dir) == nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Errorf("could not remove the test cgroup %s", dir)
	})
	for f, v := range set(v2) {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(v), 0o644); err != nil {
			t.Fatalf("set %s of the test cgroup: %v", f, err)
		}
	}
	return dir, []string{"bash", "-c", `echo $$ > "$0/cgroup.procs" && exec "$@"`, dir}
}

// cgroupMount finds where controller's hierarchy is mounted: its own v1
// hierarchy, else the v2 one (v2 true) with the controller enabled for
// children.
func cgroupMount(t *testing.T, controller string) (mount string, v2 bool) {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unified := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		pre, post, _ := strings.Cut(sc.Text(), " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if len(pf) < 5 || len(qf) < 3 {
			continue
		}
		switch qf[0] {
		case "cgroup":
			for _, c := range strings.Split(qf[2], ",") {
				if c == controller {
					return pf[4], false
				}
			}
		case "cgroup2":
			unified = pf[4]
		}
	}
	if unified != "" {
		if err := os.WriteFile(filepath.Join(unified, "cgroup.subtree_control"), []byte("+"+controller), 0o644); err == nil {
			return unified, true
		}
	}
	t.Fatalf("no cgroup hierarchy carries the %s controller", controller)
	return "", false
}

// More ranks than the pids cgroup has room for: refused at once, naming
// the cgroup's limit.
func TestPidsCgroupGuard(t *testing.T) {
	dir, wrap := testCgroup(t, "pids", func(bool) map[string]string { return map[string]string{"pids.max": "40"} })
	r := run(t, job{wrap: wrap, args: []string{"-n", "60", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 60: more ranks than the pids cgroup leaves room for \(\d+ tasks needed with pmirun's own threads, \d+ left: `+
		regexp.QuoteMeta(filepath.Join(dir, "pids.max"))+` is 40, \d+ in use\)`)
	r.wantFaster(t, 5*time.Second)
	// Jobs that fit still run.
	r = run(t, job{wrap: wrap, args: []string{"-n", "4", "true"}})
	r.wantCode(t, 0)
}

// Room for the job when it starts, none midway: the ranks fork until the
// cgroup is full while pmirun is still starting the others. The job ends
// with one message naming the rank that could not start and why, never a
// runtime abort, and nothing it started survives. The ranks are bash,
// which retries a fork that fails: no rank fails of it before pmirun's
// own fork does (dash exits, and the job would end on that rank's
// failure, pmirun's reason printed after it, if its fork came to fail).
func TestPidsExhaustedMidStart(t *testing.T) {
	_, wrap := testCgroup(t, "pids", func(bool) map[string]string { return map[string]string{"pids.max": "80"} })
	r := run(t, job{wrap: wrap, args: []string{"-n", "40", "bash", "-c", `while :; do sleep 30 & done`}, timeout: 60 * time.Second})
	if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "SIGABRT") || strings.Contains(r.stderr, "fatal error") {
		t.Fatalf("pmirun aborted:\n%s", r)
	}
	r.wantCode(t, 1)
	r.wantMessage(t, `start rank \d+: fork/exec \S+: resource temporarily unavailable \(no room for another process: see ulimit -u and the pids cgroup's pids.max\)`)
}

// A shared segment larger than what the memory cgroup leaves: refused at
// once, naming the cgroup (MemAvailable sees the whole machine).
func TestMemoryCgroupGuard(t *testing.T) {
	_, wrap := testCgroup(t, "memory", func(v2 bool) map[string]string {
		if v2 {
			return map[string]string{"memory.max": strconv.Itoa(32 << 20)}
		}
		return map[string]string{"memory.limit_in_bytes": strconv.Itoa(32 << 20)}
	})
	r := run(t, job{wrap: wrap, args: []string{"-n", "1000", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 1000: the shared segment needs \d+ MiB, more than the \d+ MiB the memory cgroup leaves \(\S+: 32 MiB, \d+ MiB in use\); use fewer ranks or --no-shm`)
	r.wantFaster(t, 5*time.Second)
	// A job whose segment fits runs.
	r = run(t, job{wrap: wrap, args: []string{"-n", "100", "true"}})
	r.wantCode(t, 0)
}
