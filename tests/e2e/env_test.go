package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// rankEnv runs `env` (and the target of PMI_FD) in every rank with -l and
// returns each rank's variables.
func rankEnv(t *testing.T, size int, callerEnv []string, pmirunArgs ...string) []map[string]string {
	t.Helper()
	args := append([]string{"-n", n(size), "-l"}, pmirunArgs...)
	args = append(args, "sh", "-c", `env; echo "PMI_FD_TARGET=$(readlink /proc/$$/fd/$PMI_FD)"`)
	r := run(t, job{args: args, env: callerEnv})
	r.wantCode(t, 0)
	envs := make([]map[string]string, size)
	for i := range envs {
		envs[i] = map[string]string{}
	}
	label := regexp.MustCompile(`^\[(\d+)\] ([^=]*)=(.*)$`)
	for _, l := range lines(r.stdout) {
		m := label.FindStringSubmatch(l)
		if m == nil {
			continue // a multi-line value of some variable
		}
		rank, _ := strconv.Atoi(m[1])
		if rank >= size {
			t.Fatalf("line labelled with rank %d in a job of %d: %q", rank, size, l)
		}
		envs[rank][m[2]] = m[3]
	}
	return envs
}

func TestRankEnvironment(t *testing.T) {
	const size = 3
	envs := rankEnv(t, size,
		[]string{"FASTPMI_CALLER_VAR=from caller", "PMI_RANK=99", "PMI_FD=77", "PMI_SIZE=1000", "MPI_LOCALRANKID=9"},
		"--env", "FOO=bar", "--env", "SPACED=a b=c", "--env", "FASTPMI_CALLER_VAR=overridden")
	jobid := envs[0]["PMI_JOBID"]
	if jobid == "" {
		t.Errorf("rank 0 has no PMI_JOBID")
	}
	for rank, env := range envs {
		want := map[string]string{
			"PMI_RANK":           n(rank),
			"PMI_SIZE":           n(size),
			"PMI_JOBID":          jobid,
			"MPI_LOCALNRANKS":    n(size),
			"MPI_LOCALRANKID":    n(rank),
			"FOO":                "bar",
			"SPACED":             "a b=c",
			"FASTPMI_CALLER_VAR": "overridden",
		}
		for k, v := range want {
			if got, ok := env[k]; !ok || got != v {
				t.Errorf("rank %d: %s=%q (set: %v), want %q", rank, k, got, ok, v)
			}
		}
		if fd, err := strconv.Atoi(env["PMI_FD"]); err != nil || fd < 0 || fd == 77 {
			t.Errorf("rank %d: PMI_FD=%q, want the number of an inherited descriptor", rank, env["PMI_FD"])
		}
		if !strings.HasPrefix(env["PMI_FD_TARGET"], "socket:") {
			t.Errorf("rank %d: PMI_FD %s is %q, want an open socket", rank, env["PMI_FD"], env["PMI_FD_TARGET"])
		}
		for k := range env {
			if strings.HasPrefix(k, "PMIX_") {
				t.Errorf("rank %d: pmirun set %s", rank, k)
			}
		}
	}

	// The caller's own variables pass through when --env does not set them.
	envs = rankEnv(t, 1, []string{"FASTPMI_CALLER_VAR=from caller"})
	if got := envs[0]["FASTPMI_CALLER_VAR"]; got != "from caller" {
		t.Errorf("caller's FASTPMI_CALLER_VAR reached the rank as %q, want %q", got, "from caller")
	}
}

// A PMIx variable inherited from the caller would make MPICH abort beside
// PMI_SIZE (mpich#7957); pmirun drops them (README, "Environment of each
// rank").
func TestRankEnvironmentDropsPMIx(t *testing.T) {
	envs := rankEnv(t, 2, []string{"PMIX_NAMESPACE=stale", "PMIX_RANK=5", "PMIX_FOO=1"})
	for rank, env := range envs {
		for k := range env {
			if strings.HasPrefix(k, "PMIX_") {
				t.Errorf("rank %d inherited %s=%s", rank, k, env[k])
			}
		}
		if env["PMI_RANK"] != n(rank) {
			t.Errorf("rank %d: PMI_RANK=%q", rank, env["PMI_RANK"])
		}
	}
}

// --trace writes a Chrome trace with events of every rank.
func TestTrace(t *testing.T) {
	const size = 3
	path := filepath.Join(t.TempDir(), "trace.json")
	r := run(t, job{args: []string{"-n", n(size), "--trace", path, prog("mpi_hello")}})
	r.wantCode(t, 0)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("no trace file: %v\n%s", err, r)
	}
	var trace struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Ts   *float64       `json:"ts"`
			Pid  *int           `json:"pid"`
			Tid  *int           `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(data, &trace); err != nil {
		t.Fatalf("trace is not valid JSON: %v\n%.400s", err, data)
	}
	if trace.TraceEvents == nil {
		t.Fatalf("trace has no traceEvents array:\n%.400s", data)
	}
	// Each rank is a thread named "rank R" (metadata) with events of its own.
	tidOf := map[int]int{}
	events := map[int]int{}
	for _, e := range trace.TraceEvents {
		if e.Ph == "" || e.Pid == nil {
			t.Errorf("event without ph or pid: %+v", e)
			continue
		}
		if e.Ph == "M" {
			if e.Name == "thread_name" && e.Tid != nil {
				if name, _ := e.Args["name"].(string); strings.HasPrefix(name, "rank ") {
					if rank, err := strconv.Atoi(strings.TrimPrefix(name, "rank ")); err == nil {
						tidOf[rank] = *e.Tid
					}
				}
			}
			continue
		}
		if e.Ts == nil {
			t.Errorf("event without ts: %+v", e)
		}
		if e.Tid != nil {
			events[*e.Tid]++
		}
	}
	for rank := 0; rank < size; rank++ {
		tid, ok := tidOf[rank]
		if !ok {
			t.Errorf("trace names no thread \"rank %d\"", rank)
			continue
		}
		if events[tid] == 0 {
			t.Errorf("trace has no events for rank %d (tid %d)", rank, tid)
		}
	}
	if _, ok := tidOf[size]; ok {
		t.Errorf("trace names a thread \"rank %d\" in a job of %d", size, size)
	}
}

// --verbose prints a start-up summary on stderr.
func TestVerbose(t *testing.T) {
	r := run(t, job{args: []string{"--verbose", "-n", "2", prog("mpi_hello")}})
	r.wantCode(t, 0)
	r.wantMessage(t, `startup: 2 ranks forked in \d`)
	// On several nodes the summary has the nodes' figures too (it said
	// "forked in -" without --trace).
	r = run(t, job{args: []string{"--verbose", "--bootstrap", "loopback", "--nodes", "2", "-n", "4", prog("mpi_hello")}})
	r.wantCode(t, 0)
	r.wantMessage(t, `startup: 4 ranks forked in \d`)

	r = run(t, job{args: []string{"-n", "2", prog("mpi_hello")}})
	r.wantCode(t, 0)
	if strings.Contains(r.stderr, "startup:") {
		t.Errorf("start-up summary printed without --verbose\n%s", r)
	}
}

// Every rank leads a session and a process group of its own (as under
// Hydra): the launcher signals the group, and where the kernel schedules
// by session (autogroup) each rank is a group of its own; no rank has a
// controlling terminal. Each rank prints its pid, process group and
// session from /proc (the fields after the command's closing parenthesis).
func TestRankSession(t *testing.T) {
	r := run(t, job{args: []string{"-n", "3", "-l", "sh", "-c",
		`s=$(cat /proc/$$/stat); s=${s##*) }; set -- $s; echo "pid=$$ pgrp=$3 sid=$4 tty=$5"`}})
	r.wantCode(t, 0)
	re := regexp.MustCompile(`^\[(\d)\] pid=(\d+) pgrp=(\d+) sid=(\d+) tty=(-?\d+)$`)
	seen := map[string]bool{}
	for _, l := range lines(r.stdout) {
		m := re.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("unexpected line %q\n%s", l, r)
		}
		seen[m[1]] = true
		if m[2] != m[3] || m[2] != m[4] {
			t.Errorf("rank %s: pid %s, process group %s, session %s: want one number\n%s", m[1], m[2], m[3], m[4], r)
		}
		if m[5] != "0" {
			t.Errorf("rank %s has a controlling terminal (tty_nr %s)", m[1], m[5])
		}
	}
	if len(seen) != 3 {
		t.Errorf("%d ranks reported, want 3\n%s", len(seen), r)
	}
}
