package cli

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/launch"
)

// Every spelling of an option sets the same field, with one or two dashes
// and with the value after "=".
func TestParseSpellings(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "4", "prog"}, {"--n", "4", "prog"}, {"-np", "4", "prog"}, {"--np=4", "prog"},
		{"--ntasks", "4", "prog"}, {"-ntasks=4", "prog"},
	} {
		cfg, err := Parse(args)
		if err != nil || cfg.Size != 4 || cfg.Prog != "prog" {
			t.Errorf("Parse(%q) = size %d prog %q, %v; want 4, prog", args, cfg.Size, cfg.Prog, err)
		}
	}
}

// Hydra's -launcher-exec (and -bootstrap-exec) name the command that
// starts agents over ssh, as --ssh does: it was an unknown option.
func TestParseLauncherExec(t *testing.T) {
	for _, flag := range []string{"--ssh", "-launcher-exec", "--launcher-exec", "-bootstrap-exec"} {
		cfg, err := Parse([]string{flag, "/opt/ssh/bin/ssh -F cfg", "-hosts", "a", "p"})
		if err != nil || cfg.SSH != "/opt/ssh/bin/ssh -F cfg" {
			t.Errorf("%s: ssh command %q, %v", flag, cfg.SSH, err)
		}
	}
}

func TestParseJob(t *testing.T) {
	_, err := Parse([]string{"-n", "3", "-l", "-genv", "A", "1", "-genv", "B=2", "--env", "C=3",
		"-wdir", "/tmp", "--timeout", "1.5", "-i", "all", "-hosts", "a:2,b", "-f", "/dev/null.missing", "x"})
	if err == nil || !strings.Contains(err.Error(), "hostfile") {
		t.Fatalf("missing hostfile: got %v, want an error naming the hostfile", err)
	}
	cfg, err := Parse([]string{"-n", "3", "-l", "-genv", "A", "1", "-genv", "B=2", "--env", "C=3",
		"-wdir", "/tmp", "--timeout", "1.5", "-i", "all", "-hosts", "a:2,b", "-bind-to", "core", "prog", "-n", "9", "--env"})
	if err != nil {
		t.Fatal(err)
	}
	want := launch.Config{
		Size: 3, Label: true, Env: []string{"A=1", "B=2", "C=3"}, Wdir: "/tmp", Timeout: 1500 * time.Millisecond,
		StdinRank: launch.StdinAll, Hosts: []string{"a", "b"}, Slots: []int{2, 0}, Bind: "core",
		UniverseSize: -1, Prog: "prog", Args: []string{"-n", "9", "--env"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("got  %+v\nwant %+v", cfg, want)
	}
}

// Bare numbers are seconds; Go durations work too.
func TestParseDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{"1": time.Second, "0.25": 250 * time.Millisecond, "2m": 2 * time.Minute, "0": 0} {
		cfg, err := Parse([]string{"--timeout", in, "p"})
		if err != nil || cfg.Timeout != want {
			t.Errorf("--timeout %s = %v, %v; want %v", in, cfg.Timeout, err, want)
		}
	}
}

// MPIEXEC_TIMEOUT, mpiexec's time limit in seconds, is the job's
// --timeout when the command line gives none; --timeout wins over it,
// and a value that is no duration is refused, naming the variable.
func TestParseTimeoutFromEnvironment(t *testing.T) {
	t.Setenv("MPIEXEC_TIMEOUT", "30")
	if cfg, err := Parse([]string{"-n", "2", "p"}); err != nil || cfg.Timeout != 30*time.Second {
		t.Errorf("MPIEXEC_TIMEOUT=30: timeout %v, %v; want 30s", cfg.Timeout, err)
	}
	for in, want := range map[string]time.Duration{"5": 5 * time.Second, "0": 0} {
		if cfg, err := Parse([]string{"--timeout", in, "p"}); err != nil || cfg.Timeout != want {
			t.Errorf("MPIEXEC_TIMEOUT=30 --timeout %s: timeout %v, %v; want %v", in, cfg.Timeout, err, want)
		}
	}
	t.Setenv("MPIEXEC_TIMEOUT", "")
	if cfg, err := Parse([]string{"p"}); err != nil || cfg.Timeout != 0 {
		t.Errorf("MPIEXEC_TIMEOUT empty: timeout %v, %v; want none", cfg.Timeout, err)
	}
	t.Setenv("MPIEXEC_TIMEOUT", "soon")
	if _, err := Parse([]string{"p"}); err == nil || !strings.Contains(err.Error(), "invalid MPIEXEC_TIMEOUT=soon in the environment") {
		t.Errorf("MPIEXEC_TIMEOUT=soon: %v, want it refused", err)
	}
	if _, err := Parse([]string{"--timeout", "1", "p"}); err != nil {
		t.Errorf("MPIEXEC_TIMEOUT=soon --timeout 1: %v, want the option to win", err)
	}
}

// Bad command lines give one line naming the option, never a usage dump.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-n", "2", "--np", "3", "p"}, "option -n given twice (as -n and --np)"},
		{[]string{"-l", "-l", "p"}, "option -l given twice"},
		{[]string{"-n", "0", "p"}, "invalid -n 0"},
		{[]string{"--tree-width", "0", "p"}, "invalid --tree-width 0"},
		{[]string{"--net-timeout", "1ns", "p"}, "want at least 1s"},
		{[]string{"--timeout", "soon", "p"}, "invalid --timeout soon"},
		{[]string{"--timeout", "-1", "p"}, "invalid --timeout -1"},
		{[]string{"--bogus", "p"}, "unknown option --bogus"},
		{[]string{"-n"}, "option -n needs a value"},
		{[]string{"-genv", "A"}, "option -genv needs a value"},
		{[]string{"-l=1", "p"}, "option -l takes no value"},
		{[]string{"--env", "NOVALUE", "p"}, "want KEY=VALUE"},
		{[]string{"-hosts", "a:0", "p"}, "SLOTS at least 1"},
		{[]string{"-hosts", "a,,b", "p"}, "empty host name"},
		{[]string{"-i", "some", "p"}, "want a rank number, all or none"},
		{[]string{"-genvall", "-genvnone", "p"}, "excludes -genvall"},
		{[]string{"-n", "2"}, "no program given"},
		{[]string{"--usize", "0", "p"}, "invalid --usize 0"},
	} {
		_, err := Parse(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("Parse(%q) = %v, want one line containing %q", c.args, err, c.want)
		}
	}
}

// Hydra's -env K V before the first program (one dash) is the first
// command's, as a segment's -env, and wins over -genv; --env K=V stays
// every rank's and takes one word.
func TestParseLocalEnv(t *testing.T) {
	cfg, err := Parse([]string{"-n", "2", "-env", "A", "x y", "-genv", "A", "g", "-env=B=2", "prog", "arg"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Prog != "prog" || fmt.Sprint(cfg.Args) != "[arg]" || fmt.Sprint(cfg.Env) != "[A=g A=x y B=2]" {
		t.Errorf("single command: prog %q args %q env %q; want prog, [arg], [A=g A=x y B=2]", cfg.Prog, cfg.Args, cfg.Env)
	}
	cfg, err = Parse([]string{"-n", "1", "-env", "A", "1", "--env", "G=1", "./a", ":", "-n", "1", "./b"})
	if err != nil {
		t.Fatal(err)
	}
	want := []node.App{{Prog: "./a", Args: []string{}, Size: 1, Env: []string{"A=1"}}, {Prog: "./b", Args: []string{}, Size: 1}}
	if fmt.Sprint(cfg.Apps) != fmt.Sprint(want) || fmt.Sprint(cfg.Env) != "[G=1]" {
		t.Errorf("MPMD: apps %+v env %q; want %+v, [G=1]", cfg.Apps, cfg.Env, want)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-env", "A"}, "option -env A needs a value"},
		{[]string{"-env"}, "option -env needs a value"},
		{[]string{"-env", "=1", "p"}, `invalid -env "=1"`},
		{[]string{"-env", "A", "1", "-configfile", "/dev/null"}, "-configfile gives each command its -env"},
	} {
		_, err := Parse(c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want an error containing %q", c.args, err, c.want)
		}
	}
}

// MPMD command lines: the options before the first program are the
// run's (-n the first command's), each later segment takes -n, -env and
// -wdir; mistakes name the segment.
func TestParseMPMD(t *testing.T) {
	cfg, err := Parse([]string{"-n", "2", "--label", "./a", "A", ":", "-np", "3", "-env", "K", "V", "-wdir", "/tmp", "./b", "B1", "B2", ":", "--env=X=1", "./c"})
	if err != nil {
		t.Fatal(err)
	}
	want := []node.App{
		{Prog: "./a", Args: []string{"A"}, Size: 2},
		{Prog: "./b", Args: []string{"B1", "B2"}, Size: 3, Env: []string{"K=V"}, Wdir: "/tmp"},
		{Prog: "./c", Args: []string{}, Size: 1, Env: []string{"X=1"}},
	}
	if cfg.Size != 6 || cfg.Prog != "" || !cfg.Label || fmt.Sprint(cfg.Apps) != fmt.Sprint(want) {
		t.Errorf("Parse: size %d prog %q label %v apps %+v; want 6, no prog, label, %+v", cfg.Size, cfg.Prog, cfg.Label, cfg.Apps, want)
	}
	cf := filepath.Join(t.TempDir(), "cmds")
	if err := os.WriteFile(cf, []byte("# the two commands\n-n 2 ./a A\n\n-np 3 -env K V -wdir /tmp ./b B1 B2\n-env X=1 ./c\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err = Parse([]string{"--label", "-configfile", cf})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Size != 6 || !cfg.Label || fmt.Sprint(cfg.Apps) != fmt.Sprint(want) {
		t.Errorf("Parse -configfile: size %d apps %+v; want 6, %+v", cfg.Size, cfg.Apps, want)
	}
	for _, args := range [][]string{
		{"-configfile", cf, "./x"},
		{"-n", "2", "-configfile", cf},
		{"-configfile", "/nonexistent/cmds"},
		{":", "./b"},
		{"-n", "1", "./a", ":"},
		{"-n", "1", "./a", ":", "-n", "0", "./b"},
		{"-n", "1", "./a", ":", "-n", "1", "-n", "2", "./b"},
		{"-n", "1", "./a", ":", "--timeout", "3", "./b"},
		{"-n", "1", "./a", ":", "-n", "2"},
		{"-n", "1", "./a", ":", "./b", ":"},
	} {
		if _, err := Parse(args); err == nil {
			t.Errorf("Parse(%q) accepted a bad MPMD command line", args)
		}
	}
}

func TestParseHelpVersion(t *testing.T) {
	for _, a := range []string{"-h", "--help", "-help"} {
		if _, err := Parse([]string{a}); !errors.Is(err, ErrHelp) {
			t.Errorf("%s: %v, want ErrHelp", a, err)
		}
	}
	if _, err := Parse([]string{"--version"}); !errors.Is(err, ErrVersion) {
		t.Errorf("--version: %v", err)
	}
}

// --help shows every option once, in its group, the groups in order, with
// examples and every exit code.
func TestUsage(t *testing.T) {
	var b bytes.Buffer
	Usage(&b)
	out := b.String()
	last := -1
	for _, g := range Groups {
		i := strings.Index(out, "\n"+groupTitle(g)+":\n")
		if i < 0 || i < last {
			t.Errorf("group %q missing or out of order", g)
		}
		last = i
	}
	for _, f := range Flags() {
		if strings.Count(out, spellings(f)) != 1 {
			t.Errorf("option %q not shown exactly once", spellings(f))
		}
		if f.Help == "" || f.Group == "" || !slicesContains(Groups, f.Group) {
			t.Errorf("option %v: no help or unknown group %q", f.Names, f.Group)
		}
	}
	for _, l := range strings.Split(out, "\n") {
		if len(l) > 80 && !strings.HasPrefix(l, "  "+"-") {
			t.Errorf("help line of %d columns: %q", len(l), l)
		}
	}
	for _, s := range []string{"examples:", "exit codes:", "126", "127", "124"} {
		if !strings.Contains(out, s) {
			t.Errorf("help lacks %q", s)
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// A hostfile holds a host a line, HOST:SLOTS or Open MPI's HOST
// slots=SLOTS, comments and blank lines. Anything else after a host is
// refused, naming the line (it was dropped, so "n3 slots=2" gave n3 one
// slot).
func TestParseHostfile(t *testing.T) {
	path := t.TempDir() + "/hosts"
	os.WriteFile(path, []byte("# the cluster\nn1:4\n\n  n2   # no slots\nn3 slots=2\r\n"), 0o644)
	for _, flag := range []string{"-f", "-hostfile", "-machinefile", "--hostfile"} {
		cfg, err := Parse([]string{flag, path, "p"})
		if err != nil || !reflect.DeepEqual(cfg.Hosts, []string{"n1", "n2", "n3"}) || !reflect.DeepEqual(cfg.Slots, []int{4, 0, 2}) {
			t.Errorf("%s: hosts %v slots %v, %v", flag, cfg.Hosts, cfg.Slots, err)
		}
	}
	for text, want := range map[string]string{
		"n1:zero\n":            `host "n1:zero"`,
		"n1\nn2:2 extra\n":     `line 2: "extra" after the host`,
		"n1 4\n":               `line 1: "4" after the host`,
		"n1:2 slots=3\n":       `line 1: "slots=3" after the host`,
		"n1 slots=2 slots=3\n": `line 1: "slots=3" after the host`,
		"n1 max_slots=8\n":     `line 1: "max_slots=8" after the host`,
	} {
		os.WriteFile(path, []byte(text), 0o644)
		if _, err := Parse([]string{"-f", path, "p"}); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("hostfile %q: %v, want an error with %q", text, err, want)
		}
	}
}

// An IPv6 address is a host, as it is or in brackets with its slots
// ([ADDRESS]:SLOTS), on -hosts and in a hostfile; it was refused
// ('host "fd00::1": want HOST or HOST:SLOTS with SLOTS at least 1'). A
// host starting with '-' is refused: ssh took it for one of its options
// (-oProxyCommand=... runs a command on this machine). So is one with
// blanks or separators inside (ssh: 'hostname contains invalid
// characters', after the agent was started); blanks around it go.
func TestParseHostsIPv6AndDash(t *testing.T) {
	cfg, err := Parse([]string{"-hosts", "fd00::1,[fd00::2]:3,[fe80::1%eth0],n1:2", "p"})
	if err != nil || !reflect.DeepEqual(cfg.Hosts, []string{"fd00::1", "fd00::2", "fe80::1%eth0", "n1"}) || !reflect.DeepEqual(cfg.Slots, []int{0, 3, 0, 2}) {
		t.Errorf("-hosts: hosts %q slots %v, %v", cfg.Hosts, cfg.Slots, err)
	}
	// Blanks around a host are dropped ("a, b" is a and b, not " b").
	cfg, err = Parse([]string{"-hosts", "a, b:2 ,c", "p"})
	if err != nil || !reflect.DeepEqual(cfg.Hosts, []string{"a", "b", "c"}) || !reflect.DeepEqual(cfg.Slots, []int{0, 2, 0}) {
		t.Errorf("-hosts with blanks: hosts %q slots %v, %v", cfg.Hosts, cfg.Slots, err)
	}
	path := t.TempDir() + "/hosts"
	os.WriteFile(path, []byte("fd00::1\nfd00::2 slots=4\n[fd00::3]:2\n[fd00::4] slots=5\n"), 0o644)
	cfg, err = Parse([]string{"-f", path, "p"})
	if err != nil || !reflect.DeepEqual(cfg.Hosts, []string{"fd00::1", "fd00::2", "fd00::3", "fd00::4"}) || !reflect.DeepEqual(cfg.Slots, []int{0, 4, 2, 5}) {
		t.Errorf("hostfile: hosts %q slots %v, %v", cfg.Hosts, cfg.Slots, err)
	}
	for _, tc := range []struct{ hosts, want string }{
		{"fd00::1:4x", `host "fd00::1:4x": want HOST or HOST:SLOTS (an IPv6 address with slots in brackets`},
		{"[fd00::1]:0", `host "[fd00::1]:0": want HOST or HOST:SLOTS with SLOTS at least 1`},
		{"[fd00::1", `host "[fd00::1": want [IPV6ADDRESS] or [IPV6ADDRESS]:SLOTS`},
		{"[n1]:2", `host "[n1]:2": want [IPV6ADDRESS]`},
		{"[fd00::1]x", `host "[fd00::1]x": want [IPV6ADDRESS]`},
		{"n1,-oProxyCommand=touch x", `host "-oProxyCommand=touch x": a host name cannot start with '-'`},
		{"-n1:2", `host "-n1": a host name cannot start with '-'`},
		{"a,b;c", `host "b;c": a host name holds no blanks`},
		{"a,b c:2", `host "b c": a host name holds no blanks`},
		{"a,b\x01", `host "b\x01": a host name holds no blanks`},
	} {
		if _, err := Parse([]string{"-hosts", tc.hosts, "p"}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("-hosts %s: %v, want an error with %q", tc.hosts, err, tc.want)
		}
	}
	os.WriteFile(path, []byte("[fd00::1]:2 slots=3\n"), 0o644)
	if _, err := Parse([]string{"-f", path, "p"}); err == nil || !strings.Contains(err.Error(), `line 1: "slots=3" after the host`) {
		t.Errorf("hostfile [fd00::1]:2 slots=3: %v", err)
	}
}
