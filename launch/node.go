package launch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/fastpmi/fastpmi/agent"
	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/fastpmi/fastpmi/perf"
	"github.com/fastpmi/fastpmi/shm"
)

// node is one node's share of a job: the agent, the local ranks'
// processes and their output. It turns what happens to each rank into
// eventMsgs for the job's fate (emit), and carries out the fate's orders
// (kill, signal). Only its owner's goroutine calls its methods; rank
// waiters and the agent feed it through evch.
type node struct {
	cfg   Config
	size  int   // ranks in the whole job
	ranks []int // global ranks here, local order
	ag    *agent.Agent
	rec   *perf.Recorder
	out   *output
	env   []string
	seg   *os.File     // shared-memory segment passed to ranks, or nil
	shm   *shm.Segment // the segment itself (goroutine ranks map it in place)
	evch  chan event
	emit  func(eventMsg)

	procs    map[int]*rankProc // by global rank
	exited   int               // procs that exited
	local    map[int]int       // global rank → local index
	killing  bool
	killTime <-chan time.Time

	// virtualStop cancels goroutine ranks (Config.Virtual), or is nil.
	virtualStop func()
}

type nodeSpec struct {
	size     int
	ranks    []int
	mapping  string
	upstream agent.Upstream
}

// newNode creates the agent (and the shared-memory segment) for spec.
func newNode(cfg Config, spec nodeSpec, rec *perf.Recorder, emit func(eventMsg)) (*node, error) {
	n := &node{
		cfg: cfg, size: spec.size, ranks: spec.ranks, rec: rec, emit: emit,
		evch:  make(chan event, 8*len(spec.ranks)+64),
		procs: make(map[int]*rankProc, len(spec.ranks)),
		local: make(map[int]int, len(spec.ranks)),
	}
	for i, g := range spec.ranks {
		n.local[g] = i
	}
	ag, err := agent.New(agent.Config{
		JobID:        cfg.JobID,
		Size:         spec.size,
		Local:        spec.ranks,
		Mapping:      spec.mapping,
		UniverseSize: cfg.UniverseSize,
		Upstream:     spec.upstream,
		Events:       events{n.evch},
		Logger:       cfg.Logger,
		Perf:         rec,
	})
	if err != nil {
		return nil, err
	}
	n.ag = ag
	n.out = newOutput(cfg)
	n.env = baseEnv(cfg, spec.size, len(spec.ranks))
	if !cfg.NoShm {
		// The node KVS holds a few keys per rank (its entries are not
		// pre-faulted: unused capacity costs address space, not memory).
		kvs := min(max(4*shm.DefaultKVSCapacity, 16*spec.size), 1<<20)
		seg, err := shm.Create(shm.Params{LocalRanks: len(spec.ranks), WorldSize: spec.size, KVSCapacity: kvs, FirstEpoch: 1})
		if err != nil {
			ag.Close()
			return nil, fmt.Errorf("create shared memory: %w (run with --no-shm to use PMI_FD only)", err)
		}
		if cfg.Virtual != "" {
			// Every party is a goroutine of this process (virtual.go).
			seg.SetWaiter(shm.InProcessWaiter())
		}
		if err := ag.AttachSegment(seg); err != nil {
			seg.Close()
			ag.Close()
			return nil, err
		}
		n.seg = seg.File()
		n.shm = seg
		fd := 4
		if cfg.PMIPort {
			fd = 3
		}
		n.env = append(n.env, "FASTPMI_SHM_FD="+strconv.Itoa(fd))
	}
	if cfg.PMIPort {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			ag.Close()
			return nil, fmt.Errorf("listen for PMI_PORT connections: %w", err)
		}
		ag.ServeListener(ln)
		n.env = append(n.env, "PMI_PORT="+ln.Addr().String())
	}
	return n, nil
}

// start forks every local rank. A rank that cannot start is reported and
// the ranks after it are not started.
func (n *node) start(path string) {
	if n.cfg.Virtual != "" {
		n.startVirtual()
		return
	}
	for i, g := range n.ranks {
		p, err := startRank(n.cfg, path, n.env, g, i, n.ag, n.out, n.seg)
		if err != nil {
			n.emit(eventMsg{Kind: evkStartErr, Rank: g, Msg: err.Error()})
			for _, r := range n.ranks[i:] {
				n.ag.RankGone(r, "never started")
			}
			return
		}
		n.procs[g] = p
		n.rec.Mark(perf.PhaseRankForked, g)
		go func() {
			werr := p.cmd.Wait()
			ev := event{kind: evExit, rank: p.rank}
			if ps := p.cmd.ProcessState; ps != nil {
				code, sig, signaled := sys.ExitStatus(ps)
				ev.code = code
				if signaled {
					ev.sig = sig
				}
			} else {
				ev.code, ev.msg = 1, werr.Error()
			}
			n.evch <- ev
		}()
	}
}

func (n *node) live() int { return len(n.procs) - n.exited }

// kill ends every local rank: SIGTERM now, SIGKILL after KillGrace.
func (n *node) kill() {
	if n.killing {
		return
	}
	n.killing = true
	n.signal(sys.SIGTERM)
	n.killTime = time.After(n.cfg.KillGrace)
}

// killNow is called when killTime fires.
func (n *node) killNow() {
	n.killTime = nil
	n.signal(sys.SIGKILL)
}

func (n *node) signal(sig os.Signal) {
	for _, p := range n.procs {
		if !p.exited && p.pid > 0 { // virtual ranks have no process
			_ = sys.SignalGroup(p.pid, sig)
		}
	}
	if n.virtualStop != nil && (sig == sys.SIGTERM || sig == sys.SIGKILL) {
		n.virtualStop()
	}
}

// handle judges one local event and reports it.
func (n *node) handle(ev event) {
	switch ev.kind {
	case evExit:
		p := n.procs[ev.rank]
		if p == nil || p.exited {
			return
		}
		p.exited = true
		n.exited++
		n.rec.Mark(perf.PhaseRankExit, ev.rank)
		if ev.sig != 0 || ev.code != 0 {
			msg := n.stage(ev.rank)
			if ev.msg != "" {
				msg = ": " + ev.msg
			}
			n.emit(eventMsg{Kind: evkExit, Rank: ev.rank, Code: ev.code, Sig: ev.sig, Msg: msg})
			// Only now release the peers waiting for this rank: the failure
			// is reported first, so their own exits cannot be blamed first.
			n.ag.RankGone(ev.rank, describeExit(ev))
			return
		}
		// Code 0: judge once the agent has read everything the rank sent
		// (its finalize may still be in the socket).
		drained := n.ag.Drained(ev.rank)
		r := ev.rank
		go func() {
			select {
			case <-drained:
			case <-time.After(500 * time.Millisecond):
			}
			spoke, fin := n.ag.RankStatus(r)
			n.evch <- event{kind: evJudged, rank: r, spoke: spoke, finalized: fin}
		}()
	case evJudged:
		n.emit(eventMsg{Kind: evkExit, Rank: ev.rank, Spoke: ev.spoke, Fin: ev.finalized})
		if !ev.finalized {
			n.ag.RankGone(ev.rank, "exited with code 0 without PMI finalize")
		}
	case evInit:
		n.emit(eventMsg{Kind: evkInit, Rank: ev.rank})
	case evFinalized:
		n.emit(eventMsg{Kind: evkFinal, Rank: ev.rank})
	case evDisconnect:
		p := n.procs[ev.rank]
		if p == nil || p.exited {
			return
		}
		r := ev.rank
		time.AfterFunc(n.cfg.DisconnectGrace, func() { n.evch <- event{kind: evDisconnectTimer, rank: r} })
	case evDisconnectTimer:
		if p := n.procs[ev.rank]; p != nil && !p.exited {
			n.emit(eventMsg{Kind: evkLost, Rank: ev.rank})
		}
	case evAbort:
		n.emit(eventMsg{Kind: evkAbort, Rank: ev.rank, Code: ev.code, Msg: ev.msg})
	case evProtocol:
		n.emit(eventMsg{Kind: evkProtocol, Rank: ev.rank, Msg: ev.msg})
	}
}

// stage says where in PMI a failed rank was, from the agent's view.
func (n *node) stage(r int) string {
	spoke, fin := n.ag.RankStatus(r)
	switch {
	case fin:
		return " after PMI finalize"
	case spoke:
		return " after PMI init, before finalize"
	}
	return " before PMI init"
}

// drain handles events that raced with the last exit, without waiting.
func (n *node) drain() {
	for {
		select {
		case ev := <-n.evch:
			n.handle(ev)
		default:
			return
		}
	}
}

// close closes the agent and waits (boundedly) for the output.
func (n *node) close() {
	n.ag.Close()
	n.out.wait(2 * time.Second)
}

var errNoProgram = errors.New("no program")

// lookProg resolves the program once for every rank.
func lookProg(prog string) (string, error) {
	if prog == "" {
		return "", errNoProgram
	}
	return exec.LookPath(prog)
}
