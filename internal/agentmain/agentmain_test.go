package agentmain

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
)

// The agent's command line refuses what it cannot run with exit code 2
// and one line saying why, before it connects anywhere; --help is its own
// usage, on stdout.
func TestCommandLine(t *testing.T) {
	spec := &node.Spec{
		JobID: "j", Size: 2, Nodes: [][]int{{0}, {1}}, Usize: -1, Virtual: "ring",
		TreeWidth: 8, NetTimeout: 1e9, KillGrace: 1e9, DisconnectGrace: 1e9, Root: "127.0.0.1:1",
	}
	if err := spec.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		code  int
		out   string // in stdout
		err   string // in stderr
	}{
		{"help", []string{"--help"}, "", 0, "--node I|slurm", ""},
		{"no node", nil, "", 2, "", "want --node I|slurm"},
		{"bad flag", []string{"--nodes", "1"}, "", 2, "", "see --help"},
		{"stray argument", []string{"--node", "0", "prog"}, "", 2, "", "unexpected arguments"},
		{"bad index", []string{"--node", "x"}, "", 2, "", `node index "x"`},
		{"daemon and node", []string{"--daemon", "--node", "0"}, "", 2, "", "exclude each other"},
		{"no jobs", []string{"--daemon", "--listen", "127.0.0.1:0", "--max-jobs", "0"}, "", 2, "", "--max-jobs 0: want at least 1"},
		{"no spec", []string{"--node", "0"}, "", 2, "", "read job spec"},
		{"garbage spec", []string{"--node", "0"}, "{not json\n", 2, "", "read job spec"},
		{"invalid spec", []string{"--node", "0"}, `{"size":0}` + "\n", 2, "", "job spec: job size 0"},
		{"virtual without a starter", []string{"--node", "1"}, string(spec.Encode()), 2, "", "plays no virtual ranks"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main("pmid", "", tc.args, strings.NewReader(tc.stdin), &stdout, &stderr, nil)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr.String())
			}
			if !strings.Contains(stdout.String(), tc.out) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tc.out)
			}
			if !strings.Contains(stderr.String(), tc.err) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tc.err)
			}
			if tc.code != 0 && strings.Count(strings.TrimSpace(stderr.String()), "\n") > 0 {
				t.Errorf("more than one line on stderr: %q", stderr.String())
			}
		})
	}
}

// pmid --status with a secret file that is not the daemon's says to
// check that file, not only that authentication failed.
func TestStatusWrongSecret(t *testing.T) {
	s, err := daemon.New(daemon.Config{Listen: "127.0.0.1:0", Secret: []byte("the daemon's secret, 32 bytes...")})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() {
		cancel()
		<-served
	}()
	wrong := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(wrong, []byte("another secret, not the daemon's\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := Main("pmid", "", []string{"--status", s.Addr().String(), "--secret-file", wrong}, strings.NewReader(""), &stdout, &stderr, nil)
	if want := "the daemon does not take the secret of --secret-file " + wrong; code != 1 || !strings.Contains(stderr.String(), want) {
		t.Errorf("pmid --status with a wrong secret: exit %d, stderr %q; want 1 and %q", code, stderr.String(), want)
	}
}
