package e2e

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// Failure ends the job, never hangs it: in every case below the other
// ranks are blocked in a PMI barrier the failed rank never reaches (they
// would wait 120 s), so a quick end shows pmirun noticed the failure. When
// pmirun releases the barrier with an error the other ranks exit 1 too;
// the job must still end with the code of, and a message naming, the rank
// that failed first. That ordering is a race inside pmirun, so each case
// runs several times.
func TestRankFailure(t *testing.T) {
	const repeat = 10
	for _, tc := range []struct {
		name string
		args []string // exit_early arguments
		size int
		code int    // pmirun's exit code; -2: any non-zero
		msg  string // regexp for pmirun's message
	}{
		{"exit 3 before init", []string{"exit-before-init", "1", "3"}, 4, 3, `\brank 1 exited with code 3\b`},
		{"exit 0 before init", []string{"exit-before-init", "1", "0"}, 4, -2, `\brank 1\b`},
		{"SIGKILL before init", []string{"kill-before-init", "2"}, 4, 128 + 9, `\brank 2 killed by signal 9\b`},
		{"exit 0 between put and fence", []string{"exit-after-put", "1", "0"}, 3, -2, `\brank 1\b`},
		{"exit 4 between put and fence", []string{"exit-after-put", "0", "4"}, 3, 4, `\brank 0 exited with code 4\b`},
		{"SIGKILL between put and fence", []string{"kill-after-put", "1"}, 2, 128 + 9, `\brank 1 killed by signal 9\b`},
		{"PMI_FD closed, rank runs on", []string{"close-after-put", "1"}, 3, -2, `\brank 1\b`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < repeat && !t.Failed(); i++ {
				r := run(t, job{args: append([]string{"-n", n(tc.size), prog("exit_early")}, tc.args...), timeout: 30 * time.Second})
				if tc.code == -2 {
					if r.code == 0 {
						t.Errorf("exit code 0 for a job whose rank failed\n%s", r)
					}
				} else {
					r.wantCode(t, tc.code)
				}
				r.wantFaster(t, 5*time.Second)
				r.wantMessage(t, tc.msg)
				if strings.Contains(r.stderr, "still waiting") {
					t.Errorf("a rank waited for its alarm instead of being ended by pmirun\n%s", r)
				}
				if t.Failed() {
					t.Logf("failed in run %d of %d", i+1, repeat)
				}
			}
		})
	}
}

// A rank that does everything but PMI finalize and exits 0 fails the job
// even when it is the last to exit (on its node, or of the whole job): its
// verdict waits for the agent to have read all it sent, and the job's end
// waits for the verdict.
func TestLastRankWithoutFinalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"one node", nil},
		{"loopback nodes", []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := 0; i < 3 && !t.Failed(); i++ {
				args := append(append([]string{}, tc.args...), "-n", "4", prog("exit_early"), "no-finalize", "3", "300")
				r := run(t, job{args: args, timeout: 30 * time.Second})
				r.wantCode(t, 1)
				r.wantMessage(t, `\brank 3 (on node 1 \(127\.0\.0\.1\) )?exited with code 0 without calling PMI finalize\b`)
				r.wantRankLines(t, 3, func(rank int) string { return fmt.Sprintf("early ok rank %d", rank) })
			}
		})
	}
}

// A rank that closes its PMI connection after init, before finalize, and
// goes on running is judged lost once the disconnect grace has passed: the
// job ends naming it, without waiting for the process (which would sleep
// for minutes), on one node and on loopback nodes (the verdict then
// travels from the agent to pmirun).
func TestRankClosesPMIAndKeepsRunning(t *testing.T) {
	const script = `printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD
if [ "$PMI_RANK" = 1 ]; then exec {PMI_FD}>&-; exec sleep 300; fi
printf 'cmd=barrier_in\n' >&$PMI_FD; read -r l <&$PMI_FD; exec sleep 300`
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"one node", nil},
		{"loopback nodes", []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, tc.args...), "-n", "2", "bash", "-c", script)
			r := run(t, job{args: args, timeout: 60 * time.Second})
			r.wantCode(t, 1)
			r.wantMessage(t, `\brank 1 (on node 1 \(127\.0\.0\.1\) )?closed its PMI connection before finalize and kept running\b`)
			r.wantFaster(t, 30*time.Second)
		})
	}
}

// A rank that closes its PMI connection without ever speaking PMI (a
// program that is no MPI program, closing what it inherited) is no
// failure, as under Hydra: the job ran both ranks to the end and exited 0
// (it failed with "closed its PMI connection before finalize and kept
// running", their output lost). Once another rank uses PMI it is one, at
// once, since that rank would wait for it for ever.
func TestRankClosesPMIBeforeInit(t *testing.T) {
	const quiet = `exec {PMI_FD}>&-; sleep 2; echo "done $PMI_RANK"`
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"one node", nil},
		{"loopback nodes", []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, job{args: append(append([]string{}, tc.args...), "-n", "2", "bash", "-c", quiet), timeout: 30 * time.Second})
			r.wantCode(t, 0)
			r.wantRankLines(t, 2, func(rank int) string { return fmt.Sprintf("done %d", rank) })
		})
	}
	const mixed = `if [ "$PMI_RANK" = 1 ]; then exec {PMI_FD}>&-; exec sleep 300; fi
printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r l <&$PMI_FD
printf 'cmd=barrier_in\n' >&$PMI_FD; read -r l <&$PMI_FD`
	r := run(t, job{args: []string{"-n", "2", "bash", "-c", mixed}, timeout: 60 * time.Second})
	r.wantCode(t, 1)
	r.wantMessage(t, `^pmirun: rank 1 closed its PMI connection before PMI init while other ranks use PMI$`)
	r.wantFaster(t, 30*time.Second)
}

// The hand-written PMI-1 client works when nobody fails: this is what makes
// the failures above meaningful.
func TestRankFailureControl(t *testing.T) {
	r := run(t, job{args: []string{"-n", "4", prog("exit_early"), "ok"}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 4, func(rank int) string { return fmt.Sprintf("early ok rank %d", rank) })
}

// pmirun killed with SIGKILL takes no rank with it explicitly, yet none
// may survive it (parent-death signal).
func TestPmirunKilled(t *testing.T) {
	const size = 4
	j := start(t, job{args: []string{"-n", n(size), prog("exit_early"), "sleep-after-init", "-1", "100"}, timeout: 30 * time.Second})
	j.waitStdout(20*time.Second, func(ls []string) bool { return len(ls) >= size })
	// The survivor check must see the live ranks, or it proves nothing.
	if got := marked(j.marker); len(got) != size {
		t.Errorf("found %d processes with the job's marker while %d ranks run: %s", len(got), size, describe(got))
	}
	if left := j.sigkill(); len(left) > 0 {
		t.Errorf("%d ranks survive pmirun's SIGKILL by 2 s: %s", len(left), describe(left))
	}
}

func TestTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
	}{
		{"plain", []string{"--timeout", "1s", "sleep", "30"}, nil},
		{"PMI", []string{"--timeout", "1s", prog("exit_early"), "sleep-after-init", "-1", "30"}, nil},
		// mpiexec's variable, in seconds, when --timeout is not given.
		{"MPIEXEC_TIMEOUT", []string{prog("mpi_abort"), "-1"}, []string{"MPIEXEC_TIMEOUT=1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, job{args: append([]string{"-n", "2"}, tc.args...), env: tc.env, timeout: 40 * time.Second})
			r.wantCode(t, 124)
			r.wantMessage(t, `timed out after 1s`)
			r.wantFaster(t, 4*time.Second)
			if r.elapsed < time.Second {
				t.Errorf("job ended after %v, before its 1 s timeout\n%s", r.elapsed, r)
			}
		})
	}
}

// The directories a PMIx job's node makes outside the ranks' own — the
// ranks' shared-memory directory, the server library's rendezvous
// directory — go with pmirun killed by SIGKILL too: its guard removes
// them (and kills the ranks).
func TestPmirunKilledPMIx(t *testing.T) {
	j := start(t, job{args: []string{"--mpi", "pmix", "-n", "2", "sh", "-c",
		`echo "dirs $OMPI_MCA_btl_vader_backing_directory $PMIX_SERVER_TMPDIR"; exec sleep 100`}, timeout: 30 * time.Second})
	var dirs []string
	j.waitStdout(20*time.Second, func(ls []string) bool {
		for _, l := range ls {
			if f := strings.Fields(l); len(f) == 3 && f[0] == "dirs" {
				dirs = f[1:]
				return true
			}
		}
		return false
	})
	for _, d := range dirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			t.Fatalf("the job's directory %s: %v", d, err)
		}
	}
	if left := j.sigkill(); len(left) > 0 {
		t.Errorf("%d ranks survive pmirun's SIGKILL by 2 s: %s", len(left), describe(left))
	}
	deadline := time.Now().Add(2 * time.Second)
	for _, d := range dirs {
		for {
			_, err := os.Stat(d)
			if os.IsNotExist(err) {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s is left behind 2 s after pmirun's SIGKILL", d)
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// A job that must end while its ranks are forked ends then, without
// forking the rest: the fork phase runs beside the loop that judges the
// job, which acts on a failed rank, a timeout or a node's report at once
// (a few thousand ranks take seconds to fork here). Every rank that
// starts prints "up"; with the fork phase stopped, far fewer than all do,
// and no rank outlives pmirun.
func TestEndDuringFork(t *testing.T) {
	const size = 3000
	up := func(fail bool) []string {
		script := `echo up; exec sleep 60`
		if fail {
			script = `if [ "$PMI_RANK" = 3 ]; then exit 3; fi; ` + script
		}
		return []string{"-n", n(size), "sh", "-c", script}
	}
	for _, tc := range []struct {
		name    string
		args    []string
		code    int
		msg     string
		oneNode bool // its log says how many ranks were not started
	}{
		{"failed rank", up(true), 3, `rank 3 exited with code 3`, true},
		{"timeout", append([]string{"--timeout", "300ms"}, up(false)...), 124, `timed out after 300ms`, true},
		{"failed rank, two nodes", append([]string{"--bootstrap", "loopback", "--nodes", "2"}, up(true)...), 3, `rank 3 on node \d \(127\.0\.0\.1\) exited with code 3`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, job{args: append([]string{"--verbose"}, tc.args...), timeout: 90 * time.Second, markAgents: true})
			r.wantCode(t, tc.code)
			r.wantMessage(t, tc.msg)
			started := strings.Count(r.stdout, "up\n")
			t.Logf("%d of %d ranks started", started, size)
			if started >= size/2 {
				t.Errorf("%d of %d ranks started: the job went on forking after it had to end\n%s", started, size, r)
			}
			if tc.oneNode && !regexp.MustCompile(`the job ended while its ranks were forked.* unstarted=[1-9]`).MatchString(r.stderr) {
				t.Errorf("no log of the ranks not started\n%s", r)
			}
		})
	}
}

// Processes a rank left behind when it ended are ended with a job that
// fails after it: rank 0 exits at once leaving a sleep in its process
// group, rank 1 fails later, and the survivor check of run finds no sleep.
// On one node and on per-job agents, where rank 0's node has finished
// its part (all its ranks ended) when the job fails. (A job that
// succeeds leaves them be, as it always did.)
func TestFailedJobEndsWhatEndedRanksLeft(t *testing.T) {
	for _, extra := range [][]string{nil, {"--bootstrap", "loopback", "--nodes", "2"}} {
		r := run(t, job{args: append(slices.Clone(extra), "-n", "2", "sh", "-c",
			`if [ "$PMI_RANK" = 0 ]; then sleep 60 & exit 0; fi; sleep 0.5; exit 3`), timeout: 30 * time.Second})
		r.wantCode(t, 3)
		r.wantMessage(t, `rank 1 (on node 1 \(127\.0\.0\.1\) )?exited with code 3`)
	}
}

// A node whose agent is killed (a rank of its own that kills its
// parent, the OOM killer) is said lost as a rank's end is said: 'agent
// killed by signal 9 (SIGKILL)', not Go's 'agent signal: killed'.
func TestAgentKilledSaid(t *testing.T) {
	r := run(t, job{args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "4", "sh", "-c", `[ $PMI_RANK = 3 ] && kill -9 $PPID; sleep 30`},
		timeout: 30 * time.Second})
	r.wantCode(t, 1)
	r.wantMessage(t, `^pmirun: node 1 \(127\.0\.0\.1\) lost: agent killed by signal 9 \(SIGKILL\)$`)
}
