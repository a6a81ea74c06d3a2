package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"
)

// hydra runs a program as n ranks under Hydra's mpiexec (Debian's MPICH
// ships it) and returns its stdout.
func hydra(t *testing.T, n int, argv ...string) string {
	t.Helper()
	mpiexec, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Fatalf("mpiexec.hydra not found (%v): %s", err, installHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpiexec, append([]string{"-n", fmt.Sprint(n)}, argv...)...)
	cmd.Env = callerEnv(nil)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("mpiexec -n %d %v: %v\n%s%s", n, argv, err, out, stderr)
	}
	return string(out)
}

// TestGoClientGetBeforeFence: Hydra's PMI-2 server ends the whole job on
// a kvs-get from a rank that has not fenced yet (mpiexec's "fn_kvs_get
// ... assert (idx != -1) failed"); under it the Go client refuses such a
// get itself, saying so, and the job goes on. Under pmirun the same gets
// are answered: not found, and the waiting ones (every rank waits) ended
// by the agent's deadlock check.
func TestGoClientGetBeforeFence(t *testing.T) {
	out := hydra(t, 2, prog("kvsprog"), "-pattern", "unfenced")
	for _, want := range []string{"kvsprog unfenced: get=refused wait=refused\n", "kvsprog ok: unfenced, 2 ranks\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("under Hydra: want %q in:\n%s", want, out)
		}
	}
	r := run(t, job{args: []string{"-n", "2", prog("kvsprog"), "-pattern", "unfenced"}})
	if want := "kvsprog unfenced: get=not-found wait=deadlock\n"; r.code != 0 || !strings.Contains(r.stdout, want) {
		t.Errorf("under pmirun: want exit 0 and %q\n%v", want, r)
	}
}

// Under Hydra the Go client learns the job's id (not "singleton"), and
// Ring and Allgather work (Hydra has neither: the client falls back to
// put/fence/get instead of making Hydra abort the job), the allgather
// with the largest binary value (it is cut into keys Hydra takes).
func TestGoClientUnderHydra(t *testing.T) {
	out := hydra(t, 4, prog("jobinfo"))
	re := regexp.MustCompile(`(?m)^jobinfo rank=(\d) size=4 jobid=(\S+) transport=pmi2 ring=(\d) left=v(\d) right=v(\d) allgather=ok$`)
	ms := re.FindAllStringSubmatch(out, -1)
	if len(ms) != 4 {
		t.Fatalf("want 4 jobinfo lines, got:\n%s", out)
	}
	for _, m := range ms {
		r, jobid := atoi(m[1]), m[2]
		if jobid == "singleton" || jobid != ms[0][2] {
			t.Errorf("rank %d: job id %q (rank 0's %q), want Hydra's job id on every rank", r, jobid, ms[0][2])
		}
		if atoi(m[3]) != r || atoi(m[4]) != (r+3)%4 || atoi(m[5]) != (r+1)%4 {
			t.Errorf("rank %d: ring position %s, left v%s, right v%s", r, m[3], m[4], m[5])
		}
	}
	// The example the README points at, unchanged, under Hydra.
	if out := hydra(t, 4, prog("hello")); !strings.Contains(out, "hello: 4 ranks over pmi2 verified allgather, ring") {
		t.Errorf("examples/hello under Hydra:\n%s", out)
	}
}

func atoi(s string) int {
	var n int
	fmt.Sscan(s, &n)
	return n
}

// The same program under pmirun: over shared memory, and over the text
// protocol, where fastpmi's allgather extension carries the binary values
// (hex-encoded, as the wire carries no NUL byte), on one node and two.
func TestGoClientBinaryAllgather(t *testing.T) {
	for _, c := range []struct {
		args      []string
		transport string
	}{
		{nil, "shm"},
		{[]string{"--no-shm"}, "pmi2"},
		{[]string{"--no-shm", "--bootstrap", "loopback", "--nodes", "2"}, "pmi2"},
	} {
		r := run(t, job{args: append(c.args, "-n", "4", prog("jobinfo"))})
		r.wantCode(t, 0)
		want := regexp.MustCompile(`(?m)^jobinfo rank=\d size=4 jobid=\S+ transport=` + c.transport + ` ring=\d left=v\d right=v\d allgather=ok$`)
		if got := len(want.FindAllString(r.stdout, -1)); got != 4 {
			t.Errorf("%v: %d of 4 ranks report the allgather of binary values\n%s", c.args, got, r)
		}
	}
}

// A put at the edges of PMI's limits: a 1024-byte value, a 64-byte key,
// a value holding a ';'. fastpmi's agent keeps all three, over shared
// memory and over the text protocol; Hydra's PMI-2 server would keep a
// 1023-byte prefix of the value, lose the key and cut the value at its
// ';', each time answering the put rc=0, so under Hydra the Go client
// refuses each put itself (the value with ErrTooLarge). kvsprog fails if
// a put it was not refused reads back other than it was put.
func TestGoClientPutEdges(t *testing.T) {
	want := "kvsprog edges: value1024=refused key64=refused semicolon=refused\n"
	if out := hydra(t, 2, prog("kvsprog"), "-pattern", "edges", "-fence"); !strings.Contains(out, want) {
		t.Errorf("under Hydra: want %q in\n%s", want, out)
	}
	want = "kvsprog edges: value1024=kept key64=kept semicolon=kept\n"
	for _, args := range [][]string{nil, {"--no-shm"}} {
		r := run(t, job{args: append(args, "-n", "2", prog("kvsprog"), "-pattern", "edges", "-fence")})
		r.wantCode(t, 0)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("want %q in\n%s", want, r)
		}
	}
}

// A rank may finalize with an Iallgather and an Ifence it has not waited
// for, and wait for them afterwards. Over the text protocol Finalize
// closed the PMI connection before their answers came: a Wait then read
// a closed connection, and under Hydra the proxy, writing the answer to
// that connection, ended the job (mpiexec exit 255, the ranks' output
// lost).
func TestGoClientFinalizeOutstanding(t *testing.T) {
	wantLines := func(t *testing.T, out string) {
		t.Helper()
		for r := range 3 {
			if want := fmt.Sprintf("kvsprog finalize: rank %d ok\n", r); !strings.Contains(out, want) {
				t.Errorf("want %q in\n%s", want, out)
			}
		}
	}
	wantLines(t, hydra(t, 3, prog("kvsprog"), "-pattern", "finalize"))
	for _, args := range [][]string{nil, {"--no-shm"}} {
		r := run(t, job{args: append(args, "-n", "3", prog("kvsprog"), "-pattern", "finalize")})
		r.wantCode(t, 0)
		wantLines(t, r.stdout)
	}
}

// A lookup and an unpublish of a name nobody published fail with
// ErrNotFound under Hydra too, whose name server refuses them with rc=1
// and no message or "service_<name>_not_found".
func TestGoClientNamesUnderHydra(t *testing.T) {
	if out := hydra(t, 2, prog("kvsprog"), "-pattern", "names"); !strings.Contains(out, "kvsprog ok: names, 2 ranks") {
		t.Errorf("under Hydra:\n%s", out)
	}
}

// A rank whose PMI_RANK is not one of the job's (a wrapper script's
// mistake) is refused at Init over shared memory, where the client takes
// its rank from the environment; it was rank 7 of 2.
func TestGoClientRankOutOfRange(t *testing.T) {
	r := run(t, job{args: []string{"-n", "2", "env", "PMI_RANK=7", prog("jobinfo")}})
	r.wantCode(t, 1)
	if want := "rank 7 (PMI_RANK) of 2 (PMI_SIZE)"; !strings.Contains(r.stderr, want) {
		t.Errorf("want %q on stderr\n%s", want, r)
	}
}

// A rank's Abort(7, ...) ends the job with exit code 7 under Hydra as
// under pmirun. Hydra's PMI-2 has no abort command: the one the client
// sent made mpiexec fail ('Unrecognized PMI command: abort', exit 255);
// it now sends PMI-1's, as MPICH's MPI_Abort does.
func TestGoClientAbortUnderHydra(t *testing.T) {
	mpiexec, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Fatalf("mpiexec.hydra not found (%v): %s", err, installHint)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, mpiexec, "-n", "2", prog("kvsprog"), "-pattern", "abort")
	cmd.Env = callerEnv(nil)
	out, err := cmd.CombinedOutput()
	if code := cmd.ProcessState.ExitCode(); code != 7 {
		t.Errorf("mpiexec exit code %d (%v), want 7\n%s", code, err, out)
	}
	r := run(t, job{args: []string{"--no-shm", "-n", "2", prog("kvsprog"), "-pattern", "abort"}})
	r.wantCode(t, 7)
}

// Under a launcher that sets no MPI_LOCALRANKID and MPI_LOCALNRANKS
// (Slurm's srun sets neither; here pmirun's ranks over PMI-2 with both
// unset) the Go client places the rank on its node from the job's
// PMI_process_mapping, as MPICH does: 5 ranks over 2 nodes in blocks
// are 3 and 2 local ranks, where Info said every rank shared one node.
func TestGoClientLocalRankFromMapping(t *testing.T) {
	r := run(t, job{args: []string{"--bootstrap", "loopback", "--nodes", "2", "--no-shm", "-n", "5",
		"env", "-u", "MPI_LOCALRANKID", "-u", "MPI_LOCALNRANKS", prog("kvsprog"), "-pattern", "local"}})
	r.wantCode(t, 0)
	for rank, want := range []string{"0 of 3", "1 of 3", "2 of 3", "0 of 2", "1 of 2"} {
		if line := fmt.Sprintf("kvsprog local: rank %d local %s\n", rank, want); !strings.Contains(r.stdout, line) {
			t.Errorf("want %q in\n%s", line, r)
		}
	}
}

// The Go client treats a segment as libfastpmi does (TestCLibBadSegment,
// TestCLibNoRankEnv): a foreign one, or one whose rank the environment
// does not say, is refused with the reason on stderr and the rank falls
// back to PMI-2 on its PMI_FD, keeping its own rank; FASTPMI_TRANSPORT=shm
// fails Init instead, =pmi2 ignores the segment. Before, a bad segment
// failed Init although PMI_FD could serve the rank, and a rank without
// PMI_RANK and MPI_LOCALRANKID took rank 0's place in the segment.
func TestGoClientSegmentFallback(t *testing.T) {
	foreign := segmentFile(t, []byte("not a fastpmi segment"), 1<<16)
	badSeg := []string{"/bin/sh", "-c", `exec 9<>"$0"; FASTPMI_SHM_FD=9 exec "$@"`, foreign, prog("jobinfo")}
	noRank := []string{"env", "-u", "PMI_RANK", "-u", "MPI_LOCALRANKID", prog("jobinfo")}
	for _, c := range []struct {
		name      string
		transport string
		argv      []string
		refusal   string // the reason said on each rank's fallback; "" = none
	}{
		{"foreign", "", badSeg, "bad magic"},
		{"norank", "", noRank, "PMI_RANK or MPI_LOCALRANKID is not set"},
		{"pmi2", "pmi2", []string{prog("jobinfo")}, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := run(t, job{args: append([]string{"--env", "FASTPMI_TRANSPORT=" + c.transport, "-n", "3"}, c.argv...)})
			r.wantCode(t, 0)
			for rank := range 3 {
				line := fmt.Sprintf("jobinfo rank=%d size=3 ", rank)
				if !strings.Contains(r.stdout, line) || strings.Count(r.stdout, "transport=pmi2") != 3 {
					t.Errorf("want %q and every rank on transport=pmi2\n%s", line, r)
				}
				said := regexp.MustCompile(fmt.Sprintf(`fastpmi client: rank %d: shared memory refused \(.*%s.*\); using the PMI-2 text protocol`, rank, regexp.QuoteMeta(c.refusal)))
				if c.refusal != "" && !said.MatchString(r.stderr) {
					t.Errorf("rank %d did not say why it left the segment (%s)\n%s", rank, c.refusal, r)
				}
			}
			if c.refusal == "" && strings.Contains(r.stderr, "refused") {
				t.Errorf("a refusal said with FASTPMI_TRANSPORT=pmi2\n%s", r)
			}
		})
	}
	t.Run("shm", func(t *testing.T) {
		for _, argv := range [][]string{badSeg, noRank} {
			r := run(t, job{args: append([]string{"--env", "FASTPMI_TRANSPORT=shm", "-n", "2"}, argv...)})
			if r.code == 0 || !strings.Contains(r.stderr, "FASTPMI_TRANSPORT=shm but the segment was refused") {
				t.Errorf("FASTPMI_TRANSPORT=shm on a refused segment: want a failed Init saying so\n%s", r)
			}
		}
		r := run(t, job{args: []string{"--env", "FASTPMI_TRANSPORT=bogus", "-n", "1", prog("jobinfo")}})
		if r.code == 0 || !strings.Contains(r.stderr, "FASTPMI_TRANSPORT=bogus: want shm or pmi2") {
			t.Errorf("FASTPMI_TRANSPORT=bogus: want a failed Init naming it\n%s", r)
		}
	})
}
