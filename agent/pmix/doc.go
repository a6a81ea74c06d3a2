// Package pmix serves PMIx ranks (Open MPI, MPICH built for PMIx) from the
// node agent, through OpenPMIx's server library: it is a front end of the
// agent like the text protocol and shared memory are, and the only cgo
// package a program of the module links.
//
// Model. One PMIx server per process (PMIx_server_init at the first Job;
// Shutdown, which pmirun and pmid call as they exit, removes its
// directory and leaves the rest to the exit: OpenPMIx cannot start a
// second server in a process, so a pmid daemon serving many jobs keeps
// one), one namespace per job and node
// (PMIx_server_register_nspace with the job's size, universe size, node
// and process maps — nodes named as the launcher names them for the whole
// run, Config.Hosts — local peers and each rank's local, node and app
// ranks; another job of the run with no rank here is registered with
// where it runs, as the launcher says, at its first direct modex), one registered client per rank (PMIx_server_register_client
// and PMIx_server_setup_fork, Job.Env, before the rank is forked). The
// server library's host callbacks — client connected, finalized, abort,
// fence, direct modex, publish, lookup, unpublish, spawn — run on PMIx's
// progress thread: they copy their request and hand it to the Job's
// worker goroutine, which steps the agent's core (agent.StepExternal) as
// init, finalize, abort, an allgather epoch (the fence: the node's
// collected data is the first local rank's value, every node's data
// concatenated in rank order comes back), name operations (a publish that
// goes with its first lookup, a lookup that waits for its name: Open
// MPI's connect/accept exchange) and a spawn (placed as any spawn; the
// children's ranks get PMIX_PARENT_ID); the replies complete the
// callbacks. A direct modex (a client's get of a rank of another node
// that no fence carried) is the agent's GetRankData: the agent of the
// rank's node asks its Job (agent.External.AskRankData), which asks the
// server library (PMIx_server_dmodex_request, answered once the rank
// committed) and hands the blob back; for a rank of another job of the
// run, the launcher routes it to that job's node.
//
// Across jobs. The library completes PMIx_Connect, PMIx_Disconnect and
// a fence over several namespaces by itself among its own clients, and
// otherwise calls the host once per process: the Job of the first of
// those namespaces served here carries the call as an
// agent.JobsColl, which the launcher completes once every process
// hosting a participant entered (fpxJobsRequest). A namespace of the
// run with no rank on this node is registered, with its size (asked of
// the launcher) and without local clients, when a direct modex first
// names it (Job.foreignReady), and deregistered with the Job that did;
// docs/pmix.md.
//
// The C side is built only with the pmix build tag (make adds it when
// pkg-config finds OpenPMIx); without it NewJob returns ErrNotSupported
// and the rest of the module stays pure Go.
//
// Lifetimes. NewJob registers the namespace and starts the worker; Close
// fails what is still queued or waiting, stops the worker and
// deregisters the namespace. The node closes the Job before its agent.
// Shutdown ends the server for good.
package pmix
