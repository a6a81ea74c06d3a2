package launch

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fastpmi/fastpmi/jobreport"
	"github.com/fastpmi/fastpmi/perf"
)

// A --report path that cannot be written is refused before the job, in
// one line, as any bad option: no report is then written there, and no
// second line says it could not be.
func TestRunReportPathRefusedOnce(t *testing.T) {
	for _, path := range []string{"/nonexistent/r.json", t.TempDir()} {
		var stderr bytes.Buffer
		err := Run(context.Background(), Config{Size: 1, Prog: "true", ReportPath: path, Stdout: &stderr, Stderr: &stderr})
		if ExitCode(err) != 2 || strings.Count(stderr.String(), "\n") != 1 || !strings.Contains(stderr.String(), "invalid --report") {
			t.Errorf("--report %s: exit %d (%v), stderr %q; want 2 and one line", path, ExitCode(err), err, stderr.String())
		}
	}
}

// Run writes the report whatever becomes of the job: run, failed to
// start, or refused.
func TestRunReport(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		name   string
		cfg    Config
		code   int
		phases []string
		nodes  int
	}{
		{"ok", Config{Size: 2, Prog: "true", NoShm: true}, 0, []string{perf.PhaseRankForked, perf.PhaseRankExit}, 1},
		{"failed", Config{Size: 2, Prog: "false", NoShm: true}, 1, []string{perf.PhaseRankForked, perf.PhaseRankExit}, 1},
		{"not found", Config{Size: 1, Prog: "/nonexistent/prog"}, 127, nil, 1},
		{"refused", Config{Size: 1}, 2, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stderr bytes.Buffer
			c.cfg.ReportPath = filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
			c.cfg.Stdout, c.cfg.Stderr = &stderr, &stderr
			err := Run(context.Background(), c.cfg)
			rep, rerr := jobreport.ReadFile(c.cfg.ReportPath)
			if rerr != nil {
				t.Fatalf("%v (stderr %q)", rerr, stderr.String())
			}
			if rep.ExitCode != c.code || ExitCode(err) != c.code || (c.code != 0) != (rep.Failure != "") || rep.Bootstrap != "fork" {
				t.Errorf("report: exit code %d, failure %q, bootstrap %q; want %d (run: %v)", rep.ExitCode, rep.Failure, rep.Bootstrap, c.code, err)
			}
			for _, name := range c.phases {
				if p, ok := rep.Phase(name); !ok || p.Count != c.cfg.Size {
					t.Errorf("phase %q: %+v, want %d stamps", name, p, c.cfg.Size)
				}
			}
			if len(rep.Nodes) != c.nodes {
				t.Errorf("%d nodes, want %d", len(rep.Nodes), c.nodes)
			}
		})
	}
}
