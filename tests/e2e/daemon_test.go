package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/netio"
)

// Daemon mode: persistent pmid --daemon processes serve many jobs, each
// submitted by pmirun --daemons, with no process started but the ranks.
// The daemons here are plain processes on loopback (and, in
// TestNetnsDaemons, one per test host); each job's ranks carry the job's
// marker, so run's survivor check covers them even though the daemon,
// not pmirun, forks them.

// pmid is the path of the pmid binary under test.
func pmid() string { return filepath.Join(binDir, "pmid") }

// daemonProc is a running pmid --daemon.
type daemonProc struct {
	cmd    *exec.Cmd
	addr   string
	marker string // in the daemon's own environment (not its ranks')
	stderr bytes.Buffer
	done   chan struct{} // closed when the process has been waited for
	err    error         // Wait's result, set before done closes
}

// newSecret writes a daemon secret file in a fresh directory.
func newSecret(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(path, []byte(newMarker()+newMarker()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// startDaemon starts pmid --daemon listening on listen (under wrap, a
// command prefix such as "ip netns exec NS") and waits for it to say
// where it listens.
func startDaemon(t *testing.T, wrap []string, listen, secret string, extra ...string) *daemonProc {
	t.Helper()
	d := &daemonProc{marker: newMarker(), done: make(chan struct{})}
	argv := append(append(append([]string{}, wrap...), pmid(), "--daemon", "--listen", listen, "--secret-file", secret), extra...)
	d.cmd = exec.Command(argv[0], argv[1:]...)
	d.cmd.Env = append(callerEnv(nil), markerVar+"="+d.marker)
	d.cmd.Stderr = &d.stderr
	out, err := d.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatalf("start pmid --daemon: %v", err)
	}
	t.Cleanup(func() {
		select {
		case <-d.done:
		default:
			d.cmd.Process.Kill()
			<-d.done
		}
		killMarked(d.marker)
	})
	lines := make(chan string, 1)
	go func() {
		br := bufio.NewReader(out)
		l, _ := br.ReadString('\n')
		lines <- l
		io.Copy(io.Discard, br)
		d.err = d.cmd.Wait()
		close(d.done)
	}()
	rx := regexp.MustCompile(`^pmid: daemon listening on (\S+) `)
	select {
	case l := <-lines:
		m := rx.FindStringSubmatch(l)
		if m == nil {
			<-d.done
			t.Fatalf("pmid --daemon said %q, want %q; stderr:\n%s", l, rx, d.stderr.String())
		}
		d.addr = m[1]
	case <-time.After(10 * time.Second):
		t.Fatalf("pmid --daemon did not say where it listens within 10s")
	}
	return d
}

// stop sends the daemon SIGTERM and returns its exit code, failing the
// test if it takes longer than d.
func (d *daemonProc) stop(t *testing.T, within time.Duration) int {
	t.Helper()
	if err := d.cmd.Process.Signal(sys.SIGTERM); err != nil {
		t.Fatalf("SIGTERM pmid --daemon: %v", err)
	}
	select {
	case <-d.done:
	case <-time.After(within):
		t.Fatalf("pmid --daemon did not exit within %v of SIGTERM; stderr:\n%s", within, d.stderr.String())
	}
	var ee *exec.ExitError
	switch {
	case d.err == nil:
		return 0
	case errors.As(d.err, &ee):
		return ee.ExitCode()
	}
	t.Fatalf("wait for pmid --daemon: %v", d.err)
	return -1
}

// status asks the daemon for its status (loopback daemons only: the test
// process dials it).
func (d *daemonProc) status(t *testing.T, secret string) daemon.Status {
	t.Helper()
	key, err := daemon.LoadSecret(secret, false)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := daemon.NewTransport(key, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := daemon.QueryStatus(ctx, tr, d.addr)
	if err != nil {
		t.Fatalf("status of daemon %s: %v", d.addr, err)
	}
	return st
}

// procFDs counts pid's open descriptors and the memfds among them.
func procFDs(t *testing.T, pid int) (fds, memfds int) {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		fds++
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "/memfd:") {
			memfds++
		}
	}
	return fds, memfds
}

// children lists the processes whose parent is pid, but for its guard
// (internal/guard: one per daemon, for the daemon's life; guardOf finds
// it).
func children(pid int) []int {
	var kids []int
	for _, c := range allChildren(pid) {
		if !isGuard(c) {
			kids = append(kids, c)
		}
	}
	return kids
}

// allChildren lists the processes whose parent is pid.
func allChildren(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var kids []int
	for _, e := range ents {
		if p, err := strconv.Atoi(e.Name()); err == nil && ppid(p) == pid {
			kids = append(kids, p)
		}
	}
	return kids
}

// ppid is process pid's parent, or -1 if it is gone.
func ppid(pid int) int {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 2 {
		return -1
	}
	p, err := strconv.Atoi(f[1])
	if err != nil {
		return -1
	}
	return p
}

// daemonPair is two loopback daemons sharing a secret.
type daemonPair struct {
	secret string
	d      [2]*daemonProc
}

func newDaemonPair(t *testing.T) *daemonPair {
	t.Helper()
	p := &daemonPair{secret: newSecret(t)}
	for i := range p.d {
		p.d[i] = startDaemon(t, nil, "127.0.0.1:0", p.secret)
	}
	return p
}

func (p *daemonPair) addrs() string { return p.d[0].addr + "," + p.d[1].addr }

// daemonNetTimeout is the jobs' --net-timeout: these tests run many
// jobs at once on a 2-core machine shared with other work, where 5 s of
// silence on a healthy link has been seen; no test here relies on the
// timeout to detect a failure.
const daemonNetTimeout = "15s"

// job is a pmirun job on both daemons.
func (p *daemonPair) job(args ...string) job {
	return job{args: append([]string{"--daemons", p.addrs(), "--secret-file", p.secret, "--net-timeout", daemonNetTimeout}, args...), timeout: 60 * time.Second}
}

// idle waits until neither daemon runs a job.
func (p *daemonPair) idle(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for _, d := range p.d {
		for {
			st := d.status(t, p.secret)
			if len(st.Jobs) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("daemon %s still runs %d jobs: %+v", d.addr, len(st.Jobs), st.Jobs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// MPICH and libpmi2 programs on two daemons: output, exit and abort
// codes, rank 0's input, labels, the job's working directory and
// environment.
func TestDaemonJobs(t *testing.T) {
	p := newDaemonPair(t)
	t.Run("mpi_allreduce", func(t *testing.T) {
		r := run(t, p.job("-n", "8", prog("mpi_allreduce")))
		r.wantCode(t, 0)
		r.wantAllreduce(t, 8)
	})
	for _, cyclic := range []bool{false, true} {
		t.Run(fmt.Sprintf("pmi2_test/cyclic=%v", cyclic), func(t *testing.T) {
			args, placement := []string{"-n", "6"}, "block"
			if cyclic {
				args, placement = append(args, "--cyclic"), "cyclic"
			}
			j := p.job(append(args, prog("pmi2_test"))...)
			// EXPECT_ reaches the ranks only through pmirun's environment,
			// carried in the spec: the daemons never had it.
			j.env = []string{"EXPECT_NNODES=2", "EXPECT_PLACEMENT=" + placement, "PMI2_TEST_ALARM=30"}
			r := run(t, j)
			r.wantCode(t, 0)
			r.wantPMI2(t, 6, 2, cyclic)
		})
	}
	t.Run("exit code", func(t *testing.T) {
		r := run(t, p.job("-n", "4", prog("exit_early"), "exit-before-init", "3", "5"))
		r.wantCode(t, 5)
		r.wantMessage(t, `\brank 3 on node 1 \(\S+\) exited with code 5\b`)
	})
	t.Run("abort", func(t *testing.T) {
		r := run(t, p.job("-n", "4", prog("mpi_abort"), "3"))
		r.wantCode(t, 7)
		r.wantMessage(t, `\brank 3 on node 1 \(\S+\) called abort with exit code 7\b`)
	})
	t.Run("stdin and label", func(t *testing.T) {
		j := p.job("-l", "-n", "3", "sh", "-c", `read x; read y; echo "got:$PMI_RANK:$x:$y"`)
		j.stdin = strings.NewReader("hello\nsecond line\n")
		r := run(t, j)
		r.wantCode(t, 0)
		r.wantLines(t, map[string]int{"[0] got:0:hello:second line": 1, "[1] got:1::": 1, "[2] got:2::": 1})
	})
	t.Run("working directory", func(t *testing.T) {
		j := p.job("-n", "2", "sh", "-c", `echo "$PMI_RANK $(pwd) $PWD"`)
		j.dir = t.TempDir()
		r := run(t, j)
		r.wantCode(t, 0)
		r.wantLines(t, map[string]int{"0 " + j.dir + " " + j.dir: 1, "1 " + j.dir + " " + j.dir: 1})
	})
	t.Run("timer slack", func(t *testing.T) {
		// The option reaches the daemons in the spec; auto is decided by
		// each daemon for its own ranks (ncpu+1 each: more than CPUs).
		cpus, err := sys.AllowedCPUs()
		if err != nil {
			t.Fatal(err)
		}
		r := run(t, p.job("-n", "4", "--timer-slack", "3ms", "cat", "/proc/self/timerslack_ns"))
		r.wantCode(t, 0)
		r.wantLines(t, map[string]int{"3000000": 4})
		r = run(t, p.job("-n", n(2*(len(cpus)+1)), "cat", "/proc/self/timerslack_ns"))
		r.wantCode(t, 0)
		r.wantLines(t, map[string]int{"1000000": 2 * (len(cpus) + 1)})
	})
	t.Run("wrong secret", func(t *testing.T) {
		j := p.job("-n", "2", "true")
		j.args[3] = newSecret(t)
		r := run(t, j)
		if r.code == 0 {
			t.Errorf("a job submitted with the wrong secret succeeded\n%s", r)
		}
		r.wantMessage(t, `authentication`)
		r.wantMessage(t, `the daemon does not take the secret of --secret-file `+regexp.QuoteMeta(j.args[3]))
		// Said once: netio's log of each refused dial (a WARN line for
		// each of the three) is for --verbose.
		if n := strings.Count(r.stderr, "\n"); n != 1 {
			t.Errorf("stderr has %d lines, want pmirun's one\n%s", n, r)
		}
	})
	t.Run("insecure secret file", func(t *testing.T) {
		j := p.job("-n", "2", "true")
		if err := os.Chmod(j.args[3], 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(j.args[3], 0o600)
		r := run(t, j)
		r.wantCode(t, 2)
		r.wantMessage(t, `group or others`)
	})
}

// concurrentJobs runs jobs at once and returns their results in order.
func concurrentJobs(t *testing.T, jobs []job) []result {
	t.Helper()
	res := make([]result, len(jobs))
	var wg sync.WaitGroup
	for i, j := range jobs {
		r := start(t, j)
		wg.Go(func() { res[i] = r.wait() })
	}
	wg.Wait()
	return res
}

// mixedJobs are n jobs of MPICH and libpmi2 programs, each in its own
// working directory, built by mk (the daemons' job constructor).
func mixedJobs(t *testing.T, n int, mk func(args ...string) job) []job {
	var jobs []job
	for i := range n {
		var j job
		if i%2 == 0 {
			j = mk("-n", "4", prog("mpi_allreduce"))
		} else {
			j = mk("-n", "4", prog("pmi2_test"))
			j.env = []string{"EXPECT_NNODES=2", "PMI2_TEST_ALARM=30"}
		}
		j.dir = t.TempDir()
		jobs = append(jobs, j)
	}
	return jobs
}

// wantMixed checks the results of mixedJobs.
func wantMixed(t *testing.T, res []result) {
	t.Helper()
	for i, r := range res {
		r.wantCode(t, 0)
		if i%2 == 0 {
			r.wantAllreduce(t, 4)
		} else {
			r.wantPMI2(t, 4, 2, false)
		}
	}
}

// 20 concurrent jobs on two daemons, two of them failing mid-fence (a
// rank SIGKILLed while the others wait in the barrier): the two fail
// with their own message, the others succeed, and the daemons go on
// serving.
func TestDaemonConcurrent(t *testing.T) {
	p := newDaemonPair(t)
	jobs := mixedJobs(t, 18, p.job)
	for range 2 {
		j := p.job("-n", "4", prog("exit_early"), "kill-after-put", "2")
		j.env = []string{"EXIT_EARLY_ALARM=30"}
		jobs = append(jobs, j)
	}
	start := time.Now()
	res := concurrentJobs(t, jobs)
	t.Logf("20 concurrent jobs on 2 daemons in %v", time.Since(start).Round(time.Millisecond))
	wantMixed(t, res[:18])
	for _, r := range res[18:] {
		r.wantCode(t, 128+9)
		r.wantMessage(t, `\brank 2 on node 1 \(\S+\) killed by signal 9\b`)
		if strings.Contains(r.stderr, "still waiting") {
			t.Errorf("a rank waited for its alarm instead of being ended\n%s", r)
		}
	}
	p.idle(t)
	r := run(t, p.job("-n", "8", prog("mpi_allreduce")))
	r.wantCode(t, 0)
	r.wantAllreduce(t, 8)
}

// Bad submissions from a peer that knows the secret, an oversized frame
// and a peer that does not know it are refused, each on its own
// connection, while a job runs on, undisturbed.
func TestDaemonRefusals(t *testing.T) {
	p := newDaemonPair(t)
	pr, pw := io.Pipe()
	j := p.job("-n", "2", "sh", "-c", `read x; echo "got:$PMI_RANK:$x"`)
	j.stdin = pr
	running := start(t, j)
	d := p.d[0]
	// The running job is on both daemons.
	deadline := time.Now().Add(10 * time.Second)
	for len(d.status(t, p.secret).Jobs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the job did not reach the daemon")
		}
		time.Sleep(10 * time.Millisecond)
	}

	key, err := daemon.LoadSecret(p.secret, false)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := netio.New(netio.Config{Secret: key, MaxFrameSize: 2 * daemon.MaxFrame})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// answer sends f as the first frame and returns the daemon's answer.
	answer := func(f netio.Frame) (netio.Frame, error) {
		c, err := tr.Dial(ctx, d.addr)
		if err != nil {
			t.Fatalf("dial daemon: %v", err)
		}
		defer c.Close()
		if err := c.Send(ctx, f); err != nil {
			return netio.Frame{}, err
		}
		return c.Recv(ctx)
	}
	good := &node.Spec{JobID: "x", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Apps: []node.App{{Prog: "true", Size: 1}}, KillGrace: time.Second,
		DisconnectGrace: time.Second, TreeWidth: 2, NetTimeout: time.Second, Root: "127.0.0.1:1", Secret: []byte("0123456789abcdef0123")}
	bad := *good
	bad.Nodes = [][]int{{0, 0}}
	noSecret := *good
	noSecret.Secret = nil
	for _, tc := range []struct {
		name string
		f    netio.Frame
		want string
	}{
		{"unknown first frame", netio.Frame{Type: 0x999}, `first frame of type 0x999`},
		{"not JSON", netio.Frame{Type: daemon.FrameSubmit, Payload: []byte("{nope")}, `decode`},
		{"no spec", netio.Frame{Type: daemon.FrameSubmit, Payload: []byte(`{"node":0}`)}, `no job spec`},
		{"bad placement", netio.Frame{Type: daemon.FrameSubmit, Payload: node.Encode(daemon.Submit{Spec: &bad})}, `placed twice`},
		{"node out of range", netio.Frame{Type: daemon.FrameSubmit, Payload: node.Encode(daemon.Submit{Node: 3, Spec: good})}, `node index 3`},
		{"no job secret", netio.Frame{Type: daemon.FrameSubmit, Payload: node.Encode(daemon.Submit{Spec: &noSecret})}, `no job secret`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := answer(tc.f)
			if err != nil {
				t.Fatalf("no answer: %v", err)
			}
			var e daemon.Exit
			if f.Type != daemon.FrameExit || node.Decode(f.Payload, &e) != nil || !regexp.MustCompile(`^daemon refused the job: .*`+tc.want).MatchString(e.Err) {
				t.Errorf("answer type %#x %q, want an Exit refusing the job with %q", f.Type, f.Payload, tc.want)
			}
		})
	}
	t.Run("oversized frame", func(t *testing.T) {
		_, err := answer(netio.Frame{Type: daemon.FrameSubmit, Payload: make([]byte, daemon.MaxFrame+1)})
		if err == nil {
			t.Errorf("the daemon answered a frame of %d bytes; want the connection closed", daemon.MaxFrame+1)
		}
	})
	t.Run("wrong secret", func(t *testing.T) {
		other, err := netio.New(netio.Config{Secret: []byte("not the daemon's secret at all")})
		if err != nil {
			t.Fatal(err)
		}
		defer other.Close()
		if _, err := other.Dial(ctx, d.addr); !errors.Is(err, netio.ErrAuth) {
			t.Errorf("dial with the wrong secret: %v, want %v", err, netio.ErrAuth)
		}
	})
	st := d.status(t, p.secret)
	if st.Refused != 6 || len(st.Jobs) != 1 {
		t.Errorf("daemon status: %d refused, %d jobs running; want 6 refused and the one job: %+v", st.Refused, len(st.Jobs), st)
	}
	io.WriteString(pw, "go on\n")
	pw.Close()
	r := running.wait()
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{"got:0:go on": 1, "got:1:": 1})
}

// A daemon refuses a job its user's process limit (RLIMIT_NPROC, which
// counts threads) has no room for beside the jobs it runs, as it refuses
// one it lacks descriptors for. Before, it took every job: once the
// ranks filled the limit a fork failed, and where the Go runtime could
// not make a thread the daemon aborted ("runtime/cgo: pthread_create
// failed", SIGABRT), ending every job it ran (4 jobs of 12 ranks at once
// under "ulimit -u 40", run by a user the limit binds).
func TestDaemonProcessLimit(t *testing.T) {
	secret := newSecret(t)
	d := startDaemon(t, ulimit("-u", 60), "127.0.0.1:0", secret)
	r := run(t, job{args: []string{"--daemons", d.addr, "--secret-file", secret, "-n", "40", "true"}})
	r.wantCode(t, 1)
	r.wantMessage(t, `daemon refused the job: no room for 40 more ranks: the daemon would run about 72 processes and threads for its 1 jobs, more than RLIMIT_NPROC 60 allows \(see ulimit -u\)`)
	r = run(t, job{args: []string{"--daemons", d.addr, "--secret-file", secret, "-n", "20", "true"}})
	r.wantCode(t, 0)
}

// 200 jobs (10 at a time; every tenth fails mid-fence) leave each daemon
// as it was after the first batch: the same descriptors, no memfd, no
// child process, no more goroutines, and threads only up to the peak of
// concurrent work.
func TestDaemonNoLeaks(t *testing.T) {
	p := newDaemonPair(t)
	batch := func(k int) {
		var jobs []job
		for i := range 10 {
			if i == 9 {
				j := p.job("-n", "4", prog("exit_early"), "kill-after-put", "1")
				j.env = []string{"EXIT_EARLY_ALARM=30"}
				jobs = append(jobs, j)
				continue
			}
			jobs = append(jobs, p.job("-n", "4", prog("exit_early"), "ok"))
		}
		for i, r := range concurrentJobs(t, jobs) {
			if i == 9 {
				r.wantCode(t, 128+9)
			} else {
				r.wantCode(t, 0)
			}
		}
		if t.Failed() {
			t.Fatalf("batch %d failed", k)
		}
	}
	type snap struct {
		fds, memfds, goroutines, threads int
		kids                             []int
	}
	take := func(d *daemonProc) snap {
		p.idle(t)
		// The status connections of idle close after their answer, and a
		// job's connection handler ends just after the job leaves the
		// daemon's table: count once descriptors and goroutines have
		// settled (a leak never settles back).
		var s snap
		for prev := (snap{fds: -1}); ; prev = s {
			time.Sleep(100 * time.Millisecond)
			s.fds, s.memfds = procFDs(t, d.cmd.Process.Pid)
			st := d.status(t, p.secret)
			s.goroutines, s.threads = st.Goroutines, st.Threads
			if s.fds == prev.fds && s.goroutines == prev.goroutines {
				break
			}
		}
		s.kids = children(d.cmd.Process.Pid)
		return s
	}
	batch(0)
	var base [2]snap
	for i, d := range p.d {
		base[i] = take(d)
	}
	start := time.Now()
	for k := 1; k < 20; k++ {
		batch(k)
	}
	t.Logf("190 more jobs in %v", time.Since(start).Round(time.Millisecond))
	for i, d := range p.d {
		now := take(d)
		// A handler still finishing its job's last frames is transient; a
		// leaked goroutine is still there 5 s later.
		for end := time.Now().Add(5 * time.Second); now.goroutines > base[i].goroutines && time.Now().Before(end); {
			time.Sleep(200 * time.Millisecond)
			now = take(d)
		}
		t.Logf("daemon %d: fds %d→%d, memfds %d→%d, goroutines %d→%d, threads %d→%d, children %v",
			i, base[i].fds, now.fds, base[i].memfds, now.memfds, base[i].goroutines, now.goroutines, base[i].threads, now.threads, now.kids)
		if now.fds != base[i].fds || now.memfds != 0 || base[i].memfds != 0 {
			t.Errorf("daemon %d: %d descriptors (%d memfds) after 200 jobs, %d (%d) after 10", i, now.fds, now.memfds, base[i].fds, base[i].memfds)
		}
		if now.goroutines > base[i].goroutines {
			t.Errorf("daemon %d: %d goroutines after 200 jobs, %d after 10", i, now.goroutines, base[i].goroutines)
		}
		// Go keeps every thread it made for blocking system calls (fork,
		// exec, ring set-up); their number follows the peak of concurrent
		// work, not the number of jobs (a leak per job would add 190).
		if now.threads > base[i].threads+16 {
			t.Errorf("daemon %d: %d threads after 200 jobs, %d after 10", i, now.threads, base[i].threads)
		}
		if len(now.kids) > 0 {
			t.Errorf("daemon %d: child processes left: %s", i, describe(now.kids))
		}
	}
}

// SIGTERM ends a daemon's jobs — their ranks killed, pmirun told which
// node was lost — and the daemon exits 0, leaving nothing behind; the
// other daemon serves on.
func TestDaemonSIGTERM(t *testing.T) {
	p := newDaemonPair(t)
	j := p.job(sleepArgs()...)
	j.env = []string{"EXIT_EARLY_ALARM=30"}
	r := start(t, j)
	r.waitReady()
	pid := p.d[1].cmd.Process.Pid
	if kids := children(pid); len(kids) != 4 {
		t.Errorf("daemon 1 has %d children, want its 4 ranks: %s", len(kids), describe(kids))
	}
	if code := p.d[1].stop(t, 10*time.Second); code != 0 {
		t.Errorf("pmid --daemon exited %d after SIGTERM, want 0; stderr:\n%s", code, p.d[1].stderr.String())
	}
	res := r.wait() // and no rank of the job is left
	if res.code == 0 {
		t.Errorf("exit code 0 after a daemon of the job shut down\n%s", res)
	}
	res.wantMessage(t, `\bnode 1 \(`+regexp.QuoteMeta(p.d[1].addr)+`\) lost: daemon on .* shutting down`)
	if left := waitNoMarked(p.d[1].marker, 2*time.Second); len(left) > 0 {
		t.Errorf("processes of the stopped daemon left: %s", describe(left))
	}
	r2 := run(t, job{args: []string{"--daemons", p.d[0].addr, "--secret-file", p.secret, "-n", "4", prog("mpi_allreduce")}})
	r2.wantCode(t, 0)
	r2.wantAllreduce(t, 4)
	if code := p.d[0].stop(t, 10*time.Second); code != 0 {
		t.Errorf("idle pmid --daemon exited %d after SIGTERM, want 0", code)
	}
}

// A job whose second daemon is not there (stopped, restarting) fails at
// once, naming it, and the first daemon's node ends with it. Before,
// pmirun said so at once but waited 10 s more, while the node it had
// submitted to the first daemon waited for the agents' table.
func TestDaemonDown(t *testing.T) {
	secret := newSecret(t)
	d := startDaemon(t, nil, "127.0.0.1:0", secret)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	r := run(t, job{args: []string{"--daemons", d.addr + "," + down, "--secret-file", secret, "-n", "4", prog("mpi_allreduce")}})
	r.wantCode(t, 1)
	r.wantMessage(t, `^pmirun: start agent of node 1 on `+regexp.QuoteMeta(down)+`: connect to daemon: .*connection refused`)
	r.wantFaster(t, 5*time.Second)
	deadline := time.Now().Add(2 * time.Second)
	for st := d.status(t, secret); len(st.Jobs) > 0; st = d.status(t, secret) {
		if time.Now().After(deadline) {
			t.Fatalf("the first daemon still runs the job 2 s after pmirun ended: %+v", st.Jobs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// umaskWrap is a command prefix that runs its command under umask mask.
func umaskWrap(mask string) []string {
	return []string{"sh", "-c", "umask " + mask + ` && exec "$@"`, "sh"}
}

// A daemon's ranks, and the output files it makes for them, have the
// umask of the pmirun that submitted the job, as ranks started by pmirun,
// by its agents or by srun have. Before, they had the daemon's (0022):
// a user's 'umask 077' left the files the ranks made readable by all.
func TestDaemonUmask(t *testing.T) {
	secret := newSecret(t)
	var addrs []string
	for range 2 {
		addrs = append(addrs, startDaemon(t, umaskWrap("022"), "127.0.0.1:0", secret).addr)
	}
	dir := t.TempDir()
	r := run(t, job{args: []string{"--daemons", strings.Join(addrs, ","), "--secret-file", secret, "-n", "2", "-l", "sh", "-c", "umask; touch made.$PMI_RANK"},
		wrap: umaskWrap("077"), dir: dir})
	r.wantCode(t, 0)
	r.wantLines(t, map[string]int{"[0] 0077": 1, "[1] 0077": 1})
	r = run(t, job{args: []string{"--daemons", strings.Join(addrs, ","), "--secret-file", secret, "-n", "2", "-o", "out.%r", "true"},
		wrap: umaskWrap("077"), dir: dir})
	r.wantCode(t, 0)
	for _, f := range []string{"made.0", "made.1", "out.0", "out.1"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if perm := st.Mode().Perm(); perm != 0o600 {
			t.Errorf("%s: mode %04o, want 0600 (pmirun's umask 077)", f, perm)
		}
	}
}

// The setting: 2 daemons in 2 test hosts, pmirun in the first,
// 20 concurrent jobs of MPICH and libpmi2 programs.
func TestNetnsDaemons(t *testing.T) {
	cl := newClusterOf(t, 2)
	secret := newSecret(t)
	var ds []*daemonProc
	var addrs []string
	for i, h := range cl.c.Hosts {
		ds = append(ds, startDaemon(t, []string{"ip", "netns", "exec", cl.names[i]}, h.Addr+":7070", secret))
		addrs = append(addrs, ds[i].addr)
	}
	mk := func(args ...string) job {
		return job{
			args:    append([]string{"--daemons", strings.Join(addrs, ","), "--secret-file", secret, "--net-timeout", daemonNetTimeout}, args...),
			wrap:    []string{"ip", "netns", "exec", cl.names[0]},
			timeout: 60 * time.Second,
		}
	}
	start := time.Now()
	res := concurrentJobs(t, mixedJobs(t, 20, mk))
	t.Logf("20 concurrent jobs on 2 daemons in 2 test hosts in %v", time.Since(start).Round(time.Millisecond))
	wantMixed(t, res)
	for i, d := range ds {
		if code := d.stop(t, 10*time.Second); code != 0 {
			t.Errorf("daemon %d exited %d after SIGTERM; stderr:\n%s", i, code, d.stderr.String())
		}
	}
}

// A job on daemons whose output pmirun's reader takes its time over
// (pmirun | less) gets all of it, and exits 0: the daemon waits for
// pmirun to read as a pipe would, as long as pmirun lives. It dropped
// what pmirun had not read for 30 s, silently, and the job exited 0.
func TestDaemonSlowReader(t *testing.T) {
	p := newDaemonPair(t)
	const each = 1500000 // 10.9 MB a rank: more than pipes and sockets between the ranks and pmirun hold
	var stderr bytes.Buffer
	cmd, out := startReading(t, &stderr, p.job("-n", "2", "seq", n(each)).args...)
	// Longer than the daemon's output timeout, while the ranks are done
	// and the daemons hold the rest of their output.
	time.Sleep(35 * time.Second)
	got := 0
	for br := bufio.NewScanner(out); br.Scan(); {
		got++
	}
	err := cmd.Wait()
	if got != 2*each || err != nil {
		t.Errorf("read %d lines of %d after a pause of 35 s; pmirun: %v\nstderr:\n%s", got, 2*each, err, stderr.String())
	}
	p.idle(t)
}

// A job on daemons whose output fits in the pipes and sockets on its
// way to pmirun ends at once; when pmirun's reader then pauses past
// --net-timeout, pmirun ends the daemons' submissions, and says what it
// did: 'stopped forwarding the ranks' output', as it says it on one
// machine. Before, the output they still held was dropped silently
// (about 300 of 800 lines and 3 of 4 ranks' stderr lines), exit 0.
func TestDaemonPausedReaderSaid(t *testing.T) {
	p := newDaemonPair(t)
	const lines = 200
	script := `i=0; while [ $i -lt ` + n(lines) + ` ]; do echo "$PMI_RANK $i ` + strings.Repeat("x", 400) + `"; i=$((i+1)); done; echo "rank $PMI_RANK end" >&2`
	var stderr bytes.Buffer
	cmd, out := startReading(t, &stderr, "--daemons", p.addrs(), "--secret-file", p.secret, "--net-timeout", "5s", "-n", "4", "sh", "-c", script)
	time.Sleep(8 * time.Second)
	got := 0
	for br := bufio.NewScanner(out); br.Scan(); {
		got++
	}
	err := cmd.Wait()
	if err != nil {
		t.Errorf("pmirun: %v, want exit 0 (the ranks succeeded)\nstderr:\n%s", err, stderr.String())
	}
	said := strings.Contains(stderr.String(), "pmirun: stopped forwarding the ranks' output: its stdout took none of it for 5s")
	if ends := strings.Count(stderr.String(), " end\n"); (got < 4*lines || ends < 4) && !said {
		t.Errorf("read %d lines of %d and %d of 4 ranks' stderr lines, and pmirun did not say it stopped forwarding\nstderr:\n%s", got, 4*lines, ends, stderr.String())
	}
	p.idle(t)
}

// startReading starts pmirun with args, marked (killed when the test
// ends), its stdout a pipe the test reads when it chooses, its stderr to
// stderr (nil: discarded).
func startReading(t *testing.T, stderr io.Writer, args ...string) (*exec.Cmd, io.ReadCloser) {
	t.Helper()
	marker := newMarker()
	cmd := exec.Command(pmirun(), append([]string{"--env", markerVar + "=" + marker}, args...)...)
	cmd.Env = callerEnv(nil)
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { killMarked(marker) })
	return cmd, out
}

// SIGTERM ends a daemon at once even while a job's pmirun reads none of
// the output its ranks wrote: the daemon does not wait for that reader.
func TestDaemonSIGTERMUnreadOutput(t *testing.T) {
	p := newDaemonPair(t)
	cmd, out := startReading(t, nil, p.job("-n", "2", "seq", "1500000").args...)
	defer func() {
		io.Copy(io.Discard, out)
		cmd.Wait()
	}()
	deadline := time.Now().Add(20 * time.Second)
	for len(p.d[1].status(t, p.secret).Jobs) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the job did not reach the daemon")
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The ranks' output fills what lies between them and pmirun.
	time.Sleep(2 * time.Second)
	if code := p.d[1].stop(t, 5*time.Second); code != 0 {
		t.Errorf("pmid --daemon exited %d after SIGTERM, want 0", code)
	}
}
