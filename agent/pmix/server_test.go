//go:build pmix

package pmix

import (
	"debug/elf"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/agent"
)

func newAgent(t *testing.T, size int, local []int) *agent.Agent {
	t.Helper()
	a, err := agent.New(agent.Config{Size: size, Local: local})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

// The real server library: two jobs share the process's one server, each
// rank gets the environment that leads it to the server, a namespace is
// served once, and the server outlives its jobs (a later round reuses
// it). TestMain checks Shutdown.
func TestServerJobs(t *testing.T) {
	var dir string
	for round := range 2 {
		a1 := newAgent(t, 4, []int{0, 1})
		j1, err := NewJob(Config{Agent: a1, Nspace: "job-a", Size: 4, Nodes: [][]int{{0, 1}, {2, 3}}, Index: 0})
		if err != nil {
			t.Fatalf("round %d: NewJob: %v", round, err)
		}
		a2 := newAgent(t, 2, []int{0, 1})
		j2, err := NewJob(Config{Agent: a2, Nspace: "job-b", Size: 2, Nodes: [][]int{{0, 1}}, Appnum: []int{0, 1}})
		if err != nil {
			t.Fatalf("round %d: second NewJob: %v", round, err)
		}
		if registry.refs != 2 || server.tmpdir == "" || (dir != "" && server.tmpdir != dir) {
			t.Fatalf("round %d: %d references to the server (dir %q, before %q), want 2 to one server", round, registry.refs, server.tmpdir, dir)
		}
		dir = server.tmpdir
		a3 := newAgent(t, 4, []int{2, 3})
		if _, err := NewJob(Config{Agent: a3, Nspace: "job-a", Size: 4, Nodes: [][]int{{0, 1}, {2, 3}}, Index: 1}); err == nil {
			t.Errorf("round %d: a namespace served twice by one process", round)
		}
		for i, want := range []int{0, 1} {
			env, err := j1.Env(i)
			if err != nil {
				t.Fatalf("Env(%d): %v", i, err)
			}
			m := envMap(env)
			if m["PMIX_NAMESPACE"] != "job-a" || m["PMIX_RANK"] != strconv.Itoa(want) {
				t.Errorf("rank %d: PMIX_NAMESPACE=%q PMIX_RANK=%q", want, m["PMIX_NAMESPACE"], m["PMIX_RANK"])
			}
			if !slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, "PMIX_SERVER_URI") }) {
				t.Errorf("rank %d: no PMIX_SERVER_URI* in %v", want, env)
			}
		}
		if _, err := j1.Env(2); err == nil {
			t.Error("Env for a local rank the node does not have")
		}
		j1.Close()
		j1.Close() // idempotent
		if _, err := os.Stat(dir); err != nil {
			t.Errorf("server directory gone while a job runs: %v", err)
		}
		j2.Close()
		if registry.refs != 0 {
			t.Errorf("%d references to the server after every job closed", registry.refs)
		}
	}
}

// TestMain runs the tests on the process's one server, then shuts it
// down: its directory must go, and a later job must be refused.
func TestMain(m *testing.M) {
	code := m.Run()
	registry.mu.Lock()
	dir := server.tmpdir
	registry.mu.Unlock()
	Shutdown()
	Shutdown() // idempotent
	if _, err := os.Stat(dir); dir != "" && !os.IsNotExist(err) {
		fmt.Fprintf(os.Stderr, "server directory %s left after Shutdown: %v\n", dir, err)
		code = 1
	}
	if a, err := agent.New(agent.Config{Size: 1, Local: []int{0}}); err == nil {
		if j, err := NewJob(Config{Agent: a, Nspace: "late", Size: 1, Nodes: [][]int{{0}}}); err == nil {
			j.Close()
			fmt.Fprintln(os.Stderr, "a job started after Shutdown")
			code = 1
		}
		a.Close()
	}
	os.Exit(code)
}

// Bad configurations are refused before the server is touched.
func TestConfigErrors(t *testing.T) {
	a := newAgent(t, 2, []int{0, 1})
	for _, c := range []Config{
		{Nspace: "x", Size: 2, Nodes: [][]int{{0, 1}}},
		{Agent: a, Size: 2, Nodes: [][]int{{0, 1}}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0}}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0, 2}}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0, 1}}, Index: 1},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0, 1}}, Appnum: []int{0}},
		{Agent: a, Nspace: strings.Repeat("n", 256), Size: 2, Nodes: [][]int{{0, 1}}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0, 1}}, Hosts: []string{"a", "b"}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0}, {1}}, Hosts: []string{"a", "a"}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0}, {1}}, Hosts: []string{"a", "b,c"}},
		{Agent: a, Nspace: "x", Size: 2, Nodes: [][]int{{0}, {1}}, Hosts: []string{"a", ""}},
	} {
		if j, err := NewJob(c); err == nil {
			j.Close()
			t.Errorf("NewJob(%+v) accepted", c)
		}
	}
	if registry.refs != 0 {
		t.Errorf("refused configurations hold %d server references", registry.refs)
	}
}

// TestNoPMIxLinked: a binary of this package does not link OpenPMIx (it
// opens it for the first PMIx job, fpx_load): this test binary needs no
// libpmix to start, and neither do pmirun and pmid. A call the C side
// makes to the library directly, not through fpx_load's pointers (one of
// the header's inline helpers), would put it back in the list.
func TestNoPMIxLinked(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(exe)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	libs, err := f.ImportedLibraries()
	if err != nil {
		t.Fatal(err)
	}
	syms, err := f.ImportedSymbols()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range libs {
		if strings.Contains(l, "pmix") {
			t.Errorf("the binary links %s (libraries %v)", l, libs)
		}
	}
	for _, s := range syms {
		if strings.HasPrefix(s.Name, "PMIx_") {
			t.Errorf("the binary imports %s directly", s.Name)
		}
	}
}
