package launch

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// buildBinaries builds pmid and the Go example into a temporary folder.
func buildBinaries(t *testing.T) (pmid, hello string) {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"pmid", "hello"} {
		src := "../cmd/pmid"
		if pkg == "hello" {
			src = "../examples/hello"
		}
		out, err := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", filepath.Join(dir, pkg), src).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "pmid"), filepath.Join(dir, "hello")
}

// fakeTool installs testdata/NAME as NAME first on PATH.
func fakeTool(t *testing.T, name string) (logPath string) {
	t.Helper()
	bin := t.TempDir()
	src, err := filepath.Abs(filepath.Join("testdata", "fake-"+name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, filepath.Join(bin, name)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	logPath = filepath.Join(t.TempDir(), "log")
	t.Setenv("FAKE_LOG", logPath)
	return logPath
}

func TestBootstraps(t *testing.T) {
	pmid, hello := buildBinaries(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		tool string
		log  string // what the fake tool must have logged
	}{
		{"ssh", Config{Bootstrap: "ssh", Hosts: []string{"alpha", "beta", "gamma"}}, "ssh", "alpha\nbeta\ngamma\n"},
		{"slurm", Config{Bootstrap: "slurm"}, "srun", "--overlap\n--nodelist=n1,n2,n3\n--ntasks=3\n--ntasks-per-node=1\n--cpus-per-task=1\n--mpi=none\n--input=all\n--kill-on-bad-exit=1\n--export=ALL\n--cpu-bind=none\n"},
		{"loopback", Config{Bootstrap: "loopback", Nodes: 3}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logPath string
			if tc.tool != "" {
				logPath = fakeTool(t, tc.tool)
			}
			if tc.name == "slurm" {
				t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
			}
			var stdout, stderr bytes.Buffer
			cfg := tc.cfg
			cfg.Size, cfg.Prog, cfg.PmidPath, cfg.RootAddr = 6, hello, pmid, "127.0.0.1"
			cfg.Stdout, cfg.Stderr, cfg.Timeout = &stdout, &stderr, time.Minute
			if err := Run(context.Background(), cfg); err != nil {
				t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), "hello: 6 ranks over shm verified") {
				t.Fatalf("stdout %q", stdout.String())
			}
			if logPath != "" {
				b, err := os.ReadFile(logPath)
				lines := strings.SplitAfter(string(b), "\n")
				sort.Strings(lines) // agents start concurrently
				if tc.name == "slurm" {
					lines = strings.SplitAfter(string(b), "\n")
				}
				if err != nil || strings.Join(lines, "") != tc.log {
					t.Fatalf("%s log %q (%v), want %q", tc.tool, b, err, tc.log)
				}
			}
		})
	}
}

// An agent that ends before it connects is named with how it ended, as
// an exit status: one that exited 0 (an ssh that ran nothing) read
// "exited before connecting: <nil>".
func TestAgentExitedBeforeConnecting(t *testing.T) {
	for _, c := range []struct{ ssh, want string }{
		{"true", "agent of node 0 on alpha exited before connecting: exit status 0"},
		{"false", "agent of node 0 on alpha exited before connecting: exit status 1"},
	} {
		var stderr bytes.Buffer
		cfg := Config{Bootstrap: "ssh", Hosts: []string{"alpha"}, SSH: c.ssh, PmidPath: "pmid", RootAddr: "127.0.0.1",
			Size: 1, Prog: "true", Stdout: &stderr, Stderr: &stderr, Timeout: time.Minute}
		err := Run(context.Background(), cfg)
		if ExitCode(err) != 1 || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ssh %s: %v (exit %d), want %q (stderr %q)", c.ssh, err, ExitCode(err), c.want, stderr.String())
		}
	}
}

// An agent started over ssh that exits before it connects says what to
// check from its exit status: ssh's 255 (the host not reached or the
// login refused), the remote shell's 127 (no pmid at that path there);
// the message gave the status alone.
func TestSSHExitHints(t *testing.T) {
	fake, err := filepath.Abs("testdata/fake-ssh")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("FAKE_LOG", filepath.Join(t.TempDir(), "log"))
	for _, c := range []struct{ ssh, pmid, want string }{
		{`sh -c "exit 255" ssh`, "pmid", "agent of node 0 on alpha exited before connecting: exit status 255 (ssh could not reach alpha or log in there: see ssh's message)"},
		{fake, "/nonexistent/pmid", "agent of node 0 on alpha exited before connecting: exit status 127 (no /nonexistent/pmid on alpha: see --pmid)"},
		{fake, "/etc/passwd", "agent of node 0 on alpha exited before connecting: exit status 126 (/etc/passwd on alpha cannot be run: see --pmid)"},
		{"false", "pmid", "agent of node 0 on alpha exited before connecting: exit status 1"},
	} {
		var stderr syncbuf.Buffer
		cfg := Config{Bootstrap: "ssh", Hosts: []string{"alpha"}, SSH: c.ssh, PmidPath: c.pmid, RootAddr: "127.0.0.1",
			Size: 1, Prog: "true", Stdout: &stderr, Stderr: &stderr, Timeout: time.Minute}
		err := Run(context.Background(), cfg)
		if err == nil || err.Error() != c.want {
			t.Errorf("ssh %s, pmid %s: %v, want %q\nstderr:\n%s", c.ssh, c.pmid, err, c.want, stderr.String())
		}
	}
}

// An agent that never connects (ssh to a host that does not answer
// waits for the TCP timeout) fails the job once the connect timeout is
// over, naming its node and host, and pmirun ends every agent then,
// without waiting longer for the one that cannot be told. --timeout and
// a signal to pmirun end the job meanwhile, as they would once the ranks
// run (they waited for the connect timeout, and ended it with code 1).
func TestAgentNeverConnects(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "ssh")
	defer func(d time.Duration) { connectTimeout = d }(connectTimeout)
	for _, c := range []struct {
		name     string
		connect  time.Duration // connectTimeout
		timeout  time.Duration // --timeout
		signal   bool          // SIGTERM to pmirun after a moment
		code     int
		msg      string
		lastsFor time.Duration
	}{
		{"connect timeout", 2 * time.Second, time.Minute, false, 1, "agent of node 1 on silent did not connect within 2s (2 of 3 did)", 2 * time.Second},
		{"--timeout", 20 * time.Second, time.Second, false, ExitTimeout, "job timed out after 1s", time.Second},
		{"SIGTERM", 20 * time.Second, time.Minute, true, 128 + 15, "SIGTERM before the ranks started: the job ends", 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			connectTimeout = c.connect
			var stderr syncbuf.Buffer // pmirun's messages and its log
			sigs := make(chan os.Signal, 1)
			cfg := Config{Bootstrap: "ssh", Hosts: []string{"alpha", "silent", "beta"}, Size: 3, Prog: "true",
				PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: io.Discard, Stderr: &stderr, Timeout: c.timeout,
				Signals: sigs, Logger: slog.New(slog.NewTextHandler(&stderr, nil))}
			if c.signal {
				time.AfterFunc(500*time.Millisecond, func() { sigs <- sys.SIGTERM })
			}
			start := time.Now()
			err := Run(context.Background(), cfg)
			took := time.Since(start)
			var je *JobError
			if !errors.As(err, &je) || je.Code != c.code {
				t.Fatalf("run: %v, want a job error of code %d\nstderr:\n%s", err, c.code, stderr.String())
			}
			if want := "pmirun: " + c.msg + "\n"; !strings.HasPrefix(stderr.String(), want) {
				t.Errorf("stderr:\n%s\nwant it to start %q", stderr.String(), want)
			}
			if strings.Contains(stderr.String(), "level=WARN") {
				t.Errorf("stderr:\n%s\nwant no warning", stderr.String())
			}
			if took > c.lastsFor+time.Second {
				t.Errorf("the job took %v, want %v and little more", took, c.lastsFor)
			}
		})
	}
}

// --pmid with a relative path names the agent from pmirun's directory,
// as a relative program does: over ssh the command runs in the login's
// home, where the path was not found (exit status 127).
func TestRelativePmidPath(t *testing.T) {
	pmid, hello := buildBinaries(t)
	fakeTool(t, "ssh")
	t.Setenv("HOME", t.TempDir())
	t.Chdir(filepath.Dir(pmid))
	var stdout bytes.Buffer
	var stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "ssh", Hosts: []string{"alpha", "beta"}, Size: 2, Prog: hello, PmidPath: "./" + filepath.Base(pmid),
		RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
	if err := Run(context.Background(), cfg); err != nil {
		t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
	}
	if !strings.Contains(stdout.String(), "hello: 2 ranks over shm verified") {
		t.Errorf("stdout %q", stdout.String())
	}
}

// An agent out of descriptors midway (a host's RLIMIT_NOFILE lower than
// its share of the ranks needs; pmirun checks only this machine's) says
// which limit: before, the message ended in a bare "too many open files".
func TestAgentOutOfDescriptors(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "ssh")
	t.Setenv("HOME", t.TempDir())
	t.Setenv("FAKE_SSH_NOFILE", "64")
	var stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "ssh", Hosts: []string{"alpha", "beta"}, Size: 60, Prog: "sleep", Args: []string{"5"}, PmidPath: pmid,
		RootAddr: "127.0.0.1", Stdout: io.Discard, Stderr: &stderr, Timeout: time.Minute}
	err := Run(context.Background(), cfg)
	// The fork, or the pipe or socket before it, finds no descriptor.
	want := regexp.MustCompile(`^start rank \d+ on node \d \((alpha|beta)\): .*: too many open files \(no descriptors left for another rank: see ulimit -n\)$`)
	if err == nil || !want.MatchString(err.Error()) {
		t.Errorf("run: %v, want a match of %q\nstderr:\n%s", err, want, stderr.String())
	}
}

// Under Slurm one srun runs every node's agent: when it ends, the
// message says so, not that node 0's agent did ('agent of node 0 on n1
// exited before connecting', 'node 0 (n1) lost: agent signal: killed',
// when srun's step failed on every node).
func TestSlurmStepEnds(t *testing.T) {
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
	var stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "slurm", Size: 3, Prog: "true", PmidPath: "/nonexistent/pmid", RootAddr: "127.0.0.1",
		Stdout: io.Discard, Stderr: &stderr, Timeout: time.Minute}
	err := Run(context.Background(), cfg)
	want := "srun, which runs every node's agent, exited before they connected: exit status 1"
	if err == nil || err.Error() != want {
		t.Errorf("run: %v, want %q\nstderr:\n%s", err, want, stderr.String())
	}
	r := &rootNode{hosts: []string{"n1", "n2", "n3"}, at: []int{0, 1, 2}, step: true}
	if got, want := r.lostBy(0, errors.New("signal: killed")), "every node lost: srun, which runs their agents, signal: killed"; got != want {
		t.Errorf("srun killed: %q, want %q", got, want)
	}
	r.step = false
	if got, want := r.lostBy(1, nil), "node 1 (n2) lost: agent exited"; got != want {
		t.Errorf("an agent of its own: %q, want %q", got, want)
	}
}

func TestExpandHostlist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"n1", "n1"},
		{"node[01-03,7],login", "node01,node02,node03,node7,login"}, // padding per range, as Slurm
		{"gpu[1-2]-ib,a", "gpu1-ib,gpu2-ib,a"},
		{"n[08-10]", "n08,n09,n10"},
		{"n[1-010]", "n1,n2,n3,n4,n5,n6,n7,n8,n9,n10"}, // the first bound's width
		{"n[1-2],,m", "n1,n2,m"},
		// Several bracket groups: their product, as scontrol show
		// hostnames expands them (it was rack1-n[01-02], rack2-n[01-02]).
		{"rack[1-2]-n[01-02]", "rack1-n01,rack1-n02,rack2-n01,rack2-n02"},
		{"a[1-2]b[3-4],c", "a1b3,a1b4,a2b3,a2b4,c"},
		{"n[1-2][3,5]", "n13,n15,n23,n25"},
	} {
		got, err := ExpandHostlist(tc.in)
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("ExpandHostlist(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "n[3-1]", "n[a-b]", "n]1[", "n1]", "n[1-2]]", "n[1-3", "a]b[1]", "n[1-[2-3]]",
		"n[+1-2]", "n[1--2]", "n[0-99999999999999999999]", "n[0-65535]x[0-65535]"} {
		if got, err := ExpandHostlist(bad); err == nil {
			t.Errorf("ExpandHostlist(%q) = %d names (%.60q...), want an error", bad, len(got), strings.Join(got, ","))
		}
	}
}

func TestAgentProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // restored after the test
	os.Unsetenv("GOMAXPROCS")
	cpus := runtime.NumCPU()
	for _, c := range []struct {
		bootstrap string
		k, want   int
	}{
		{"loopback", 64, 1},
		{"netns", 4, max(1, cpus/4)},
		{"loopback", 1, cpus},
		{"ssh", 64, 0},
		{"slurm", 64, 0},
		{"fork", 1, 0},
	} {
		if got := agentProcs(c.bootstrap, c.k); got != c.want {
			t.Errorf("agentProcs(%s, %d) = %d, want %d", c.bootstrap, c.k, got, c.want)
		}
	}
	t.Setenv("GOMAXPROCS", "3")
	if got := agentProcs("loopback", 64); got != 0 {
		t.Errorf("with GOMAXPROCS set: agentProcs = %d, want 0 (the caller's setting stands)", got)
	}
}

func TestShellQuote(t *testing.T) {
	for in, want := range map[string]string{
		"/usr/bin/pmid":      "/usr/bin/pmid",
		"/opt/my tools/pmid": "'/opt/my tools/pmid'",
		"/tmp/it's/pmid":     `'/tmp/it'\''s/pmid'`,
		"/tmp/$HOME;rm/pmid": "'/tmp/$HOME;rm/pmid'",
		"":                   "''",
	} {
		if got := shellQuote(in); got != want {
			t.Errorf("shellQuote(%q) = %s, want %s", in, got, want)
		}
		// The shell gives the word back as it was.
		out, err := exec.Command("sh", "-c", "printf %s "+shellQuote(in)).Output()
		if err != nil || string(out) != in {
			t.Errorf("sh read %s as %q (%v), want %q", shellQuote(in), out, err, in)
		}
	}
}

// --ssh, else FASTPMI_SSH, else ssh; the agents' command lines carry the
// options and a quoted pmid path.
func TestSSHCommand(t *testing.T) {
	t.Setenv("FASTPMI_SSH", "")
	c := Config{Bootstrap: "ssh", PmidPath: "/opt/fast pmi/pmid"}
	if got := c.sshCommand(); got != "ssh" {
		t.Errorf("default ssh command %q", got)
	}
	t.Setenv("FASTPMI_SSH", "ssh -p 2222")
	if got := c.sshCommand(); got != "ssh -p 2222" {
		t.Errorf("FASTPMI_SSH: ssh command %q", got)
	}
	c.SSH = "/usr/bin/ssh -F /etc/cluster/ssh_config"
	cmds, err := c.agentCommands(context.Background(), []string{"n1", "n2"})
	if err != nil || len(cmds) != 2 {
		t.Fatalf("%d commands, %v", len(cmds), err)
	}
	want := []string{"/usr/bin/ssh", "-F", "/etc/cluster/ssh_config", "-o", "BatchMode=yes", "-T", "n2", "'/opt/fast pmi/pmid'", "--node", "1"}
	if got := cmds[1].Args; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("agent command %q, want %q", got, want)
	}
	c.SSH = "   "
	c.Bootstrap = "ssh"
	t.Setenv("FASTPMI_SSH", "")
	if cmds, _ := c.agentCommands(context.Background(), []string{"n1"}); cmds[0].Args[0] != "ssh" {
		t.Errorf("blank --ssh: agent command %q, want ssh", cmds[0].Args)
	}
}

// An ssh command is split into words as the shell splits it, quotes
// and backslashes kept from it; it was split at every space, so
// --ssh "ssh -o 'ProxyCommand ssh -W %h:%p gw'" gave ssh "'ProxyCommand".
// A quote left open is refused before any agent starts.
func TestSSHCommandWords(t *testing.T) {
	for _, in := range []string{
		`ssh -o 'ProxyCommand ssh -W %h:%p gw'`,
		`ssh -i "/home/me/my keys/id" -p 2222`,
		`/opt/my\ tools/ssh  -F cfg`,
		`ssh -o "ProxyCommand=nc \"a b\" \x \$H"`,
		`ssh -o 'a\b' x""y ''`,
		"\tssh  -v ",
	} {
		got, err := splitWords(in)
		// The shell's own split, each word on a line of its own.
		out, serr := exec.Command("sh", "-c", "printf '%s\\n' "+in).Output()
		want := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
		if err != nil || serr != nil || strings.Join(got, "|") != strings.Join(want, "|") {
			t.Errorf("splitWords(%q) = %q, %v; the shell: %q, %v", in, got, err, want, serr)
		}
	}
	c := Config{Bootstrap: "ssh", SSH: `ssh -o 'ProxyCommand ssh -W %h:%p gw'`, PmidPath: "pmid"}
	cmds, err := c.agentCommands(context.Background(), []string{"n1"})
	if err != nil || len(cmds) != 1 || cmds[0].Args[2] != "ProxyCommand ssh -W %h:%p gw" {
		t.Errorf("agent command %q, %v", cmds[0].Args, err)
	}
	for ssh, want := range map[string]string{
		`ssh -o 'ProxyCommand x`: `invalid --ssh "ssh -o 'ProxyCommand x": unterminated ' quote`,
		`ssh -o "ProxyCommand x`: `invalid --ssh "ssh -o \"ProxyCommand x": unterminated " quote`,
		`ssh -p 22 \`:            `invalid --ssh "ssh -p 22 \\": a backslash ends it`,
	} {
		c := Config{Bootstrap: "ssh", Hosts: []string{"n1"}, SSH: ssh, Size: 1, Prog: "true"}
		if err := c.validate(); err == nil || err.Error() != want {
			t.Errorf("--ssh %s: %v, want %q", ssh, err, want)
		}
	}
	t.Setenv("FASTPMI_SSH", "ssh '")
	c = Config{Bootstrap: "ssh", Hosts: []string{"n1"}, Size: 1, Prog: "true"}
	if err := c.validate(); err == nil || !strings.HasPrefix(err.Error(), "invalid FASTPMI_SSH") {
		t.Errorf("FASTPMI_SSH=\"ssh '\": %v", err)
	}
}

// pmirun sends agents started over ssh its environment without its own
// machine's variables.
func TestLauncherEnv(t *testing.T) {
	t.Setenv("HOSTNAME", "launcher")
	t.Setenv("SSH_CONNECTION", "10.0.0.1 5000 10.0.0.2 22")
	t.Setenv("JOB_VAR", "1")
	env := strings.Join(launcherEnv(), "\n")
	if strings.Contains(env, "HOSTNAME=") || strings.Contains(env, "SSH_CONNECTION=") || !strings.Contains(env, "JOB_VAR=1") {
		t.Errorf("launcher environment:\n%s", env)
	}
}

// pmirun listens for its agents on the one address it tells them to dial,
// never on every interface, but where daemons are reached from several
// of its addresses.
func TestRootListenAddr(t *testing.T) {
	first := firstAddr()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Bootstrap: "loopback"}, "127.0.0.1:0"},
		{Config{Bootstrap: "loopback", RootAddr: "10.1.2.3"}, "127.0.0.1:0"},
		{Config{Bootstrap: "ssh"}, first + ":0"},
		{Config{Bootstrap: "slurm"}, first + ":0"},
		{Config{Bootstrap: "netns", RootAddr: "10.1.2.3"}, "10.1.2.3:0"},
		{Config{Bootstrap: "daemon", Daemons: []string{"127.0.0.1:7070", "localhost:7071"}}, "127.0.0.1:0"},
		{Config{Bootstrap: "daemon", Daemons: []string{"127.0.0.1:7070"}, RootAddr: "10.1.2.3"}, "10.1.2.3:0"},
		// Daemons reached from one address (here, this machine's own):
		// that one.
		{Config{Bootstrap: "daemon", Daemons: []string{first + ":7070", first + ":7071"}}, first + ":0"},
	} {
		if got := tc.cfg.rootListenAddr(); got != tc.want {
			t.Errorf("bootstrap %s, root addr %q, daemons %v: listen on %q, want %q",
				tc.cfg.Bootstrap, tc.cfg.RootAddr, tc.cfg.Daemons, got, tc.want)
		}
	}
	if sourceAddr([]string{"127.0.0.1:1", "no-such-host.invalid:1"}) != "" {
		t.Error("sourceAddr of an unresolvable daemon is not empty")
	}
}

// Under Slurm one srun feeds every node's agent (--input=all), so the
// job's input reaches the rank that reads it on whichever node it runs:
// it reached only a rank of node 0, and -i 2 on node 2 read nothing.
func TestSlurmStdinRank(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
	for _, rank := range []int{0, 2} {
		var stdout, stderr syncbuf.Buffer
		cfg := Config{Bootstrap: "slurm", Size: 3, Prog: "sh", Args: []string{"-c", `read x; echo "$PMI_RANK:$x"`},
			StdinRank: rank, Stdin: strings.NewReader("hello\n"), PmidPath: pmid, RootAddr: "127.0.0.1",
			Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
		err := Run(context.Background(), cfg)
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		sort.Strings(lines)
		want := []string{"0:", "1:", "2:"}
		want[rank] += "hello"
		if err != nil || strings.Join(lines, " ") != strings.Join(want, " ") {
			t.Errorf("-i %d: %q, %v; want %q\nstderr:\n%s", rank, lines, err, want, stderr.String())
		}
	}
}

// A job of the allocation's tasks runs them where Slurm allocated them
// (SLURM_TASKS_PER_NODE), as srun and Hydra do: salloc -n 5 on nodes of
// 4 CPUs holds 4 and 1 tasks, and pmirun spread the ranks 3 and 2, one
// more on the second node than it has CPUs for the job. A job of
// another size is spread evenly, as before.
func TestSlurmTasksPerNode(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
	t.Setenv("SLURM_NTASKS", "6")
	t.Setenv("SLURM_TASKS_PER_NODE", "4,1(x2)")
	for _, c := range []struct {
		size   int
		cyclic bool
		want   string
	}{
		{0, false, "0:0 1:0 2:0 3:0 4:1 5:2"}, // -n unsaid: SLURM_NTASKS
		{6, false, "0:0 1:0 2:0 3:0 4:1 5:2"},
		{6, true, "0:0 1:1 2:2 3:0 4:0 5:0"}, // srun's cyclic: a task each in turn while a node has some left
		{3, false, "0:0 1:1 2:2"},
	} {
		var stdout, stderr syncbuf.Buffer
		cfg := Config{Bootstrap: "slurm", Size: c.size, Cyclic: c.cyclic, Prog: "sh", Args: []string{"-c", `echo "$PMI_RANK:$SLURM_NODEID"`},
			PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
		err := Run(context.Background(), cfg)
		lines := strings.Fields(stdout.String())
		sort.Strings(lines)
		if got := strings.Join(lines, " "); err != nil || got != c.want {
			t.Errorf("-n %d cyclic %v: %s, %v; want %s\nstderr:\n%s", c.size, c.cyclic, got, err, c.want, stderr.String())
		}
	}
	for v, want := range map[string][]int{
		"2(x3),1": {2, 2, 2, 1}, "1(x4)": {1, 1, 1, 1}, "4,1,1,2": {4, 1, 1, 2},
		"": nil, "2(x5)": nil, "2(x3)": nil, "2(x3": nil, "0(x4)": nil, "a,1,1,1": nil, "1,1,1,1,1": nil,
	} {
		t.Setenv("SLURM_TASKS_PER_NODE", v)
		if got := slurmTasks(4); !slices.Equal(got, want) {
			t.Errorf("SLURM_TASKS_PER_NODE=%s: %v, want %v", v, got, want)
		}
	}
}

// A job that names no bootstrap or hosts inside a Slurm allocation of
// other nodes (sbatch -N 2, salloc on a login node) runs on the
// allocation's nodes, as Hydra and Open MPI's mpirun run it: it ran on
// this machine alone, one rank without -n, and exited 0. An allocation
// of this node alone, --bootstrap fork, or no allocation leave it here.
func TestSlurmAllocationDetected(t *testing.T) {
	pmid, _ := buildBinaries(t)
	log := fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-2]")
	t.Setenv("SLURM_NTASKS", "4")
	t.Setenv("SLURMD_NODENAME", "")
	os.Unsetenv("SLURMD_NODENAME")
	for _, c := range []struct {
		name      string
		jobID     string
		nodeName  string
		bootstrap string
		want      string
	}{
		{"batch script", "7", "n1", "", "0:0 1:0 2:1 3:1"},
		{"salloc on a login node", "7", "", "", "0:0 1:0 2:1 3:1"},
		{"allocation of this node", "7", "n1", "fork", "0: 1: 2: 3:"},
		{"no allocation", "", "", "", "0:"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Setenv("SLURM_JOB_ID", c.jobID)
			t.Setenv("SLURMD_NODENAME", c.nodeName)
			os.Remove(log)
			var stdout, stderr syncbuf.Buffer
			cfg := Config{Bootstrap: c.bootstrap, Prog: "sh", Args: []string{"-c", `echo "$PMI_RANK:$SLURM_NODEID"`},
				PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
			if c.bootstrap == "fork" {
				cfg.Size = 4
			}
			err := Run(context.Background(), cfg)
			lines := strings.Fields(stdout.String())
			sort.Strings(lines)
			if got := strings.Join(lines, " "); err != nil || got != c.want {
				t.Errorf("%s, %v; want %s\nstderr:\n%s", got, err, c.want, stderr.String())
			}
			_, err = os.Stat(log)
			if srun := err == nil; srun != strings.Contains(c.want, ":1") {
				t.Errorf("srun ran: %v", srun)
			}
		})
	}
	// An allocation of this node alone: the job is forked here.
	t.Setenv("SLURM_JOB_ID", "7")
	t.Setenv("SLURM_JOB_NODELIST", "n1")
	t.Setenv("SLURMD_NODENAME", "n1")
	if c := (Config{}); c.inSlurmAllocation() {
		t.Error("an allocation of this node alone: slurm bootstrap")
	}
	t.Setenv("SLURMD_NODENAME", "")
	t.Setenv("SLURM_JOB_NODELIST", "localhost")
	if c := (Config{}); c.inSlurmAllocation() {
		t.Error("an allocation of localhost alone: slurm bootstrap")
	}
	if c := (Config{Hosts: []string{"a"}}); c.inSlurmAllocation() {
		t.Error("hosts given: slurm bootstrap")
	}
}

// The agents' srun step gets pmirun's environment whatever
// SLURM_EXPORT_ENV says: 'sbatch --export=NONE' sets it to NONE for the
// batch script, where srun then starts its tasks with the SLURM_*
// variables alone, so the ranks lost the PATH, LD_LIBRARY_PATH and
// module settings the script had made for pmirun.
func TestSlurmExportsEnvironment(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-2]")
	t.Setenv("SLURM_EXPORT_ENV", "NONE")
	t.Setenv("JOB_SETTING", "from-the-script")
	var stdout, stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "slurm", Size: 2, Prog: "/bin/sh", Args: []string{"-c", `echo "$PMI_RANK:$JOB_SETTING"`},
		PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
	err := Run(context.Background(), cfg)
	lines := strings.Fields(stdout.String())
	sort.Strings(lines)
	if got, want := strings.Join(lines, " "), "0:from-the-script 1:from-the-script"; err != nil || got != want {
		t.Errorf("%s, %v; want %s\nstderr:\n%s", got, err, want, stderr.String())
	}
}

// The agents' srun step runs unbound (--cpu-bind=none), as Open MPI's
// daemons' srun and other per-node daemons run: under task/affinity srun
// bound each agent, a task of one CPU, to that CPU, and with it every
// rank it forked (and -bind-to spread them over that one CPU), however
// many CPUs the job holds on the node.
func TestSlurmAgentsUnbound(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-2]")
	b, err := os.ReadFile("/proc/self/status")
	mine := regexp.MustCompile(`(?m)^Cpus_allowed_list:\s*(\S+)$`).FindSubmatch(b)
	if err != nil || mine == nil {
		t.Fatalf("no Cpus_allowed_list: %v", err)
	}
	var stdout, stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "slurm", Size: 2, Prog: "/bin/sh", Args: []string{"-c", `sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status`},
		PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
	err = Run(context.Background(), cfg)
	if got, want := strings.Fields(stdout.String()), []string{string(mine[1]), string(mine[1])}; err != nil || !slices.Equal(got, want) {
		t.Errorf("the ranks may use CPUs %q, %v; want %q, pmirun's\nstderr:\n%s", got, err, want, stderr.String())
	}
}

// Under Slurm every node's agent is fed the job's input (--input=all),
// and srun holds only so much of it that a task has not read: the agents
// of the other nodes read none, so an input of more than a few pipes
// (pmirun ... < data) stopped after the first 64 KiB here, and rank 0
// waited for the rest until the job's timeout. They now read it and let
// it go.
func TestSlurmLargeStdin(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
	const size = 4 << 20
	var stdout, stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "slurm", Size: 3, Prog: "/bin/sh", Args: []string{"-c", `if [ "$PMI_RANK" = 0 ]; then wc -c; fi`},
		Stdin: bytes.NewReader(make([]byte, size)), PmidPath: pmid, RootAddr: "127.0.0.1",
		Stdout: &stdout, Stderr: &stderr, Timeout: 20 * time.Second}
	start := time.Now()
	err := Run(context.Background(), cfg)
	if got := strings.TrimSpace(stdout.String()); err != nil || got != strconv.Itoa(size) {
		t.Errorf("rank 0 read %q bytes (%v after %v), want %d\nstderr:\n%s", got, err, time.Since(start).Round(time.Millisecond), size, stderr.String())
	}
}

// A host that is this machine among others (-hosts $(hostname),b) gets
// its agent started here, as Hydra starts its local host's proxy: it was
// started over ssh to this machine, which fails where no sshd runs here
// ('ssh: connect to host ... port 22: Connection refused').
func TestSSHThisMachineStartsHere(t *testing.T) {
	pmid, _ := buildBinaries(t)
	log := fakeTool(t, "ssh")
	me, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	for _, here := range []string{me, "localhost", "127.0.0.1"} {
		os.Remove(log)
		var stdout, stderr syncbuf.Buffer
		cfg := Config{Bootstrap: "ssh", Hosts: []string{here, "beta"}, Size: 2, Prog: "/bin/sh", Args: []string{"-c", `echo "$PMI_RANK"`},
			PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
		err := Run(context.Background(), cfg)
		lines := strings.Fields(stdout.String())
		sort.Strings(lines)
		b, _ := os.ReadFile(log)
		if err != nil || strings.Join(lines, " ") != "0 1" || string(b) != "beta\n" {
			t.Errorf("-hosts %s,beta: ranks %q, %v; ssh to %q, want beta alone\nstderr:\n%s", here, lines, err, b, stderr.String())
		}
	}
}

// The agents' step names its CPUs per task itself: srun from Slurm 23.11
// refuses a step that does not, where the batch script's
// SLURM_CPUS_PER_TASK (sbatch -c 2) and SLURM_TRES_PER_TASK differ
// ('srun: fatal: cpus_per_task set by two different environment
// variables'), so every hybrid MPI+threads job failed to start.
func TestSlurmCPUsPerTaskOwn(t *testing.T) {
	pmid, _ := buildBinaries(t)
	fakeTool(t, "srun")
	t.Setenv("SLURM_JOB_NODELIST", "n[1-2]")
	t.Setenv("SLURM_CPUS_PER_TASK", "2")
	t.Setenv("SLURM_TRES_PER_TASK", "cpu:1")
	var stdout, stderr syncbuf.Buffer
	cfg := Config{Bootstrap: "slurm", Size: 2, Prog: "/bin/sh", Args: []string{"-c", `echo "$PMI_RANK:$SLURM_CPUS_PER_TASK"`},
		PmidPath: pmid, RootAddr: "127.0.0.1", Stdout: &stdout, Stderr: &stderr, Timeout: time.Minute}
	err := Run(context.Background(), cfg)
	lines := strings.Fields(stdout.String())
	sort.Strings(lines)
	// The ranks still see the script's setting (OMP_NUM_THREADS from it).
	if got, want := strings.Join(lines, " "), "0:2 1:2"; err != nil || got != want {
		t.Errorf("%s, %v; want %s\nstderr:\n%s", got, err, want, stderr.String())
	}
}
