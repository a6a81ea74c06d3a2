// Package tree is the k-ary tree of node agents and its gather and
// broadcast collectives, as pure state machines: no sockets, clocks or
// goroutines. The agent's I/O shell feeds a Node the local contribution and
// the messages it receives and sends the messages the Node returns.
//
// # Topology
//
// Nodes 0..K-1; node 0, the launcher, is the root. With width k, node i's
// children are k*i+1 .. k*i+k (those below K) and its parent is (i-1)/k.
// Width 1 makes a chain.
//
// # Contributions
//
// A gather carries rank-tagged binary contributions: a set of (rank, value)
// entries for allgather, or of (key, value, owner rank) entries for the
// puts of a fence. Encodings use varint lengths and sorted, delta-coded ranks
// (or sorted keys), so a decoded set never holds a duplicate; decoders
// validate everything against Limits (rank < P, value and key lengths, total
// size) and are fuzzed. Decoded values alias the input bytes.
//
// # Collectives
//
// For each collective kind (fence, allgather) epochs are numbered 1, 2, 3 ...
// and several may be in flight at once (non-blocking collectives). For one
// epoch a node is fed its own contribution (Contribute) and one Up message
// per child carrying that child's whole subtree; when all are in it merges
// them and returns one Up message to its parent, or, at the root, an
// EventGathered with the complete result. The root's caller may compress
// the result and calls Broadcast; every node forwards the Down payload
// unchanged to each child and gets an EventDelivered for its own use. An
// epoch is finished at a node once it has been delivered there.
//
// Messages for an epoch this node has not reached yet are kept (up to
// Window epochs ahead of the oldest unfinished one); messages for a
// finished epoch are ErrStaleEpoch; a second Up from the same child is
// ErrDuplicate; an Up from a node that is not a child, or a Down before
// this node sent its Up, is ErrUnexpected. A refused message changes
// nothing. A failed merge (a malformed part, ErrMalformed or ErrLimit; a
// rank, or a key of one rank, from two parts, ErrConflict) leaves its
// epoch stuck: the caller ends the job. A key put by ranks of two parts
// keeps the higher rank's value (MergeKVs).
//
// # Ownership
//
// A Node is used by one goroutine. It keeps the payload slices passed to
// Contribute and Step until the epoch's merge, so the caller hands over
// buffers it will not reuse. Down payloads are shared, unmodified, between
// the messages to every child and the local event: treat them as read-only.
package tree
