// Package ring is the ring-exchange collective (Slurm's PMIX_Ring) between
// node agents, as a pure state machine: no sockets, clocks or goroutines.
//
// # Model
//
// Every process contributes (count, left value, right value). Processes are
// laid out in ring order: node order 0..K-1, then local order inside a node,
// so ring positions are contiguous per node. A process's position is the sum
// of the counts of the processes before it; the ring size is the sum of all
// counts. The process at index j of the ring order receives, as its "left",
// the Right value of process j-1 and, as its "right", the Left value of
// process j+1 (both wrapping). A Map describes the placement of ranks on
// nodes and gives each rank its node, local index and ring position.
//
// Only nodes that hold ranks take part; a node with no ranks is skipped, and
// its ring neighbours are the nearest non-empty nodes on either side.
//
// # Two messages per node
//
// A Node is one node's part of one ring epoch. Its inputs are its local
// entries and the two messages of its neighbour nodes; it sends exactly two
// messages, both on the ring: ToLeft (its first entry's Left value) to the
// left neighbour node and ToRight (its last entry's Right value) to the right
// neighbour node. A ring with one non-empty node sends nothing and closes on
// itself.
//
// Positions need the counts of all nodes before this one. Two count modes,
// chosen job-wide by the agent:
//
//   - CountsFromMap (the normal case): PMIX_Ring clients always pass count=1
//     (Slurm's libpmi2 hard-codes it), so every node's offset and the ring
//     size follow from the Map without communication. Both messages leave at
//     Start; the ring takes one message latency. A local entry with
//     Count != 1 is refused at New (ErrCounts): the agent must not guess.
//   - CountsChained (arbitrary counts): the same two messages per node, but
//     a ToRight message carries the running prefix sum and leaves only once
//     the sender knows its offset, and a ToLeft message carries the ring size
//     and leaves only once the sender knows it. Offsets travel head to tail
//     and the size travels back tail to head, so the ring takes about 2K
//     message latencies. The head node (first non-empty node, offset 0)
//     sends its ToLeft at once: its receiver, the tail, learns the size
//     itself.
//
// Every message carries the epoch, both node ids, the mode and the
// sender's view of the offsets, and the receiver checks them against its own
// view, so neighbours that disagree on the map, the mode or the counts get
// an error rather than a wrong answer.
//
// # Epochs
//
// A Node handles one epoch and rejects a message of any other epoch
// (ErrStaleEpoch for an older one, ErrFutureEpoch for a newer one).
// Sequence runs consecutive epochs on one node and holds messages for the
// next epoch until it starts: a neighbour can be at most one epoch ahead,
// because it cannot finish epoch e+1 without this node's messages for e+1,
// so at most two messages are ever held.
//
// # Ownership
//
// A Map is immutable after construction and may be shared between
// goroutines; slices it returns must not be modified. A Node and a Sequence
// are used by one goroutine (the agent's I/O shell) and keep the entries
// slice passed to New; values are strings, so nothing aliases a receive
// buffer. Messages are plain values; EncodeMessage appends to a caller's
// buffer and DecodeMessage copies the value out of its input.
package ring
