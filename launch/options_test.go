package launch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// Options the job would otherwise ignore, and bad multi-node values
// whatever the bootstrap, are refused by validate with a message naming
// the option.
func TestValidateRefuses(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{Size: 2, Prog: "p", Hosts: []string{"a"}, Bootstrap: "fork"}, "hosts (-hosts, -hostfile) are for --bootstrap ssh or netns, not fork"},
		{Config{Size: 2, Prog: "p", Hosts: []string{"a"}, Bootstrap: "loopback", Nodes: 2}, "not loopback"},
		{Config{Size: 2, Prog: "p", Hosts: []string{"a"}, Daemons: []string{"a:1"}, SecretFile: "s"}, "excludes -hosts"},
		{Config{Size: 2, Prog: "p", Nodes: 2}, "--nodes is the number of agents of --bootstrap loopback"},
		{Config{Size: 2, Prog: "p", Cyclic: true}, "--cyclic places ranks over several nodes"},
		{Config{Size: 4, Prog: "p", PPN: 2}, "-ppn 2 places 4 ranks on more than one node"},
		{Config{Size: 2, Prog: "p", Codec: "lz4"}, `invalid --compress "lz4"`},
		{Config{Size: 2, Prog: "p", NetBackend: "rdma"}, `invalid --netio "rdma"`},
		{Config{Size: 2, Prog: "p", NetTimeout: time.Nanosecond}, "invalid --net-timeout 1ns"},
		{Config{Size: 2, Prog: "p", TreeWidth: -1}, "invalid tree width"},
		{Config{Size: 2, Prog: "p", Bind: "numa"}, `invalid -bind-to "numa"`},
		{Config{Size: 2, Prog: "p", MapBy: "socket"}, "-map-by socket orders the ranks' CPU binding: it needs -bind-to"},
		{Config{Size: 2, Prog: "p", StdinRank: 2}, "invalid -i/--stdin 2: the job has ranks 0..1"},
		{Config{Size: 2, Prog: "p", StdinRank: StdinAll, Bootstrap: "loopback", Nodes: 2}, "--stdin all needs a job on one node"},
		{Config{Size: 2, Prog: "p", Label: true, PrefixPattern: "%r"}, "-prepend-pattern excludes -l"},
		{Config{Size: 2, Prog: "p", PrefixPattern: "%q"}, "unknown %q"},
		{Config{Size: 2, Prog: "p", OutPattern: "out.txt"}, "needs %r"},
		{Config{Size: 2, Prog: "p", ErrPattern: "err.%t"}, "unknown %t"},
		{Config{Size: 2, Prog: "p", Wdir: "/nonexistent/dir"}, "invalid -wdir /nonexistent/dir: no such directory"},
		{Config{Size: 2, Prog: "p", Wdir: "/etc/passwd"}, "invalid -wdir /etc/passwd: not a directory"},
		{Config{Size: 2, Apps: []node.App{{Prog: "p", Size: 1}, {Prog: "q", Size: 1, Wdir: "/nonexistent/dir"}}},
			"MPMD command 1 (q): invalid -wdir /nonexistent/dir: no such directory"},
		{Config{Size: 2, Wdir: "/", Apps: []node.App{{Prog: "p", Size: 1, Wdir: "etc/passwd"}, {Prog: "q", Size: 1}}},
			"MPMD command 0 (p): invalid -wdir etc/passwd: not a directory"},
		{Config{Size: 2, Prog: "p", Hosts: []string{"a", "b"}, Slots: []int{1}}, "1 slot counts for 2 hosts"},
		{Config{Size: 2, Prog: "p", TracePath: "/nonexistent/t.json"}, "invalid --trace /nonexistent/t.json: cannot write in /nonexistent: no such file or directory"},
		{Config{Size: 2, Prog: "p", ReportPath: os.TempDir()}, "invalid --report " + os.TempDir() + ": " + os.TempDir() + " is a directory"},
		{Config{Size: 2, Prog: "p", TracePath: "j.json", ReportPath: "./j.json"}, "--trace and --report name the same file"},
		{Config{Size: 1000000, Prog: "p"}, "-n 1000000: no shared segment for so many ranks"},
	} {
		err := c.cfg.validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("validate(%+v) = %v, want %q", c.cfg, err, c.want)
		}
	}
}

// Hosts without a bootstrap start agents over ssh, as Hydra does, unless
// every one is this machine: then the job is forked here, without ssh;
// one node's -ppn that holds every rank is fine.
func TestValidateHostsMeanSSH(t *testing.T) {
	c := Config{Size: 2, Prog: "p", Hosts: []string{"a", "b"}}
	if err := c.validate(); err != nil || c.Bootstrap != "ssh" {
		t.Errorf("hosts without --bootstrap: bootstrap %q, %v; want ssh", c.Bootstrap, err)
	}
	host, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	for _, hosts := range [][]string{{"localhost"}, {"LOCALHOST", host, "127.0.0.1"}} {
		c = Config{Size: 4, Prog: "p", Hosts: hosts, Slots: make([]int, len(hosts))}
		if err := c.validate(); err != nil || !c.nodeInProcess() || c.Hosts != nil || c.Slots != nil {
			t.Errorf("hosts %v, all this machine: bootstrap %q, hosts %v, slots %v, %v; want the fork bootstrap", hosts, c.Bootstrap, c.Hosts, c.Slots, err)
		}
	}
	c = Config{Size: 2, Prog: "p", Hosts: []string{"localhost", "a"}}
	if err := c.validate(); err != nil || c.Bootstrap != "ssh" {
		t.Errorf("hosts localhost and a: bootstrap %q, %v; want ssh", c.Bootstrap, err)
	}
	c = Config{Size: 4, Prog: "p", PPN: 4}
	if err := c.validate(); err != nil {
		t.Errorf("-ppn 4 -n 4 on one node: %v", err)
	}
}

// A host named several times in a row is one node with the slots of all
// of them, as Hydra makes it (a machinefile with a line per core, as
// PBS's): -hosts a,a,b -n 4 runs ranks 0, 1, 3 on a and 2 on b, a host
// named again later is another node, and -n defaults to the slots. Each
// had an agent of its own, so MPI saw ranks of one host on several nodes.
func TestRepeatedHostsMerge(t *testing.T) {
	for _, c := range []struct {
		hosts []string
		slots []int
		size  int
		want  string // hosts:slots after validate
		ranks [][]int
	}{
		{[]string{"a", "a", "b"}, nil, 4, "[a b] [2 0]", [][]int{{0, 1, 3}, {2}}},
		{[]string{"a", "a", "b", "b"}, nil, 0, "[a b] [2 2]", [][]int{{0, 1}, {2, 3}}},
		{[]string{"a", "a", "b"}, []int{2, 0, 0}, 0, "[a b] [3 0]", [][]int{{0, 1, 2}, {3}}},
		{[]string{"a", "b", "a"}, nil, 3, "[a b a] [0 0 0]", [][]int{{0}, {1}, {2}}},
		{[]string{"a", "b"}, []int{0, 0}, 4, "[a b] [0 0]", [][]int{{0, 1}, {2, 3}}},
	} {
		cfg := Config{Size: c.size, Prog: "p", Bootstrap: "ssh", Hosts: c.hosts, Slots: c.slots}
		if c.slots == nil {
			cfg.Slots = make([]int, len(c.hosts))
		}
		if err := cfg.validate(); err != nil {
			t.Errorf("hosts %v, slots %v: %v", c.hosts, c.slots, err)
			continue
		}
		if got := fmt.Sprint(cfg.Hosts, " ", cfg.Slots); got != c.want {
			t.Errorf("hosts %v, slots %v: %s, want %s", c.hosts, c.slots, got, c.want)
		}
		m, err := placement(cfg, len(cfg.Hosts))
		if err != nil {
			t.Errorf("hosts %v, slots %v: %v", c.hosts, c.slots, err)
			continue
		}
		got := make([][]int, m.Nodes())
		for n := range got {
			got[n] = m.Ranks(n)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.ranks) {
			t.Errorf("hosts %v, slots %v, -n %d: ranks %v, want %v", c.hosts, c.slots, c.size, got, c.ranks)
		}
	}
}

// Without -n a job runs a rank for every slot of its nodes, as Hydra
// does (HOST:SLOTS, 1 a host without, or -ppn a node; this machine alone
// is one node), and under Slurm as many as srun would: SLURM_NTASKS, else
// one a node (it was one rank, refused on more than one node).
func TestUnsaidSize(t *testing.T) {
	t.Setenv("SLURM_JOB_NODELIST", "n[1-4]")
	t.Setenv("SLURM_NTASKS", "")
	for _, c := range []struct {
		cfg    Config
		ntasks string // SLURM_NTASKS
		want   int
	}{
		{Config{Hosts: []string{"a", "b", "c"}, Slots: []int{2, 0, 3}}, "", 6},
		{Config{Hosts: []string{"a", "b", "c"}}, "", 3},
		{Config{Hosts: []string{"a", "b"}, PPN: 2}, "", 4},
		{Config{Hosts: []string{"a", "b"}, Slots: []int{2, 3}, PPN: 1}, "", 2},
		{Config{Hosts: []string{"localhost"}, Slots: []int{3}}, "", 3},
		{Config{Bootstrap: "loopback", Nodes: 3}, "", 3},
		{Config{Bootstrap: "loopback", Nodes: 2, PPN: 4}, "", 8},
		{Config{Bootstrap: "slurm"}, "", 4},
		{Config{Bootstrap: "slurm"}, "6", 6},
		{Config{Bootstrap: "slurm", PPN: 2}, "6", 8},
		{Config{Daemons: []string{"127.0.0.1:1", "127.0.0.1:2"}, SecretFile: "s"}, "", 2},
		{Config{}, "", 1},
		{Config{PPN: 3}, "", 3},
		{Config{Size: 5, Hosts: []string{"a", "b"}}, "", 5},
	} {
		t.Setenv("SLURM_NTASKS", c.ntasks)
		cfg := c.cfg
		cfg.Prog = "p"
		if err := cfg.validate(); err != nil || cfg.Size != c.want {
			t.Errorf("-n %d, hosts %v, slots %v, -ppn %d, bootstrap %q, nodes %d, daemons %v, SLURM_NTASKS %q: %d ranks, %v; want %d",
				c.cfg.Size, c.cfg.Hosts, c.cfg.Slots, c.cfg.PPN, c.cfg.Bootstrap, c.cfg.Nodes, c.cfg.Daemons, c.ntasks, cfg.Size, err, c.want)
		}
	}
}

// Without slots or --ppn, ranks are spread evenly in blocks of
// consecutive ranks, the first nodes one more (as srun does): 4 ranks on
// 3 nodes is 2, 1, 1 (it was refused: ceil(4/3) per node left node 2
// empty).
func TestPlacementSpreadsEvenly(t *testing.T) {
	for _, c := range []struct {
		size, k int
		want    [][]int
	}{
		{4, 3, [][]int{{0, 1}, {2}, {3}}},
		{10, 4, [][]int{{0, 1, 2}, {3, 4, 5}, {6, 7}, {8, 9}}},
		{6, 2, [][]int{{0, 1, 2}, {3, 4, 5}}},
	} {
		m, err := placement(Config{Size: c.size}, c.k)
		if err != nil {
			t.Fatalf("%d ranks on %d nodes: %v", c.size, c.k, err)
		}
		for n, want := range c.want {
			if !slices.Equal(m.Ranks(n), want) {
				t.Errorf("%d ranks on %d nodes: node %d has %v, want %v", c.size, c.k, n, m.Ranks(n), want)
			}
		}
	}
}

// A job of fewer ranks than its hosts runs on the hosts its ranks fill,
// as Hydra and srun run it (-hosts a,b,c -n 2 on a and b; -hosts a:3,b
// -n 3 on a; -ppn 2 -hosts a,b,c -n 4 on a and b); it was refused. The
// loopback bootstrap's --nodes N still asks for N nodes with ranks.
func TestPlacementFewerRanksThanHosts(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		k    int
		want [][]int
	}{
		{Config{Size: 2, Bootstrap: "ssh"}, 3, [][]int{{0}, {1}}},
		{Config{Size: 3, Bootstrap: "ssh", Slots: []int{3, 0}}, 2, [][]int{{0, 1, 2}}},
		{Config{Size: 4, Bootstrap: "ssh", PPN: 2}, 3, [][]int{{0, 1}, {2, 3}}},
		{Config{Size: 2, Bootstrap: "slurm", Cyclic: true}, 4, [][]int{{0}, {1}}},
		{Config{Size: 1, Bootstrap: "netns"}, 2, [][]int{{0}}},
	} {
		m, err := placement(c.cfg, c.k)
		if err != nil {
			t.Errorf("%d ranks on %d %s nodes (slots %v, -ppn %d): %v", c.cfg.Size, c.k, c.cfg.Bootstrap, c.cfg.Slots, c.cfg.PPN, err)
			continue
		}
		got := make([][]int, m.Nodes())
		for n := range got {
			got[n] = m.Ranks(n)
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%d ranks on %d %s nodes (slots %v, -ppn %d): %v, want %v", c.cfg.Size, c.k, c.cfg.Bootstrap, c.cfg.Slots, c.cfg.PPN, got, c.want)
		}
	}
	for _, cfg := range []Config{{Size: 2, Bootstrap: "loopback"}, {Size: 4, Bootstrap: "loopback", PPN: 2}} {
		if _, err := placement(cfg, 3); err == nil || !strings.Contains(err.Error(), "of --nodes 3 without a rank") {
			t.Errorf("%d ranks, -ppn %d, --nodes 3: %v, want node 2 without a rank refused", cfg.Size, cfg.PPN, err)
		}
	}
}

// HOST:SLOTS fills each host with its slots, host after host, starting
// over while ranks remain; unsaid slots count 1. With --cyclic the hosts
// take a rank each in turn while they have slots free (--cyclic was
// ignored with slots: the ranks went in blocks).
func TestSlotPlacement(t *testing.T) {
	for _, c := range []struct {
		size   int
		slots  []int
		cyclic bool
		want   [][]int
	}{
		{7, []int{2, 0, 3}, false, [][]int{{0, 1, 6}, {2}, {3, 4, 5}}},
		{7, []int{2, 0, 3}, true, [][]int{{0, 3, 6}, {1}, {2, 4, 5}}},
		{4, []int{2, 2}, true, [][]int{{0, 2}, {1, 3}}},
		{6, []int{3, 1}, true, [][]int{{0, 2, 3, 4}, {1, 5}}},
	} {
		if got := slotPlacement(c.size, c.slots, c.cyclic); fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("%d ranks on slots %v, cyclic %v: %v, want %v", c.size, c.slots, c.cyclic, got, c.want)
		}
	}
	cfg := Config{Size: 7, Slots: []int{2, 0, 3}}
	if m, err := placement(cfg, 3); err != nil || !slices.Equal(m.Ranks(0), []int{0, 1, 6}) {
		t.Errorf("placement with slots: %v, %v", m, err)
	}
	cfg.Cyclic = true
	if m, err := placement(cfg, 3); err != nil || !slices.Equal(m.Ranks(0), []int{0, 3, 6}) {
		t.Errorf("cyclic placement with slots: %v, %v", m, err)
	}
}

// run runs a job on this machine and returns its stdout and stderr.
func run(t *testing.T, cfg Config) (string, string, error) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cfg.Stdout, cfg.Stderr = &stdout, &stderr
	if cfg.Timeout == 0 {
		cfg.Timeout = 60 * time.Second
	}
	err := Run(context.Background(), cfg)
	return stdout.String(), stderr.String(), err
}

// -bind-to hwthread gives each rank one CPU of those pmirun may use, in
// order, as the rank itself reads from /proc/self/status; without
// -bind-to every rank may use all of them.
func TestBindToHwthread(t *testing.T) {
	cpus, err := sys.AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	n := len(cpus) + 1 // wraps around
	out, stderr, err := run(t, Config{Size: n, Prog: "sh", Bind: "hwthread", Label: true,
		Args: []string{"-c", "grep Cpus_allowed_list /proc/self/status"}})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for r := range n {
		want := "[" + strconv.Itoa(r) + "] Cpus_allowed_list:\t" + strconv.Itoa(cpus[r%len(cpus)]) + "\n"
		if !strings.Contains(out, want) {
			t.Errorf("rank %d not bound to cpu %d: want %q in\n%s", r, cpus[r%len(cpus)], want, out)
		}
	}
	out, _, err = run(t, Config{Size: 1, Prog: "sh", Args: []string{"-c", "grep Cpus_allowed_list /proc/self/status"}})
	own, _ := os.ReadFile("/proc/self/status")
	wantAll := regexp.MustCompile(`Cpus_allowed_list:\t.*\n`).FindString(string(own))
	if err != nil || out != wantAll {
		t.Errorf("unbound rank: %q, %v; want pmirun's own %q", out, err, wantAll)
	}
}

// --timer-slack: every rank of a node running more ranks than CPUs
// starts with 1 ms unless told otherwise, as the rank itself reads it
// from /proc/self/timerslack_ns; a node with a CPU per rank leaves the
// ranks pmirun's own, and a duration is set on every rank.
func TestTimerSlackOfRanks(t *testing.T) {
	cpus, err := sys.AllowedCPUs()
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile("/proc/self/timerslack_ns")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		size  int
		slack time.Duration
		want  string
	}{
		{len(cpus) + 1, node.TimerSlackAuto, "1000000\n"},
		{len(cpus), node.TimerSlackAuto, string(own)},
		{len(cpus) + 1, node.TimerSlackOff, string(own)},
		{1, 3 * time.Millisecond, "3000000\n"},
	} {
		out, stderr, err := run(t, Config{Size: c.size, Prog: "cat", Args: []string{"/proc/self/timerslack_ns"}, TimerSlack: c.slack})
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		if want := strings.Repeat(c.want, c.size); out != want {
			t.Errorf("%d ranks on %d CPUs, timer slack %v: ranks read %q, want %q", c.size, len(cpus), c.slack, out, want)
		}
	}
}

// -wdir sets the ranks' working directory and finds a relative program
// there.
func TestWdir(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "prog.sh"), []byte("#!/bin/sh\npwd\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, Config{Size: 2, Prog: "./prog.sh", Wdir: dir})
	if err != nil || out != dir+"\n"+dir+"\n" {
		t.Errorf("-wdir %s: %q, %v\n%s", dir, out, err, stderr)
	}
}

// -genvnone passes none of pmirun's environment, -genvlist only the
// named variables; -genv values and the PMI variables always.
func TestEnvNoneAndList(t *testing.T) {
	t.Setenv("FASTPMI_TEST_KEEP", "kept")
	t.Setenv("FASTPMI_TEST_DROP", "dropped")
	prog := "/usr/bin/env"
	out, stderr, err := run(t, Config{Size: 1, Prog: prog, EnvNone: true, Env: []string{"X=1"}})
	if err != nil || strings.Contains(out, "FASTPMI_TEST_") || strings.Contains(out, "PATH=") ||
		!strings.Contains(out, "X=1\n") || !strings.Contains(out, "PMI_RANK=0\n") {
		t.Errorf("-genvnone: %v\n%s%s", err, out, stderr)
	}
	out, stderr, err = run(t, Config{Size: 1, Prog: prog, EnvList: []string{"FASTPMI_TEST_KEEP"}})
	if err != nil || !strings.Contains(out, "FASTPMI_TEST_KEEP=kept\n") || strings.Contains(out, "FASTPMI_TEST_DROP") {
		t.Errorf("-genvlist: %v\n%s%s", err, out, stderr)
	}
	out, _, err = run(t, Config{Size: 1, Prog: prog})
	if err != nil || !strings.Contains(out, "FASTPMI_TEST_DROP=dropped\n") {
		t.Errorf("default (-genvall): %v\n%s", err, out)
	}
}

// Output prefixes: --tag-output names rank and host, --timestamp-output
// the time, -prepend-pattern anything of %r %h %t.
func TestOutputPrefixes(t *testing.T) {
	host, _ := os.Hostname()
	out, _, err := run(t, Config{Size: 2, Prog: "echo", Args: []string{"hi"}, TagOutput: true})
	if err != nil || !strings.Contains(out, "[0@"+host+"] hi\n") || !strings.Contains(out, "[1@"+host+"] hi\n") {
		t.Errorf("--tag-output: %q, %v", out, err)
	}
	out, _, err = run(t, Config{Size: 2, Prog: "echo", Args: []string{"hi"}, Label: true, Timestamp: true})
	stamp := regexp.MustCompile(`(?m)^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6} \[[01]\] hi$`)
	if err != nil || len(stamp.FindAllString(out, -1)) != 2 {
		t.Errorf("-l --timestamp-output: %q, %v", out, err)
	}
	out, _, err = run(t, Config{Size: 1, Prog: "echo", Args: []string{"hi"}, PrefixPattern: "<%r|%h|%%> "})
	if err != nil || out != "<0|"+host+"|%> hi\n" {
		t.Errorf("-prepend-pattern: %q, %v", out, err)
	}
}

// -outfile-pattern and -errfile-pattern write each rank's streams to its
// own file, relative to the working directory.
func TestOutputFiles(t *testing.T) {
	dir := t.TempDir()
	out, _, err := run(t, Config{Size: 2, Prog: "sh", Wdir: dir, OutPattern: "out.%r", ErrPattern: "err.%r",
		Args: []string{"-c", "echo o$PMI_RANK; echo e$PMI_RANK >&2"}})
	if err != nil || out != "" {
		t.Fatalf("%q, %v", out, err)
	}
	for r := range 2 {
		for _, s := range []string{"out", "err"} {
			b, err := os.ReadFile(filepath.Join(dir, s+"."+strconv.Itoa(r)))
			if want := s[:1] + strconv.Itoa(r) + "\n"; err != nil || string(b) != want {
				t.Errorf("%s.%d = %q, %v; want %q", s, r, b, err, want)
			}
		}
	}
	// A file that cannot be made ends the job with exit code 1 and says
	// why: not 127, which says the program is missing.
	_, stderr, err := run(t, Config{Size: 2, Prog: "true", Wdir: dir, OutPattern: "nodir/out.%r"})
	if code := ExitCode(err); code != 1 || !strings.Contains(stderr, "output file of rank 0: open "+dir+"/nodir/out.0: no such file or directory") {
		t.Errorf("output file in a missing directory: exit code %d, want 1\n%s", code, stderr)
	}
}

// --stdin RANK, all and none choose who reads pmirun's input.
func TestStdinChoice(t *testing.T) {
	for _, c := range []struct {
		rank int
		want []string
	}{
		{2, []string{"0:", "1:", "2:hello"}},
		{StdinAll, []string{"0:hello", "1:hello", "2:hello"}},
		{StdinNone, []string{"0:", "1:", "2:"}},
	} {
		out, _, err := run(t, Config{Size: 3, Prog: "sh", StdinRank: c.rank, Stdin: strings.NewReader("hello\n"),
			Args: []string{"-c", `read x; echo "$PMI_RANK:$x"`}})
		lines := strings.Split(strings.TrimSpace(out), "\n")
		slices.Sort(lines)
		if err != nil || !slices.Equal(lines, c.want) {
			t.Errorf("--stdin %d: %q, %v; want %q", c.rank, lines, err, c.want)
		}
	}
}

// A file that is there but is no program exits 126 (as shells do), one
// that is not there 127.
func TestExitCodesCannotExecute(t *testing.T) {
	dir := t.TempDir()
	garbage := filepath.Join(dir, "garbage")
	plain := filepath.Join(dir, "plain")
	os.WriteFile(garbage, []byte("\x01\x02 not a program"), 0o755)
	os.WriteFile(plain, []byte("#!/bin/sh\n"), 0o644)
	for prog, want := range map[string]int{garbage: 126, plain: 126, dir: 126, filepath.Join(dir, "missing"): 127, "no-such-program-anywhere": 127} {
		_, stderr, err := run(t, Config{Size: 2, Prog: prog})
		if ExitCode(err) != want || !strings.Contains(stderr, filepath.Base(prog)) {
			t.Errorf("%s: exit %d (%v), want %d; stderr %q", prog, ExitCode(err), err, want, stderr)
		}
	}
}

// A program not on the PATH is named once: the message said its name
// twice ('cannot run "prog": "prog": executable file not found in $PATH').
func TestProgramNotFoundNamedOnce(t *testing.T) {
	_, stderr, err := run(t, Config{Size: 2, Prog: "no-such-program-anywhere"})
	const want = "pmirun: cannot run \"no-such-program-anywhere\": executable file not found in $PATH\n"
	if ExitCode(err) != 127 || stderr != want {
		t.Errorf("exit %d, stderr %q; want 127, %q", ExitCode(err), stderr, want)
	}
}

// A script without "#!" runs under /bin/sh, as execvp (Hydra's
// mpiexec, a shell) runs it: every rank, with its arguments, from a
// relative path in -wdir; an MPMD command of such a script beside a
// program runs too.
func TestScriptWithoutShebang(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "noshebang")
	if err := os.WriteFile(script, []byte("echo \"rank $PMI_RANK of $PMI_SIZE: $1 ($0)\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, Config{Size: 3, Prog: "./noshebang", Args: []string{"a b"}, Wdir: dir})
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for r := range 3 {
		if want := fmt.Sprintf("rank %d of 3: a b (%s)\n", r, script); !strings.Contains(out, want) {
			t.Errorf("output %q lacks %q", out, want)
		}
	}
	out, stderr, err = run(t, Config{Size: 2, Apps: []node.App{{Prog: "echo", Args: []string{"first"}, Size: 1}, {Prog: script, Args: []string{"x"}, Size: 1}}})
	if err != nil || !strings.Contains(out, "first\n") || !strings.Contains(out, "rank 1 of 2: x") {
		t.Errorf("MPMD: %v, output %q\n%s", err, out, stderr)
	}
}

// An MPMD command's -env PATH DIR finds its bare program name on DIR, as
// its ranks' PATH (and Hydra) would; the other command keeps the job's.
func TestCommandPathFindsProgram(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "only-here"), []byte("#!/bin/sh\necho found $PMI_RANK\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := run(t, Config{Size: 2, Apps: []node.App{
		{Prog: "echo", Args: []string{"first"}, Size: 1},
		{Prog: "only-here", Size: 1, Env: []string{"PATH=" + dir}},
	}})
	if err != nil || !strings.Contains(out, "found 1\n") || !strings.Contains(out, "first\n") {
		t.Errorf("%v, output %q\n%s", err, out, stderr)
	}
}

// A script whose "#!" interpreter is missing (DOS line ends make it
// "/bin/sh\r") exits 127 naming the interpreter, not only "no such file"
// for the script that is there.
func TestMissingInterpreterNamed(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"crlf": "#!/bin/sh\r\necho hi\r\n", "gone": "#! /no/such/interp -x\necho hi\n"} {
		script := filepath.Join(dir, name)
		if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
		_, stderr, err := run(t, Config{Size: 2, Prog: script})
		want := map[string]string{"crlf": `its interpreter "/bin/sh\r" is not found`, "gone": `its interpreter "/no/such/interp" is not found`}[name]
		if ExitCode(err) != 127 || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit %d, stderr %q; want 127 and %q", name, ExitCode(err), stderr, want)
		}
	}
}

// startRecording starts a job of n ranks that record, on their stdout,
// every signal they receive (or, with ignoreIntTerm, ignore SIGINT and
// SIGTERM), and waits until each has set its traps. The job's signals go
// through sigs; done delivers Run's result.
func startRecording(t *testing.T, n int, ignoreIntTerm bool) (sigs chan os.Signal, out, errb *syncbuf.Buffer, done chan error) {
	script := `for s in INT TERM HUP QUIT USR1 USR2; do trap "echo got $s" $s; done; `
	if ignoreIntTerm {
		script = `trap '' INT TERM; `
	}
	script += `echo ready; while :; do sleep 0.05; done`
	// Catch the forwarded signals as pmirun's main does: the ranks then
	// start with their default dispositions even when this process was
	// started with some ignored (under nohup, or as a shell's background
	// job), which a shell rank could not trap.
	caught := make(chan os.Signal, 1)
	signal.Notify(caught, sys.ForwardedSignals...)
	t.Cleanup(func() { signal.Stop(caught) })
	sigs, out, errb, done = make(chan os.Signal, 8), &syncbuf.Buffer{}, &syncbuf.Buffer{}, make(chan error, 1)
	cfg := Config{Size: n, Prog: "sh", Label: true, Args: []string{"-c", script},
		Stdout: out, Stderr: errb, Signals: sigs, Timeout: 60 * time.Second}
	go func() { done <- Run(context.Background(), cfg) }()
	waitFor(t, out, "ready", n)
	return sigs, out, errb, done
}

// waitFor polls buf until it holds want n times.
func waitFor(t *testing.T, buf *syncbuf.Buffer, want string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for strings.Count(buf.String(), want) < n {
		if time.Now().After(deadline) {
			t.Fatalf("no %d × %q in 30s:\n%s", n, want, buf.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Every forwarded signal reaches every rank; SIGTERM then ends the job.
func TestSignalsForwarded(t *testing.T) {
	sigs, out, errb, done := startRecording(t, 3, false)
	for _, s := range []os.Signal{sys.SIGHUP, sys.SIGQUIT, sys.SIGUSR1, sys.SIGUSR2, sys.SIGINT, sys.SIGTERM} {
		sigs <- s
		name := strings.TrimPrefix(sys.SignalName(sys.SignalNumber(s)), "SIG")
		waitFor(t, out, "got "+name, 3)
	}
	sigs <- sys.SIGKILL // the recording ranks ignore nothing else
	err := <-done
	if ExitCode(err) != 128+9 {
		t.Errorf("exit %d (%v), want 137", ExitCode(err), err)
	}
	if !strings.Contains(errb.String(), "press Ctrl-C again within 5s to kill them") {
		t.Errorf("the first SIGINT did not say how to kill the ranks:\n%s", errb.String())
	}
}

// A second SIGINT within the window kills ranks that ignore SIGINT and
// SIGTERM; pmirun exits 130.
func TestSecondInterruptKills(t *testing.T) {
	sigs, _, errb, done := startRecording(t, 2, true)
	sigs <- sys.SIGINT
	sigs <- sys.SIGINT
	select {
	case err := <-done:
		if ExitCode(err) != 130 || !strings.Contains(errb.String(), "interrupted twice: killing every rank") {
			t.Errorf("exit %d (%v), want 130 and a message; stderr:\n%s", ExitCode(err), err, errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("ranks ignoring SIGINT and SIGTERM outlived a second Ctrl-C")
	}
}

// fullWriter fails every write, as /dev/full does.
type fullWriter struct{}

func (fullWriter) Write([]byte) (int, error) { return 0, errors.New("no space left on device") }

// Output that cannot be written is never lost in silence: the first
// failure is said on stderr at once, and a job that otherwise succeeded
// ends with exit code 1; a job that failed keeps its own code. Failing
// stderr, with nowhere to say it, still gives the exit code.
func TestOutputWriteFailure(t *testing.T) {
	for _, c := range []struct {
		script   string
		failErr  bool
		wantCode int
	}{
		{"echo hi", false, 1},
		{"echo hi; exit 3", false, 3},
		{"echo hi >&2", true, 1},
		{":", false, 0}, // nothing written, nothing failed
	} {
		var stdout io.Writer = fullWriter{}
		var stderr bytes.Buffer
		var errw io.Writer = &stderr
		if c.failErr {
			stdout, errw = io.Discard, fullWriter{}
		}
		err := Run(context.Background(), Config{Size: 2, Prog: "sh", Args: []string{"-c", c.script}, Stdout: stdout, Stderr: errw, Timeout: 30 * time.Second})
		if code := ExitCode(err); code != c.wantCode {
			t.Errorf("%q (stderr failing %v): exit code %d (%v), want %d", c.script, c.failErr, code, err, c.wantCode)
		}
		said := strings.Count(stderr.String(), "pmirun: cannot write the job's standard output (no space left on device): the ranks' output is being lost\n")
		if want := map[bool]int{true: 1, false: 0}[c.script == "echo hi" || c.script == "echo hi; exit 3"]; said != want {
			t.Errorf("%q: the failure said %d times, want %d:\n%s", c.script, said, want, stderr.String())
		}
	}
}

// --trace and --report through a link to one file are refused as the
// same path is: the report, renamed into place last, replaced the trace
// written through the link.
func TestValidateTraceReportSameFile(t *testing.T) {
	dir := t.TempDir()
	file, link := filepath.Join(dir, "out.json"), filepath.Join(dir, "link.json")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(file, link); err != nil {
		t.Fatal(err)
	}
	c := Config{Size: 1, Prog: "p", TracePath: link, ReportPath: file}
	if err := c.validate(); err == nil || !strings.Contains(err.Error(), "--trace and --report name the same file") {
		t.Errorf("--trace %s --report %s: %v, want them refused as one file", link, file, err)
	}
}
