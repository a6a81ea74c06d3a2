package e2e

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// A raw PMI-1 client in bash on PMI_FD: every rank inits; rank 0 aborts
// with the code given, the others sleep (pmirun must end them).
func abortScript(code string) string {
	return fmt.Sprintf(`printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD
read -r line <&$PMI_FD
if [ "$PMI_RANK" = 0 ]; then printf 'cmd=abort exitcode=%s\n' >&$PMI_FD; fi
sleep 20`, code)
}

// An abort's exit code is never 0: codes a process exit status cannot hold
// as a failure (0, negative, 256 and beyond, which the kernel would
// truncate to 0..255) become launch.ExitAbortOutOfRange (1), on one node
// and with agents; codes 1..255
// are kept.
func TestAbortExitCode(t *testing.T) {
	for _, tc := range []struct {
		code string
		want int
		boot []string
	}{
		{"0", 1, nil}, {"256", 1, nil}, {"512", 1, nil}, {"-1", 1, nil}, {"255", 255, nil}, {"3", 3, nil},
		{"0", 1, []string{"--bootstrap", "loopback", "--nodes", "2"}},
		{"256", 1, []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.code+strings.Join(tc.boot, ""), func(t *testing.T) {
			args := append(append([]string{}, tc.boot...), "-n", "2", "bash", "-c", abortScript(tc.code))
			r := run(t, job{args: args, timeout: 30 * time.Second})
			r.wantCode(t, tc.want)
			r.wantMessage(t, fmt.Sprintf(`\brank 0 (on node 0 \(127\.0\.0\.1\) )?called abort with exit code %s\b`, tc.code))
			r.wantFaster(t, 10*time.Second)
		})
	}
}

// scribbleBound is how soon a job whose shared segment a rank damaged must
// end. On a quiet machine such a job ends in well under 2 s (the
// scribbler's own exit, or the agent's verdict on the damage); the bound
// is generous because the tests share a loaded 2-core machine, and
// --timeout (30 s) would end a job the agent failed to end.
const scribbleBound = 15 * time.Second

// A rank that stores random bytes into every rank-writable region of the
// node's segment (the header, the doorbell and epoch lines, the control
// blocks, the rings, the slots, results and KVS) never hangs pmirun or
// crashes its agent: every job ends within scribbleBound with a failure
// and a message, never by --timeout. Two probes are deterministic: a 0
// stored into the agent-sleepers word once left pmirun waiting forever,
// even past --timeout; a rewritten header went unnoticed.
func TestShmScribbler(t *testing.T) {
	var worst time.Duration
	for i, tc := range []struct {
		region string
		msg    string
	}{
		{"sleepers", `\brank 1 exited with code 0 without calling PMI finalize\b`},
		{"header", `PMI protocol error: shared memory corrupt: the segment header .* was overwritten`},
		{"lines", ""}, {"ctrl", ""}, {"rings", ""}, {"data", ""}, {"any", ""},
	} {
		args := []string{"--timeout", "30s", "-n", "4", prog("scribbler"), "-target", "1", "-seed", n(i + 1), "-region", tc.region, "-stores", "64"}
		r := run(t, job{args: args, timeout: 60 * time.Second})
		if r.code == 0 || r.code == ExitTimeoutCode {
			t.Errorf("region %s: exit code %d, want a failure other than the timeout\n%s", tc.region, r.code, r)
		}
		if tc.msg == "" {
			tc.msg = `\brank \d+ (exited|broke the PMI protocol|killed)|PMI protocol error`
		}
		r.wantMessage(t, tc.msg)
		r.wantFaster(t, scribbleBound)
		worst = max(worst, r.elapsed)
	}
	t.Logf("slowest job: %v", worst)
}

// ExitTimeoutCode is pmirun's exit code on --timeout (launch.ExitTimeout).
const ExitTimeoutCode = 124

// The verdicts above hold on running daemons too (pmid --daemon, pmirun
// --daemons): a last rank that ends without finalize, and an abort with
// an out-of-range code, fail the job.
func TestVerdictsOnDaemons(t *testing.T) {
	p := newDaemonPair(t)
	r := run(t, p.job("-n", "4", prog("exit_early"), "no-finalize", "3", "300"))
	r.wantCode(t, 1)
	r.wantMessage(t, `\brank 3 on node 1 \(\S+\) exited with code 0 without calling PMI finalize\b`)
	r = run(t, p.job("-n", "2", "bash", "-c", abortScript("256")))
	r.wantCode(t, 1)
	r.wantMessage(t, `\brank 0 on node 0 \(\S+\) called abort with exit code 256\b`)
	p.idle(t)
}

// A rank that breaks the PMI protocol fails the job with one line naming
// it, on one node and through agents; the agent's own log of it is for
// --verbose (before, a raw log line said it first).
func TestProtocolErrorSaidOnce(t *testing.T) {
	script := `[ $PMI_RANK = 0 ] || exec sleep 20; printf 'cmd=init pmi_version=1 pmi_subversion=1\n' >&$PMI_FD; read -r line <&$PMI_FD; printf 'xx\n' >&$PMI_FD; sleep 20`
	for _, boot := range [][]string{nil, {"--bootstrap", "loopback", "--nodes", "2"}} {
		args := append(append([]string{}, boot...), "-n", "2", "sh", "-c", script)
		r := run(t, job{args: args, timeout: 30 * time.Second})
		r.wantCode(t, 1)
		r.wantMessage(t, `^pmirun: rank 0 (on node 0 \(127\.0\.0\.1\) )?broke the PMI protocol: .*malformed`)
		if n := strings.Count(r.stderr, "\n"); n != 1 {
			t.Errorf("%v: %d lines on stderr, want 1\n%s", boot, n, r)
		}
	}
}

// A rank that rings its agent's doorbell in a tight loop (bump and
// FUTEX_WAKE, without a request), or marks itself ready without end,
// does not make the agent spin with it: the agent — pmirun on one node, a
// per-job pmid, a daemon serving other jobs — spends under a quarter of
// the storm's time on it (measured by the rank from /proc; before, a
// parked agent was handed back from its bed at every ring: 1.3-1.8 s of
// CPU in a 2 s storm).
func TestShmWakeStorm(t *testing.T) {
	p := newDaemonPair(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"doorbell", []string{"-n", "2", prog("shm_storm"), "doorbell", "2"}},
		{"ready", []string{"-n", "2", prog("shm_storm"), "ready", "2"}},
		{"doorbell-pmid", []string{"--bootstrap", "loopback", "--nodes", "1", "-n", "2", prog("shm_storm"), "doorbell", "2"}},
		{"doorbell-daemons", p.job("-n", "2", prog("shm_storm"), "doorbell", "2").args},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, job{args: append([]string{"--timeout", "30s"}, tc.args...), timeout: 60 * time.Second})
			r.wantCode(t, 0)
			lines := regexp.MustCompile(`agent cpu ms (\d+) of (\d+)`).FindAllStringSubmatch(r.stdout, -1)
			if len(lines) == 0 {
				t.Fatalf("no measurement\n%s", r)
			}
			for _, m := range lines {
				used, _ := strconv.Atoi(m[1])
				of, _ := strconv.Atoi(m[2])
				if 4*used > of {
					t.Errorf("the agent spent %d ms of CPU in a %d ms storm, want at most a quarter\n%s", used, of, r)
				}
			}
		})
	}
	p.idle(t)
}

// A rank that posts waiting gets without end, never reading an answer,
// ends its job with a message naming it once it has more requests waiting
// than a text connection may (4,096), on one node and on daemons; before,
// each one grew its agent's memory (a daemon's, at every job's expense)
// until --timeout.
func TestShmPendingFlood(t *testing.T) {
	p := newDaemonPair(t)
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"fork", []string{"-n", "2", prog("shmflood"), "-target", "1"}},
		{"daemons", p.job("-n", "4", prog("shmflood"), "-target", "1").args},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, job{args: append([]string{"--timeout", "30s"}, tc.args...), timeout: 60 * time.Second})
			r.wantCode(t, 1)
			r.wantMessage(t, `^pmirun: rank 1 (on node 0 \(\S+\) )?broke the PMI protocol: quota exceeded: more than 4096 requests waiting for an answer$`)
			r.wantFaster(t, scribbleBound)
		})
	}
	p.idle(t)
}
