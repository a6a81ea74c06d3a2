package launch

// Virtual ranks (Config.Virtual): the scale benchmark plays every local
// rank as a goroutine of the node's own process instead of forking it.
// Each goroutine is a real shared-memory client (client.NewVirtual) of the
// node's segment, so the agent serves it exactly as it serves a rank
// process; only fork/exec and the PMI_FD connection are left out, which
// lets one machine run many agents with thousands of ranks each.
//
// Ownership. startVirtual runs on the node's loop goroutine: it fills
// n.procs with one placeholder per rank (pid 0, no command) and starts one
// goroutine per rank. A rank goroutine touches nothing of the node but its
// own Client and the event channel: it sends exactly one evExit for its
// rank when it is done, after its Client finalized, so the loop (which
// runs until every placeholder exited) closes the agent, and with it the
// segment, only after every goroutine stopped using it. n.virtualStop
// cancels the goroutines' context (kill); a cancelled rank still
// finalizes and reports.
//
// Exit judging. A rank that exits with code 0 is judged once the agent
// has drained its PMI connection (node.handle). A virtual rank has no text
// connection, so Agent.Drained would never close and the judgement would
// wait for the 500 ms fallback. Its Finalize is synchronous — when it
// returns the agent has served every request of the rank — so the rank
// then binds an already-closed connection (drainedNow): the agent sees a
// finalized rank's connection end, closes Drained and reports nothing.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/fastpmi/fastpmi/client"
)

// DefaultVirtualRounds is the number of timed rounds of a virtual workload
// when Config.VirtualRounds is 0.
const DefaultVirtualRounds = 10

// VirtualWarmupRounds is the number of untimed rounds a virtual rank runs
// before the timed ones (they absorb the agents' and ranks' start-up
// skew). Counters of a virtual job cover warm-up and timed rounds alike.
const VirtualWarmupRounds = 1

// ScaleLinePrefix starts the one line global rank 0 of a virtual job
// prints to standard output with its timings (see scaleReport.line).
const ScaleLinePrefix = "fastpmi-scale"

// virtualRound is one round of a workload for one rank: it runs the
// operation and checks its result.
type virtualRound func(ctx context.Context, c *client.Client, round int) error

// virtualWorkloads are the workloads Config.Virtual may name.
var virtualWorkloads = map[string]virtualRound{
	"allgather":  allgatherRound,
	"iallgather": iallgatherRound,
	"fence":      fenceRound,
	"ring":       ringRound,
}

// VirtualWorkloads returns the names Config.Virtual accepts, sorted.
func VirtualWorkloads() []string {
	names := make([]string, 0, len(virtualWorkloads))
	for k := range virtualWorkloads {
		names = append(names, k)
	}
	sort.Strings(names)
	return names
}

// startVirtual runs the node's ranks as goroutines (Config.Virtual).
func (n *node) startVirtual() {
	round, ok := virtualWorkloads[n.cfg.Virtual]
	var why string
	switch {
	case !ok:
		why = fmt.Sprintf("virtual ranks: unknown workload %q (want %s)", n.cfg.Virtual, strings.Join(VirtualWorkloads(), ", "))
	case n.shm == nil:
		why = "virtual ranks need the shared-memory segment (drop --no-shm)"
	case n.cfg.VirtualRounds < 0:
		why = fmt.Sprintf("virtual ranks: %d rounds", n.cfg.VirtualRounds)
	}
	if why != "" {
		n.emit(eventMsg{Kind: evkStartErr, Rank: n.ranks[0], Msg: why})
		for _, g := range n.ranks {
			n.ag.RankGone(g, "never started")
		}
		return
	}
	rounds := n.cfg.VirtualRounds
	if rounds == 0 {
		rounds = DefaultVirtualRounds
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.virtualStop = cancel
	for i, g := range n.ranks {
		n.procs[g] = &rankProc{rank: g}
		vr := virtualRank{
			info:   client.Info{Rank: g, Size: n.size, LocalRank: i, LocalSize: len(n.ranks), JobID: n.cfg.JobID},
			op:     n.cfg.Virtual,
			round:  round,
			rounds: rounds,
		}
		go func() {
			code := 0
			if err := vr.run(ctx, n); err != nil {
				code = 1
				if ctx.Err() == nil { // a kill cancelled it: the job's failure is reported elsewhere
					n.out.err.write(fmt.Appendf(nil, "pmid: rank %d: %v\n", g, err))
				}
			}
			n.evch <- event{kind: evExit, rank: g, code: code}
		}()
	}
}

// virtualRank is one goroutine rank.
type virtualRank struct {
	info   client.Info
	op     string
	round  virtualRound
	rounds int
}

// run plays the rank: VirtualWarmupRounds untimed rounds, then the timed
// rounds back to back, then Finalize. Global rank 0 prints the timings.
func (v virtualRank) run(ctx context.Context, n *node) error {
	c, err := client.NewVirtual(n.shm, v.info)
	if err != nil {
		return err
	}
	err = v.play(ctx, c, n)
	if ferr := c.Finalize(); ferr != nil {
		return errors.Join(err, ferr)
	}
	if err != nil {
		return err
	}
	if derr := drainedNow(n, v.info.LocalRank); derr != nil {
		// Judging falls back to node.handle's timeout; not an error.
		n.out.err.write(fmt.Appendf(nil, "pmid: rank %d: %v\n", v.info.Rank, derr))
	}
	return nil
}

func (v virtualRank) play(ctx context.Context, c *client.Client, n *node) error {
	rep := scaleReport{op: v.op, size: v.info.Size, local: v.info.LocalSize}
	timed := v.info.Rank == 0
	for r := range VirtualWarmupRounds + v.rounds {
		t := time.Now()
		if err := v.round(ctx, c, r); err != nil {
			return fmt.Errorf("%s round %d: %w", v.op, r, err)
		}
		switch d := time.Since(t); {
		case r < VirtualWarmupRounds:
			rep.warmup += d
		case timed:
			rep.times = append(rep.times, d)
		}
	}
	if timed {
		n.out.out.write([]byte(rep.line() + "\n"))
	}
	// No end barrier: an agent whose ranks are done keeps its links open
	// until pmirun closes them all (agentNode.loop), so a peer still in
	// its last round never sees it leave.
	return nil
}

// drainedNow tells the agent that local rank i, which has finalized, will
// send nothing more: it binds a connection whose other end is already
// closed, so the agent ends it at once and closes Drained (see the file
// comment).
func drainedNow(n *node, i int) error {
	ours, theirs := net.Pipe()
	ours.Close()
	if err := n.ag.Serve(i, theirs); err != nil {
		return fmt.Errorf("mark drained: %w", err)
	}
	return nil
}

// scaleReport is rank 0's timings of one virtual job.
type scaleReport struct {
	op          string
	size, local int
	warmup      time.Duration
	times       []time.Duration // per timed round
}

// line formats the report as one machine-readable line:
//
//	fastpmi-scale op=allgather P=8192 local=128 rounds=10 median_us=... min_us=... max_us=... mean_us=... warmup_us=...
//
// Times are microseconds with one decimal, measured by global rank 0 from
// before its operation to after it completed (a fence round is put, fence
// and get).
func (r scaleReport) line() string {
	s := slices.Clone(r.times)
	slices.Sort(s)
	var med, lo, hi, mean time.Duration
	if len(s) > 0 {
		lo, hi = s[0], s[len(s)-1]
		med = s[len(s)/2]
		if len(s)%2 == 0 {
			med = (s[len(s)/2-1] + s[len(s)/2]) / 2
		}
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		mean = sum / time.Duration(len(s))
	}
	us := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }
	return fmt.Sprintf("%s op=%s P=%d local=%d rounds=%d median_us=%s min_us=%s max_us=%s mean_us=%s warmup_us=%s",
		ScaleLinePrefix, r.op, r.size, r.local, len(s), us(med), us(lo), us(hi), us(mean), us(r.warmup))
}

// The workloads. Values depend only on (rank, round), so any rank can
// check any other rank's value.

// agValueLen is the allgather workload's value size.
const agValueLen = 64

// agValue is rank r's allgather value in round k: rank and round, then a
// pattern.
func agValue(b []byte, r, k int) []byte {
	b = b[:agValueLen]
	binary.LittleEndian.PutUint32(b, uint32(r))
	binary.LittleEndian.PutUint32(b[4:], uint32(k))
	for i := 8; i < len(b); i++ {
		b[i] = byte(r*31 + k + i)
	}
	return b
}

// checkValues checks a few entries of an allgather result: the first and
// last rank, this rank, its successor and one that moves with the round.
func checkValues(vals client.Values, rank, size, round int) error {
	if vals.Len() != size {
		return fmt.Errorf("result holds %d ranks, want %d", vals.Len(), size)
	}
	var want [agValueLen]byte
	for _, r := range [...]int{0, size - 1, rank, (rank + 1) % size, (rank*7919 + round*104729) % size} {
		got := vals.At(r)
		if string(got) != string(agValue(want[:], r, round)) {
			return fmt.Errorf("value of rank %d: got %d bytes %x..., want rank %d round %d", r, len(got), got[:min(len(got), 8)], r, round)
		}
	}
	return nil
}

func allgatherRound(ctx context.Context, c *client.Client, round int) error {
	var b [agValueLen]byte
	vals, err := c.Allgather(ctx, agValue(b[:], c.Rank(), round))
	if err != nil {
		return err
	}
	return checkValues(vals, c.Rank(), c.Size(), round)
}

func iallgatherRound(ctx context.Context, c *client.Client, round int) error {
	var b [agValueLen]byte
	req := c.Iallgather(agValue(b[:], c.Rank(), round))
	if err := req.Wait(ctx); err != nil {
		return err
	}
	return checkValues(req.Values(), c.Rank(), c.Size(), round)
}

// businessCard is what an MPICH-style library would put for rank r in
// round k: its address as text, much alike from rank to rank (which is
// what makes broadcasts of them compress).
func businessCard(r, k int) string {
	node := r / 64
	return fmt.Sprintf("description#node%05d$port#%d$ifname#10.%d.%d.%d$shm_host#node%05d$round#%d$",
		node, 40000+r%20000, 1+node>>8, node&255, 1+r%64, node, k)
}

func cardKey(r int) string { return fmt.Sprintf("bc-%d", r) }

// fenceRound puts this rank's business card (dense: it travels with the
// fence), fences, and reads the next rank's card.
func fenceRound(ctx context.Context, c *client.Client, round int) error {
	r, size := c.Rank(), c.Size()
	if err := c.Put(cardKey(r), []byte(businessCard(r, round)), client.Dense); err != nil {
		return err
	}
	if err := c.Fence(ctx); err != nil {
		return err
	}
	src := (r + 1) % size
	v, err := c.Get(ctx, cardKey(src), client.FromRank(src))
	if err != nil {
		return err
	}
	if want := businessCard(src, round); string(v) != want {
		return fmt.Errorf("get %s: %q, want %q", cardKey(src), v, want)
	}
	return nil
}

func ringRound(ctx context.Context, c *client.Client, round int) error {
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:], uint32(c.Rank()))
	binary.LittleEndian.PutUint32(b[4:], uint32(round))
	res, err := c.Ring(ctx, b[:])
	if err != nil {
		return err
	}
	switch {
	case res.Size != c.Size():
		return fmt.Errorf("ring of %d ranks, want %d", res.Size, c.Size())
	case res.Rank < 0 || res.Rank >= res.Size:
		return fmt.Errorf("ring position %d of %d", res.Rank, res.Size)
	case len(res.Left) != len(b) || len(res.Right) != len(b):
		return fmt.Errorf("ring neighbours' values of %d and %d bytes, want %d", len(res.Left), len(res.Right), len(b))
	case binary.LittleEndian.Uint32(res.Left[4:]) != uint32(round) || binary.LittleEndian.Uint32(res.Right[4:]) != uint32(round):
		return fmt.Errorf("ring neighbours' values from another round")
	}
	return nil
}
