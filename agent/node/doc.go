// Package node is the node agent's shell: everything one node does for a
// job around the agent's PMI semantics (package agent).
//
// A Node is one job's share of one node: the agent serving the local
// ranks on both front ends (PMI text connections and the shared-memory
// segment it creates), the ranks themselves (forked in the job's working
// directory with their PMI environment, or played in-process by a
// Starter), and their output, forwarded a whole line at a time. It turns
// what happens to its ranks into Events for the job's fate and carries out
// the fate's orders (Kill, Signal). pmirun runs one Node in its own
// process for a job on one machine (the fork bootstrap).
//
// RunAgent is a node of a multi-node job in an agent process (pmid): the
// Node plus the network — the control link to pmirun, links to its tree
// parent, tree children and ring neighbours over netio, heartbeats, link
// failure — and the tree (package tree) and ring (package ring) state
// machines, which the agent reaches through its Upstream (netUpstream).
//
// The Spec is the job as the root built it, consumed as it is; the wire
// types in proto.go are the control protocol between pmirun and its
// agents. Nothing here changes process-wide state (working directory,
// environment, GOMAXPROCS): the ranks get the job's directory and
// environment, and the agent's command applies the spec's process
// settings.
//
// Ownership. A Node and an agentNode are each driven by one goroutine, the
// owner's loop; every goroutine they start (rank waiters, exit judges,
// disconnect timers, link readers) is waited for by Close or RunAgent.
package node
