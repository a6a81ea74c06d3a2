package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

func TestSummarizeAndTable(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	samples := []Sample{
		{Workload: "pmi2", N: 4, Launcher: "pmirun", Wall: ms(3)},
		{Workload: "pmi2", N: 4, Launcher: "hydra", Wall: ms(10)},
		{Workload: "pmi2", N: 4, Launcher: "pmirun", Wall: ms(5)},
		{Workload: "pmi2", N: 4, Launcher: "hydra", Wall: ms(12)},
		{Workload: "pmi2", N: 4, Launcher: "pmirun", Wall: ms(4)},
		{Workload: "pmi2", N: 4, Launcher: "hydra", Err: "run x: exit status 1"},
		{Workload: "hello", N: 1, Launcher: "pmirun", Wall: ms(2)},
		{Workload: "hello", N: 1, Launcher: "hydra", Err: "run x: exit status 1"},
		{Workload: "pmi2", N: 1, Launcher: "pmirun", Wall: ms(1)},
		{Workload: "pmi2", N: 1, Launcher: "hydra", Wall: ms(2)},
	}
	launchers := []string{"pmirun", "hydra"}
	rows := Summarize(samples, launchers)
	// Grouped by workload in order of appearance, then N ascending.
	var got []string
	for _, r := range rows {
		got = append(got, r.Workload+"/"+strings.Repeat("*", r.N))
	}
	if want := []string{"pmi2/*", "pmi2/****", "hello/*"}; !slices.Equal(got, want) {
		t.Fatalf("row order = %v, want %v", got, want)
	}
	r := rows[1]
	if c := r.Cells[0]; c.Launcher != "pmirun" || c.Stats.N != 3 || c.Stats.Median != ms(4) || c.Stats.Min != ms(3) || c.Stats.Max != ms(5) || c.Failed != 0 {
		t.Errorf("pmirun cell = %+v", c)
	}
	if c := r.Cells[1]; c.Launcher != "hydra" || c.Stats.N != 2 || c.Stats.Median != ms(11) || c.Failed != 1 {
		t.Errorf("hydra cell = %+v", c)
	}
	if q := r.Ratio(); q < 0.3636 || q > 0.3637 {
		t.Errorf("ratio = %v, want 4/11", q)
	}
	if q := rows[2].Ratio(); q != 0 {
		t.Errorf("ratio with no hydra success = %v, want 0", q)
	}

	header, body := Table(rows, launchers)
	wantHeader := []string{"workload", "N", "pmirun median", "hydra median", "pmirun/hydra", "pmirun min", "pmirun max", "hydra min", "hydra max", "failed"}
	if !slices.Equal(header, wantHeader) {
		t.Errorf("header = %q", header)
	}
	wantBody := [][]string{
		{"pmi2", "1", "1ms", "2ms", "0.50x", "1ms", "1ms", "2ms", "2ms", "0"},
		{"pmi2", "4", "4ms", "11ms", "0.36x", "3ms", "5ms", "10ms", "12ms", "1"},
		{"hello", "1", "2ms", "-", "-", "2ms", "2ms", "-", "-", "1"},
	}
	for i := range wantBody {
		if !slices.Equal(body[i], wantBody[i]) {
			t.Errorf("row %d = %q, want %q", i, body[i], wantBody[i])
		}
	}

	// One launcher: no ratio column.
	header, _ = Table(Summarize(samples, []string{"pmirun"}), []string{"pmirun"})
	if slices.Contains(header, "pmirun/hydra") || len(header) != 6 {
		t.Errorf("single-launcher header = %q", header)
	}

	var md, txt bytes.Buffer
	if err := WriteTable(&md, rows, launchers, true); err != nil {
		t.Fatal(err)
	}
	if err := WriteTable(&txt, rows, launchers, false); err != nil {
		t.Fatal(err)
	}
	if lines := strings.Split(strings.TrimSpace(md.String()), "\n"); len(lines) != 5 || !strings.HasPrefix(lines[1], "| ---") {
		t.Errorf("markdown table:\n%s", md.String())
	}
	if lines := strings.Split(strings.TrimSpace(txt.String()), "\n"); len(lines) != 4 || !strings.Contains(lines[2], "0.36x") {
		t.Errorf("text table:\n%s", txt.String())
	}
}

func TestMpiexecOptions(t *testing.T) {
	hydraHelp := `
Usage: ./mpiexec [global opts] [local opts for exec1] [exec1] [exec1 args] : ...

  Hydra specific options (treated as global):
    -bind-to                         process binding
    -map-by                          process mapping
`
	if name, args := mpiexecOptions(hydraHelp); name != "hydra" || !slices.Equal(args, []string{"-bind-to", "none"}) {
		t.Errorf("hydra help: %q %q", name, args)
	}
	// Open MPI spells it --bind-to and is not Hydra.
	if name, args := mpiexecOptions("mpiexec (Open MPI)\n  --bind-to <arg0>  Policy\n"); name != "mpiexec" || args != nil {
		t.Errorf("other help: %q %q", name, args)
	}
	// Another pmirun build as the second launcher: its help names Hydra,
	// but it is not.
	if name, args := mpiexecOptions("usage: pmirun [options] program [args...]\n\nlike Hydra's mpiexec\n"); name != "pmirun-B" || args != nil {
		t.Errorf("pmirun help: %q %q", name, args)
	}
	if name, args := mpiexecOptions(""); name != "mpiexec" || args != nil {
		t.Errorf("empty help: %q %q", name, args)
	}
}

func TestParseInts(t *testing.T) {
	got, err := parseInts(" 1,4, 16,,128")
	if err != nil || !slices.Equal(got, []int{1, 4, 16, 128}) {
		t.Errorf("parseInts = %v, %v", got, err)
	}
	for _, bad := range []string{"", ",", "1,x", "0", "-3"} {
		if _, err := parseInts(bad); err == nil {
			t.Errorf("parseInts(%q) succeeded", bad)
		}
	}
}

func TestRepoRoot(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module "+modulePath+"\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "cmd", "pmibench")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	// A nested module of another name is skipped.
	if err := os.WriteFile(filepath.Join(sub, "go.mod"), []byte("module example.com/other\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := repoRoot(sub); got != dir {
		t.Errorf("repoRoot(%s) = %s, want %s", sub, got, dir)
	}
	lonely := t.TempDir()
	if got := repoRoot(lonely); got != lonely {
		t.Errorf("repoRoot without go.mod = %s, want %s", got, lonely)
	}
}

func TestResolveWorkloads(t *testing.T) {
	root := t.TempDir()
	prog := filepath.Join(root, defaultHelloProg)
	if err := os.MkdirAll(filepath.Dir(prog), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	ws, err := resolveWorkloads(options{workloads: []string{"hello", "pmi2"}, pmi2Prog: "/bin/true"}, root)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].Prog != prog || ws[1].Prog != "/bin/true" {
		t.Errorf("workloads = %+v", ws)
	}
	_, err = resolveWorkloads(options{workloads: []string{"pmi2"}}, root)
	if err == nil || !strings.Contains(err.Error(), "-pmi2-prog") {
		t.Errorf("missing default program: err = %v", err)
	}
	if _, err := resolveWorkloads(options{workloads: []string{"spawn"}}, root); err == nil {
		t.Error("unknown workload accepted")
	}
}

// TestRunCommand drives the whole command with /bin/true standing in for
// both launchers and the programs, and a script that fails as pmirun.
func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
	jsonPath := filepath.Join(dir, "out.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-runs", "2", "-warmup", "0", "-n", "1,3", "-workload", "pmi2,hello",
		"-pmirun", "/bin/true", "-mpiexec", "/bin/true",
		"-pmi2-prog", "/bin/true", "-hello-prog", "/bin/true", "-markdown", "-json", jsonPath}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	// /bin/true -h prints nothing: the column is "mpiexec", no -bind-to.
	if !strings.Contains(stdout.String(), "pmirun/mpiexec") || strings.Count(stdout.String(), "\n") != 6 {
		t.Errorf("stdout:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var rep Report
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("decode json: %v\n%s", err, raw)
	}
	if len(rep.Samples) != 2*2*2*2 || len(rep.Launchers) != 2 || rep.Runs != 2 {
		t.Fatalf("report: %d samples, %d launchers, runs %d", len(rep.Samples), len(rep.Launchers), rep.Runs)
	}
	for i, s := range rep.Samples {
		if s.Seq != i || !s.OK() || s.Wall <= 0 {
			t.Errorf("sample %d = %+v", i, s)
		}
	}

	// A pmirun that always fails: every pmirun run is an error, exit 1.
	bad := filepath.Join(dir, "badrun")
	if err := os.WriteFile(bad, []byte("#!/bin/sh\necho no ranks >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	args = []string{"-runs", "2", "-n", "2", "-workload", "pmi2", "-pmirun", bad, "-mpiexec", "none", "-pmi2-prog", "/bin/true"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 1 {
		t.Errorf("exit %d with a failing pmirun, want 1", code)
	}
	if strings.Count(stderr.String(), "exit status 3: no ranks") != 2 || !strings.Contains(stderr.String(), "timing pmirun alone") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	if lines := strings.Split(strings.TrimSpace(stdout.String()), "\n"); len(lines) != 2 || !strings.HasSuffix(strings.TrimSpace(lines[1]), "2") {
		t.Errorf("stdout:\n%s", stdout.String())
	}
}

// Ctrl-C says what stopped the runs, in the note -json keeps too: it
// said Go's "context canceled".
func TestInterruptSaid(t *testing.T) {
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGINT)
	defer stop()
	self, err := os.FindProcess(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if err := self.Signal(sys.SIGINT); err != nil {
		t.Fatal(err)
	}
	<-ctx.Done()
	path := filepath.Join(t.TempDir(), "r.json")
	var stdout, stderr bytes.Buffer
	args := []string{"-runs", "1", "-n", "1", "-workload", "pmi2", "-pmirun", "/bin/true", "-mpiexec", "none", "-pmi2-prog", "/bin/true", "-json", path}
	if code := run(ctx, args, &stdout, &stderr); code != 1 {
		t.Errorf("interrupted: exit %d, want 1", code)
	}
	const want = "stopped early: interrupt signal received"
	if !strings.Contains(stderr.String(), "pmibench: "+want+"\n") {
		t.Errorf("stderr:\n%s\nwant %q", stderr.String(), want)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), want) {
		t.Errorf("-json: %v\n%s\nwant the note %q", err, b, want)
	}
	// No run: no samples, an empty list (it was null).
	if b, _ := os.ReadFile(path); !strings.Contains(string(b), `"samples": []`) {
		t.Errorf("-json:\n%s\nwant \"samples\": []", b)
	}
}

// A -plot directory is checked, not made, before the runs: a run
// refused after the check (here: no pmirun) left it behind, empty.
func TestRefusedRunMakesNoPlotDir(t *testing.T) {
	dir := t.TempDir()
	plots := filepath.Join(dir, "new", "plots")
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-plot", plots, "-pmirun", "/nonexistent/pmirun"}, &stdout, &stderr); code != 2 {
		t.Errorf("exit %d, want 2 (stderr %q)", code, stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); err == nil {
		t.Errorf("a refused run left %s behind", filepath.Join(dir, "new"))
	}
	// A directory named plot beside the new one is no obstacle.
	if err := os.Mkdir(filepath.Join(dir, "plot"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := checkOutputs("", filepath.Join(dir, "plot2")); err != nil {
		t.Errorf("-plot beside a directory named plot: %v", err)
	}
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := checkOutputs("", filepath.Join(file, "plots")); err == nil || !strings.Contains(err.Error(), file+" is not a directory") {
		t.Errorf("-plot under a file: %v, want %s is not a directory", err, file)
	}
}

// A cell's progress line comes after its last run's line: it came
// before it, so "pmi2 N=1 done: 1 of 2 runs" was followed by that cell's
// last run (and its failure, if it failed).
func TestProgressAfterRuns(t *testing.T) {
	var stdout, stderr bytes.Buffer
	args := []string{"-v", "-runs", "1", "-warmup", "0", "-n", "1,2", "-workload", "pmi2", "-pmirun", "/bin/true", "-mpiexec", "none", "-pmi2-prog", "/bin/true"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s", code, stderr.String())
	}
	out := stderr.String()
	runLine, doneLine := strings.Index(out, "pmibench: pmi2 N=1 pmirun run 0: "), strings.Index(out, "pmibench: pmi2 N=1 done: 1 of 2 runs")
	if runLine < 0 || doneLine < 0 || doneLine < runLine {
		t.Errorf("want the run's line, then the cell's progress line:\n%s", out)
	}
}

// -daemon's two columns are pmirun's two ways of starting a job: -mpi
// and -mpiexec were dropped without a word (the daemons' jobs ran
// without --mpi pmix), and -lib and -ompi timed other launchers beside
// them, -lib's a pmirun of the fork bootstrap, compared with loopback
// agents in the ratio. They are refused with -daemon.
func TestDaemonRefusesOtherColumns(t *testing.T) {
	for _, extra := range [][]string{{"-mpi", "pmix"}, {"-lib", "build/lib"}, {"-mpiexec", "/usr/bin/mpiexec"}, {"-ompi", "mpirun"}} {
		_, err := parseFlags(append([]string{"-daemon"}, extra...), io.Discard)
		if err == nil || !strings.HasPrefix(err.Error(), "parse -daemon: ") {
			t.Errorf("-daemon %q: %v, want a refusal", extra, err)
		}
	}
	if _, err := parseFlags([]string{"-daemon", "-n", "1,8"}, io.Discard); err != nil {
		t.Errorf("-daemon alone: %v", err)
	}
}

func TestRunUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"-n", "0"},
		{"-runs", "0"},
		{"-timeout", "0s"},
		{"-workload", "nope", "-pmirun", "/bin/true"},
		{"-pmirun", "/nonexistent/pmirun"},
		{"-mpiexec", "/nonexistent/mpiexec", "-pmirun", "/bin/true"},
		{"stray"},
		{"-bogus"},
		{"-n", "2,2,1"},
		{"-workload", "true,true", "-pmirun", "/bin/true", "-mpiexec", "none"}, // twice the runs in one row
		{"-runs", "x"},
		{"-mpi", "bogus", "-pmirun", "/bin/true", "-mpiexec", "none"}, // every pmirun run failed, exit 1
		// Where the results could not be written, before any run.
		{"-json", "/nonexistent/r.json", "-pmirun", "/bin/true", "-mpiexec", "none"},
		{"-plot", "/proc/plots", "-pmirun", "/bin/true", "-mpiexec", "none"},
		{"-scale", "-json", "/nonexistent/r.json"},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != 2 {
			t.Errorf("%q: exit %d, want 2 (stderr %q)", args, code, stderr.String())
		}
		// One line, never the whole usage.
		if lines := strings.Count(stderr.String(), "\n"); lines != 1 || stdout.Len() > 0 {
			t.Errorf("%q: %d lines on stderr, want 1:\n%s", args, lines, stderr.String())
		}
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 || !strings.Contains(stderr.String(), "-pmi2-prog") {
		t.Errorf("-h: exit %d, stderr %q", code, stderr.String())
	}
}

// Every mode and every -ops entry the docs use is named by -h: the
// top-level usage names the other modes, -scale's every KVS comparison.
func TestHelpNamesModesAndOps(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"-h"}, []string{"-scale", "-spawn", "-paper"}},
		{[]string{"-scale", "-h"}, kvsOps},
	} {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), tc.args, &stdout, &stderr); code != 0 {
			t.Fatalf("%q: exit %d, stderr %q", tc.args, code, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("%q: usage does not name %s:\n%s", tc.args, w, stderr.String())
			}
		}
	}
}

// -lib adds a first column: pmirun giving its ranks the library's
// directory and requiring shared memory; a directory without
// libpmi2.so.0 is a usage error.
func TestRunLib(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "lib")
	if err := os.Mkdir(lib, 0o755); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"-lib", lib, "-pmirun", "/bin/true", "-mpiexec", "none"}, &stdout, &stderr); code != 2 ||
		!strings.Contains(stderr.String(), "libpmi2.so.0") {
		t.Errorf("-lib without libpmi2.so.0: exit %d, stderr %q", code, stderr.String())
	}
	if err := os.WriteFile(filepath.Join(lib, "libpmi2.so.0"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "argv")
	fake := filepath.Join(dir, "pmirun")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\necho \"$*\" >> "+log+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	stdout.Reset()
	stderr.Reset()
	args := []string{"-lib", lib, "-runs", "1", "-warmup", "0", "-n", "2", "-workload", "pmi2", "-pmirun", fake, "-mpiexec", "none", "-pmi2-prog", "/bin/true"}
	if code := run(context.Background(), args, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String(), "pmirun+lib/pmirun") {
		t.Errorf("no pmirun+lib/pmirun ratio column:\n%s", stdout.String())
	}
	raw, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	want := "--env LD_LIBRARY_PATH=" + lib + " --env FASTPMI_TRANSPORT=shm -n 2 /bin/true"
	if got := strings.Split(strings.TrimSpace(string(raw)), "\n"); len(got) != 2 || got[0] != want || got[1] != "-n 2 /bin/true" {
		t.Errorf("pmirun runs:\n%s\nwant first %q then %q", raw, want, "-n 2 /bin/true")
	}
}
