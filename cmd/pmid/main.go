// Command pmid is fastpmi's node agent run as its own process.
//
//	pmid -n N [options] program [args...]
//
// It serves one node's share of a job: it creates the node agent, forks the
// node's ranks with their PMI environment and serves their PMI requests,
// exactly as pmirun does in-process for a job on one machine (the fork
// bootstrap). Its options and exit codes are pmirun's. Bootstraps that
// start one agent per node (ssh, Slurm) run pmid on each node.
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
)

func main() { os.Exit(run()) }

func run() int {
	cfg, err := cli.Parse("pmid", os.Args[1:], os.Stderr)
	if errors.Is(err, cli.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "pmid: %v\n", err)
		return 2
	}
	level := slog.LevelWarn
	if cfg.Verbose {
		level = slog.LevelInfo
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("agent", "pmid")
	cfg.Stdin = os.Stdin
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, sys.SIGINT, sys.SIGTERM, sys.SIGHUP)
	cfg.Signals = sigs
	return launch.ExitCode(launch.Run(context.Background(), cfg))
}
