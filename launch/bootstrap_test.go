package launch

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"testing"
	"time"
)

// buildBinaries builds pmid and the Go example into a temporary folder.
func buildBinaries(t *testing.T) (pmid, hello string) {
	t.Helper()
	dir := t.TempDir()
	for _, pkg := range []string{"pmid", "hello"} {
		src := "../cmd/pmid"
		if pkg == "hello" {
			src = "../examples/hello"
		}
		out, err := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", filepath.Join(dir, pkg), src).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", pkg, err, out)
		}
	}
	return filepath.Join(dir, "pmid"), filepath.Join(dir, "hello")
}

// fakeTool installs testdata/NAME as NAME first on PATH.
func fakeTool(t *testing.T, name string) (logPath string) {
	t.Helper()
	bin := t.TempDir()
	src, err := filepath.Abs(filepath.Join("testdata", "fake-"+name))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(src, filepath.Join(bin, name)); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	logPath = filepath.Join(t.TempDir(), "log")
	t.Setenv("FAKE_LOG", logPath)
	return logPath
}

func TestBootstraps(t *testing.T) {
	pmid, hello := buildBinaries(t)
	for _, tc := range []struct {
		name string
		cfg  Config
		tool string
		log  string // what the fake tool must have logged
	}{
		{"ssh", Config{Bootstrap: "ssh", Hosts: []string{"alpha", "beta", "gamma"}}, "ssh", "alpha\nbeta\ngamma\n"},
		{"slurm", Config{Bootstrap: "slurm"}, "srun", "--ntasks=3\n--ntasks-per-node=1\n--mpi=none\n--input=all\n--kill-on-bad-exit=1\n"},
		{"loopback", Config{Bootstrap: "loopback", Nodes: 3}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logPath string
			if tc.tool != "" {
				logPath = fakeTool(t, tc.tool)
			}
			if tc.name == "slurm" {
				t.Setenv("SLURM_JOB_NODELIST", "n[1-3]")
			}
			var stdout, stderr bytes.Buffer
			cfg := tc.cfg
			cfg.Size, cfg.Prog, cfg.PmidPath, cfg.RootAddr = 6, hello, pmid, "127.0.0.1"
			cfg.Stdout, cfg.Stderr, cfg.Timeout = &stdout, &stderr, time.Minute
			if err := Run(context.Background(), cfg); err != nil {
				t.Fatalf("run: %v\nstderr:\n%s", err, stderr.String())
			}
			if !strings.Contains(stdout.String(), "hello: 6 ranks over shm verified") {
				t.Fatalf("stdout %q", stdout.String())
			}
			if logPath != "" {
				b, err := os.ReadFile(logPath)
				lines := strings.SplitAfter(string(b), "\n")
				sort.Strings(lines) // agents start concurrently
				if tc.name == "slurm" {
					lines = strings.SplitAfter(string(b), "\n")
				}
				if err != nil || strings.Join(lines, "") != tc.log {
					t.Fatalf("%s log %q (%v), want %q", tc.tool, b, err, tc.log)
				}
			}
		})
	}
}

func TestExpandHostlist(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string
	}{
		{"n1", "n1"},
		{"node[01-03,7],login", "node01,node02,node03,node7,login"}, // padding per range, as Slurm
		{"gpu[1-2]-ib,a", "gpu1-ib,gpu2-ib,a"},
	} {
		got, err := ExpandHostlist(tc.in)
		if err != nil || strings.Join(got, ",") != tc.want {
			t.Errorf("ExpandHostlist(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "n[3-1]", "n[a-b]", "n]1["} {
		if got, err := ExpandHostlist(bad); err == nil {
			t.Errorf("ExpandHostlist(%q) = %v, want an error", bad, got)
		}
	}
}

func TestAgentProcs(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // restored after the test
	os.Unsetenv("GOMAXPROCS")
	cpus := runtime.NumCPU()
	for _, c := range []struct {
		bootstrap string
		k, want   int
	}{
		{"loopback", 64, 1},
		{"netns", 4, max(1, cpus/4)},
		{"loopback", 1, cpus},
		{"ssh", 64, 0},
		{"slurm", 64, 0},
		{"fork", 1, 0},
	} {
		if got := agentProcs(c.bootstrap, c.k); got != c.want {
			t.Errorf("agentProcs(%s, %d) = %d, want %d", c.bootstrap, c.k, got, c.want)
		}
	}
	t.Setenv("GOMAXPROCS", "3")
	if got := agentProcs("loopback", 64); got != 0 {
		t.Errorf("with GOMAXPROCS set: agentProcs = %d, want 0 (the caller's setting stands)", got)
	}
}
