// Command pmid is fastpmi's node agent run as its own process.
//
//	pmid --node I [--listen ADDR]      (started by pmirun's bootstraps)
//	pmid -n N [options] program [args...]
//
// With --node it serves node I of a multi-node job: it reads the job spec
// (and the job's secret) from its standard input, connects to pmirun and
// to its peer agents (tree and ring links), forks the node's ranks and
// serves their PMI, and reports to pmirun until its ranks have ended.
// "--node slurm" takes the index from SLURM_NODEID.
//
// FASTPMI_CPUPROFILE=FILE (in pmirun's environment, which agents inherit
// on this machine) writes each agent's CPU profile to FILE.nodeI.
//
// Without --node it runs a whole job on this machine with the agent in
// this process, exactly as pmirun does (the fork bootstrap); its options
// and exit codes are pmirun's.
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
	if len(os.Args) > 2 && os.Args[1] == "--node" {
		return runAgent()
	}
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

func runAgent() int {
	node := os.Args[2]
	listen := ""
	if len(os.Args) > 4 && os.Args[3] == "--listen" {
		listen = os.Args[4]
	}
	level := slog.LevelWarn
	if os.Getenv("FASTPMI_DEBUG") != "" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("agent", "pmid", "node", node)
	if path := os.Getenv("FASTPMI_CPUPROFILE"); path != "" {
		stopProfile, err := cli.StartProfile(path + ".node" + node)
		if err != nil {
			fmt.Fprintf(os.Stderr, "pmid: node %s: %v\n", node, err)
			return 2
		}
		defer stopProfile()
	}
	ctx, stop := signal.NotifyContext(context.Background(), sys.SIGTERM, sys.SIGINT, sys.SIGHUP)
	defer stop()
	err := launch.RunAgent(ctx, launch.AgentOptions{Node: node, Listen: listen, Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr, Logger: log})
	if err != nil {
		fmt.Fprintf(os.Stderr, "pmid: %v\n", err) // the error names the node
		return 1
	}
	return 0
}
