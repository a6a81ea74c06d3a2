package client_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fastpmi/fastpmi/client"
	"github.com/fastpmi/fastpmi/internal/syncbuf"
	"github.com/fastpmi/fastpmi/launch"
)

// Rank processes. The tests start real jobs with launch.Run whose ranks
// are this test binary: TestMain sees envScenario and runs that scenario
// as a rank instead of the tests. A scenario checks every value it gets
// and fails with a message naming the rank; the rank then exits 1, which
// fails the job.
const (
	envScenario  = "FASTPMI_CLIENT_TEST_SCENARIO"  // rank mode: a key of scenarios, or a benchmark op
	envTransport = "FASTPMI_CLIENT_TEST_TRANSPORT" // "shm", "text" or "mixed": what Info.Transport must say
	envBench     = "FASTPMI_CLIENT_BENCH"          // benchmark ranks: "rounds,warmup,outfile"
)

// rankTimeout bounds a scenario inside one rank; jobTimeout bounds a job.
const (
	rankTimeout = 30 * time.Second
	jobTimeout  = 60 * time.Second
)

func TestMain(m *testing.M) {
	if s := os.Getenv(envScenario); s != "" {
		if err := runRank(s); err != nil {
			fmt.Fprintf(os.Stderr, "rank %s: scenario %s over %s: %v\n",
				os.Getenv("PMI_RANK"), s, os.Getenv(envTransport), err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// rankEnv is one rank's view of its job, for scenarios.
type rankEnv struct {
	c      *client.Client
	me, n  int
	mode   string // "shm", "text", "mixed", "singleton"
	deadln time.Time
}

// runRank runs scenario s as a rank of the job it was started in.
func runRank(s string) error {
	mode := os.Getenv(envTransport)
	rank, _ := strconv.Atoi(os.Getenv("PMI_RANK"))
	if mode == "mixed" && rank%2 == 1 {
		// Odd ranks speak PMI-2 text to the same agent the even ranks
		// reach through shared memory.
		os.Unsetenv("FASTPMI_SHM_FD")
	}
	useShm := os.Getenv("FASTPMI_SHM_FD") != ""
	if isBenchOp(s) {
		return runBenchRank(s)
	}
	f, ok := scenarios[s]
	if !ok {
		return fmt.Errorf("unknown scenario")
	}
	c, err := client.Init()
	if err != nil {
		return err
	}
	info := c.Info()
	want := map[string]string{"shm": "shm", "text": "pmi2", "singleton": "singleton"}[mode]
	if mode == "mixed" {
		want = map[bool]string{true: "shm", false: "pmi2"}[useShm]
	}
	if info.Transport != want {
		return fmt.Errorf("transport %q, want %q", info.Transport, want)
	}
	if !info.Extensions {
		return errors.New("fastpmi's agent does not report its extensions")
	}
	if mode != "singleton" && info.Rank != rank {
		return fmt.Errorf("Info.Rank %d, PMI_RANK %d", info.Rank, rank)
	}
	e := &rankEnv{c: c, me: info.Rank, n: info.Size, mode: mode, deadln: time.Now().Add(rankTimeout)}
	ctx, cancel := context.WithDeadline(context.Background(), e.deadln)
	defer cancel()
	if err := f(ctx, e); err != nil {
		return err
	}
	return c.Finalize()
}

// transports are the ways a job's ranks reach the agent.
var transports = []struct {
	name  string
	noShm bool
}{{"shm", false}, {"text", true}, {"mixed", false}}

// job describes one launch of this test binary as n ranks.
type job struct {
	scenario  string
	n         int
	transport string // "shm", "text" or "mixed"
	env       []string
	universe  int
}

// run launches the job and returns the job's combined output and
// launch.Run's error.
func (j job) run(tb testing.TB) (string, error) {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	var out syncbuf.Buffer
	cfg := launch.Config{
		Size:         j.n,
		Prog:         exe,
		Env:          append([]string{envScenario + "=" + j.scenario, envTransport + "=" + j.transport}, j.env...),
		NoShm:        j.transport == "text",
		Timeout:      jobTimeout,
		UniverseSize: j.universe,
		Stdout:       &out,
		Stderr:       &out,
	}
	err = launch.Run(context.Background(), cfg)
	return out.String(), err
}

// runOK launches the job and fails the test unless every rank succeeded.
func (j job) runOK(t *testing.T) {
	t.Helper()
	if out, err := j.run(t); err != nil {
		t.Fatalf("%s on %d ranks over %s: %v (exit code %d)\n%s",
			j.scenario, j.n, j.transport, err, launch.ExitCode(err), strings.TrimSpace(out))
	}
}

// forEach runs scenario at every size over every transport, as subtests
// named transport/n=N.
func forEach(t *testing.T, scenario string, sizes ...int) {
	for _, tr := range transports {
		for _, n := range sizes {
			if tr.name == "mixed" && n == 1 {
				continue // rank 0 is even: a one-rank mixed job is the shm job
			}
			t.Run(fmt.Sprintf("%s/n=%d", tr.name, n), func(t *testing.T) {
				job{scenario: scenario, n: n, transport: tr.name}.runOK(t)
			})
		}
	}
}
