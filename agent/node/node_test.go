package node

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestBaseEnvDropsLauncherVariables(t *testing.T) {
	t.Setenv("PMI_PORT", "stale:1")
	t.Setenv("PMIX_NAMESPACE", "other")
	t.Setenv("MPI_LOCALRANKID", "9")
	t.Setenv("FASTPMI_KEEP", "yes")
	spec := &Spec{Size: 3, JobID: "j", Env: []string{"A=b c"}}
	env := baseEnv(spec, 3)
	joined := "\n" + strings.Join(env, "\n") + "\n"
	for _, bad := range []string{"PMI_PORT=", "PMIX_NAMESPACE=", "MPI_LOCALRANKID=9"} {
		if strings.Contains(joined, "\n"+bad) {
			t.Errorf("environment keeps %s", bad)
		}
	}
	for _, good := range []string{"FASTPMI_KEEP=yes", "PMI_FD=3", "PMI_SIZE=3", "PMI_JOBID=j", "MPI_LOCALNRANKS=3", "A=b c"} {
		if !strings.Contains(joined, "\n"+good+"\n") {
			t.Errorf("environment lacks %s", good)
		}
	}
}

// Ranks of an agent started over ssh get pmirun's environment, keeping
// this machine's and session's own variables, and pmirun's working
// directory; the agent's own process environment and directory stay as
// they are (a daemon serving several jobs cannot change them).
func TestLauncherEnvironmentForRanks(t *testing.T) {
	t.Setenv("SSH_CONNECTION", "10.0.0.1 5000 10.0.0.2 22")
	t.Setenv("HOSTNAME", "remote")
	t.Setenv("LOGIN_ONLY", "x")
	wd, _ := os.Getwd()
	spec := &Spec{Wdir: t.TempDir(), LauncherEnv: []string{
		"PATH=/launcher/bin", "JOB_VAR=a=b", "HOSTNAME=launcher", "SSH_CONNECTION=launcher", "=bad", "noequals"}}
	env := spec.launchEnv()
	for k, want := range map[string]string{
		"PATH": "/launcher/bin", "JOB_VAR": "a=b", "HOSTNAME": "remote",
		"SSH_CONNECTION": "10.0.0.1 5000 10.0.0.2 22", "PWD": spec.Wdir, "LOGIN_ONLY": "",
	} {
		if got := getEnv(env, k); got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	if os.Getenv("LOGIN_ONLY") != "x" || os.Getenv("HOSTNAME") != "remote" {
		t.Error("the agent's own environment changed")
	}
	if now, _ := os.Getwd(); now != wd {
		t.Errorf("the agent's working directory changed to %s", now)
	}
}

// The program is found relative to the job's working directory and on
// the ranks' PATH, not the agent's.
func TestLookProg(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{filepath.Join(dir, "prog"), filepath.Join(bin, "tool")} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "data"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	env := []string{"PATH=/nonexistent:" + bin}
	for _, tc := range []struct {
		prog, want string
		ok         bool
	}{
		{"./prog", filepath.Join(dir, "prog"), true},
		{"tool", filepath.Join(bin, "tool"), true},
		{"prog", "", false}, // not on PATH
		{"./data", "", false},
		{"./missing", "", false},
		{"bin", "", false},
	} {
		got, err := lookProg(tc.prog, dir, env)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("lookProg(%q) = %q, %v; want %q ok=%v", tc.prog, got, err, tc.want, tc.ok)
		}
	}
}

// A spawned job's spec names its parent's rank only with its parent's
// job, and never a negative one.
func TestSpecSpawner(t *testing.T) {
	for _, c := range []struct {
		job  string
		rank int
		ok   bool
	}{{"", 0, true}, {"job-0", 0, true}, {"job-0", 3, true}, {"job-0", -1, false}, {"", 3, false}} {
		s := Spec{JobID: "job-0-1", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Virtual: "ring",
			TreeWidth: 8, NetTimeout: 1e9, KillGrace: 1e9, DisconnectGrace: 1e9,
			SpawnerJobID: c.job, SpawnerRank: c.rank}
		if err := s.Validate(); (err == nil) != c.ok {
			t.Errorf("spawner %q rank %d: %v, want ok %v", c.job, c.rank, err, c.ok)
		}
	}
}

// A spec's timer slack is auto, off, or a duration up to MaxTimerSlack;
// a node sets DefaultTimerSlack under auto only where it runs more ranks
// than CPUs.
func TestTimerSlack(t *testing.T) {
	for _, c := range []struct {
		slack time.Duration
		ok    bool
	}{{TimerSlackAuto, true}, {TimerSlackOff, true}, {time.Microsecond, true}, {MaxTimerSlack, true},
		{MaxTimerSlack + 1, false}, {-2, false}} {
		s := Spec{JobID: "job-0", Size: 1, Nodes: [][]int{{0}}, Usize: -1, Virtual: "ring",
			TreeWidth: 8, NetTimeout: 1e9, KillGrace: 1e9, DisconnectGrace: 1e9, TimerSlack: c.slack}
		if err := s.Validate(); (err == nil) != c.ok {
			t.Errorf("timer slack %v: %v, want ok %v", c.slack, err, c.ok)
		}
	}
	for _, c := range []struct {
		ask   time.Duration
		over  bool
		slack time.Duration
	}{
		{TimerSlackAuto, false, 0}, {TimerSlackAuto, true, DefaultTimerSlack},
		{TimerSlackOff, false, 0}, {TimerSlackOff, true, 0},
		{3 * time.Millisecond, false, 3 * time.Millisecond}, {3 * time.Millisecond, true, 3 * time.Millisecond},
	} {
		if got := rankSlack(c.ask, c.over); got != c.slack {
			t.Errorf("rankSlack(%v, oversubscribed %v) = %v, want %v", c.ask, c.over, got, c.slack)
		}
	}
}

// %h names a node as the run names it for its ranks when the launcher
// named the run's nodes, else by this machine's host name.
func TestHostName(t *testing.T) {
	if h := hostName(Options{Index: 1, Hosts: []string{"vm-0", "vm-1"}}); h != "vm-1" {
		t.Errorf("node 1 of a named run: %q, want vm-1", h)
	}
	if h, want := hostName(Options{}), mustHostname(t); h != want {
		t.Errorf("a node of an unnamed run: %q, want this machine's %q", h, want)
	}
}

func mustHostname(t *testing.T) string {
	t.Helper()
	h, err := os.Hostname()
	if err != nil {
		t.Fatal(err)
	}
	return h
}
