package agentmain

import (
	"context"
	"log/slog"
	"net"

	"github.com/fastpmi/fastpmi/agent/daemon"
	"github.com/fastpmi/fastpmi/agent/node"
)

// hostedJobs bounds the spawned jobs' nodes a per-job agent runs at once:
// no bound of its own (a job holds at least one process, and --usize is
// the run's), only daemon.Config's need of one.
const hostedJobs = node.MaxRanks

// runHost makes a per-job agent the host of its run's spawned jobs: a
// daemon scoped to the run. Once the command line's job's node knows the
// address it reaches pmirun from (node.AgentOptions.HostJobs), listen
// starts a daemon.Server there that only the run's secret opens, and
// pmirun submits to it the nodes of the jobs the run spawns on this host,
// which then run in this process beside the first job's node, each with
// its own KVS, segment, transport, directory and environment: a spawn
// starts no process but the children. The first job's node lasts as long
// as the run (pmirun holds that job's links until every job of the run
// has ended), and close, called when it has ended, ends the server and
// any job it still runs.
type runHost struct {
	secret  []byte
	log     *slog.Logger
	starter node.Starter

	// Set by listen, on the node's goroutine, before RunAgent returns;
	// read by close after it has.
	cancel context.CancelFunc
	done   chan error // Serve's result
}

// listen starts the run's daemon at host, any free port, and returns its
// address.
func (h *runHost) listen(host string) (string, error) {
	srv, err := daemon.New(daemon.Config{Listen: net.JoinHostPort(host, "0"), Secret: h.secret, MaxJobs: hostedJobs,
		Logger: h.log.With("host", "run"), Starter: h.starter})
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel, h.done = cancel, make(chan error, 1)
	go func() { h.done <- srv.Serve(ctx) }() // waited for by close
	return srv.Addr().String(), nil
}

// close ends the server, the jobs it runs with it, and waits for it.
func (h *runHost) close() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	return <-h.done
}
