package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/sys"
)

// MPICH (PMI-1) programs under pmirun.

func TestMPIAllreduce(t *testing.T) {
	for _, size := range []int{1, 2, 4, 8, 16, 32} {
		t.Run(fmt.Sprintf("N=%d", size), func(t *testing.T) {
			r := run(t, job{args: []string{"-n", n(size), prog("mpi_allreduce")}, timeout: 120 * time.Second})
			r.wantCode(t, 0)
			r.wantAllreduce(t, size)
		})
	}
}

// wantLines fails the test unless stdout holds exactly the lines of want,
// each as often as want says, in any order.
func (r result) wantLines(t *testing.T, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for _, l := range lines(r.stdout) {
		got[l]++
	}
	for l, c := range want {
		if got[l] != c {
			t.Errorf("stdout has %d lines %q, want %d\n%s", got[l], l, c, r)
			return
		}
	}
	for l := range got {
		if want[l] == 0 {
			t.Errorf("unexpected stdout line %q\n%s", l, r)
			return
		}
	}
}

func TestMPIHello(t *testing.T) {
	r := run(t, job{args: []string{"-n", "4", "--env", "FASTPMI_HELLO_VERBOSE=1", prog("mpi_hello")}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 4, func(rank int) string { return fmt.Sprintf("hello from rank %d of 4", rank) })

	// Silent without the variable: the benchmark workload prints nothing.
	r = run(t, job{args: []string{"-n", "3", prog("mpi_hello")}})
	r.wantCode(t, 0)
	if r.stdout != "" {
		t.Errorf("mpi_hello printed on stdout without FASTPMI_HELLO_VERBOSE\n%s", r)
	}
}

// MPI_Abort(7) ends the job with code 7 and kills every other rank (they
// sleep for 60 s otherwise); run checks that none survives.
func TestMPIAbort(t *testing.T) {
	for _, tc := range []struct{ size, victim int }{{4, 1}, {2, 0}, {3, 2}} {
		t.Run(fmt.Sprintf("N=%d/rank%d", tc.size, tc.victim), func(t *testing.T) {
			r := run(t, job{args: []string{"-n", n(tc.size), prog("mpi_abort"), n(tc.victim)}, timeout: 30 * time.Second})
			r.wantCode(t, 7)
			r.wantFaster(t, 10*time.Second)
			r.wantMessage(t, fmt.Sprintf(`\brank %d\b`, tc.victim))
			if strings.Contains(r.stderr, "was not killed") {
				t.Errorf("a rank outlived the abort\n%s", r)
			}
		})
	}
}

// Publish / lookup / unpublish go through pmirun's name service; the
// program checks the values and that a lookup after unpublish fails.
func TestMPIPublishLookup(t *testing.T) {
	for _, size := range []int{2, 4} {
		t.Run(fmt.Sprintf("N=%d", size), func(t *testing.T) {
			r := run(t, job{args: []string{"-n", n(size), prog("mpi_pubname")}, timeout: 60 * time.Second})
			r.wantCode(t, 0)
			r.wantRankLines(t, size, func(rank int) string { return fmt.Sprintf("pubname ok rank %d", rank) })
		})
	}
}

// Arguments after the program reach every rank byte for byte, including
// spaces, empty ones and ones that look like pmirun options.
func TestMPIArgs(t *testing.T) {
	args := []string{"a b", "c  d", "", "x=y", "'q'", "tab\there", "-n", "--label", "*", "$HOME", " lead", "trail "}
	var expect strings.Builder
	var line strings.Builder
	for _, a := range args {
		expect.WriteString(a + "\x1f")
		line.WriteString(" [" + a + "]")
	}
	r := run(t, job{
		args: append([]string{"-n", "3", prog("mpi_args")}, args...),
		env:  []string{"EXPECT_ARGS=" + expect.String()},
	})
	r.wantCode(t, 0)
	r.wantRankLines(t, 3, func(rank int) string { return fmt.Sprintf("rank %d:%s", rank, line.String()) })

	// No arguments at all stays no arguments.
	r = run(t, job{args: []string{"-n", "2", prog("mpi_args")}, env: []string{"EXPECT_ARGS="}})
	r.wantCode(t, 0)
	r.wantRankLines(t, 2, func(rank int) string { return fmt.Sprintf("rank %d:", rank) })
}

// A rank that exits with a non-zero code after MPI_Finalize fails the
// job with its code, and the other ranks, which work on after finalize
// (writing their results), finish: as under Hydra, nothing is killed.
// On one machine and across loopback agents.
func TestMPIExitAfterFinalize(t *testing.T) {
	for _, tc := range []struct {
		name string
		j    job
	}{
		{"fork", job{args: []string{"-n", "3", prog("mpi_finexit"), "1", "3"}, timeout: 30 * time.Second}},
		{"loopback", loopbackJob(2, "net", "-n", "3", prog("mpi_finexit"), "1", "3")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, tc.j)
			r.wantCode(t, 3)
			r.wantMessage(t, `^pmirun: rank 1 (on node 0 \(\S+\) )?exited with code 3 after PMI finalize$`)
			r.wantLines(t, map[string]int{"results rank 0": 1, "results rank 2": 1})
		})
	}
}

// A placement PMI_process_mapping cannot represent in 1,024 bytes (hundreds
// of nodes of uneven rank counts) leaves the attribute absent, as Hydra
// does: MPICH then finds the nodes itself. It was served empty, which
// MPICH reads as a broken mapping: MPI_Init failed ('unable to populate
// node ids from PMI_process_mapping', exit 16). Real MPICH ranks on an
// agent whose mapping is "", the case such a placement gives it.
func TestMPICHUnrepresentableMapping(t *testing.T) {
	const size = 2
	a, err := agent.New(agent.Config{JobID: "unmapped", Size: size, Local: []int{0, 1}, Mapping: ""})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cmds []*exec.Cmd
	var outs []*bytes.Buffer
	for r := range size {
		agentEnd, rankEnd, err := sys.Socketpair("pmi")
		if err != nil {
			t.Fatal(err)
		}
		ac, err := net.FileConn(agentEnd)
		agentEnd.Close()
		if err != nil {
			rankEnd.Close()
			t.Fatal(err)
		}
		if err := a.Serve(r, ac); err != nil {
			rankEnd.Close()
			t.Fatal(err)
		}
		var out bytes.Buffer
		cmd := exec.CommandContext(ctx, prog("mpi_hello"))
		cmd.ExtraFiles = []*os.File{rankEnd} // fd 3
		cmd.Env = append(callerEnv(nil), "PMI_FD=3", fmt.Sprintf("PMI_RANK=%d", r), fmt.Sprintf("PMI_SIZE=%d", size),
			"FASTPMI_HELLO_VERBOSE=1")
		cmd.Stdout, cmd.Stderr = &out, &out
		err = cmd.Start()
		rankEnd.Close()
		if err != nil {
			t.Fatal(err)
		}
		cmds, outs = append(cmds, cmd), append(outs, &out)
	}
	for r, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("rank %d: %v\n%s", r, err, outs[r])
			continue
		}
		if want := fmt.Sprintf("hello from rank %d of %d\n", r, size); outs[r].String() != want {
			t.Errorf("rank %d said %q, want %q", r, outs[r], want)
		}
	}
}
