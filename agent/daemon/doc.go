// Package daemon is pmid's daemon mode: one persistent node agent that
// serves many jobs, submitted to it by pmirun, without starting any
// process but the ranks (like MPD, PRRTE's DVM or Flux's brokers).
//
// Model. A Server listens on one netio transport whose secret is the
// daemon's (a file readable only by its owner, LoadSecret); a connection
// that does not prove it knows the secret is refused by netio before a
// frame is read. An authenticated connection's first frame is either a
// status request (answered, then closed) or a submission: one node of one
// job, its node.Spec (with the job's own secret, working directory and
// environment) and the node's index. The daemon runs that node with
// node.RunAgent exactly as a per-job pmid would — it dials the job's root
// (pmirun) and its peers with the job's secret — and streams the ranks'
// output back on the submission connection, takes rank 0's input from it,
// and ends with an Exit frame. pmirun ends the job early by closing the
// submission (or sending Kill).
//
// Isolation. Each job has its own transport, agent, KVS, epochs, segment,
// secret, working directory and environment; nothing process-wide
// changes per job (Spec.AgentProcs is ignored). A bad or oversized
// submission is refused on its own connection; a job's failure ends only
// that job. Running jobs are bounded (Config.MaxJobs) and so are frames
// (MaxFrame).
//
// Across runs. A connection whose first frame is a name request is a
// run's name session (names.go): runs launched separately on the same
// daemons keep their names at the daemon of their first node, and
// register their jobs there too (jobs.go), so that a collective across
// jobs of two runs (PMIx connect between an MPI_Comm_accept server and
// its clients) completes there, and a node can learn where the other
// run's job runs and read its ranks' data through that run.
//
// Scoped to a run. A per-job pmid runs a Server too, for the rest of its
// run (internal/agentmain's runHost): its secret is the run's, pmirun
// submits to it the nodes of the jobs the run spawns on its host, and it
// ends with the pmid, when the run does.
//
// Ownership. Serve owns every goroutine of the server: one per
// connection, and for a job its input forwarder and reader; it returns
// only after all of them, and every job's ranks, have ended. Cancelling
// Serve's context (SIGTERM in pmid) stops accepting, tells each job's
// pmirun the daemon is shutting down (node.Ending: on the submission, and
// from the node on its link to pmirun ahead of its ranks' events), and
// ends every job.
package daemon
