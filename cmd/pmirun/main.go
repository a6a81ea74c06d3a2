// Command pmirun launches a parallel (MPI) job and serves its PMI.
//
//	pmirun -n N [options] program [args...]
//
// It runs the node agent in-process (or agents on other nodes: -hosts,
// -hostfile, --bootstrap), forks N ranks with PMI_FD, PMI_RANK,
// PMI_SIZE, PMI_JOBID, MPI_LOCALNRANKS and MPI_LOCALRANKID set, forwards
// their output line by line, stdin to rank 0 (--stdin) and SIGINT,
// SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 to every rank (a second
// Ctrl-C within 5 s kills them), and exits with the first failing rank's
// code (128+signal for a rank killed by a signal, 124 on --timeout, 126
// or 127 when the program cannot be executed or found), else 0.
// "pmirun --help" lists every option (internal/cli holds them). Built
// without cgo, it hands a one-machine PMIx job to pmirun-pmix beside it
// (withPMIx).
// FASTPMI_CPUPROFILE=FILE writes a CPU profile of pmirun itself (go tool
// pprof) to show where the launcher spends its time.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"time"

	"github.com/fastpmi/fastpmi/agent/pmix"
	"github.com/fastpmi/fastpmi/internal/cli"
	"github.com/fastpmi/fastpmi/internal/guard"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/internal/version"
	"github.com/fastpmi/fastpmi/launch"
	"github.com/fastpmi/fastpmi/perf"
)

func main() {
	guard.Main() // run as its parent pmirun's guard, it serves that and exits here
	code := run()
	guard.Stop()    // before os.Exit: every rank is reaped, nothing registered is left
	pmix.Shutdown() // the PMIx server of --mpi pmix jobs, if one started
	os.Exit(code)
}

func run() int {
	cfg, err := cli.Parse(os.Args[1:])
	switch {
	case errors.Is(err, cli.ErrHelp):
		cli.Usage(os.Stdout)
		return 0
	case errors.Is(err, cli.ErrVersion):
		fmt.Println(version.String("pmirun"))
		return 0
	case err != nil:
		fmt.Fprintf(os.Stderr, "pmirun: %v (see pmirun --help)\n", err)
		return 2
	}
	if !pmix.Supported && cfg.PMIxInProcess() {
		if err := execWithPMIx(); err != nil {
			fmt.Fprintf(os.Stderr, "pmirun: %v\n", err)
			return 1
		}
	}
	if path := os.Getenv("FASTPMI_CPUPROFILE"); path != "" {
		stop, err := perf.StartCPUProfile(path)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pmirun: %v\n", err)
			return 2
		}
		defer stop()
	}
	level := slog.LevelWarn
	if cfg.Verbose {
		level = slog.LevelInfo
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// Signals are caught before the guard starts: each one Notify
	// enables is a hand-off to the runtime's signal thread, which the
	// guard's start-up on the other CPU delays (0.5-1 ms for the six
	// then, 0.1-0.5 ms before).
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwarded()...)
	if len(cfg.Daemons) == 0 {
		// pmirun forks the ranks (fork bootstrap) or the agents: its
		// guard kills their process groups if pmirun is killed. It
		// starts concurrently with the job.
		guard.Start(guard.SelfExe, cfg.Logger)
	}
	cfg.Stdin = os.Stdin
	if sys.IsTerminal(os.Stdin) {
		// Ranks run in process groups of their own, in the terminal's
		// background: one reading the terminal itself would be stopped
		// by SIGTTIN. pmirun, in the foreground, reads it and relays
		// the bytes through a pipe (as Hydra does).
		cfg.Stdin = terminalInput{os.Stdin}
	}
	cfg.Signals = sigs
	err = launch.Run(context.Background(), cfg)
	return launch.ExitCode(err)
}

// forwarded are the signals pmirun catches and forwards to the ranks:
// sys.ForwardedSignals but SIGHUP if pmirun was started ignoring it
// (nohup), which then stays ignored, by pmirun and by the ranks, which
// inherit that: "nohup pmirun ... &" survives the hangup of its terminal,
// as "nohup mpiexec" does.
func forwarded() []os.Signal {
	return slices.DeleteFunc(slices.Clone(sys.ForwardedSignals), func(s os.Signal) bool {
		return s == sys.SIGHUP && signal.Ignored(s)
	})
}

// terminalInput is pmirun's terminal as the ranks' input (cfg.Stdin): it
// reads the terminal only while pmirun is in its foreground. A read in
// the background would stop pmirun (SIGTTIN) and with it the job, though
// no rank may want input: "pmirun -n 4 ./app &", or Ctrl-Z then bg,
// would leave the job stopped where mpiexec runs on. So it waits for
// input without reading (a read already waiting when the job is sent to
// the background would be stopped as it restarts) and reads it only if
// pmirun is the foreground job; in the background it looks again every
// terminalPoll. A background group that is orphaned ("(pmirun ... &)",
// or its shell gone) can never be brought to the foreground: its input
// ends there, as a read of the terminal would end it (EIO).
type terminalInput struct{ tty *os.File }

const (
	terminalPoll = 100 * time.Millisecond
	// orphanPolls is how many polls apart the background reader checks
	// whether its group is orphaned (a scan of /proc when it is).
	orphanPolls = 10
)

func (t terminalInput) Read(b []byte) (int, error) {
	for polls := 0; ; polls++ {
		if sys.InBackground(t.tty) {
			if polls%orphanPolls == 0 && sys.OrphanedGroup() {
				return 0, io.EOF
			}
			time.Sleep(terminalPoll)
			continue
		}
		if sys.WaitReadable(t.tty, time.Minute) && !sys.InBackground(t.tty) {
			return t.tty.Read(b)
		}
	}
}

// withPMIx is pmirun built with PMIx support (-tags pmix: cgo and
// OpenPMIx's server library), installed beside a pmirun built without
// it. A binary without cgo is linked statically and starts about 1 ms
// sooner (docs/benchmarks.md, "pmirun without cgo"), so every job starts
// that way, and a job whose ranks pmirun would serve over PMIx itself
// (its node inside pmirun: the fork bootstrap) is handed to this one.
const withPMIx = "pmirun-pmix"

// execWithPMIx replaces this process with withPMIx from beside this
// executable, with the same arguments and environment, before pmirun
// has started anything. It returns nil, doing nothing, when there is no
// such file (Run then says that this build serves no PMIx) or this
// process is it.
func execWithPMIx() error {
	exe, err := os.Executable()
	if err != nil || filepath.Base(exe) == withPMIx {
		return nil
	}
	p := filepath.Join(filepath.Dir(exe), withPMIx)
	if _, err := os.Stat(p); err != nil {
		return nil
	}
	return fmt.Errorf("run %s for --mpi pmix: %w", p, sys.Exec(p, os.Args, os.Environ()))
}
