// Package agentmain is the command line of a node agent process: pmid's,
// and pmibench's when pmirun starts it as the agent of a job of virtual
// ranks. Per job (--node), it parses the flags a bootstrap passes, reads
// the job's spec from standard input, applies the spec's process-wide
// settings (this process serves one run), and runs the node until the
// run has ended, hosting the node's share of the jobs the run spawns
// (host.go). As a daemon (--daemon) it serves many jobs' nodes,
// submitted by pmirun --daemons, until SIGTERM (package agent/daemon);
// --status asks a running daemon how it is.
package agentmain

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/internal/version"
	"github.com/fastpmi/fastpmi/netio"
	"github.com/fastpmi/fastpmi/perf"
)

// Usage is the agent's synopsis.
const Usage = `%[1]s --node I|slurm [--listen ADDR]
%[1]s --daemon --listen ADDR --secret-file FILE [--max-jobs N]
%[1]s --status ADDR --secret-file FILE

%[1]s is a node agent of a fastpmi job, started by pmirun's bootstraps
(ssh, Slurm, netns, loopback): it reads the job's spec and secret from its
standard input, connects to pmirun and to its peer agents, forks the
node's ranks and serves their PMI. It also runs the node's share of every
job the run spawns (MPI_Comm_spawn), so a spawn starts no process but the
children, and exits when the run has ended. Users run pmirun, not %[1]s.

  --node I        this agent's node index; "slurm" takes SLURM_NODEID
  --listen ADDR   address for peer agents' links, announced to them
                  (default, and the host of a wildcard ADDR: the address
                  this node reaches pmirun from; any free port)

Daemon mode: %[1]s --daemon stays up and runs the nodes of many jobs, each
submitted by "pmirun --daemons ADDR,... --secret-file FILE", starting no
process but the ranks. Each job keeps its own KVS, segment, secret,
working directory and environment. SIGTERM or SIGINT ends its jobs and
it exits 0.

  --daemon            serve jobs until SIGTERM
  --listen ADDR       address pmirun connects to (required, e.g. :7070 or
                      127.0.0.1:0; it prints "listening on ADDR")
  --secret-file FILE  the daemon's secret: connections must prove they
                      know it. Made (mode 0600, random) if missing; refused
                      if group or others can read it or another user owns it
  --max-jobs N        jobs run at once, at least 1; more are refused (default 64)
  --status ADDR       print a running daemon's status (jobs, served,
                      strangers dropped, goroutines, threads,
                      descriptors, memfds) as JSON

  --version           print the version and VCS revision
  --help              print this help

Environment: FASTPMI_DEBUG=1 logs at debug level; FASTPMI_CPUPROFILE=FILE
writes a CPU profile to FILE.nodeI; FASTPMI_PMIX_LIBRARY names OpenPMIx's
library to open for PMIx jobs (default libpmix.so.2).
`

// Main runs the agent with args (without the program name) and returns
// its exit code. starter, when set, plays the ranks of jobs of virtual
// ranks (node.Spec.Virtual); an agent without one refuses such jobs.
// guardExe, when set, is the binary to start as the agent's guard
// (internal/guard, guard.SelfExe: the command calls guard.Main first in
// its main) when it runs a node or a daemon, so that nothing its ranks
// started survives the agent's SIGKILL; Main stops the guard before it
// returns. "" starts none (ranks played as goroutines, tests).
func Main(name, guardExe string, args []string, stdin io.Reader, stdout, stderr io.Writer, starter node.Starter) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	nodeFlag := fs.String("node", "", "")
	listen := fs.String("listen", "", "")
	daemonMode := fs.Bool("daemon", false, "")
	statusAddr := fs.String("status", "", "")
	secretFile := fs.String("secret-file", "", "")
	maxJobs := fs.Int("max-jobs", daemon.DefaultMaxJobs, "")
	showVersion := fs.Bool("version", false, "")
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintf(stdout, Usage, name)
		return 0
	case err == nil && *showVersion:
		fmt.Fprintln(stdout, version.String(name))
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v (see --help)\n", name, err)
		return 2
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "%s: unexpected arguments %q (see --help)\n", name, fs.Args())
		return 2
	case *daemonMode || *statusAddr != "":
		if *nodeFlag != "" || (*daemonMode && *statusAddr != "") {
			fmt.Fprintf(stderr, "%s: --daemon, --status and --node exclude each other (see --help)\n", name)
			return 2
		}
		if *maxJobs < 1 {
			fmt.Fprintf(stderr, "%s: --max-jobs %d: want at least 1\n", name, *maxJobs)
			return 2
		}
		if *statusAddr != "" {
			return status(name, *statusAddr, *secretFile, stdout, stderr)
		}
		return serve(name, guardExe, *listen, *secretFile, *maxJobs, stdout, stderr, starter)
	case *nodeFlag == "":
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
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("agent", name)
	if path := os.Getenv("FASTPMI_CPUPROFILE"); path != "" {
		stop, err := perf.StartCPUProfile(path + ".node" + strconv.Itoa(idx))
		if err != nil {
			fmt.Fprintf(stderr, "%s: node %d: %v\n", name, idx, err)
			return 2
		}
		defer stop()
	}
	if guardExe != "" {
		// Started before the spec is read: it comes up while the agent
		// reads, connects and links.
		guard.Start(guardExe, log)
		defer guard.Stop()
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
	switch {
	case idx == spec.StdinNode():
		o.Stdin = br
	case *nodeFlag == "slurm":
		// srun feeds every node's agent the job's input (--input=all)
		// and holds only so much of it as a task has not read: left
		// unread here, it would stop the input of the node whose rank
		// reads it. Like pmirun's pumps of the input, this goroutine is
		// not waited for: it may be blocked in a read when the agent
		// ends, and ends with the process.
		go func() { _, _ = io.Copy(io.Discard, br) }()
	}
	// The command line's job's agents host the jobs the run spawns; an
	// agent pmirun starts for a spawned job (when hosting could not be
	// set up) hosts none.
	host := &runHost{secret: spec.Secret, log: log, starter: starter}
	if spec.Jobno == 0 {
		o.HostJobs = host.listen
	}
	err = node.RunAgent(ctx, spec, o)
	if herr := host.close(); herr != nil {
		log.Warn("host of the run's jobs", "err", herr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err) // the error names the node
		return 1
	}
	return 0
}

// logger is the agent's log: warnings, or everything with FASTPMI_DEBUG.
func logger(stderr io.Writer) *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("FASTPMI_DEBUG") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
}

// serve runs the daemon until SIGTERM, SIGINT or SIGHUP, with one
// guard (guardExe, unless "") for the ranks of all its jobs.
func serve(name, guardExe, listen, secretFile string, maxJobs int, stdout, stderr io.Writer, starter node.Starter) int {
	if listen == "" || secretFile == "" {
		fmt.Fprintf(stderr, "%s: --daemon needs --listen ADDR and --secret-file FILE (see --help)\n", name)
		return 2
	}
	secret, err := daemon.LoadSecret(secretFile, true)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	if guardExe != "" {
		guard.Start(guardExe, logger(stderr).With("agent", name, "daemon", listen))
		defer guard.Stop()
	}
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGTERM, sys.SIGINT, sys.SIGHUP)
	defer stop()
	srv, err := daemon.New(daemon.Config{Listen: listen, Secret: secret, MaxJobs: maxJobs,
		Logger: logger(stderr).With("agent", name, "daemon", listen), Starter: starter})
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: daemon listening on %s (jobs' links follow their pmirun --netio)\n", name, srv.Addr())
	if err := srv.Serve(ctx); err != nil {
		fmt.Fprintf(stderr, "%s: daemon: %v\n", name, err)
		return 1
	}
	return 0
}

// status prints a running daemon's status as JSON.
func status(name, addr, secretFile string, stdout, stderr io.Writer) int {
	if secretFile == "" {
		fmt.Fprintf(stderr, "%s: --status needs --secret-file FILE\n", name)
		return 2
	}
	secret, err := daemon.LoadSecret(secretFile, false)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	tr, err := daemon.NewTransport(secret, nil)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	defer tr.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := daemon.QueryStatus(ctx, tr, addr)
	if err != nil {
		if errors.Is(err, netio.ErrAuth) {
			err = fmt.Errorf("%w (the daemon does not take the secret of --secret-file %s, or is no pmid --daemon)", err, secretFile)
		}
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	b, _ := json.MarshalIndent(st, "", "  ")
	fmt.Fprintf(stdout, "%s\n", b)
	return 0
}
