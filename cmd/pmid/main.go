// Command pmid is fastpmi's node agent run as its own process.
//
//	pmid --node I|slurm [--listen ADDR]      (started by pmirun's bootstraps)
//	pmid --daemon --listen ADDR --secret-file FILE [--max-jobs N]
//	pmid --status ADDR --secret-file FILE
//
// It serves node I of a multi-node job: it reads the job spec (and the
// job's secret) from its standard input, connects to pmirun and to its peer
// agents (tree and ring links), forks the node's ranks and serves their
// PMI, and reports to pmirun until its ranks have ended. "--node slurm"
// takes the index from SLURM_NODEID. A job on one machine needs no pmid:
// pmirun runs the node's agent in its own process.
//
// With --daemon it stays up and runs the nodes of many jobs submitted by
// pmirun --daemons (package agent/daemon), starting no process but the
// ranks, until SIGTERM or SIGINT, which end its jobs; --status prints a
// running daemon's jobs, goroutines, threads and descriptors.
//
// FASTPMI_CPUPROFILE=FILE (in pmirun's environment, which agents inherit
// on this machine) writes each agent's CPU profile to FILE.nodeI.
package main

import (
	"os"

	"github.com/fastpmi/fastpmi/agent/pmix"
	"github.com/fastpmi/fastpmi/internal/agentmain"
	"github.com/fastpmi/fastpmi/internal/guard"
)

func main() {
	guard.Main() // run as its parent pmid's guard, it serves that and exits here
	code := agentmain.Main("pmid", guard.SelfExe, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, nil)
	pmix.Shutdown() // the PMIx server of --mpi pmix jobs, if one started
	os.Exit(code)
}
