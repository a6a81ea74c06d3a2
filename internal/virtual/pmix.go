package virtual

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/fastpmi/fastpmi/agent"
)

// The played PMIx server (workload pmix-fence). A PMIx job's ranks speak
// to OpenPMIx's server library in their agent, which gathers what they
// need of the agent (agent/pmix): a benchmark of thousands of ranks per
// node cannot run that library's clients, each a process with its own
// socket. So a node of the pmix-fence workload plays the library's part
// itself, and its ranks are the library's clients. The agent is the host
// the played library calls, through the same external front end and the
// same operations as agent/pmix's:
//
//   - a client connects (agent.Init) and finalizes (agent.Finalize);
//   - PMIx_Fence with collected data: every client hands the server the
//     data it committed; once every local client is in, the server packs
//     the node's data into one blob and calls the host's fence_nb
//     (agent.NodeAllgather); the host's answer, every node's blob in rank
//     order, is unpacked into the server's store, from which each client's
//     PMIx_Get of a peer's key is served without a message;
//   - PMIx_Fence without data (the barrier before a late round) is the
//     same with nothing collected.
//
// The ranks' timestamp exchange after the timed rounds is one more fence
// with data. Left out: the library's own encoding (PMIx's buffer packing;
// here a rank number and a length in front of each client's data) and its
// socket to each client. A played rank has no shared-memory client: its
// fences are epochs of the agent's external front end, which a
// shared-memory client, numbering its own epochs, cannot share.
//
// Concurrency. Rank goroutines call fence and finalize; the agent calls
// Reply and AskRankData while it carries out a turn, on whatever goroutine
// stepped it (a rank's, or the agent's links'). playedServer.mu guards the
// fences being entered and waited for; it is never held while calling
// the agent, which calls back into the server.

// pmixWorkloads are the workloads of node.VirtualWorkloads played over
// the played PMIx server.
var pmixWorkloads = map[string]playedRound{
	"pmix-fence": pmixFenceRound,
}

// playedRound is one round of a workload for one played PMIx client, as
// virtualRound is for a shared-memory one.
type playedRound func(ctx context.Context, p *playedClient, round int, done func()) error

// playedServer is one node's played PMIx server library: the agent's
// external front end.
type playedServer struct {
	ag    *agent.Agent
	ranks []int // global ranks, local order
	size  int   // the job's

	mu      sync.Mutex              // guards the fields below
	nextID  uint64                  // the last Req.ID given to the agent
	open    *playedFence            // the fence the clients are entering, nil between fences
	stepped map[uint64]*playedFence // fences handed to the agent, by Req.ID, until answered
	asks    []uint64                // the agent's requests for rank data, to answer (answerAsks)
}

// playedFence is one fence of the node's clients.
type playedFence struct {
	data    [][]byte // each local client's data (nil: none), by local index; under playedServer.mu
	in      []bool   // the clients that entered; under playedServer.mu
	entered int      // under playedServer.mu

	// done is closed once the agent answered: blob and err are written
	// before it closes and only read after.
	done chan struct{}
	blob []byte // every node's data, in rank order
	err  error

	unpack sync.Once // the first client that reads the answer unpacks it
	store  [][]byte  // every rank's data (views of blob), by global rank
	bad    error     // a blob that does not unpack
}

// newPlayedServer attaches a played server to ag as its external front
// end.
func newPlayedServer(ag *agent.Agent, ranks []int, size int) (*playedServer, error) {
	s := &playedServer{ag: ag, ranks: ranks, size: size, stepped: map[uint64]*playedFence{}}
	if err := ag.AttachExternal(s); err != nil {
		return nil, fmt.Errorf("played PMIx server: %w", err)
	}
	return s, nil
}

// connect is local client i's connection: the library's client_connected.
func (s *playedServer) connect(i int) (*playedClient, error) {
	if err := s.ag.StepExternal(agent.Init{Local: i}); err != nil {
		return nil, fmt.Errorf("connect: %w", err)
	}
	return &playedClient{s: s, local: i, rank: s.ranks[i], size: s.size}, nil
}

// fence enters local client i in the node's next fence with data (nil:
// none) and returns the fence once the agent answered it. The last
// client in hands the node's data to the agent.
func (s *playedServer) fence(ctx context.Context, i int, data []byte) (*playedFence, error) {
	s.mu.Lock()
	f := s.open
	if f == nil {
		n := len(s.ranks)
		f = &playedFence{data: make([][]byte, n), in: make([]bool, n), done: make(chan struct{})}
		s.open = f
	}
	if f.in[i] {
		s.mu.Unlock()
		return nil, fmt.Errorf("client %d entered a fence twice", s.ranks[i])
	}
	f.in[i], f.data[i] = true, data
	f.entered++
	var req agent.Req
	if f.entered == len(s.ranks) {
		s.open = nil
		s.nextID++
		req = agent.Req{Via: agent.ViaExternal, ID: s.nextID}
		s.stepped[req.ID] = f
	}
	s.mu.Unlock()
	if req.ID != 0 {
		ops := agent.NodeAllgather(len(s.ranks), req, packNode(s.ranks, f.data))
		if err := s.ag.StepExternal(ops...); err != nil {
			s.answer(req.ID, nil, err)
		}
	}
	s.answerAsks()
	select {
	case <-f.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.err != nil {
		return nil, f.err
	}
	f.unpack.Do(func() { f.store, f.bad = unpackJob(f.blob, s.size) })
	return f, f.bad
}

// answer completes the stepped fence id, unless it was answered.
func (s *playedServer) answer(id uint64, blob []byte, err error) {
	s.mu.Lock()
	f := s.stepped[id]
	delete(s.stepped, id)
	s.mu.Unlock()
	if f != nil {
		f.blob, f.err = blob, err
		close(f.done)
	}
}

// Reply takes the agent's answer to a fence (agent.External).
func (s *playedServer) Reply(rp agent.Reply) {
	if blob, completes := agent.NodeData(rp); completes {
		s.answer(rp.Req.ID, blob, rp.Err)
	}
}

// AskRankData queues the agent's request for a client's data (a direct
// modex, agent.External): a played client's data travels only with
// fences, so the next call of a client answers "not found"
// (answerAsks). Asks still queued when the node's last client finalized
// are failed by the agent as it closes.
func (s *playedServer) AskRankData(id uint64, rank int) {
	s.mu.Lock()
	s.asks = append(s.asks, id)
	s.mu.Unlock()
}

// answerAsks answers the queued requests for rank data.
func (s *playedServer) answerAsks() {
	s.mu.Lock()
	asks := s.asks
	s.asks = nil
	s.mu.Unlock()
	for _, id := range asks {
		_ = s.ag.StepExternal(agent.RankDataDone{ID: id}) // refused only by a closed agent, which failed it
	}
}

// packNode is the node's collected data: each client's data behind its
// global rank and length (little-endian uint32s), clients without data
// left out.
func packNode(ranks []int, data [][]byte) []byte {
	n := 0
	for _, d := range data {
		if d != nil {
			n += 8 + len(d)
		}
	}
	b := make([]byte, 0, n)
	for i, d := range data {
		if d != nil {
			b = binary.LittleEndian.AppendUint32(b, uint32(ranks[i]))
			b = binary.LittleEndian.AppendUint32(b, uint32(len(d)))
			b = append(b, d...)
		}
	}
	return b
}

// unpackJob reads every node's packNode data, concatenated, into each
// rank's data (views of blob), by global rank: nil for a rank without.
func unpackJob(blob []byte, size int) ([][]byte, error) {
	store := make([][]byte, size)
	for len(blob) > 0 {
		if len(blob) < 8 {
			return nil, fmt.Errorf("fence data: %d bytes left, want a rank and a length", len(blob))
		}
		r, n := binary.LittleEndian.Uint32(blob), binary.LittleEndian.Uint32(blob[4:])
		blob = blob[8:]
		switch {
		case uint64(r) >= uint64(size):
			return nil, fmt.Errorf("fence data: rank %d in a job of %d", r, size)
		case uint64(n) > uint64(len(blob)):
			return nil, fmt.Errorf("fence data: rank %d has %d bytes, %d left", r, n, len(blob))
		case store[r] != nil:
			return nil, fmt.Errorf("fence data: rank %d twice", r)
		}
		store[r], blob = blob[:n:n], blob[n:]
	}
	return store, nil
}

// Len and At read a fence's store as an allgather result (stampValues).
func (f *playedFence) Len() int        { return len(f.store) }
func (f *playedFence) At(r int) []byte { return f.store[r] }

// playedClient is one rank, a client of the node's played server.
type playedClient struct {
	s                 *playedServer
	local, rank, size int
}

// Barrier is PMIx_Fence without data.
func (p *playedClient) Barrier(ctx context.Context) error {
	_, err := p.s.fence(ctx, p.local, nil)
	return err
}

// Allgather is PMIx_Fence with v as the client's data; the fence holds
// every rank's.
func (p *playedClient) Allgather(ctx context.Context, v []byte) (stampValues, error) {
	if v == nil {
		v = []byte{}
	}
	f, err := p.s.fence(ctx, p.local, v)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// Finalize is the library's client_finalized.
func (p *playedClient) Finalize() error {
	p.s.answerAsks()
	if err := p.s.ag.StepExternal(agent.Finalize{Local: p.local, Req: agent.Req{Via: agent.ViaExternal}}); err != nil {
		return fmt.Errorf("finalize: %w", err)
	}
	return nil
}

// pmixFenceRound is the fence workload as a PMIx client does it: its
// business card committed under its key, PMIx_Fence with collected data,
// then PMIx_Get of the next rank's card, served from the server's store.
func pmixFenceRound(ctx context.Context, p *playedClient, round int, done func()) error {
	f, err := p.s.fence(ctx, p.local, []byte(cardKey(p.rank)+"="+businessCard(p.rank, round)))
	if err != nil {
		return err
	}
	src := (p.rank + 1) % p.size
	v, err := playedGet(f, src, cardKey(src))
	if err != nil {
		return err
	}
	done()
	if want := businessCard(src, round); v != want {
		return fmt.Errorf("get %s: %q, want %q", cardKey(src), v, want)
	}
	return nil
}

// playedGet is a get of rank r's key from a fence's store.
func playedGet(f *playedFence, r int, key string) (string, error) {
	k, v, ok := strings.Cut(string(f.At(r)), "=")
	if !ok || k != key {
		return "", errors.New("get " + key + ": not found")
	}
	return v, nil
}
