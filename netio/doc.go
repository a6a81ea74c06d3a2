// Package netio is the agent-to-agent transport: authenticated TCP
// connections that carry frames, over one of two backends behind one
// interface, plus the payload codecs (compression) the tree uses.
//
// # Model
//
// A Transport (one per process) makes Listeners and Conns and owns them:
// Transport.Close closes everything it made and waits for every goroutine
// it started. A Conn moves Frames — a type (uint16; values from
// TypeReserved up belong to the transport), an epoch (uint64) and a payload
// — both ways, in order per sender. Send copies the frame, so the caller
// keeps its buffer; Recv returns a payload the caller owns. Both take a
// context; Recv's cancellation leaves the Conn usable, and a Send that gave
// up mid-frame leaves it broken (the error says so). Close is idempotent,
// lets queued frames reach the kernel (Config.Linger), and returns when
// nothing of the Conn is left running. A peer's close shows as
// ErrPeerClosed (wrapping io.EOF) after the frames it sent; a stream cut
// inside a frame as ErrTruncatedFrame; a local close as ErrClosed.
//
// Framing is a pure codec (frame.go): a 16-byte header (length, type,
// magic, version, epoch) then the payload; AppendFrame, DecodeFrame and the
// streaming Decoder check the magic, version and a maximum size
// (Config.MaxFrameSize), and the Decoder allocates a payload as its bytes
// arrive (at most 1 MiB ahead), so a header alone cannot make it allocate
// the announced size.
//
// # Authentication
//
// Every connection is authenticated before it is returned, both ways, by
// a challenge–response over the job secret (Config.Secret; the launcher
// draws 32 random bytes and hands them to agents outside the command
// line): each end sends a fresh nonce, then HMAC-SHA256(secret, role label
// || dialer nonce || acceptor nonce), and checks the peer's; the acceptor
// sends its own only once the dialer's checked out. Until then a
// peer may send only two frames of at most 64 bytes. Dial fails with
// ErrAuth; a listener never returns the connection, and logs the first
// refusal of each kind (Config.Logger, with the peer's address and the
// reason), then counts them and logs the counts in one line at Close (and
// at most once a minute meanwhile). A listener authenticates at most 256
// connections at once, dropping the oldest for a newer one (but never one
// it has begun to prove itself to, which proved itself first: its dialer
// may hold a Conn), and drops a
// peer that has not authenticated after 2 s (or Config.HandshakeTimeout
// if shorter): a flood of strangers' connections neither grows without
// bound nor locks the job's agents out, and Dial tries again (8 times in
// all, 2.5 s of pauses) when the listener hangs up before it proved
// itself.
//
// # Backends
//
// The net backend uses Go's net package (TCP_NODELAY) and no goroutines of
// its own: Send writes from the caller's goroutine (small frames copied
// behind their header into one pooled buffer, large ones with writev) and
// Recv reads and decodes on the caller's goroutine. A listener has one
// accept goroutine and one goroutine per handshake in progress, in both
// backends.
//
// The io_uring backend (giouring, uring_linux.go) gives each Transport one
// ring shared by its goroutines: multishot accept per listener, multishot
// recv per connection with one provided-buffer ring. A Send on a
// connection with nothing queued writes the frame to the socket itself
// with a non-blocking send(2); only what the socket does not take goes to
// the ring as a plain SEND SQE, one in flight per connection with the
// frames queued meanwhile coalesced into one pooled buffer
// (bytebufferpool). Any goroutine submits (under a mutex, with one
// non-blocking io_uring_enter) and a Send reaps its own completion at
// once; one goroutine at a time holds the reaper token — a Recv with
// nothing to return takes it when it is free — and waits parked in Go's
// poller on the ring's descriptor, never in io_uring_enter, so its frame
// is decoded and returned on its own goroutine and its thread stays free
// meanwhile. When nobody holds the token, an eventfd registered with the
// ring wakes a watcher goroutine to reap. A recv whose completions keep
// being reaped on another thread is armed again from that thread (the
// kernel finishes a recv on the thread that armed it, waking it if it
// sleeps; the thread is looked at every 4th completion, a recv moves
// after 2 looks in a row find another one, at most once per millisecond).
// A receiver that falls RecvQueue bytes behind makes the backend stop
// reading that socket until it catches up; a sender blocks while
// SendQueue bytes wait.
//
// Why no owner thread: the first version gave the ring to one goroutine
// locked to its OS thread (SINGLE_ISSUER, DEFER_TASKRUN) that every other
// goroutine reached through a request queue and an eventfd. Every message
// then crossed goroutines and threads several times (the locked goroutine
// can run only on its own thread, so each hand-off to it is a thread
// wake-up): about 100 µs one way. Letting the waiting goroutine reap and
// block in io_uring_enter itself cut that to about 40 µs, still two
// context switches per round trip (a thread asleep in the kernel must be
// woken, on another CPU). Parking the reaper in Go's poller lets a
// ping-pong run on one thread with almost no context switch, as the net
// backend's does.
//
// The backend is chosen once per Transport: Config.Backend "uring" or "net"
// forces it; "auto" (the default) takes FASTPMI_NETIO=uring|net if set, and
// otherwise probes io_uring once per process (kernel.io_uring_disabled,
// io_uring_setup — EPERM under seccomp, ENOSYS on old kernels — the opcodes
// used, a provided-buffer ring and a multishot recv on a socketpair) and
// caches the answer. Transport.Backend and ChooseBackend say which backend
// and why, for --verbose. Forcing uring where the probe fails is an error
// wrapping ErrNotSupported.
//
// # Measured here (2 shared cores, loopback, medians of 9 interleaved rounds)
//
// BenchmarkLatency, each end on its own Transport as two agents would be,
// one way; both backends, and a build of the previous version (commit
// 466dc05) run the same way inside the same loop:
//
//	go test -c -ldflags=-checklinkname=0 -o netio.test ./netio
//	cd netio; for r in 1 2 3 4 5 6 7 8 9; do ../netio.test -test.run '^$' \
//	    -test.bench BenchmarkLatency -test.benchtime 30000x -test.benchmem; done
//
//	                                         64 B frame   4 KiB frame
//	net                                      7.5 µs       11.1 µs
//	uring                                    7.4 µs       10.5 µs
//	uring before: SEND SQEs, recv moved      10.1 µs      13.9 µs
//	  after 32 messages, at most every 10 ms
//	uring, reaper in io_uring_enter          47.6 µs      51.4 µs
//	uring, locked owner thread               116 µs       112 µs
//
// (The last two rows are from earlier runs, when net measured 9.1 and 15.0
// µs.) At 64 B the backends are level within the noise (medians of
// repeated runs move by ±0.3 µs here); at 4 KiB io_uring is ahead. Per
// one-way message the io_uring backend now makes one sendto and one
// epoll_pwait, plus a gettid every 4th message, against net's write, two
// reads (the second finds nothing) and epoll_pwait; allocations are the
// payloads only (2 per round trip, against 10-14 for net). What it still
// pays for that net does not: the recv runs as task work at the sender's
// return to user space, and its completion wakes the ring's pollers. What
// made the difference: moving the recv to the reaping thread soon (perf
// stat, 4 KiB: 0.44 -> 0.07 context switches per round trip, as net), the
// send written to the socket by Send itself (no SQE, completion, reaping
// or poller wake-up for it), and no select over four channels nor
// allocation per wait.
//
// BenchmarkThroughput, one agent streaming to another, same build, medians
// of 7 interleaved rounds of -test.benchtime 1s:
//
//	            256 B frames    64 KiB frames   1 MiB frames
//	net         214 K/s         1.37 GB/s       1.59 GB/s
//	uring       232 K/s         1.04 GB/s       1.81 GB/s
//
// (The locked-owner design streamed 256 B frames at 2.2 M/s, its sends
// coalescing behind the hand-off to the owner thread; here a Send of an
// idle connection goes out at once.) The 64 KiB figure depends on what
// ran before it in the process: with only the 64 KiB benchmarks
// (-test.bench 'BenchmarkThroughput/.*/65536B', 9 rounds) io_uring streams
// 2.1 GB/s against net's 1.5, but after the 256 B stream it allocates
// about 3.4 times the bytes per frame and halves. Likely cause, not yet
// confirmed: bytebufferpool, calibrated by the small frames, drops the
// large buffers that frames queued behind a send in flight grow, so each
// is grown again from scratch. The earlier design showed the same (1.09
// against 1.44 GB/s in the full run).
//
// 64 agents on the 2 cores (pmirun -bootstrap loopback -nodes 64 -n 1024
// -virtual fence, medians of 5 interleaved runs): 1.35 s wall and 2.6 s
// CPU over io_uring against 1.42 s and 2.7 s with the previous version;
// -virtual ring 0.56 against 0.57 s. An idle pair of connections, each
// with a Recv waiting, uses no CPU of its own (3 ms of the process's
// over 3 s, as with net).
//
// # Compression
//
// Compress(policy, dst, src) appends a one-byte codec tag and the
// compressed payload; Decompress(dst, src, max) reads the tag and refuses,
// before allocating, output beyond max (s2's and zstd's headers announce
// the size; zstd frames without one are refused, and decoding stops at the
// announced size; a size over 1 MiB and 16 times the payload is not
// allocated on the header's word: an s2 body's tags are walked first to
// check that they make it, a zstd body is decoded as a stream). A payload that does not shrink is sent as it is under
// tag none, whatever the policy. The tree compresses once at the root and
// forwards the bytes unchanged.
//
// Measured on MPICH-style business cards, hex-encoded as MPICH puts binary
// values ("description#nodeNNNN...$port#NNNNN$ifname#10.x.y.z$", 16 ranks
// per node, random ports; P entries with rank and length), medians of 5:
//
//	P      bytes    s2 ratio  enc GB/s  dec GB/s   zstd ratio  enc GB/s  dec GB/s
//	16     2.3 K    6.1       3.3       6.2        9.4         0.42      0.88
//	1024   147 K    9.6       3.1       6.4        15.1        0.76      2.6
//	4096   595 K    9.6       2.8       7.1        14.5        0.73      2.5
//	16384  2.4 M    9.6       2.3       5.2        14.0        0.61      2.2
//
// Per byte of payload that is about 0.4 ns to encode and 0.2 ns to decode
// with s2, 1.5 ns and 0.45 ns with zstd. A broadcast that crosses x links
// in series (tree depth times fan-out) costs per byte
// encode + x/(ratio*link) + decode. On 1 GbE (8 ns/B): none 8x, s2
// 0.6+0.83x, zstd 2.0+0.56x — s2 beats none on any path and zstd beats s2
// only from x ≈ 5; on 10 GbE or loopback (0.7-0.8 ns/B): s2 0.6+0.08x
// beats none from one link on and zstd needs x ≈ 50. Below one TCP segment
// compression saves no packet. Hence the auto rule: payloads under
// AutoMinSize (1400 bytes) go as they are, everything else with s2; zstd
// is for a slow management network with a deep or wide tree, chosen
// explicitly.
package netio
