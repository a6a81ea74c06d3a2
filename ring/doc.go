// Package ring is the ring-exchange collective (Slurm's PMIX_Ring) between
// node agents, as a pure state machine: no sockets, clocks or goroutines.
//
// # Model
//
// Every rank contributes a Left and a Right value and counts 1 (PMIX_Ring
// clients always pass count 1; Slurm's libpmi2 hard-codes it). Ranks are
// laid out in ring order, node order then local order, so a node's ranks
// hold contiguous ring positions. The rank at position p receives, as its
// left, the Right value of position p-1 and, as its right, the Left value
// of position p+1, both wrapping. A Map is the placement of ranks on nodes:
// it gives every rank its node, local index and position and every node
// its offset, so positions and the ring size need no communication. A node
// holding no ranks takes no part; a node's ring neighbours are the nearest
// nodes holding ranks on either side. ParseProcessMapping and
// Map.ProcessMapping read and write the PMI_process_mapping value.
//
// # Links and messages
//
// Only a node's first and last ranks need a value from another node. A
// Link is a node's two sides. The left side sends the first rank's Left
// value to the left neighbour node (a ToLeft Message) and receives that
// node's last rank's Right value (its ToRight); the right side is the
// mirror image. A side sends the moment its rank enters an epoch
// (Link.Send), so a node sends exactly two messages per epoch and a rank
// waits only for its own two neighbours. A message carries the epoch, both
// node ids, the count mode, the ring size and an offset, and Link.Recv
// checks them against the Map, so neighbours that disagree on the
// placement get an error, not a wrong answer. AppendMessage and
// DecodeMessage are the wire codec.
//
// # Epochs
//
// Epochs run 1, 2, 3, ... on each side separately: a node's ranks, and so
// its two sides, may be in different epochs. A side's Sends must follow
// each other, and Recv takes exactly the epoch after the side's last
// received one, at most one past its last Send: the neighbour's boundary
// rank cannot leave epoch e before this side's value of e reached it, so
// it is at most one epoch ahead. A value that arrives before its side's
// Send is held, and that Send returns it. Anything else is refused
// (ErrSequence, ErrFutureEpoch, ErrUnexpected, ErrMismatch) and leaves the
// Link as it was; the caller fails the ring.
//
// # One node
//
// When one node holds every rank the ring closes on it: both neighbours
// are the node itself, Send's message is addressed to the node, and the
// caller feeds it straight back into Recv. Nothing crosses the network.
//
// # Ownership
//
// A Map is immutable after construction and may be shared between
// goroutines; slices it returns must not be modified. A Link is used by one
// goroutine (the agent's I/O shell). Messages are plain values and values
// are strings, so nothing aliases a receive buffer: AppendMessage appends
// to the caller's buffer and DecodeMessage copies the value out of its
// input.
package ring
