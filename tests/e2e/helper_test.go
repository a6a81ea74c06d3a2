package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// markerVar is set, to a value unique per job, in every rank's environment.
const markerVar = "FASTPMI_TEST_MARKER"

// installHint ends every message about a missing tool.
const installHint = "run make test, which installs mpich libmpich-dev libpmi2-0-dev, libpmix-dev openmpi-bin libopenmpi-dev, OpenSSH and Slurm"

// binDir holds pmirun and the C programs, built once by TestMain.
var binDir string

// pmirun is the path of the pmirun binary under test.
func pmirun() string { return filepath.Join(binDir, "pmirun") }

// prog is the path of a C test program built from tests/cprog/<name>.c.
func prog(name string) string { return filepath.Join(binDir, name) }

// cprogs are the programs TestMain compiles: name → compiler command
// (source and output are appended); the source is tests/cprog/<src or
// name>.c.
var cprogs = []struct {
	name string
	cc   []string
	libs []string
	src  string
}{
	{"mpi_allreduce", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_hello", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_abort", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_pubname", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_args", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_appnum", []string{"mpicc.mpich"}, nil, ""},
	{"mpi_finexit", []string{"mpicc.mpich"}, nil, ""},
	// Open MPI (PMIx) builds of the MPICH programs, and one of its own.
	{"ompi_allreduce", []string{"mpicc.openmpi"}, nil, "mpi_allreduce"},
	{"ompi_abort", []string{"mpicc.openmpi"}, nil, "mpi_abort"},
	{"ompi_hello", []string{"mpicc.openmpi"}, nil, "mpi_hello"},
	{"ompi_pubname", []string{"mpicc.openmpi"}, nil, "mpi_pubname"},
	{"ompi_die", []string{"mpicc.openmpi"}, nil, ""},
	{"ompi_spawn", []string{"mpicc.openmpi"}, nil, ""},
	{"ompi_accept", []string{"mpicc.openmpi"}, nil, ""},
	{"pmi2_test", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmi2_bench", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmi2_spawn", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmi2_appnum", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmi2_spawnbench", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmi2_cost", []string{"gcc"}, []string{"-lpmi2", "-ldl"}, ""},
	{"pmi2_codes", []string{"gcc"}, []string{"-lpmi2"}, ""},
	{"pmix_bench", []string{"gcc"}, nil, ""},  // with pkgConfig's flags
	{"pmix_dmodex", []string{"gcc"}, nil, ""}, // with pkgConfig's flags
	{"pmix_spawn", []string{"gcc"}, nil, ""},  // with pkgConfig's flags
	{"pmix_join", []string{"gcc"}, nil, ""},   // with pkgConfig's flags
	{"exit_early", []string{"gcc"}, nil, ""},
	{"shm_storm", []string{"gcc"}, nil, ""},
}

// pkgConfig names the pkg-config package whose compile and link flags a
// program of cprogs needs.
var pkgConfig = map[string]string{"pmix_bench": "pmix", "pmix_dmodex": "pmix", "pmix_spawn": "pmix", "pmix_join": "pmix"}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fastpmi-e2e-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.Exit(1)
	}
	binDir = dir
	if err := build(dir); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %v\n", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// build compiles pmirun, pmid, the Go test ranks and every C program
// into dir. A missing MPI or
// libpmi2 installation is an error, never a skip.
func build(dir string) error {
	root, err := moduleRoot()
	if err != nil {
		return err
	}
	// Each MPI by its own wrapper: installing Open MPI moves Debian's
	// mpicc alternative away from MPICH.
	for _, cc := range []string{"mpicc.mpich", "mpicc.openmpi"} {
		if _, err := exec.LookPath(cc); err != nil {
			return fmt.Errorf("%s not found (%v): %s", cc, err, installHint)
		}
	}
	if _, err := exec.LookPath("gcc"); err != nil {
		return fmt.Errorf("gcc not found (%v): %s", err, installHint)
	}
	if _, err := os.Stat("/usr/include/slurm/pmi2.h"); err != nil {
		return fmt.Errorf("libpmi2 header <slurm/pmi2.h> missing (%v): %s", err, installHint)
	}

	// pmirun and pmid serve PMIx ranks (Open MPI) only when built with
	// OpenPMIx's server library (agent/pmix, -tags pmix).
	if err := exec.Command("pkg-config", "--exists", "pmix").Run(); err != nil {
		return fmt.Errorf("OpenPMIx (pkg-config pmix) not found (%v): %s", err, installHint)
	}

	// go test puts its own GOROOT/bin first in the test's PATH.
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("go not found to build pmirun: %v", err)
	}
	// pmid goes next to pmirun, where pmirun looks for it, and so does
	// pmirun-pmix, the PMIx build pmirun (pure Go, as make builds it)
	// hands one-node PMIx jobs to; the Go test ranks beside them.
	for _, b := range []struct{ out, pkg string }{
		{"pmirun", "./cmd/pmirun"},
		{"pmirun-pmix", "./cmd/pmirun"},
		{"pmid", "./cmd/pmid"},
		{"hello", "./examples/hello"},
		{"multiprog", "./tests/e2e/multiprog"},
		{"kvsprog", "./tests/e2e/kvsprog"},
		{"spawnprog", "./tests/e2e/spawnprog"},
		{"tracerank", "./tests/e2e/tracerank"},
		{"jobinfo", "./tests/e2e/jobinfo"},
		{"scribbler", "./tests/e2e/scribbler"},
		{"shmflood", "./tests/e2e/shmflood"},
		{"pmibench", "./cmd/pmibench"},
	} {
		tags, env := []string{"-tags", "pmix"}, os.Environ()
		if b.out == "pmirun" { // pure Go, as make builds it
			tags, env = nil, append(env, "CGO_ENABLED=0")
		}
		args := append(append([]string{"build", "-ldflags=-checklinkname=0"}, tags...), "-o", filepath.Join(dir, b.out), b.pkg)
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = root, env
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %v\n%s", b.pkg, err, out)
		}
	}

	if err := buildCLib(root, dir, goBin); err != nil {
		return err
	}
	src := filepath.Join(root, "tests", "cprog")
	for _, p := range cprogs {
		args := append([]string{}, p.cc[1:]...)
		name := p.name
		if p.src != "" {
			name = p.src
		}
		args = append(args, "-O2", "-Wall", "-o", filepath.Join(dir, p.name), filepath.Join(src, name+".c"))
		args = append(args, p.libs...)
		if pkg := pkgConfig[p.name]; pkg != "" {
			out, err := exec.Command("pkg-config", "--cflags", "--libs", pkg).Output()
			if err != nil {
				return fmt.Errorf("pkg-config --cflags --libs %s: %v (%s)", pkg, err, installHint)
			}
			args = append(args, strings.Fields(string(out))...)
		}
		cmd := exec.Command(p.cc[0], args...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%s %s: %v\n%s\n(%s)", p.cc[0], strings.Join(args, " "), err, out, installHint)
		}
	}
	return nil
}

// moduleRoot is the directory holding go.mod, found upwards from the test's
// working directory (the package directory under go test).
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test directory")
		}
		dir = parent
	}
}

// job is one pmirun invocation.
type job struct {
	args    []string      // pmirun's arguments (the marker --env is put first)
	env     []string      // added to pmirun's environment
	stdin   io.Reader     // pmirun's stdin; nil means /dev/null
	timeout time.Duration // the job must end by then; default 60 s
	dir     string        // pmirun's working directory; default the test's
	// wrap, if set, is a command prefix pmirun runs under, such as
	// "ip netns exec NS" to run it inside a test host.
	wrap []string
	// markAgents puts the job's marker in pmirun's own environment too,
	// so the agents (pmid) it starts carry it and the survivor check
	// covers them.
	markAgents bool
}

// result is how a job ended.
type result struct {
	args    []string
	stdout  string
	stderr  string
	code    int // exit code; -1 if pmirun itself was killed by a signal
	elapsed time.Duration
	marker  string
}

func (r result) String() string {
	return fmt.Sprintf("pmirun %s\nexit code %d after %v\n--- stdout:\n%s--- stderr:\n%s---",
		quoteArgs(r.args), r.code, r.elapsed.Round(time.Millisecond), clip(r.stdout), clip(r.stderr))
}

// quoteArgs prints args so that one with spaces is visible as one.
func quoteArgs(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		if a == "" || strings.ContainsAny(a, " \t\n'\"\\$*") {
			q[i] = strconv.Quote(a)
		} else {
			q[i] = a
		}
	}
	return strings.Join(q, " ")
}

// clip keeps a failure message readable when a job printed megabytes.
func clip(s string) string {
	const max = 4000
	if len(s) > max {
		return s[:max/2] + fmt.Sprintf("\n... (%d bytes) ...\n", len(s)-max) + s[len(s)-max/2:]
	}
	return s
}

// lines splits output into lines without their LF; a last line without LF
// is kept.
func lines(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(strings.TrimSuffix(s, "\n"), "\n")
}

// pmirunLines are pmirun's own messages: stderr lines starting "pmirun: ".
func (r result) pmirunLines() []string {
	var out []string
	for _, l := range lines(r.stderr) {
		if strings.HasPrefix(l, "pmirun: ") {
			out = append(out, l)
		}
	}
	return out
}

// wantCode fails the test unless the job exited with code.
func (r result) wantCode(t *testing.T, code int) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code %d, want %d\n%s", r.code, code, r)
	}
}

// wantMessage fails the test unless one of pmirun's own stderr lines
// matches the regular expression re.
func (r result) wantMessage(t *testing.T, re string) {
	t.Helper()
	rx := regexp.MustCompile(re)
	for _, l := range r.pmirunLines() {
		if rx.MatchString(l) {
			return
		}
	}
	t.Errorf("no pmirun message matching %q on stderr\n%s", re, r)
}

// wantFaster fails the test unless the job ended within d.
func (r result) wantFaster(t *testing.T, d time.Duration) {
	t.Helper()
	if r.elapsed > d {
		t.Errorf("job took %v, want under %v\n%s", r.elapsed.Round(time.Millisecond), d, r)
	}
}

// wantRankLines fails the test unless stdout is exactly one line per rank
// 0..n-1, formatted by format(rank), in any order.
func (r result) wantRankLines(t *testing.T, n int, format func(rank int) string) {
	t.Helper()
	want := map[string]int{}
	for rank := 0; rank < n; rank++ {
		want[format(rank)]++
	}
	r.wantLines(t, want)
}

// newMarker returns a value for markerVar that no other job uses.
func newMarker() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "e2e-" + hex.EncodeToString(b[:])
}

// callerEnv is pmirun's environment: the test's own, less anything a
// launcher around the test may have set for its own ranks.
func callerEnv(extra []string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "PMI_") || strings.HasPrefix(k, "PMIX_") || strings.HasPrefix(k, "MPI_LOCAL") ||
			strings.HasPrefix(k, "EXPECT_") || k == markerVar {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// running is a started pmirun whose stdout is read line by line while it
// runs.
type running struct {
	t       *testing.T
	cmd     *exec.Cmd
	args    []string
	marker  string
	start   time.Time
	cancel  context.CancelFunc
	ctx     context.Context
	stderr  bytes.Buffer // written by exec's copier; read only after Wait
	pw      *io.PipeWriter
	readerD chan struct{} // closed when stdout is read to EOF

	mu     sync.Mutex
	out    []string      // stdout lines so far
	notify chan struct{} // closed and replaced on every new line
}

// start starts pmirun for j and registers a cleanup that kills whatever
// is left of the job.
func start(t *testing.T, j job) *running {
	t.Helper()
	if j.timeout == 0 {
		j.timeout = 60 * time.Second
	}
	r := &running{t: t, marker: newMarker(), notify: make(chan struct{}), readerD: make(chan struct{})}
	r.args = append([]string{"--env", markerVar + "=" + r.marker}, j.args...)
	r.ctx, r.cancel = context.WithTimeout(context.Background(), j.timeout)
	argv := append(append(append([]string{}, j.wrap...), pmirun()), r.args...)
	r.cmd = exec.CommandContext(r.ctx, argv[0], argv[1:]...)
	r.cmd.Env = callerEnv(j.env)
	r.cmd.Dir = j.dir
	if j.markAgents {
		r.cmd.Env = append(r.cmd.Env, markerVar+"="+r.marker)
	}
	r.cmd.Stdin = j.stdin
	r.cmd.Stderr = &r.stderr
	// Ranks that outlive pmirun would hold its output pipes open; do not
	// wait for them forever (the survivor check reports them).
	r.cmd.WaitDelay = 5 * time.Second
	pr, pw := io.Pipe()
	r.pw = pw
	r.cmd.Stdout = pw
	go r.read(pr)
	r.start = time.Now()
	if err := r.cmd.Start(); err != nil {
		r.cancel()
		pw.Close()
		t.Fatalf("start pmirun: %v", err)
	}
	t.Cleanup(func() { killMarked(r.marker) })
	return r
}

func (r *running) read(pr *io.PipeReader) {
	defer close(r.readerD)
	br := bufio.NewReaderSize(pr, 1<<16)
	for {
		l, err := br.ReadString('\n')
		if l != "" {
			r.mu.Lock()
			r.out = append(r.out, l)
			close(r.notify)
			r.notify = make(chan struct{})
			r.mu.Unlock()
		}
		if err != nil {
			io.Copy(io.Discard, pr)
			return
		}
	}
}

// waitStdout waits until ok accepts the stdout lines seen so far, and
// fails the test if that does not happen within d.
func (r *running) waitStdout(d time.Duration, ok func(lines []string) bool) {
	r.t.Helper()
	deadline := time.After(d)
	for {
		r.mu.Lock()
		var ls []string
		for _, l := range r.out {
			ls = append(ls, strings.TrimSuffix(l, "\n"))
		}
		ch := r.notify
		r.mu.Unlock()
		if ok(ls) {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			r.cmd.Process.Kill()
			res := r.wait()
			r.t.Fatalf("expected output did not appear within %v\n%s", d, res)
		}
	}
}

// sigkill kills pmirun with SIGKILL, waits for it, and returns the
// processes of the job still alive 2 s later.
func (r *running) sigkill() []int {
	r.cmd.Process.Kill()
	r.cmd.Wait()
	r.pw.Close()
	r.cancel()
	return waitNoMarked(r.marker, 2*time.Second)
}

// ulimit is a job's wrap that runs pmirun under "ulimit OPT N" (-n
// descriptors, -u processes): what it and its children may hold.
func ulimit(opt string, n int) []string {
	return []string{"bash", "-c", "ulimit " + opt + " " + strconv.Itoa(n) + ` && exec "$@"`, "bash"}
}

// threadsThenTerm returns pmirun's thread count now, then ends the job
// with SIGTERM, as a batch system would, and checks that it ended so.
func (r *running) threadsThenTerm() int {
	r.t.Helper()
	threads, err := sys.Threads(r.cmd.Process.Pid)
	if err != nil {
		r.t.Fatal(err)
	}
	r.cmd.Process.Signal(sys.SIGTERM)
	r.wait().wantCode(r.t, 128+15)
	return threads
}

// wait waits for pmirun to end and checks that no rank of the job is left.
func (r *running) wait() result {
	r.t.Helper()
	err := r.cmd.Wait()
	elapsed := time.Since(r.start)
	r.pw.Close()
	<-r.readerD
	timedOut := r.ctx.Err() != nil
	r.cancel()

	r.mu.Lock()
	res := result{args: r.args, stdout: strings.Join(r.out, ""), stderr: r.stderr.String(), elapsed: elapsed, marker: r.marker}
	r.mu.Unlock()
	res.code = -1
	var ee *exec.ExitError
	switch {
	case err == nil:
		res.code = 0
	case errors.As(err, &ee):
		res.code = ee.ExitCode() // -1 if killed by a signal
	case errors.Is(err, exec.ErrWaitDelay):
		res.code = r.cmd.ProcessState.ExitCode()
		r.t.Errorf("pmirun's output pipes stayed open %v after it exited: something it started still runs", r.cmd.WaitDelay)
	default:
		r.t.Errorf("wait for pmirun: %v", err)
	}
	if timedOut {
		r.t.Errorf("pmirun did not end within the test's limit and was killed\n%s", res)
	}
	if left := waitNoMarked(r.marker, 2*time.Second); len(left) > 0 {
		r.t.Errorf("%d processes of the job survive pmirun's exit by 2 s: %s\n%s", len(left), describe(left), res)
		killMarked(r.marker)
	}
	return res
}

// run runs j to its end.
func run(t *testing.T, j job) result {
	t.Helper()
	r := start(t, j)
	res := r.wait()
	t.Logf("pmirun %s: exit %d in %v", quoteArgs(res.args), res.code, res.elapsed.Round(time.Millisecond))
	return res
}

// marked lists the processes whose environment holds markerVar=marker.
func marked(marker string) []int {
	var pids []int
	for _, pid := range sys.Pids() {
		if pid == os.Getpid() || !sys.HasEnv(pid, markerVar+"="+marker) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil {
			// A zombie has ended; only its parent has yet to reap it.
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
				continue
			}
		}
		pids = append(pids, pid)
	}
	return pids
}

// waitNoMarked polls until no process carries marker or d has passed, and
// returns what is left.
func waitNoMarked(marker string, d time.Duration) []int {
	deadline := time.Now().Add(d)
	for {
		left := marked(marker)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killMarked sends SIGKILL to every process of the job with marker, so a
// failed test leaves nothing running.
func killMarked(marker string) {
	for _, pid := range marked(marker) {
		if p, err := os.FindProcess(pid); err == nil {
			p.Kill()
		}
	}
}

// describe names processes by pid and command line.
func describe(pids []int) string {
	var b strings.Builder
	for _, pid := range pids {
		cl, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		fmt.Fprintf(&b, "\n  pid %d: %s", pid, strings.ReplaceAll(strings.TrimRight(string(cl), "\x00"), "\x00", " "))
	}
	return b.String()
}

// n is strconv.Itoa, for building argument lists.
func n(i int) string { return strconv.Itoa(i) }
