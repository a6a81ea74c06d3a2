// Command pmirun launches a parallel (MPI) job and serves its PMI.
//
//	pmirun -n N [options] program [args...]
//
// It runs the node agent in-process, forks N ranks with PMI_FD, PMI_RANK,
// PMI_SIZE, PMI_JOBID, MPI_LOCALNRANKS and MPI_LOCALRANKID set, forwards
// their output line by line, stdin to rank 0 and SIGINT/SIGTERM/SIGHUP to
// every rank, and exits with the first failing rank's code (128+signal for
// a rank killed by a signal, 124 on --timeout), else 0. See the README for
// every option. FASTPMI_CPUPROFILE=FILE writes a CPU profile of pmirun
// itself (go tool pprof) to show where the launcher spends its time.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"

	"github.com/fastpmi/fastpmi/internal/cli"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/launch"
	"github.com/fastpmi/fastpmi/perf"
)

func main() { os.Exit(run()) }

func run() int {
	cfg, err := cli.Parse("pmirun", os.Args[1:], os.Stderr)
	if errors.Is(err, cli.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pmirun: %v\n", err)
		return 2
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
	cfg.Stdin = os.Stdin
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, sys.SIGINT, sys.SIGTERM, sys.SIGHUP)
	cfg.Signals = sigs
	err = launch.Run(context.Background(), cfg)
	return launch.ExitCode(err)
}
