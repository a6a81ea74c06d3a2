package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// No survivors (docs/security.md): when the process that forked the
// ranks is killed with SIGKILL — pmirun with the fork bootstrap, a pmid
// agent, a pmid --daemon — every process of every rank's process group
// dies too, not only the ranks (the parent-death signal's share). Each
// rank here is a wrapper script whose background child, the grandchild,
// outlives any of them without the node's guard (internal/guard).

// survivorRanks is the ranks of these jobs.
const survivorRanks = 4

// survivorBound is how soon the grandchildren must be gone after the
// kill: milliseconds on a quiet machine; generous, because the tests
// share a loaded 2-core machine.
const survivorBound = 5 * time.Second

// grandchildArgs runs survivorRanks ranks that each start a background
// sleep, write its pid to dir/gc.RANK and say "ready RANK".
func grandchildArgs(dir string) []string {
	script := `sleep 300 & echo $! > "$1/gc.$PMI_RANK"; echo "ready $PMI_RANK"; wait`
	return []string{"-n", n(survivorRanks), "bash", "-c", script, "bash", dir}
}

// waitGrandchildren waits until every rank said it is ready and returns
// its grandchild's pid, checking that each runs (else the checks after
// the kill prove nothing).
func (r *running) waitGrandchildren(dir string) []int {
	r.t.Helper()
	r.waitStdout(30*time.Second, func(ls []string) bool {
		k := 0
		for _, l := range ls {
			if strings.Contains(l, "ready ") {
				k++
			}
		}
		return k == survivorRanks
	})
	var pids []int
	for rank := range survivorRanks {
		b, err := os.ReadFile(filepath.Join(dir, "gc."+n(rank)))
		pid, perr := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || perr != nil {
			r.t.Fatalf("grandchild pid of rank %d: %v %v (%q)", rank, err, perr, b)
		}
		if !pidRuns(pid) {
			r.t.Fatalf("grandchild %d of rank %d is not running before the kill", pid, rank)
		}
		pids = append(pids, pid)
	}
	r.t.Cleanup(func() {
		for _, pid := range pids {
			if pidRuns(pid) {
				_ = sys.SignalProcess(pid, sys.SIGKILL)
			}
		}
	})
	return pids
}

// pidRuns reports whether process pid runs (a zombie has ended).
func pidRuns(pid int) bool {
	stat, err := os.ReadFile("/proc/" + n(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] != 'Z'
}

// wantGone fails the test unless none of pids (what they are) runs
// within survivorBound of since; it logs how long they took.
func wantGone(t *testing.T, what string, pids []int, since time.Time) {
	t.Helper()
	for {
		var left []int
		for _, pid := range pids {
			if pidRuns(pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			t.Logf("%s gone %v after the kill", what, time.Since(since).Round(time.Millisecond))
			return
		}
		if time.Since(since) > survivorBound {
			t.Errorf("%d of %s survive the kill by %v: %s", len(left), what, survivorBound, describe(left))
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// guardOf returns the pid of the guard process whose parent is pid, or
// 0 if it has none within 10 s (it starts concurrently with the job).
func guardOf(pid int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if g := findGuard(pid); g != 0 || time.Now().After(deadline) {
			return g
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// findGuard returns the pid of the guard process whose parent is pid, or
// 0.
func findGuard(pid int) int {
	for _, c := range allChildren(pid) {
		if isGuard(c) {
			return c
		}
	}
	return 0
}

// isGuard reports whether process pid is a guard (internal/guard).
func isGuard(pid int) bool {
	args := cmdline(pid)
	return len(args) == 2 && args[1] == guard.Arg
}

// killPmirun kills r's pmirun with SIGKILL and reaps it; it returns when
// the kill was sent.
func (r *running) killPmirun() time.Time {
	r.t.Helper()
	killed := time.Now()
	if err := r.cmd.Process.Kill(); err != nil {
		r.t.Fatalf("kill pmirun: %v", err)
	}
	r.cmd.Wait()
	r.pw.Close()
	r.cancel()
	return killed
}

// pmirun killed with SIGKILL, the ranks forked in its own process (fork
// bootstrap) or by its agents (loopback, where the agents die by their
// parent-death signal and their guards act): the ranks' grandchildren
// die too, and so do the guards, and everything else of the job.
func TestNoSurvivorsPmirunKilled(t *testing.T) {
	for _, tc := range []struct {
		name string
		boot []string
	}{
		{"fork", nil},
		{"loopback", []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			j := job{args: append(append([]string{}, tc.boot...), grandchildArgs(dir)...), timeout: 60 * time.Second, markAgents: true}
			r := start(t, j)
			gcs := r.waitGrandchildren(dir)
			g := guardOf(r.cmd.Process.Pid)
			if g == 0 {
				t.Errorf("pmirun %d has no guard process", r.cmd.Process.Pid)
			}
			killed := r.killPmirun()
			wantGone(t, "the ranks' grandchildren", gcs, killed)
			if g != 0 {
				wantGone(t, "pmirun's guard", []int{g}, killed)
			}
			if left := waitNoMarked(r.marker, survivorBound); len(left) > 0 {
				t.Errorf("%d processes of the job survive pmirun's SIGKILL by %v: %s", len(left), survivorBound, describe(left))
			}
		})
	}
}

// One pmid agent of a loopback job killed with SIGKILL: its ranks'
// grandchildren die with it (its guard), the job fails naming the node
// and the other node's ranks end as in any failed job; nothing of the
// job is left (run's survivor check, the agents' guards included).
func TestNoSurvivorsAgentKilled(t *testing.T) {
	dir := t.TempDir()
	j := loopbackJob(2, "auto", grandchildArgs(dir)...)
	r := start(t, j)
	gcs := r.waitGrandchildren(dir)
	pids := agentPIDs(t, r.marker, 2)
	g := guardOf(pids[1])
	if g == 0 {
		t.Errorf("the agent of node 1 (pid %d) has no guard process", pids[1])
	}
	killed := time.Now()
	if err := sys.SignalProcess(pids[1], sys.SIGKILL); err != nil {
		t.Fatalf("kill agent of node 1: %v", err)
	}
	res := r.wait()
	if res.code == 0 {
		t.Errorf("exit code 0 after an agent was killed\n%s", res)
	}
	res.wantMessage(t, `\bnode 1\b.*\blost\b`)
	wantGone(t, "the ranks' grandchildren", gcs, killed)
	if g != 0 {
		wantGone(t, "the agent's guard", []int{g}, killed)
	}
}

// pmid --daemon killed with SIGKILL while it runs a job's ranks: its
// guard kills every rank's group (the grandchildren included) and ends;
// pmirun fails the job; nothing of the job or the daemon is left.
func TestNoSurvivorsDaemonKilled(t *testing.T) {
	p := newDaemonPair(t)
	dir := t.TempDir()
	r := start(t, p.job(grandchildArgs(dir)...))
	gcs := r.waitGrandchildren(dir)
	d := p.d[1]
	g := guardOf(d.cmd.Process.Pid)
	if g == 0 {
		t.Errorf("the daemon (pid %d) has no guard process", d.cmd.Process.Pid)
	}
	killed := time.Now()
	if err := d.cmd.Process.Kill(); err != nil {
		t.Fatalf("kill daemon: %v", err)
	}
	<-d.done
	res := r.wait()
	if res.code == 0 {
		t.Errorf("exit code 0 after a daemon was killed\n%s", res)
	}
	wantGone(t, "the ranks' grandchildren", gcs, killed)
	if left := waitNoMarked(d.marker, survivorBound); len(left) > 0 {
		t.Errorf("%d processes of the killed daemon (its guard) survive by %v: %s", len(left), survivorBound, describe(left))
	}
}
