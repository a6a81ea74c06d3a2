// Package agentmain is the command line of a node agent process: pmid's,
// and pmibench's when pmirun starts it as the agent of a job of virtual
// ranks. It parses the flags a bootstrap passes, reads the job's spec
// from standard input, applies the spec's process-wide settings (this
// process serves one job), and runs the node until its ranks have ended.
package agentmain

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"

	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
)

// Usage is the agent's synopsis.
const Usage = `%[1]s --node I|slurm [--listen ADDR]

%[1]s is a node agent of a fastpmi job, started by pmirun's bootstraps
(ssh, Slurm, netns, loopback): it reads the job's spec and secret from its
standard input, connects to pmirun and to its peer agents, forks the
node's ranks, serves their PMI, and exits when they have ended. Users run
pmirun, not %[1]s.

  --node I        this agent's node index; "slurm" takes SLURM_NODEID
  --listen ADDR   address for peer agents' links (default ":0")

Environment: FASTPMI_DEBUG=1 logs at debug level; FASTPMI_CPUPROFILE=FILE
writes a CPU profile to FILE.nodeI.
`

// Main runs the agent with args (without the program name) and returns
// its exit code. starter, when set, plays the ranks of jobs of virtual
// ranks (node.Spec.Virtual); an agent without one refuses such jobs.
func Main(name string, args []string, stdin io.Reader, stdout, stderr io.Writer, starter node.Starter) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	nodeFlag := fs.String("node", "", "")
	listen := fs.String("listen", "", "")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stdout, Usage, name)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v (see --help)\n", name, err)
		return 2
	case fs.NArg() > 0 || *nodeFlag == "":
		fmt.Fprintf(stderr, "%s: want --node I|slurm [--listen ADDR] (see --help; jobs are started with pmirun)\n", name)
		return 2
	}
	idxs := *nodeFlag
	if idxs == "slurm" {
		idxs = os.Getenv("SLURM_NODEID")
	}
	idx, err := strconv.Atoi(idxs)
	if err != nil || idx < 0 {
		fmt.Fprintf(stderr, "%s: node index %q: want a number >= 0\n", name, idxs)
		return 2
	}
	level := slog.LevelWarn
	if os.Getenv("FASTPMI_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("agent", name, "node", idx)
	if path := os.Getenv("FASTPMI_CPUPROFILE"); path != "" {
		stop, err := perf.StartCPUProfile(path + ".node" + strconv.Itoa(idx))
		if err != nil {
			fmt.Fprintf(stderr, "%s: node %d: %v\n", name, idx, err)
			return 2
		}
		defer stop()
	}
	br := bufio.NewReaderSize(stdin, 1<<16)
	spec, err := node.ReadSpec(br)
	if err != nil {
		fmt.Fprintf(stderr, "%s: node %d: %v\n", name, idx, err)
		return 2
	}
	if spec.Virtual != "" && starter == nil {
		fmt.Fprintf(stderr, "%s: node %d: this agent plays no virtual ranks (%q): pmirun starts pmibench as the agent for --virtual\n", name, idx, spec.Virtual)
		return 2
	}
	if spec.AgentProcs > 0 {
		runtime.GOMAXPROCS(spec.AgentProcs) // this process serves this one job
	}
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGTERM, sys.SIGINT, sys.SIGHUP)
	defer stop()
	o := node.AgentOptions{Index: idx, Listen: *listen, Stdout: stdout, Stderr: stderr, Logger: log, Starter: starter}
	if idx == 0 {
		o.Stdin = br
	}
	if err := node.RunAgent(ctx, spec, o); err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err) // the error names the node
		return 1
	}
	return 0
}
