// Package shm is the per-node shared-memory substrate between a node agent
// and its local ranks: one segment per job per node, made by the agent
// with memfd_create (nothing in /dev/shm, nothing left after a crash),
// mapped shared by the agent and by every rank process, which inherits the
// descriptor across fork/exec (exec.Cmd.ExtraFiles) and maps it with Open.
//
// # Layout (LayoutVersion 3)
//
// Every region starts on a 4 KiB boundary; offsets and strides are named
// constants in layout.go and all are stored in the header, which a reader
// checks against its own computation before it touches anything else.
//
//	header      magic "fpmi-shm", version, sizes, offsets, strides, total length;
//	            the doorbell line (doorbell futex word, agent-sleeping flag);
//	            the epoch line (published epoch, its futex word, sleeper count)
//	control     per local rank, 256 bytes: a line written only by the rank
//	            (request-ring tail, response-ring head, rank-sleeping flag,
//	            state, pid) and, two lines further, a line written only by the
//	            agent (request-ring head, response-ring tail, rank wake word)
//	ready       one bit per local rank (uint64 words, closing the control
//	            region): set by the rank after each request, taken by the agent
//	rings       per local rank: request ring (rank → agent), response ring
//	            (agent → rank); power-of-two byte rings of 16-byte-aligned
//	            records, each a header (length, op, flags, seq, epoch) and a
//	            contiguous payload; a pad record fills a gap at the end
//	slots       per local rank and epoch parity: length, epoch, MaxValue bytes
//	results     the allgather result array, two buffers (epoch parity) of
//	            WorldSize entries indexed by global rank: length, epoch,
//	            MaxValue bytes
//	kvs index   open-addressing hash buckets (uint32: entry number + 1)
//	kvs entries append-only, 24 bytes: epoch, key length, value length, hash,
//	            arena offset
//	kvs arena   append-only key and value bytes, each entry's at its own
//	            size (Params.KVSArenaBytes; unused pages are never touched)
//
// Plain fields are little-endian; atomic words are native-endian (the
// segment never leaves its node). Counters are free-running and wrap: ring
// positions are uint64 byte counts (position x is at x & (size-1)), epochs
// and sequence numbers uint32 compared by signed difference; Params.RingBase
// and Params.FirstEpoch start them anywhere, so tests run them across the
// wrap.
//
// This package owns the layout; libfastpmi (clib/, the C rank side for
// programs linked against libpmi2) is its second implementation. The C
// constants are generated from this package (cheader.go, go generate
// ./shm writes clib/fastpmi_layout.h; a test fails when the committed
// header differs), and the C reader recomputes the geometry and refuses a
// segment whose LayoutVersion or offsets it does not compute itself, so
// any change here means: bump LayoutVersion if the format changed, run go
// generate, and port the change to clib/layout.c and clib/shm.c.
//
// # Ownership
//
// The agent writes the header (once, before sharing), its control lines,
// the response rings' records, the result array, the KVS and the epoch. A
// rank writes its own control line, its request ring's records and its own
// slots; it reads the rest. Nobody else writes anything. Rings are
// single-producer single-consumer: the bytes in [head, tail) belong to the
// consumer, the others to the producer.
//
// # Ordering
//
// All shared words are accessed only with sync/atomic, whose operations are
// sequentially consistent; everything else is plain memory published by
// one of them:
//
//   - A ring's tail Store (Producer.Commit) publishes the records before it;
//     the consumer's tail Load (Consumer.Peek) pairs with it. The head Store
//     (Consumer.Release) returns bytes to the producer; the producer's head
//     Load pairs with it before overwriting them.
//   - A rank's ready bit (an atomic Or after its tail Store) tells the
//     agent which rings to drain; the agent's Swap (Agent.TakeReady)
//     pairs with it, and its doorbell wait tests the bitmap, so a request
//     is never missed and an idle ring is never visited.
//   - A request record publishes the slot the rank wrote before pushing it
//     (CommitSlot, then Push): the agent reads the slot after Peek.
//   - The epoch Store (Agent.Publish) publishes every result entry and KVS
//     entry written for that epoch; Rank.WaitEpoch, Rank.Result and
//     Rank.Lookup load it first.
//   - A KVS bucket Store publishes its (immutable) entry; Lookup's bucket
//     Load pairs with it, so readers need no lock and no seqlock retry.
//   - The state Store (Rank.SetState) publishes the pid stored before it.
//   - Waking is Dekker-style (see event in wait.go): a sleeper counts itself
//     in a sleepers word and then re-checks its condition; a signaller
//     stores the new state and then loads sleepers, and only if it is
//     non-zero bumps the futex word and calls FUTEX_WAKE. Sequential
//     consistency guarantees that one of the two sees the other, so no
//     wake-up is lost and nobody makes a system call while nobody sleeps.
//     With InProcessWaiter (every party a goroutine of one process) the
//     sleeper registers its handle's reusable channel under the word's
//     address before counting itself, and the signaller sends to the
//     registered channels instead of calling FUTEX_WAKE; the same argument
//     holds with the registration in place of the kernel's compare.
//
// The agent sleeps on the one doorbell word for all ranks (Agent.Wait),
// woken by request pushes, response-ring releases and Kick. A rank sleeps on
// its own wake word (ring waits) or on the shared epoch word (WaitEpoch,
// one FUTEX_WAKE for all ranks). A Waiter spins first only while local
// ranks + 1 fit on the online CPUs; otherwise it sleeps at once. An agent
// idle for a while may park instead (Agent.Park): it announces its sleep
// the same way and a Sleeper's bed waits on its doorbell word together
// with up to 126 others (futex_waitv), so that idle agents hold no thread
// each; nothing changes for the ranks.
//
// # Lifetimes
//
// A Segment owns its mapping (and the creator's memfd) until Close, which
// is idempotent; every view it handed out dies with it. Each Segment has
// one Agent handle and one Rank handle per local rank; a handle is used by
// one goroutine of the one process playing that role (Agent.Kick may be
// called from anywhere). A ring message's Payload lives until Release. A
// slot for epoch e is the rank's to write only after epoch e-2 is
// published, and the agent's to read from the rank's request for e until
// it publishes e. A result view for epoch e lives until the rank requests
// epoch e+2: the agent writes epoch e+2's entries into the same buffer only
// after every local rank requested e+2. KVS entries never change, so a
// Lookup view lives as long as the segment.
//
// Heap-backed segments (NewHeap, FromBytes, Attach) run the same code over
// a 64-byte-aligned Go buffer, so tests can run the algorithms with
// goroutines under the race detector, which cannot see mmap'd memory.
package shm
