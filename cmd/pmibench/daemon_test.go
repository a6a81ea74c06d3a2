package main

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/internal/syncbuf"
)

// -daemon times the same job both ways, on at most as many agents or
// daemons as there are ranks.
func TestDaemonLaunchers(t *testing.T) {
	d := &daemons{secret: "/s", addrs: []string{"127.0.0.1:1", "127.0.0.1:2"}}
	ls := d.launchers("/bin/pmirun")
	w := Workload{Name: "pmi2", Prog: "/p"}
	for _, tc := range []struct {
		l    int
		n    int
		want []string
	}{
		{0, 1, []string{"/bin/pmirun", "--bootstrap", "loopback", "--nodes", "1", "-n", "1", "/p"}},
		{0, 8, []string{"/bin/pmirun", "--bootstrap", "loopback", "--nodes", "2", "-n", "8", "/p"}},
		{1, 1, []string{"/bin/pmirun", "--secret-file", "/s", "--daemons", "127.0.0.1:1", "-n", "1", "/p"}},
		{1, 64, []string{"/bin/pmirun", "--secret-file", "/s", "--daemons", "127.0.0.1:1,127.0.0.1:2", "-n", "64", "/p"}},
	} {
		if got := ls[tc.l].Argv(tc.n, w); !slices.Equal(got, tc.want) {
			t.Errorf("%s N=%d: %q, want %q", ls[tc.l].Name, tc.n, got, tc.want)
		}
	}
	if ls[0].Name != "loopback" || ls[1].Name != "daemon" {
		t.Errorf("launchers %s, %s: want loopback then daemon (the ratio is loopback/daemon)", ls[0].Name, ls[1].Name)
	}
}

// Ctrl-C (the benchmark's context done) ends the daemons as the end of
// the benchmark does, with SIGTERM, and they exit 0: started with the
// context, they were SIGKILLed at once, leaving their jobs to their
// guards, and pmibench said "pmibench: daemon 0: signal: killed".
func TestDaemonsStopAfterInterrupt(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", filepath.Join(dir, "pmid"), "../pmid").CombinedOutput(); err != nil {
		t.Fatalf("build pmid: %v\n%s", err, out)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var stderr syncbuf.Buffer
	ds, err := startDaemons(ctx, filepath.Join(dir, "pmirun"), 2, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	ds.stop(&stderr)
	for i, cmd := range ds.cmds {
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("daemon %d: %v, want exit 0 after SIGTERM", i, cmd.ProcessState)
		}
	}
	if strings.Contains(stderr.String(), "pmibench: daemon") {
		t.Errorf("stopping the daemons after an interrupt said:\n%s", stderr.String())
	}
}
