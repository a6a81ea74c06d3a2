package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// MPMD command lines ("prog A : -n 3 prog B"): one world, appnum per
// command (MPI_APPNUM through MPICH's PMI-1 client, appnum through
// Slurm's libpmi2 and the Go client), per-command -env and -wdir, and C
// and Go programs mixed in one job; on one node and on loopback agents.
func TestMPMD(t *testing.T) {
	t.Run("mpich", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "2", prog("mpi_appnum"), "X", ":", "-n", "3", prog("mpi_appnum"), "Y"}})
		r.wantCode(t, 0)
		want := map[string]int{}
		for rank := 0; rank < 5; rank++ {
			app, arg := 0, "X"
			if rank >= 2 {
				app, arg = 1, "Y"
			}
			want[fmt.Sprintf("appnum rank %d size 5 appnum %d arg %s sum 3", rank, app, arg)]++
		}
		r.wantLines(t, want)
	})
	apps := "0,0,1,1,1,2"
	mixed := func(rank int) string {
		app, arg := 0, "C"
		switch {
		case rank >= 5:
			app, arg = 2, "C2"
		case rank >= 2:
			app, arg = 1, "Go"
		}
		return fmt.Sprintf("appnum rank %d size 6 appnum %d arg %s apps %s", rank, app, arg, apps)
	}
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"mixed/fork", nil},
		{"mixed/loopback", []string{"--bootstrap", "loopback", "--nodes", "2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(tc.args, "-n", "2", prog("pmi2_appnum"), "C", ":", "-n", "3", prog("spawnprog"), "-appnum", "Go",
				":", prog("pmi2_appnum"), "C2")
			r := run(t, job{args: args, markAgents: len(tc.args) > 0})
			r.wantCode(t, 0)
			r.wantRankLines(t, 6, mixed)
		})
	}
	t.Run("env-wdir", func(t *testing.T) {
		dir := t.TempDir()
		r := run(t, job{args: []string{"-n", "1", "/bin/sh", "-c", "echo first $MPMD_K $(pwd)", ":",
			"-env", "MPMD_K", "second", "-wdir", dir, "/bin/sh", "-c", "echo second $MPMD_K $(pwd)"}})
		r.wantCode(t, 0)
		r.wantLines(t, map[string]int{"first " + mustCwd(t): 1, "second second " + dir: 1})
	})
	t.Run("refused", func(t *testing.T) {
		r := run(t, job{args: []string{"-n", "1", prog("mpi_appnum"), ":", "--timeout", "3", prog("mpi_appnum")}})
		r.wantCode(t, 2)
		if !strings.Contains(r.stderr, "MPMD command 1") {
			t.Errorf("the refusal does not name the segment\n%s", r)
		}
	})
}

// mustCwd is the test's working directory (pmirun's, and its ranks').
func mustCwd(t *testing.T) string {
	t.Helper()
	d, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return d
}
