package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// buildPMI2Bench compiles tests/cprog/pmi2_bench.c against Slurm's
// libpmi2 into dir, as make cprog does.
func buildPMI2Bench(t *testing.T, dir string) string {
	t.Helper()
	prog := filepath.Join(dir, "pmi2_bench")
	out, err := exec.Command("gcc", "-O2", "-o", prog, filepath.Join("..", "..", "tests", "cprog", "pmi2_bench.c"), "-lpmi2", "-ldl").CombinedOutput()
	if err != nil {
		t.Fatalf("build pmi2_bench (make test installs gcc and libpmi2-0-dev): %v\n%s", err, out)
	}
	return prog
}

// watchWriter collects what is written to it and closes seen once the
// text contains want.
type watchWriter struct {
	want string
	seen chan struct{}

	mu   sync.Mutex
	buf  bytes.Buffer // guarded by mu
	done bool         // guarded by mu: seen is closed
}

func (w *watchWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if !w.done && strings.Contains(w.buf.String(), w.want) {
		w.done = true
		close(w.seen)
	}
	return len(p), nil
}

func (w *watchWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// slurmDirRx finds the local Slurm's directory in pmibench's stderr.
var slurmDirRx = regexp.MustCompile(`slurmd in (\S+)\)`)

// wantSlurmGone checks that nothing of the local Slurm in stderr's
// directory is left: the directory, and any process whose command line
// or environment names it (the daemons, slurmstepd, the ranks).
func wantSlurmGone(t *testing.T, stderr string) {
	t.Helper()
	m := slurmDirRx.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("no Slurm directory in stderr:\n%s", stderr)
	}
	dir := m[1]
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s left behind (%v)", dir, err)
	}
	// A process that is ending may still be seen for a moment: each must
	// be gone within a generous bound.
	left := func() (out []string) {
		procs, _ := filepath.Glob("/proc/[0-9]*")
		for _, p := range procs {
			for _, f := range []string{"cmdline", "environ"} {
				if raw, err := os.ReadFile(filepath.Join(p, f)); err == nil && bytes.Contains(raw, []byte(dir)) {
					cmd, _ := os.ReadFile(filepath.Join(p, "cmdline"))
					out = append(out, fmt.Sprintf("%s %q", filepath.Base(p), bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
					break
				}
			}
		}
		return out
	}
	deadline := time.Now().Add(30 * time.Second)
	for procs := left(); len(procs) > 0; procs = left() {
		if time.Now().After(deadline) {
			t.Errorf("still running 30s after pmibench ended: %s", strings.Join(procs, ", "))
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !strings.Contains(stderr, "pmibench: slurm: stopped") {
		t.Errorf("no stop reported:\n%s", stderr)
	}
}

// -slurm starts a real one-node Slurm, runs the pmi2 workload (Slurm's
// libpmi2: put, fence, gets, ring) under srun --mpi=pmi2 beside the other
// launchers and stops Slurm at the end, and also when the benchmark is
// interrupted: no daemon, step or file of it is left. pmirun is /bin/true
// here: the column under test is Slurm's.
func TestRunSlurm(t *testing.T) {
	for _, tool := range slurmTools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found (%v): run make test, which installs munge, slurmctld, slurmd and slurm-client", tool, err)
		}
	}
	dir := t.TempDir()
	prog := buildPMI2Bench(t, dir)
	jsonPath := filepath.Join(dir, "out.json")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	var stdout bytes.Buffer
	stderr := &watchWriter{want: "\x00", seen: make(chan struct{})}
	args := []string{"-slurm", "-runs", "2", "-warmup", "0", "-n", "1,2", "-workload", "pmi2", "-pmi2-prog", prog,
		"-pmirun", "/bin/true", "-mpiexec", "none", "-json", jsonPath}
	if code := run(ctx, args, &stdout, stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	wantSlurmGone(t, stderr.String())
	if !strings.Contains(stdout.String(), "pmirun/slurm") {
		t.Errorf("no pmirun/slurm ratio column:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("decode json: %v", err)
	}
	i := slices.IndexFunc(rep.Launchers, func(l reportLauncher) bool { return l.Name == "slurm" })
	if i < 0 || !slices.Contains(rep.Launchers[i].Args, "--mpi=pmi2") || filepath.Base(rep.Launchers[i].Path) != "srun" {
		t.Fatalf("launchers %+v: want srun --mpi=pmi2 as slurm", rep.Launchers)
	}
	got := map[int]int{}
	for _, s := range rep.Samples {
		if s.Launcher == "slurm" {
			if !s.OK() || s.Wall <= 0 {
				t.Errorf("slurm sample %+v", s)
			}
			got[s.N]++
		}
	}
	if got[1] != 2 || got[2] != 2 {
		t.Errorf("slurm samples by N: %v, want 2 at N=1 and 2", got)
	}

	// Interrupted while a job runs (Ctrl-C): Slurm is stopped all the
	// same, the job's step with it.
	stderr = &watchWriter{want: "pmibench: slurm = ", seen: make(chan struct{})}
	ictx, icancel := context.WithCancel(ctx)
	defer icancel()
	go func() {
		select {
		case <-stderr.seen:
			time.Sleep(time.Second)
			icancel()
		case <-ictx.Done():
		}
	}()
	args = []string{"-slurm", "-runs", "1000", "-warmup", "0", "-n", "2", "-workload", "pmi2", "-pmi2-prog", prog,
		"-pmirun", "/bin/true", "-mpiexec", "none"}
	if code := run(ictx, args, &stdout, stderr); code != 1 {
		t.Errorf("interrupted: exit %d, want 1", code)
	}
	if ctx.Err() != nil {
		t.Fatalf("interrupted run outlived the test's bound:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "stopped early: context canceled") {
		t.Errorf("not interrupted:\n%s", stderr.String())
	}
	wantSlurmGone(t, stderr.String())
}

// A job that stops answering is ended once the stall passes, with what
// it printed before; one that answers in time is not.
func TestRunJobStall(t *testing.T) {
	o := spawnOptions{timeout: 2 * time.Minute}
	argv := []string{"/bin/sh", "-c", "echo spawn_us 1 100; exec sleep 100"}
	t0 := time.Now()
	out, _, stalled, err := runJobStall(context.Background(), o, argv, nil, 2*time.Second)
	if !stalled || err == nil || string(out) != "spawn_us 1 100\n" {
		t.Errorf("stalled %v, err %v, out %q: want a stall after the first line", stalled, err, out)
	}
	if d := time.Since(t0); d > time.Minute {
		t.Errorf("stalled job ended after %v", d)
	}
	argv = []string{"/bin/sh", "-c", "echo a; sleep 1; echo b"}
	out, _, stalled, err = runJobStall(context.Background(), o, argv, nil, 30*time.Second)
	if stalled || err != nil || string(out) != "a\nb\n" {
		t.Errorf("stalled %v, err %v, out %q: want a\\nb\\n", stalled, err, out)
	}
}

// The local Slurm's ports are distinct, free, and below the kernel's
// ephemeral range (no outgoing connection is handed one between the
// check and slurmctld's bind).
func TestFreePorts(t *testing.T) {
	ports, err := freePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	lo, _, err := sys.EphemeralPorts()
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 2 || ports[0] == ports[1] || ports[0] >= lo || ports[1] >= lo {
		t.Errorf("ports %v, want 2 distinct below %d", ports, lo)
	}
	for _, p := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Errorf("port %d is not free: %v", p, err)
			continue
		}
		l.Close()
	}
}
