package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// runBinary runs one of the built commands with args and returns its
// stdout, stderr and exit code.
func runBinary(t *testing.T, name string, args ...string) (string, string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog(name), args...)
	cmd.Env = callerEnv(nil)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%s %q: %v", name, args, err)
	}
	return stdout.String(), stderr.String(), code
}

// --help goes to stdout, grouped, with examples and exit codes; pmid has
// its own.
func TestHelpOnStdout(t *testing.T) {
	out, errOut, code := runBinary(t, "pmirun", "--help")
	if code != 0 || errOut != "" {
		t.Fatalf("pmirun --help: exit %d, stderr %q", code, errOut)
	}
	for _, s := range []string{"\nJob:\n", "\nPlacement:\n", "\nEnvironment:\n", "\nOutput:\n", "\nMulti-node:\n",
		"\nDebugging:\n", "\nBenchmarking:\n", "-genv KEY VALUE", "-bind-to", "\nexamples:\n", "\nexit codes:\n", "126"} {
		if !strings.Contains(out, s) {
			t.Errorf("pmirun --help lacks %q", s)
		}
	}
	out, errOut, code = runBinary(t, "pmid", "--help")
	if code != 0 || errOut != "" || !strings.Contains(out, "--node I|slurm") || strings.Contains(out, "-genv") {
		t.Errorf("pmid --help: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}

// A bad command line is one line on stderr pointing at --help, exit 2.
func TestBadFlagOneLine(t *testing.T) {
	for _, args := range [][]string{
		{"--bogus", "true"}, {"-n", "2", "--np", "3", "true"}, {"--timeout", "soon", "true"},
		{"--timer-slack", "2s", "true"}, {"--timer-slack", "-1ms", "true"},
		{"-n", "1", "./a", "A", ":", "--timeout", "3", "./b", "B"},
	} {
		out, errOut, code := runBinary(t, "pmirun", args...)
		if code != 2 || out != "" || strings.Count(errOut, "\n") != 1 || !strings.HasSuffix(errOut, "(see pmirun --help)\n") {
			t.Errorf("pmirun %q: exit %d, stdout %q, stderr %q; want exit 2 and one line", args, code, out, errOut)
		}
	}
}

// --version names the command, the module version and the revision.
func TestVersion(t *testing.T) {
	for _, name := range []string{"pmirun", "pmid", "pmibench"} {
		out, errOut, code := runBinary(t, name, "--version")
		if code != 0 || !strings.HasPrefix(out, name+" fastpmi ") || !strings.Contains(out, "(rev ") || errOut != "" {
			t.Errorf("%s --version: exit %d, %q, stderr %q", name, code, out, errOut)
		}
	}
}

// The cases that used to pass silently now fail with a message (or, for
// hosts, start over ssh as Hydra does).
func TestPreviouslySilentCases(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		msg  string
	}{
		{[]string{"-n", "2", "-hosts", "nosuchhost1,nosuchhost2", "true"}, 1, `agent of node \d on nosuchhost\d exited before connecting`},
		{[]string{"-n", "2", "--cyclic", "true"}, 2, "--cyclic places ranks over several nodes"},
		{[]string{"-n", "2", "--nodes", "2", "true"}, 2, "--nodes is the number of agents of --bootstrap loopback"},
		{[]string{"--compress", "lz4", "true"}, 2, `invalid --compress "lz4"`},
		{[]string{"--tree-width", "0", "true"}, 2, "invalid --tree-width 0"},
		{[]string{"--net-timeout", "1ns", "true"}, 2, "invalid --net-timeout 1ns"},
		{[]string{"-n", "2", "--np", "3", "true"}, 2, `option -n given twice \(as -n and --np\)`},
		{[]string{"-n", "1", "./a", "A", ":", "-n", "2", "./b"}, 127, `cannot run "\./a"`}, // MPMD: both commands are looked for
		{[]string{"--timeout", "1", "sleep", "30"}, 124, "job timed out after 1s"},
	} {
		r := run(t, job{args: c.args})
		r.wantCode(t, c.code)
		r.wantMessage(t, c.msg)
	}
}

// A program that is there but cannot be executed exits 126, one that is
// not there 127, as in a shell.
func TestExitCodes126And127(t *testing.T) {
	garbage := t.TempDir() + "/garbage"
	if err := os.WriteFile(garbage, []byte("\x7fELF but not really"), 0o755); err != nil {
		t.Fatal(err)
	}
	r := run(t, job{args: []string{"-n", "2", garbage}})
	r.wantCode(t, 126)
	r.wantMessage(t, "exec format error")
	r = run(t, job{args: []string{"-n", "2", "/no/such/program"}})
	r.wantCode(t, 127)
}

// -n beyond the user's process limit fails at once, naming the limit.
//
// RLIMIT_NPROC counts threads: pmirun's own and its guard's count too.
// Before, a job of one rank under "ulimit -u 12" ran as far as the Go
// runtime could make threads, and (run by a user, whom the limit binds)
// pmirun aborted with "fatal error: newosproc" and a stack dump.
func TestProcessLimitGuard(t *testing.T) {
	for _, c := range []struct {
		limit int
		n     string
		need  int
	}{{64, "100", 132}, {12, "1", 33}, {40, "8", 40}} {
		r := run(t, job{wrap: ulimit("-u", c.limit), args: []string{"-n", c.n, "true"}})
		if c.need <= c.limit {
			r.wantCode(t, 0)
			continue
		}
		r.wantCode(t, 2)
		r.wantMessage(t, fmt.Sprintf(`-n %s: more ranks than this user may run processes \(%d tasks needed with pmirun's own threads, RLIMIT_NPROC %d; see ulimit -u\)`, c.n, c.need, c.limit))
		r.wantFaster(t, 5*time.Second)
	}
}

// SIGQUIT (Ctrl-\) is forwarded to the ranks and prints no Go stack
// dump.
func TestSIGQUITForwardedNoStackDump(t *testing.T) {
	j := start(t, job{args: []string{"-n", "2", "-l", "sh", "-c", `trap "echo got QUIT" QUIT; echo ready; while :; do sleep 0.05; done`}})
	j.waitStdout(30*time.Second, func(ls []string) bool { return countContaining(ls, "ready") == 2 })
	j.cmd.Process.Signal(sys.SIGQUIT)
	j.waitStdout(30*time.Second, func(ls []string) bool { return countContaining(ls, "got QUIT") == 2 })
	j.cmd.Process.Signal(sys.SIGTERM) // the ranks die of it
	r := j.wait()
	r.wantCode(t, 128+15)
	if strings.Contains(r.stderr, "goroutine ") {
		t.Errorf("pmirun printed a Go stack dump:\n%s", r)
	}
}

// Under nohup (SIGHUP ignored) a hangup neither ends pmirun nor reaches
// the ranks, which start with SIGHUP ignored as nohup's children do; the
// other signals are forwarded still. Before, pmirun caught SIGHUP anyway
// and forwarded it: the ranks died of it, exit 129.
func TestNohupSurvivesHangup(t *testing.T) {
	j := start(t, job{wrap: []string{"nohup"}, args: []string{"-n", "2", "-l", "sh", "-c",
		`trap "echo got USR1" USR1; echo ready; for i in 1 2 3 4 5 6 7 8 9 10; do sleep 0.1; done; echo survived`}})
	j.waitStdout(30*time.Second, func(ls []string) bool { return countContaining(ls, "ready") == 2 })
	j.cmd.Process.Signal(sys.SIGHUP)
	time.Sleep(100 * time.Millisecond)
	j.cmd.Process.Signal(sys.SIGUSR1)
	r := j.wait()
	r.wantCode(t, 0)
	if strings.Count(r.stdout, "survived") != 2 || strings.Count(r.stdout, "got USR1") != 2 {
		t.Errorf("want both ranks to survive the hangup and get SIGUSR1:\n%s", r)
	}
}

func countContaining(ls []string, s string) int {
	n := 0
	for _, l := range ls {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// terminal is pmirun run as a shell runs a foreground job: in a session
// whose controlling terminal is a pty, its stdin, stdout and stderr.
type terminal struct {
	t      *testing.T
	master *os.File
	cmd    *exec.Cmd
	mu     sync.Mutex
	seen   strings.Builder
	read   chan struct{} // closed when the reader ends
}

func startTerminal(t *testing.T, args ...string) *terminal {
	t.Helper()
	return startOnTerminal(t, pmirun(), args...)
}

// startOnTerminal runs prog (pmirun, or a shell that runs it) as a
// terminal's foreground job.
func startOnTerminal(t *testing.T, prog string, args ...string) *terminal {
	t.Helper()
	master, tty, err := sys.OpenPTY()
	if err != nil {
		t.Fatalf("open pty: %v", err)
	}
	tm := &terminal{t: t, master: master, read: make(chan struct{})}
	tm.cmd = exec.Command(prog, args...)
	tm.cmd.Env = callerEnv(nil)
	tm.cmd.Stdin, tm.cmd.Stdout, tm.cmd.Stderr = tty, tty, tty
	tm.cmd.SysProcAttr = sys.TerminalProcAttr(0)
	if err := tm.cmd.Start(); err != nil {
		t.Fatalf("start pmirun on a pty: %v", err)
	}
	tty.Close()
	go func() {
		defer close(tm.read)
		br := bufio.NewReader(master)
		buf := make([]byte, 4096)
		for {
			n, err := br.Read(buf)
			tm.mu.Lock()
			tm.seen.Write(buf[:n])
			tm.mu.Unlock()
			if err != nil {
				return // EIO once every holder of the tty is gone
			}
		}
	}()
	t.Cleanup(func() {
		tm.cmd.Process.Kill()
		tm.cmd.Wait()
		master.Close()
		<-tm.read
	})
	return tm
}

// waitFor waits until the terminal showed s n times.
func (tm *terminal) waitFor(s string, n int) {
	tm.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		tm.mu.Lock()
		got := tm.seen.String()
		tm.mu.Unlock()
		if strings.Count(got, s) >= n {
			return
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("terminal did not show %d × %q in 30s:\n%s", n, s, got)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// wait waits (30 s at most) for pmirun's exit code.
func (tm *terminal) wait() int {
	tm.t.Helper()
	done := make(chan error, 1)
	go func() { done <- tm.cmd.Wait() }()
	select {
	case <-done:
		return tm.cmd.ProcessState.ExitCode()
	case <-time.After(30 * time.Second):
		tm.cmd.Process.Kill()
		<-done
		tm.mu.Lock()
		defer tm.mu.Unlock()
		tm.t.Fatalf("pmirun on a terminal did not end in 30s:\n%s", tm.seen.String())
	}
	return -1
}

// On a terminal, a prompt that a rank leaves unfinished while it waits
// for input shows before the answer is typed (MPICH's icpi asks "Enter
// the number of intervals: "), on one node and through per-job agents;
// the answer's line follows it with its label.
func TestTerminalPrompt(t *testing.T) {
	for _, extra := range [][]string{nil, {"--bootstrap", "loopback", "--nodes", "2"}} {
		args := append(slices.Clone(extra), "-n", "2", "-l", "sh", "-c", `[ $PMI_RANK = 0 ] || exit 0; printf 'intervals: '; read x; echo "got:$x"`)
		tm := startTerminal(t, args...)
		tm.waitFor("[0] intervals: ", 1)
		tm.master.Write([]byte("12\n"))
		tm.waitFor("got:12", 1)
		if code := tm.wait(); code != 0 {
			t.Errorf("%v: exit %d, want 0", args, code)
		}
	}
}

// Input typed on the terminal reaches rank 0, which is never stopped by
// SIGTTIN (it runs in a process group of its own, in the background).
func TestTerminalStdinReachesRankZero(t *testing.T) {
	tm := startTerminal(t, "-n", "2", "-l", "sh", "-c", `echo ready; read x; echo "got:$x"`)
	tm.waitFor("ready", 2)
	tm.master.Write([]byte("hello\n"))
	tm.waitFor("[0] got:hello", 1)
	tm.waitFor("[1] got:", 1)
	if code := tm.wait(); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}

// pmirun started in the background of a shell with job control
// ("pmirun ... &") runs its job: it reads the terminal for the ranks only
// once in the foreground, never stopped by SIGTTIN (before, the job hung
// stopped, though no rank read input). Brought to the foreground, it
// relays what is typed.
func TestTerminalBackgroundJob(t *testing.T) {
	tm := startOnTerminal(t, "sh", "-c", `set -m; "$0" -n 2 -l sh -c 'echo rank-done' & wait $!; echo "exit=$?"`, pmirun())
	tm.waitFor("exit=0", 1)
	tm.waitFor("rank-done", 2)
	if code := tm.wait(); code != 0 {
		t.Errorf("shell exit %d, want 0", code)
	}
	tm = startOnTerminal(t, "sh", "-c", `set -m; "$0" -n 1 sh -c 'read x; echo "got:$x"' & sleep 0.5; echo started; fg`, pmirun())
	tm.waitFor("started", 1)
	tm.waitFor("read x", 1) // fg names the job it resumes
	time.Sleep(200 * time.Millisecond)
	tm.master.Write([]byte("typed\n"))
	tm.waitFor("got:typed", 1)
	if code := tm.wait(); code != 0 {
		t.Errorf("shell exit %d, want 0", code)
	}
}

// pmirun in an orphaned background group can never become the
// foreground job: a shell started it in the background ("pmirun ... &",
// the terminal its input) and exited, and the session's shell took the
// terminal back. A rank that reads its input gets end of file and the job
// ends, as a read of the terminal ends there (EIO), instead of waiting
// for ever for a foreground that never comes. The session's shell stays,
// so the terminal does not hang up.
func TestTerminalOrphanedBackground(t *testing.T) {
	dir := t.TempDir()
	job, inner, pgid := filepath.Join(dir, "job"), filepath.Join(dir, "inner"), filepath.Join(dir, "pgid")
	for f, script := range map[string]string{
		// The job's shell leads its process group, pmirun's.
		job:   `echo $$ > "$2"; "$1" -n 1 sh -c 'read x; echo "got:[$x]"'; echo "ex""it=$?"`,
		inner: `set -m; sh "$1" "$2" "$3" &`, // job control: the job keeps the terminal as input
	} {
		if err := os.WriteFile(f, []byte(script+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tm := startOnTerminal(t, "sh", "-c", `set -m; sh "$0" "$1" "$2" "$3"; sleep 60`, inner, job, pmirun(), pgid)
	t.Cleanup(func() {
		// A pmirun left waiting would hold the terminal open for ever.
		if b, err := os.ReadFile(pgid); err == nil {
			if g, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = sys.SignalGroup(g, os.Kill)
			}
		}
	})
	tm.waitFor("exit=", 1)
	tm.waitFor("got:[]", 1)
	tm.waitFor("exit=0", 1)
}

// A job suspended with Ctrl-Z and resumed in the background (bg) runs on
// to its end, as under mpiexec; before, pmirun's waiting read of the
// terminal restarted in the background and stopped it (SIGTTIN).
func TestTerminalSuspendThenBackground(t *testing.T) {
	tm := startOnTerminal(t, "bash", "--norc", "--noprofile", "-i")
	// The quotes keep the terminal's echo of the command from matching.
	tm.master.Write([]byte(pmirun() + ` -n 2 -l sh -c 'echo "sta""rted"; sleep 1; echo "rank-""done"'` + "\n"))
	tm.waitFor("started", 2)
	tm.master.Write([]byte{26}) // ^Z
	tm.waitFor("Stopped", 1)
	tm.master.Write([]byte("bg; wait; echo \"ex\"\"it=$?\"\n"))
	tm.waitFor("exit=", 1)
	tm.waitFor("exit=0", 1)
	tm.waitFor("rank-done", 2)
	tm.master.Write([]byte("exit\n"))
	tm.wait()
}

// Ctrl-C on the terminal is forwarded with a note; a second one kills
// ranks that ignore SIGINT and SIGTERM, exit 130.
func TestTerminalCtrlCTwice(t *testing.T) {
	tm := startTerminal(t, "-n", "2", "-l", "sh", "-c", `trap '' INT TERM; echo ready; while :; do sleep 0.05; done`)
	tm.waitFor("ready", 2)
	tm.master.Write([]byte{3}) // ^C
	tm.waitFor("press Ctrl-C again within 5s to kill them", 1)
	tm.master.Write([]byte{3})
	if code := tm.wait(); code != 130 {
		t.Errorf("exit %d, want 130", code)
	}
	tm.waitFor("interrupted twice: killing every rank", 1)
}

// -n beyond the descriptors pmirun may hold fails at once, naming the
// limit, instead of failing rank by rank; and the count is true: the most
// ranks it lets start run, all at once.
func TestFileLimitGuard(t *testing.T) {
	limited := ulimit("-n", 1024)
	r := run(t, job{wrap: limited, args: []string{"-n", "1000", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 1000: more ranks than pmirun can hold descriptors for \(4040 needed, RLIMIT_NOFILE 1024; see ulimit -n\)`)
	r = run(t, job{wrap: limited, args: []string{"-n", "247", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 247: more ranks than pmirun can hold descriptors for \(1028 needed`)
	// 246 ranks alive together (before, with three descriptors a rank
	// counted and five held, 203 started and the 204th failed).
	r = run(t, job{wrap: limited, args: []string{"-n", "246", "sleep", "1"}})
	r.wantCode(t, 0)
	// A small limit leaves room for a small job: before, pmirun kept 64
	// descriptors for itself, all of "ulimit -n 64", and refused -n 1.
	r = run(t, job{wrap: ulimit("-n", 64), args: []string{"-n", "4", prog("exit_early"), "ok"}})
	r.wantCode(t, 0)
	r = run(t, job{wrap: ulimit("-n", 64), args: []string{"-n", "7", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 7: more ranks than pmirun can hold descriptors for \(68 needed, RLIMIT_NOFILE 64; see ulimit -n\)`)
	// Loopback agents run here under the same limit, each with its
	// node's share of the ranks: before, the job started and failed
	// midway ("start rank 54 on node 0 (127.0.0.1): fork/exec ...: too
	// many open files", exit 1).
	limited = ulimit("-n", 256)
	r = run(t, job{wrap: limited, args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "200", "sleep", "1"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `-n 200: more ranks on a node \(100\) than its agent can hold descriptors for \(440 needed, RLIMIT_NOFILE 256; see ulimit -n\)`)
	r.wantFaster(t, 5*time.Second)
	r = run(t, job{wrap: limited, args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "108", "sleep", "1"}})
	r.wantCode(t, 0)
}

// The shared segment is a memfd, a file to the kernel: under a file size
// limit too small for it pmirun refuses the job at once, naming the
// limit, and an agent that cannot size its segment says which limit.
// Before, the job failed with "truncate memfd:fastpmi-shm: file too
// large", exit 1, naming no limit.
func TestFileSizeLimitGuard(t *testing.T) {
	limited := ulimit("-f", 10)
	r := run(t, job{wrap: limited, args: []string{"-n", "2", "true"}})
	r.wantCode(t, 2)
	r.wantMessage(t, `^pmirun: -n 2: the shared segment needs \d+ KiB, more than the file size limit allows \(RLIMIT_FSIZE 10 KiB; see ulimit -f\); use --no-shm$`)
	r.wantFaster(t, 5*time.Second)
	r = run(t, job{wrap: limited, args: []string{"--no-shm", "-n", "2", "true"}})
	r.wantCode(t, 0)
	r = run(t, job{wrap: limited, args: []string{"--bootstrap", "loopback", "--nodes", "2", "-n", "2", "true"}})
	r.wantCode(t, 1)
	r.wantMessage(t, `^pmirun: start rank \d on node \d \(127\.0\.0\.1\): create shared memory: .*file too large \(the file size limit, RLIMIT_FSIZE: see ulimit -f; or run with --no-shm to use PMI_FD only\)$`)
}

// pmirun waits for its ranks without a thread each (Go aborts past
// 10,000 threads and each counts against RLIMIT_NPROC): with 300 ranks
// running it has far fewer than 300 threads.
func TestRankWaitersHoldNoThreads(t *testing.T) {
	const n = 300
	j := start(t, job{args: []string{"-n", strconv.Itoa(n), "sleep", "60"}, timeout: 120 * time.Second})
	deadline := time.Now().Add(60 * time.Second)
	for len(marked(j.marker)) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ranks running after 60s", len(marked(j.marker)), n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // every waiter has begun waiting
	threads := j.threadsThenTerm()
	if threads < 1 || threads > n/3 {
		t.Errorf("pmirun has %d threads while waiting for %d ranks, want at most %d", threads, n, n/3)
	}
}

// Across real nodes (test hosts): HOST:SLOTS places the ranks, -wdir,
// -genv and --tag-output reach every node, and --stdin RANK sends the
// input to the node of that rank. --tag-output's node is the run's name
// for it, as its ranks see it: the test hosts share one host name, the
// run tells them apart.
func TestNetnsSlotsStdinRank(t *testing.T) {
	cl := newClusterOf(t, 2)
	dir := t.TempDir()
	j := job{
		args: []string{"--bootstrap", "netns", "-hosts", cl.names[0] + ":3," + cl.names[1],
			"--root-addr", cl.c.Hosts[0].Addr, "-n", "5", "--stdin", "3", "-wdir", dir, "-genv", "GREETING", "hi",
			"--tag-output", "sh", "-c", `read x; echo "$MPI_LOCALNRANKS $(pwd) $GREETING in:$x"`},
		wrap: []string{"ip", "netns", "exec", cl.names[0]}, markAgents: true, timeout: 40 * time.Second,
		stdin: strings.NewReader("typed\n"),
	}
	r := run(t, j)
	r.wantCode(t, 0)
	// Node 0 takes 3 ranks, node 1 one, then node 0 again: 0,1,2,4 | 3.
	tagged := regexp.MustCompile(`^\[(\d)@(\S+)\] (.*)$`)
	nodeOf := map[string]string{} // rank: the node its tag names
	var rest []string
	for _, l := range lines(r.stdout) {
		m := tagged.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("line %q: want [rank@node] ...\n%s", l, r)
		}
		nodeOf[m[1]] = m[2]
		rest = append(rest, "["+m[1]+"] "+m[3])
	}
	r.stdout = strings.Join(rest, "\n") + "\n"
	r.wantRankLines(t, 5, func(rank int) string {
		local, in := "4", ""
		if rank == 3 {
			local, in = "1", "typed"
		}
		return "[" + strconv.Itoa(rank) + "] " + local + " " + dir + " hi in:" + in
	})
	if n0 := nodeOf["0"]; n0 == "" || nodeOf["1"] != n0 || nodeOf["2"] != n0 || nodeOf["4"] != n0 || nodeOf["3"] == n0 || nodeOf["3"] == "" {
		t.Errorf("the nodes --tag-output names: %v, want ranks 0, 1, 2, 4 on one node and 3 on another", nodeOf)
	}

	// A machinefile with a line per slot (PBS's), comments and a blank
	// line, and no -n: a rank a line, a host's lines one node of that
	// many ranks, as Hydra runs it (each line had an agent of its own).
	hostfile := filepath.Join(dir, "hosts")
	text := "# the job's nodes\n" + cl.names[0] + "\n" + cl.names[0] + " # twice\n\n" + cl.names[1] + "\n" + cl.names[1] + "\n" + cl.names[1] + "\n"
	if err := os.WriteFile(hostfile, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	j = job{
		args: []string{"--bootstrap", "netns", "-f", hostfile, "--root-addr", cl.c.Hosts[0].Addr, "--verbose", "-l",
			"sh", "-c", `echo "$MPI_LOCALRANKID/$MPI_LOCALNRANKS"`},
		wrap: []string{"ip", "netns", "exec", cl.names[0]}, markAgents: true, timeout: 40 * time.Second,
	}
	r = run(t, j)
	r.wantCode(t, 0)
	r.wantMessage(t, "^pmirun: 2 nodes via netns")
	r.wantRankLines(t, 5, func(rank int) string {
		local := map[int]string{0: "0/2", 1: "1/2", 2: "0/3", 3: "1/3", 4: "2/3"}[rank]
		return fmt.Sprintf("[%d] %s", rank, local)
	})
	// --cyclic with those slots: the nodes take a rank each in turn
	// while they have slots free (it was ignored: blocks).
	j.args = append([]string{"--cyclic"}, j.args...)
	r = run(t, j)
	r.wantCode(t, 0)
	r.wantRankLines(t, 5, func(rank int) string {
		local := map[int]string{0: "0/2", 2: "1/2", 1: "0/3", 3: "1/3", 4: "2/3"}[rank]
		return fmt.Sprintf("[%d] %s", rank, local)
	})
}

// --pmi-port (Hydra's -pmi-port): ranks reach the agent over loopback TCP
// (PMI_PORT, PMI_ID: an unguessable token, docs/security.md), no PMI_FD.
func TestPMIPort(t *testing.T) {
	r := run(t, job{args: []string{"-n", "3", "--pmi-port", prog("pmi2_test")},
		env: []string{"EXPECT_USIZE=-1", "PMI2_TEST_ALARM=30"}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 3, func(rank int) string {
		return fmt.Sprintf("pmi2 ok rank %d size 3 node 0 local %d/3 ring %d usize -1", rank, rank, rank)
	})
	r = run(t, job{args: []string{"-n", "1", "--pmi-port", "sh", "-c", `echo "fd=${PMI_FD:-none} port=${PMI_PORT%:*} id=$PMI_ID"`}})
	r.wantCode(t, 0)
	if ls := lines(r.stdout); len(ls) != 1 || !regexp.MustCompile(`^fd=none port=127\.0\.0\.1 id=[1-9][0-9]{9}$`).MatchString(ls[0]) {
		t.Errorf("the rank's environment: %q, want no PMI_FD, a loopback PMI_PORT and a 10-digit PMI_ID\n%s", ls, r)
	}
}

// With agents of their own (loopback bootstrap), input typed on the
// terminal still reaches rank 0 and the job ends when the ranks do: no
// wait for a terminal read.
func TestTerminalStdinMultiNode(t *testing.T) {
	tm := startTerminal(t, "--bootstrap", "loopback", "--nodes", "2", "-n", "2", "-l", "sh", "-c", `echo ready; read x; echo "got:$x"`)
	tm.waitFor("ready", 2)
	tm.master.Write([]byte("hello\n"))
	tm.waitFor("[0] got:hello", 1)
	if code := tm.wait(); code != 0 {
		t.Errorf("exit %d, want 0", code)
	}
}
