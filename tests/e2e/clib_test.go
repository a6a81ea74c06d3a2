package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/pmiwire"
	"github.com/fastpmi/fastpmi/pmiwire/pmiwiretest"
	"github.com/fastpmi/fastpmi/shm"
)

// libfastpmi (clib/), the drop-in libpmi2.so.0: the programs built once
// against Slurm's header and library (pmi2_test, pmi2_bench) run with
// LD_LIBRARY_PATH pointing at fastpmi's library instead, over shared
// memory under pmirun (FASTPMI_TRANSPORT=shm makes the library refuse to
// start without the segment, so a silent fall-back to the text protocol
// fails the test), over the text protocol under pmirun --no-shm and
// Hydra, on one node and across test hosts, and built with
// AddressSanitizer and UndefinedBehaviorSanitizer.

// buildCLib builds libfastpmi twice into dir (lib/, and lib-san/ with the
// sanitizers) through the Makefile's lib target, the scenario program
// against it, and the scenario's Go twin.
func buildCLib(root, dir, goBin string) error {
	for _, b := range []struct{ dir, san string }{{"lib", "0"}, {"lib-san", "1"}} {
		cmd := exec.Command("make", "--no-print-directory", "-s", "-C", root, "lib", "LIB="+filepath.Join(dir, b.dir), "CLIB_SAN="+b.san)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("make lib (CLIB_SAN=%s): %v\n%s", b.san, err, out)
		}
	}
	cmd := exec.Command("gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-I", filepath.Join(root, "clib", "include"),
		"-o", filepath.Join(dir, "fastpmi_scenario"), filepath.Join(root, "tests", "cprog", "fastpmi_scenario.c"),
		"-L", filepath.Join(dir, "lib"), "-lpmi2", "-lpthread")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("gcc fastpmi_scenario: %v\n%s", err, out)
	}
	cmd = exec.Command(goBin, "build", "-ldflags=-checklinkname=0", "-o", filepath.Join(dir, "conform"), "./tests/e2e/conform")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build conform: %v\n%s", err, out)
	}
	return nil
}

// libArgs are pmirun's options that give every rank fastpmi's library
// (the sanitized build if san) and require the transport.
func libArgs(t *testing.T, san bool, transport string) []string {
	t.Helper()
	dir := filepath.Join(binDir, "lib")
	args := []string{"--env", "FASTPMI_TRANSPORT=" + transport}
	if san {
		dir = filepath.Join(binDir, "lib-san")
		// Leak checking is off: the Slurm-built test programs do not
		// free what they allocate, and the library's state lives until
		// the process ends.
		args = append(args, "--env", "LD_PRELOAD="+asanRuntime(t), "--env", "ASAN_OPTIONS=exitcode=86:detect_leaks=0",
			"--env", "UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87")
	}
	return append(args, "--env", "LD_LIBRARY_PATH="+dir)
}

// asanRuntime is the path of gcc's AddressSanitizer runtime, which must be
// loaded first into a program that is not itself instrumented.
func asanRuntime(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("gcc", "-print-file-name=libasan.so").Output()
	p := strings.TrimSpace(string(out))
	if err != nil || !filepath.IsAbs(p) {
		t.Fatalf("gcc -print-file-name=libasan.so: %q %v (%s)", p, err, installHint)
	}
	return p
}

// The library exports every function of Slurm's libpmi2.so.0.
func TestCLibSymbols(t *testing.T) {
	syms := func(lib string) []string {
		out, err := exec.Command("nm", "-D", "--defined-only", lib).Output()
		if err != nil {
			t.Fatalf("nm -D %s: %v", lib, err)
		}
		var s []string
		for _, l := range lines(string(out)) {
			if f := strings.Fields(l); len(f) == 3 && f[1] == "T" {
				s = append(s, f[2])
			}
		}
		return s
	}
	slurm := syms("/usr/lib/x86_64-linux-gnu/libpmi2.so.0")
	ours := syms(filepath.Join(binDir, "lib", "libpmi2.so.0"))
	if len(slurm) < 20 {
		t.Fatalf("Slurm's libpmi2 exports only %v", slurm)
	}
	for _, s := range slurm {
		if !slices.Contains(ours, s) {
			t.Errorf("libfastpmi does not export %s", s)
		}
	}
	for _, s := range []string{"PMIX_Allgather", "PMIX_Iallgather", "PMIX_KVS_Ifence", "PMIX_Wait", "PMIX_Allgather_view", "PMIX_Iallgather_view"} {
		if !slices.Contains(ours, s) {
			t.Errorf("libfastpmi does not export the extension %s", s)
		}
	}
	for _, s := range ours {
		if !strings.HasPrefix(s, "PMI2_") && !strings.HasPrefix(s, "PMIX_") {
			t.Errorf("libfastpmi exports %s, outside the PMI2_/PMIX_ name space", s)
		}
	}
	out, err := exec.Command("objdump", "-p", filepath.Join(binDir, "lib", "libpmi2.so.0")).Output()
	if err != nil || !bytes.Contains(out, []byte("SONAME               libpmi2.so.0")) {
		t.Errorf("libfastpmi's soname is not libpmi2.so.0: %v\n%s", err, out)
	}
}

// Slurm-built pmi2_test and pmi2_bench, unmodified, over fastpmi's
// library: shared memory under pmirun, the text protocol with --no-shm;
// the sanitized build too.
func TestCLibDropIn(t *testing.T) {
	for _, c := range []struct {
		name      string
		transport string
		san       bool
		sizes     []int
	}{
		{"shm", "shm", false, []int{1, 16}},
		{"pmi2", "pmi2", false, []int{4}},
		{"shm/sanitizers", "shm", true, []int{4}},
		{"pmi2/sanitizers", "pmi2", true, []int{4}},
	} {
		for _, size := range c.sizes {
			t.Run(fmt.Sprintf("%s/N=%d", c.name, size), func(t *testing.T) {
				args := libArgs(t, c.san, c.transport)
				if c.transport == "pmi2" {
					args = append(args, "--no-shm")
				}
				j := job{args: append(args, "-n", n(size), prog("pmi2_test")), env: []string{"PMI2_TEST_ALARM=30"}, timeout: 60 * time.Second}
				r := run(t, j)
				r.wantCode(t, 0)
				r.wantPMI2(t, size, 1, false)
				r = run(t, job{args: append(args, "-n", n(size), prog("pmi2_bench")), timeout: 60 * time.Second})
				r.wantCode(t, 0)
				if r.stdout != "" || r.stderr != "" {
					t.Errorf("pmi2_bench is meant to be silent\n%s", r)
				}
			})
		}
	}
}

// pmi2_cost, built against Slurm's libpmi2, finds libfastpmi's extensions
// with dlsym and times them on every rank.
func TestCLibCost(t *testing.T) {
	line := regexp.MustCompile(`^cost rank=(\d+) start_cpu_us=\d+ init_cpu_us=[\d.]+ init_us=[\d.]+ xchg_cpu_us=\d+ xchg_us=\d+ get_ns=\d+ ag_us=\d+ iag_us=\d+$`)
	r := run(t, job{args: append(libArgs(t, false, "shm"), "-n", "4", prog("pmi2_cost"))})
	r.wantCode(t, 0)
	seen := map[string]bool{}
	for _, l := range lines(r.stdout) {
		m := line.FindStringSubmatch(l)
		if m == nil {
			t.Errorf("unexpected line %q\n%s", l, r)
			continue
		}
		seen[m[1]] = true
	}
	if len(seen) != 4 {
		t.Errorf("%d ranks reported, want 4\n%s", len(seen), r)
	}
}

// Calls from several threads at once are serialised: threads getting
// keys while the main thread runs allgathers, sanitized, on both paths.
func TestCLibThreads(t *testing.T) {
	for _, tr := range []string{"shm", "pmi2"} {
		t.Run(tr, func(t *testing.T) {
			args := libArgs(t, true, tr)
			if tr == "pmi2" {
				args = append(args, "--no-shm")
			}
			r := run(t, job{args: append(args, "-n", "3", prog("fastpmi_scenario"), "threads")})
			r.wantCode(t, 0)
			for rank := range 3 {
				if !slices.Contains(lines(r.stdout), fmt.Sprintf("r=%d threads ok", rank)) {
					t.Errorf("rank %d did not report\n%s", rank, r)
				}
			}
		})
	}
}

// sortedLines are out's lines, sorted (ranks print concurrently).
func sortedLines(out string) []string {
	l := lines(out)
	slices.Sort(l)
	return l
}

// One scenario (put/fence/get, allgather and its zero-copy view,
// iallgather and ifence outstanding together, get with wait, ring, job
// attribute, node attributes, names, a missing key, a spawn) through the
// Go client and through
// libfastpmi against the same agent: the same lines, on shared memory and
// on the text protocol, plain and sanitized.
func TestCLibConformance(t *testing.T) {
	const size = 5
	for _, c := range []struct {
		name      string
		transport string
		san       bool
	}{{"shm", "shm", false}, {"pmi2", "pmi2", false}, {"shm/sanitizers", "shm", true}} {
		t.Run(c.name, func(t *testing.T) {
			var extra []string
			if c.transport == "pmi2" {
				extra = []string{"--no-shm"}
			}
			goRun := run(t, job{args: append(append([]string{}, extra...), "-n", n(size), prog("conform"), "withspawn")})
			goRun.wantCode(t, 0)
			cRun := run(t, job{args: append(append(libArgs(t, c.san, c.transport), extra...), "-n", n(size), prog("fastpmi_scenario"), "withspawn")})
			cRun.wantCode(t, 0)
			gl, cl := sortedLines(goRun.stdout), sortedLines(cRun.stdout)
			if len(gl) != 14*size+1 {
				t.Fatalf("the Go client printed %d lines, want %d\n%s", len(gl), 14*size+1, goRun)
			}
			if !slices.Equal(gl, cl) {
				t.Errorf("the Go client and libfastpmi disagree\n--- Go:\n%s\n--- C:\n%s", strings.Join(gl, "\n"), strings.Join(cl, "\n"))
			}
			for _, want := range []string{
				fmt.Sprintf("r=0 init size=%d transport=%s", size, c.transport),
				fmt.Sprintf("r=%d nodeattr found=1 node-shared missing=0", size-1),
				"r=0 spawn rc=0 job=1",
			} {
				if !slices.Contains(cl, want) {
					t.Errorf("no line %q\n%s", want, cRun)
				}
			}
		})
	}
	// Without a launcher, each is a singleton with a process-local KVS
	// and name service: the same lines again.
	t.Run("singleton", func(t *testing.T) {
		goOut, err := runOther([]string{prog("conform")})
		if err != nil {
			t.Fatalf("the Go client as a singleton: %v", err)
		}
		cOut, err := runOther([]string{prog("fastpmi_scenario")}, "LD_LIBRARY_PATH="+filepath.Join(binDir, "lib"))
		if err != nil {
			t.Fatalf("libfastpmi as a singleton: %v", err)
		}
		gl, cl := sortedLines(goOut), sortedLines(cOut)
		if !slices.Equal(gl, cl) || !slices.Contains(cl, "r=0 lookup rc=0 port-0") || !slices.Contains(cl, "r=0 iallgather iag-0") {
			t.Errorf("the Go client and libfastpmi disagree as singletons\n--- Go:\n%s\n--- C:\n%s", strings.Join(gl, "\n"), strings.Join(cl, "\n"))
		}
	})
}

// Abort through either ends the job alike; PMI2_Job_Spawn through the
// library starts the children and returns their job id, with PMI_FD or
// over the segment alone (--pmi-port).
func TestCLibAbortAndSpawn(t *testing.T) {
	goRun := run(t, job{args: []string{"-n", "3", prog("conform"), "abort"}, timeout: 40 * time.Second})
	cRun := run(t, job{args: append(libArgs(t, false, "shm"), "-n", "3", prog("fastpmi_scenario"), "abort"), timeout: 40 * time.Second})
	for _, r := range []result{goRun, cRun} {
		r.wantCode(t, 1)
		r.wantMessage(t, `rank 0 called abort with exit code 1: scenario abort`)
	}
	// Over the segment alone: with --pmi-port the rank has no PMI_FD. A
	// request larger than a ring message (9000 bytes) goes on PMI_FD.
	for _, c := range []struct{ opts, mode []string }{
		{nil, []string{"spawn"}},
		{[]string{"--pmi-port"}, []string{"spawn"}},
		{nil, []string{"spawn", "9000"}},
	} {
		extra := append(append([]string{}, c.opts...), c.mode...)
		r := run(t, job{args: append(append(append(libArgs(t, false, "shm"), c.opts...), "-n", "2", prog("fastpmi_scenario")), c.mode...)})
		r.wantCode(t, 0)
		var rc int
		var jobid string
		found := false
		for _, l := range lines(r.stdout) {
			if _, err := fmt.Sscanf(l, "r=0 spawn rc=%d jobid=%s", &rc, &jobid); err == nil || strings.HasPrefix(l, "r=0 spawn rc=") {
				found = true
				fmt.Sscanf(l, "r=0 spawn rc=%d", &rc)
			}
		}
		if !found {
			t.Fatalf("%v: no spawn line\n%s", extra, r)
		}
		if rc != 0 || !strings.HasSuffix(jobid, "-1") {
			t.Errorf("%v: spawn through libfastpmi: rc=%d jobid=%q, want 0 and the run's job 1\n%s", extra, rc, jobid, r)
		}
	}
}

// segmentFile writes a file that poses as a segment: header bytes hdr,
// padded to size.
func segmentFile(t *testing.T, hdr []byte, size int) string {
	t.Helper()
	b := make([]byte, size)
	copy(b, hdr)
	p := filepath.Join(t.TempDir(), "segment")
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A corrupt or foreign segment is refused with a clear message and the
// library falls back to the text protocol (on PMI_FD, or PMI_PORT under
// --pmi-port); with FASTPMI_TRANSPORT=shm it
// refuses to start instead. The sanitized build reads the bad headers.
func TestCLibBadSegment(t *testing.T) {
	magic := binary.LittleEndian.AppendUint64(nil, shm.Magic)
	cases := []struct {
		name string
		file string
		msg  string
	}{
		{"foreign", segmentFile(t, []byte("not a fastpmi segment"), 1<<16), `bad magic`},
		{"version", segmentFile(t, binary.LittleEndian.AppendUint32(append([]byte{}, magic...), 99), 1<<16), `layout version 99`},
		{"short", segmentFile(t, magic, 100), `cannot hold a segment`},
		{"sizes", segmentFile(t, binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(append([]byte{}, magic...), shm.LayoutVersion), 4096), 1<<16), `header sizes`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// The rank's FASTPMI_SHM_FD is replaced by a descriptor of the
			// bad file before the program starts.
			wrap := []string{"/bin/sh", "-c", `exec 9<>"$0"; FASTPMI_SHM_FD=9 exec "$@"`, c.file, prog("pmi2_test")}
			// With PMI_FD, and with PMI_PORT (--pmi-port gives no PMI_FD).
			for _, extra := range [][]string{nil, {"--pmi-port"}} {
				args := append(append(libArgs(t, true, ""), extra...), "-n", "2")
				r := run(t, job{args: append(args, wrap...), env: []string{"PMI2_TEST_ALARM=30"}})
				r.wantCode(t, 0)
				r.wantPMI2(t, 2, 1, false)
				if !regexp.MustCompile(`libfastpmi: rank \d: shared memory refused \(.*` + c.msg + `.*\); using the PMI-2 text protocol`).MatchString(r.stderr) {
					t.Errorf("%v: no message that the segment was refused for %s\n%s", extra, c.msg, r)
				}
			}

			args := append(libArgs(t, true, "shm"), "-n", "2")
			r := run(t, job{args: append(args, wrap...), env: []string{"PMI2_TEST_ALARM=30"}})
			if r.code == 0 {
				t.Errorf("FASTPMI_TRANSPORT=shm started on a bad segment\n%s", r)
			}
			if !strings.Contains(r.stderr, "FASTPMI_TRANSPORT=shm but the segment was refused") {
				t.Errorf("no message that the segment was refused\n%s", r)
			}
		})
	}
}

// The segment does not say which rank a process is: PMI_RANK and
// MPI_LOCALRANKID do. A rank started without them (a wrapper that cleans
// the environment) asks the launcher over PMI_FD, as Slurm's library
// does, instead of taking rank 0 and its ring: every rank keeps its own
// rank, and the refusal names the variables.
func TestCLibNoRankEnv(t *testing.T) {
	for _, unset := range []string{"PMI_RANK", "PMI_RANK MPI_LOCALRANKID"} {
		t.Run(strings.ReplaceAll(unset, " ", "+"), func(t *testing.T) {
			wrap := []string{"/bin/sh", "-c", "unset " + unset + `; exec "$@"`, "sh", prog("fastpmi_scenario")}
			r := run(t, job{args: append(append(libArgs(t, true, ""), "-n", "3"), wrap...), timeout: 40 * time.Second})
			r.wantCode(t, 0)
			for rank := range 3 {
				for _, want := range []string{
					fmt.Sprintf("r=%d init size=3 transport=pmi2", rank),
					fmt.Sprintf("r=%d allgather ag-0,ag-1,ag-2", rank),
				} {
					if !slices.Contains(lines(r.stdout), want) {
						t.Errorf("no line %q\n%s", want, r)
					}
				}
				msg := fmt.Sprintf("libfastpmi: rank %d: shared memory refused (PMI_RANK or MPI_LOCALRANKID is not set", rank)
				if !strings.Contains(r.stderr, msg) {
					t.Errorf("no message %q\n%s", msg, r)
				}
			}

			r = run(t, job{args: append(append(libArgs(t, false, "shm"), "-n", "2"), wrap...), timeout: 40 * time.Second})
			if r.code == 0 || !strings.Contains(r.stderr, "FASTPMI_TRANSPORT=shm but the segment was refused (PMI_RANK or MPI_LOCALRANKID") {
				t.Errorf("FASTPMI_TRANSPORT=shm without the rank's variables: want a refusal naming them\n%s", r)
			}
		})
	}
}

// A launcher variable that is no number fails PMI2_Init with a message
// that names it and its value.
func TestCLibBadEnvironment(t *testing.T) {
	for _, v := range []string{"FASTPMI_SHM_FD=abc", "PMI_SPAWNED=yes", "PMI_RANK=1x"} {
		t.Run(v, func(t *testing.T) {
			wrap := []string{"/bin/sh", "-c", `export "$0"; exec "$@"`, v, prog("pmi2_test")}
			r := run(t, job{args: append(append(libArgs(t, false, ""), "-n", "1"), wrap...), timeout: 40 * time.Second})
			if r.code == 0 {
				t.Errorf("PMI2_Init succeeded with %s\n%s", v, r)
			}
			if msg := "libfastpmi: bad PMI environment: " + v + " is not a number"; !strings.Contains(r.stderr, msg) {
				t.Errorf("no message %q\n%s", msg, r)
			}
		})
	}
}

// runOther runs a launcher other than pmirun (argv) with env added to the
// test's environment, bounded by a minute: its stdout, or an error with
// both outputs.
func runOther(argv []string, env ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = callerEnv(env)
	cmd.WaitDelay = 5 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%w\n%s%s", err, out.String(), errb.String())
	}
	return out.String(), nil
}

// The same program gives the same return codes and results with Slurm's
// library and with libfastpmi, on either transport, at the edges where
// they differed: buffers too small for a job id, a value, a port or ring
// values (cut, and a success), a key or a name nobody put or published
// (asked of a rank the job does not have too: over shared memory the agent
// would end the job for it), a name published twice (PMI2_ERR_OTHER, a refusal), an attribute that is
// no integer list read as one (PMI2_ERR_OTHER), a put of a key the
// launcher keeps (PMI2_ERR_OTHER; over shared memory the agent would end
// the job for it), a fence the agent fails as a deadlock (PMI2_ERR_OTHER).
// A singleton's name service refuses alike.
func TestCLibReturnCodes(t *testing.T) {
	slurm := run(t, job{args: []string{"--no-shm", "-n", "2", prog("pmi2_codes")}})
	slurm.wantCode(t, 0)
	if len(lines(slurm.stdout)) != 15 || !strings.Contains(slurm.stdout, "publish again rc=14") {
		t.Fatalf("Slurm's library: %d lines, want 15\n%s", len(lines(slurm.stdout)), slurm)
	}
	for _, tr := range []string{"shm", "pmi2"} {
		args := libArgs(t, false, tr)
		if tr == "pmi2" {
			args = append(args, "--no-shm")
		}
		ours := run(t, job{args: append(args, "-n", "2", prog("pmi2_codes"))})
		ours.wantCode(t, 0)
		if ours.stdout != slurm.stdout {
			t.Errorf("libfastpmi over %s and Slurm's library disagree\n--- Slurm's:\n%s--- libfastpmi:\n%s", tr, slurm.stdout, ours.stdout)
		}
	}
	// A singleton's own name service refuses as a launcher's does.
	out, err := runOther([]string{prog("pmi2_codes")}, "LD_LIBRARY_PATH="+filepath.Join(binDir, "lib"))
	if err != nil {
		t.Fatalf("pmi2_codes as a singleton: %v", err)
	}
	for _, want := range []string{"publish again rc=14", "lookup missing rc=14", "unpublish missing rc=14"} {
		if !slices.Contains(lines(out), want) {
			t.Errorf("as a singleton: no line %q\n%s", want, out)
		}
	}
}

// Under Debian's Hydra (no segment): the text protocol, with the
// extensions emulated by put/fence/get.
// pmi2ErrOther is PMI2_ERR_OTHER, Slurm's code for a key not found.
const pmi2ErrOther = 14

func TestCLibHydra(t *testing.T) {
	hydra, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Fatalf("mpiexec.hydra not found: %v (%s)", err, installHint)
	}
	hydraRun := func(args ...string) (string, error) {
		return runOther(append([]string{hydra, "-n", "4"}, args...),
			"LD_LIBRARY_PATH="+filepath.Join(binDir, "lib"), "PMI2_TEST_SKIP=usize", "PMI2_TEST_ALARM=30")
	}
	out, err := hydraRun(prog("pmi2_test"))
	if err != nil {
		t.Fatalf("pmi2_test under Hydra: %v", err)
	}
	if got := len(lines(out)); got != 4 {
		t.Errorf("pmi2_test under Hydra: %d lines, want 4\n%s", got, out)
	}
	// PMIX_Ring too: Hydra has no ring command (it ends the job on one),
	// the library makes the ring of a put, a fence and two gets.
	out, err = hydraRun(prog("fastpmi_scenario"), "plain")
	if err != nil {
		t.Fatalf("fastpmi_scenario under Hydra: %v", err)
	}
	got := sortedLines(out)
	for r := range 4 {
		for _, want := range []string{
			fmt.Sprintf("r=%d init size=4 transport=pmi2", r),
			fmt.Sprintf("r=%d get v-0,v-1,v-2,v-3", r),
			fmt.Sprintf("r=%d ring pos=%d size=4 left=ring-%d right=ring-%d", r, r, (r+3)%4, (r+1)%4),
			fmt.Sprintf("r=%d allgather ag-0,ag-1,ag-2,ag-3", r),
			fmt.Sprintf("r=%d view zc-0,zc-1,zc-2,zc-3", r),
			fmt.Sprintf("r=%d iallgather iag-0,iag-1,iag-2,iag-3", r),
			fmt.Sprintf("r=%d ifence-get fv-0,fv-1,fv-2,fv-3", r),
			fmt.Sprintf("r=%d getwait wv-%d", r, (r+1)%4),
			fmt.Sprintf("r=%d nodeattr found=1 node-shared missing=0", r),
			fmt.Sprintf("r=%d iview iv-0,iv-1,iv-2,iv-3", r),
		} {
			if !slices.Contains(got, want) {
				t.Errorf("under Hydra no line %q\n%s", want, out)
			}
		}
	}
	// A rank that finalizes with an ifence and an iallgather outstanding:
	// Hydra gets finalize once they are done.
	out, err = hydraRun(prog("fastpmi_scenario"), "finpending")
	if err != nil {
		t.Fatalf("fastpmi_scenario finpending under Hydra: %v", err)
	}
	for r := range 4 {
		if want := fmt.Sprintf("r=%d finpending ok", r); !slices.Contains(lines(out), want) {
			t.Errorf("under Hydra no line %q\n%s", want, out)
		}
	}
	// Gets before the rank's first fence: Hydra's PMI-2 server ends the
	// whole job on one (mpiexec fails its own assertion); the library
	// refuses them itself, and the job goes on. Under pmirun the same
	// gets find nothing, and the waiting ones end as a deadlock.
	out, err = hydraRun(prog("fastpmi_scenario"), "unfenced")
	if err != nil {
		t.Fatalf("fastpmi_scenario unfenced under Hydra: %v", err)
	}
	for r := range 4 {
		if want := fmt.Sprintf("r=%d unfenced get=%d wait=%d", r, pmi2ErrOther, pmi2ErrOther); !slices.Contains(lines(out), want) {
			t.Errorf("under Hydra no line %q\n%s", want, out)
		}
	}
	res := run(t, job{args: append(libArgs(t, false, "pmi2"), "-n", "4", prog("fastpmi_scenario"), "unfenced")})
	for r := range 4 {
		if want := fmt.Sprintf("r=%d unfenced get=%d wait=%d", r, pmi2ErrOther, pmi2ErrOther); res.code != 0 || !slices.Contains(lines(res.stdout), want) {
			t.Errorf("under pmirun: want exit 0 and the line %q\n%v", want, res)
		}
	}
	// A value holding a ';': Hydra keeps what comes before it and says
	// nothing; the library refuses the put (PMI2_ERR_INVALID_VAL, 6).
	// Under pmirun the value is kept whole.
	out, err = hydraRun(prog("fastpmi_scenario"), "semicolon")
	for r := range 4 {
		if want := fmt.Sprintf("r=%d semicolon put=6 get=%d val=", r, pmi2ErrOther); err != nil || !slices.Contains(lines(out), want) {
			t.Errorf("under Hydra: %v, want the line %q\n%s", err, want, out)
		}
	}
	res = run(t, job{args: append(libArgs(t, false, "pmi2"), "--no-shm", "-n", "2", prog("fastpmi_scenario"), "semicolon")})
	for r := range 2 {
		if want := fmt.Sprintf("r=%d semicolon put=0 get=0 val=a;b;c", r); res.code != 0 || !slices.Contains(lines(res.stdout), want) {
			t.Errorf("under pmirun: want exit 0 and the line %q\n%v", want, res)
		}
	}
	// PMI2_Abort: Hydra's PMI-2 has no abort command (mpiexec ends the
	// job with 255, "Unrecognized PMI command: abort"); the library
	// sends PMI-1's, which Hydra takes: the job ends with the abort's 1.
	_, err = hydraRun(prog("fastpmi_scenario"), "abortexit")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || strings.Contains(err.Error(), "Unrecognized PMI command") {
		t.Errorf("fastpmi_scenario abortexit under Hydra: %v, want exit status 1 from the abort", err)
	}
	// The largest values, binary ones included, through Hydra's KVS
	// (hex-encoded, cut into keys Hydra takes).
	out, err = hydraRun(prog("fastpmi_scenario"), "agbig")
	if err != nil {
		t.Fatalf("fastpmi_scenario agbig under Hydra: %v", err)
	}
	for r := range 4 {
		if want := fmt.Sprintf("r=%d agbig ok", r); !slices.Contains(lines(out), want) {
			t.Errorf("under Hydra no line %q\n%s", want, out)
		}
	}
}

// Across test hosts: each node's ranks on its own segment.
func TestCLibNetns(t *testing.T) {
	cl := newClusterOf(t, 2)
	j := cl.job("net", append(libArgs(t, false, "shm"), "-n", "8", prog("pmi2_test"))...)
	j.env = []string{"EXPECT_NNODES=2", "EXPECT_PLACEMENT=block", "PMI2_TEST_ALARM=30"}
	r := run(t, j)
	r.wantCode(t, 0)
	r.wantPMI2(t, 8, 2, false)

	r = run(t, cl.job("net", append(libArgs(t, false, "shm"), "-n", "8", prog("pmi2_bench"))...))
	r.wantCode(t, 0)

	goRun := run(t, cl.job("net", "-n", "6", prog("conform"), "nowait"))
	goRun.wantCode(t, 0)
	cRun := run(t, cl.job("net", append(libArgs(t, false, "shm"), "-n", "6", prog("fastpmi_scenario"), "nowait")...))
	cRun.wantCode(t, 0)
	if gl, cl := sortedLines(goRun.stdout), sortedLines(cRun.stdout); !slices.Equal(gl, cl) || len(gl) != 6*13 {
		t.Errorf("across hosts the Go client and libfastpmi disagree\n--- Go:\n%s\n--- C:\n%s", strings.Join(gl, "\n"), strings.Join(cl, "\n"))
	}
}

// Under Slurm itself (srun --mpi=pmi2, Slurm's own PMI-2 server in the
// slurmstepd): libfastpmi speaks the text protocol to it.
func TestNetnsSlurmCLib(t *testing.T) {
	cl := newCluster(t)
	s := startSlurm(t, cl)
	srun := func(args ...string) (string, error) {
		return runOther(append([]string{"ip", "netns", "exec", cl.names[0], "salloc", "--quiet", "--nodes", "2",
			"srun", "--mpi=pmi2", "--overcommit", "--nodes", "2", "--ntasks", "4"}, args...),
			"SLURM_CONF="+s.conf, "LD_LIBRARY_PATH="+filepath.Join(binDir, "lib"), "PMI2_TEST_SKIP=usize", "PMI2_TEST_ALARM=30", "EXPECT_NNODES=2")
	}
	out, err := srun(prog("pmi2_test"))
	if err != nil {
		t.Fatalf("pmi2_test under srun --mpi=pmi2: %v", err)
	}
	if got := len(lines(out)); got != 4 {
		t.Errorf("pmi2_test under srun: %d lines, want 4\n%s", got, out)
	}
	out, err = srun(prog("fastpmi_scenario"), "nowait")
	if err != nil {
		t.Fatalf("fastpmi_scenario under srun --mpi=pmi2: %v", err)
	}
	got := sortedLines(out)
	for r := range 4 {
		for _, want := range []string{
			fmt.Sprintf("r=%d init size=4 transport=pmi2", r),
			fmt.Sprintf("r=%d allgather ag-0,ag-1,ag-2,ag-3", r),
			fmt.Sprintf("r=%d iallgather iag-0,iag-1,iag-2,iag-3", r),
			fmt.Sprintf("r=%d ifence-get fv-0,fv-1,fv-2,fv-3", r),
		} {
			if !slices.Contains(got, want) {
				t.Errorf("under srun no line %q\n%s", want, out)
			}
		}
	}
}

// libfastpmi at the edges of its promises, each a scenario mode: any
// number of outstanding iallgathers waited for oldest first; allgathers
// of the largest values, NUL bytes included, on every transport; a
// watchdog thread learns its rank and aborts while another waits in a
// fence, which ends the job at once; an atexit handler calling the library after an abort does not hang; after
// the deadlock check failed an epoch a rank never entered, its next fence
// synchronises (the epoch numbers the agent expects); over-long names are
// refused locally rather than sent in a frame the agent refuses, and
// FASTPMI_DEBUG says so; a rank may finalize with collectives outstanding;
// a stale view fails to read;
// a child
// forked after PMI2_Init may call it, and its parent goes on; a PMI_PORT
// connection has TCP_NODELAY; a request
// waited for already is refused (PMI2_ERR_INVALID_ARG).
func TestCLibEdges(t *testing.T) {
	shm := func(san bool) []string { return libArgs(t, san, "shm") }
	t.Run("agmany", func(t *testing.T) {
		for _, san := range []bool{false, true} {
			r := run(t, job{args: append(shm(san), "-n", "3", prog("fastpmi_scenario"), "agmany"), timeout: 40 * time.Second})
			r.wantCode(t, 0)
			for rank := range 3 {
				if !slices.Contains(lines(r.stdout), fmt.Sprintf("r=%d agmany ok", rank)) {
					t.Errorf("rank %d did not report (sanitizers %v)\n%s", rank, san, r)
				}
			}
		}
	})
	t.Run("abortthread", func(t *testing.T) {
		// The watchdog thread learns who it is (PMI2_Initialized,
		// PMI2_Job_GetRank, PMI2_Info_GetSize) and aborts while the main
		// thread holds the library in the fence, on either transport.
		for _, tr := range []string{"shm", "pmi2"} {
			args := libArgs(t, false, tr)
			if tr == "pmi2" {
				args = append(args, "--no-shm")
			}
			start := time.Now()
			r := run(t, job{args: append(args, "-n", "2", prog("fastpmi_scenario"), "abortthread"), timeout: 40 * time.Second})
			r.wantCode(t, 1)
			r.wantMessage(t, `rank 1 called abort with exit code 1: scenario abortthread`)
			if d := time.Since(start); d > 12*time.Second {
				t.Errorf("%s: the abort took %v: it waited for the fence\n%s", tr, d, r)
			}
			if strings.Contains(r.stderr, "the watchdog read") {
				t.Errorf("%s: the watchdog did not learn its rank\n%s", tr, r)
			}
		}
	})
	t.Run("abortexit", func(t *testing.T) {
		// Singleton (no launcher to kill the process first): the handler
		// runs and its call fails at once.
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, prog("fastpmi_scenario"), "abortexit")
		cmd.Env = append(os.Environ(), "LD_LIBRARY_PATH="+filepath.Join(binDir, "lib"))
		out, err := cmd.Output()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !slices.Contains(lines(string(out)), "r=0 atexit rc=-1") {
			t.Errorf("abort with an atexit handler calling PMI2_Finalize: %v\n%s", err, out)
		}
	})
	t.Run("skipfailed", func(t *testing.T) {
		r := run(t, job{args: append(shm(false), "-n", "3", prog("fastpmi_scenario"), "skipfailed"), timeout: 40 * time.Second})
		r.wantCode(t, 0)
		for rank := range 3 {
			for _, want := range []string{fmt.Sprintf("r=%d failed rc=1", rank), fmt.Sprintf("r=%d after rc=0", rank)} {
				if !slices.Contains(lines(r.stdout), want) {
					t.Errorf("no line %q\n%s", want, r)
				}
			}
		}
	})
	t.Run("agbig", func(t *testing.T) {
		// The largest values, binary ones included, over shared memory
		// and over the text protocol (fastpmi's allgather extension).
		scenarioOK(t, false, 3, "agbig")
	})
	t.Run("longname", func(t *testing.T) { scenarioOK(t, true, 2, "longname") })
	t.Run("debug", func(t *testing.T) {
		// FASTPMI_DEBUG=1 says why each call failed, a refusal before
		// sending (the over-long names) too.
		r := run(t, job{args: append(shm(false), "--env", "FASTPMI_DEBUG=1", "-n", "1", prog("fastpmi_scenario"), "longname")})
		r.wantCode(t, 0)
		for _, f := range []string{"PMI2_Info_GetNodeAttr", "PMI2_Info_GetJobAttr", "PMI2_Nameserv_publish", "PMI2_Nameserv_lookup"} {
			if !regexp.MustCompile(`libfastpmi: rank 0: ` + f + `: PMI2_ERR_INVALID_(KEY_)?LENGTH: .* too long`).MatchString(r.stderr) {
				t.Errorf("no reason for %s's failure\n%s", f, r)
			}
		}
	})
	t.Run("detached", func(t *testing.T) {
		// A rank working after PMIX_Iallgather is not stuck; one in
		// PMIX_Wait is.
		scenarioOK(t, true, 3, "detached")
	})
	t.Run("nodelay", func(t *testing.T) {
		// Over PMI_PORT (--pmi-port --no-shm) the connection has
		// TCP_NODELAY: PMIX_Wait's notice written behind an outstanding
		// ifence is not held 40 ms for the agent's delayed ack.
		r := run(t, job{args: append(libArgs(t, true, "pmi2"), "--pmi-port", "--no-shm", "-n", "2", prog("fastpmi_scenario"), "nodelay")})
		r.wantCode(t, 0)
		for rank := range 2 {
			if want := fmt.Sprintf("r=%d nodelay ok tcp=1", rank); !slices.Contains(lines(r.stdout), want) {
				t.Errorf("no line %q\n%s", want, r)
			}
		}
	})
	t.Run("finpending", func(t *testing.T) { scenarioOK(t, true, 3, "finpending") })
	t.Run("staleview", func(t *testing.T) {
		// A view older than the rule allows fails to read, in place or
		// a copy (the text protocol's), instead of reading freed memory.
		scenarioOK(t, true, 2, "staleview")
	})
	t.Run("fork", func(t *testing.T) {
		// A child forked after PMI2_Init calls the library without
		// touching its parent's segment (the text protocol on PMI_FD).
		scenarioOK(t, true, 2, "fork")
	})
	t.Run("waittwice", func(t *testing.T) {
		// A request waited for already is refused, not freed again.
		scenarioOK(t, true, 2, "waittwice")
	})
}

// scenarioOK runs fastpmi_scenario MODE as size ranks over shared memory
// and over the text protocol (the sanitized library if san), and wants
// every rank's "r=<rank> MODE ok".
func scenarioOK(t *testing.T, san bool, size int, mode string) {
	t.Helper()
	for _, tr := range []string{"shm", "pmi2"} {
		args := libArgs(t, san, tr)
		if tr == "pmi2" {
			args = append(args, "--no-shm")
		}
		r := run(t, job{args: append(args, "-n", n(size), prog("fastpmi_scenario"), mode), timeout: 40 * time.Second})
		r.wantCode(t, 0)
		for rank := range size {
			if !slices.Contains(lines(r.stdout), fmt.Sprintf("r=%d %s ok", rank, mode)) {
				t.Errorf("%s: rank %d did not report\n%s", tr, rank, r)
			}
		}
	}
}

// TestCLibWaitingGetBacksOff: a waiting get under a launcher that cannot
// park it (Slurm's PMI-2 server, played on a real socket: it finds the
// key only 300 ms after the first waiting get asked) polls it ever less
// often: at most 20 requests in those 300 ms, where a poll every
// millisecond made about 300.
func TestCLibWaitingGetBacksOff(t *testing.T) {
	srv, rank := pmiwiretest.RankSocket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog("fastpmi_scenario"), "unfenced")
	cmd.Env = callerEnv([]string{"PMI_FD=3", "PMI_RANK=0", "PMI_SIZE=1", "SLURM_STEP_ID=0",
		"LD_LIBRARY_PATH=" + filepath.Join(binDir, "lib")})
	cmd.ExtraFiles = []*os.File{rank}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rank.Close()
	// The scenario's first get (not waiting) finds nothing; the waiting
	// one finds the key once it has waited late.
	const late = 300 * time.Millisecond
	gets, polls := 0, 0
	var first time.Time
	stop := pmiwiretest.Start(t, srv, func(m *pmiwire.Msg) []pmiwire.Pair {
		if m.Cmd != "kvs-get" {
			return nil
		}
		if gets++; gets == 1 {
			return []pmiwire.Pair{{Key: "found", Val: "FALSE"}}
		}
		polls++
		if first.IsZero() {
			first = time.Now()
		} else if time.Since(first) > late {
			return []pmiwire.Pair{{Key: "value", Val: "late"}, {Key: "found", Val: "TRUE"}}
		}
		return []pmiwire.Pair{{Key: "found", Val: "FALSE"}}
	})
	err := cmd.Wait()
	stop()
	if err != nil {
		t.Fatalf("fastpmi_scenario unfenced: %v\n%s%s", err, out.String(), errb.String())
	}
	if want := fmt.Sprintf("r=0 unfenced get=%d wait=0", pmi2ErrOther); !strings.Contains(out.String(), want) {
		t.Errorf("want %q in:\n%s%s", want, out.String(), errb.String())
	}
	if polls < 2 || polls > 20 {
		t.Errorf("the waiting get asked the launcher %d times in %v, want 2 to 20", polls, late)
	}
}
