package agent

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// Rank data: what the external front end holds for one of its ranks and
// hands out on request — PMIx's direct modex, where a rank's committed
// data lives only in the server library of its node, and the library of
// another node asks for it when one of its clients reads a key the rank
// did not exchange in a fence. It is not a KVS key: nothing is put,
// placed, cached or fenced; every request asks the rank's node, whose
// front end answers when it has the data (OpenPMIx waits for the rank's
// commit). The request travels the on-demand get path's links, always
// to the rank's own node (the Direct strategy's route, whatever the get
// strategy: no other node holds the data).
//
// The core keeps each request until it is answered: the front end's
// answer (RankDataDone), the rank's end before it answered (Gone of a
// rank that did not finalize: the job is failing), or Shutdown. A rank
// that finalized is still asked: its data stays with its front end,
// which says "not found" if there is none (agent/pmix).

// MaxRankDataBytes bounds one rank's data as it crosses nodes; a front
// end's larger answer fails the request.
const MaxRankDataBytes = 1 << 20

type (
	// GetRankData is the external front end's request for rank Rank's
	// data (PMIx: a direct modex for Rank). It is answered by one Reply
	// of kind ReplyGet with Local -1: Found and Val, or Err. Job, when
	// set, names another job of the launcher's run that Rank belongs to
	// (a PMIx client reading the data of a rank of the job it spawned or
	// connected to): the launcher fetches it from that job's node.
	GetRankData struct {
		Req  Req
		Rank int
		Job  string
	}
	// ServeRankData is another node's GetRankData, routed here, the node
	// of Rank; answered through an UpAnswer call naming ID (as ServeGet).
	ServeRankData struct {
		ID   uint64
		Rank int
	}
	// RankDataDone completes rank-data call ID: the external front end's
	// answer to Ready.Asks, or the Upstream's to an UpRankData call.
	RankDataDone struct {
		ID    uint64
		Found bool
		Val   string
		Err   error
	}
)

func (GetRankData) isOp()   {}
func (ServeRankData) isOp() {}
func (RankDataDone) isOp()  {}

// Ask asks the external front end for local rank data: it answers by
// stepping RankDataDone{ID: ID}.
type Ask struct {
	ID   uint64
	Rank int // global
}

// rankData is one rank-data request on its way: asked of this node's
// front end (the rank is here) or of the rank's node, for the external
// front end's GetRankData or for another node's ServeRankData.
type rankData struct {
	rank  int  // global
	asked bool // of this node's front end (Ready.Asks); else of the rank's node (UpRankData)
	ext   *to  // the GetRankData to answer, or nil
	peer  uint64
}

// ErrNoRankData fails rank-data requests for a rank that ended before
// its front end answered.
var ErrNoRankData = errors.New("rank data not available")

// getRankData serves the external front end's GetRankData.
func (c *Core) getRankData(o GetRankData) error {
	if o.Job != "" && o.Job != c.cfg.jobID {
		if o.Rank < 0 {
			return fmt.Errorf("rank data of rank %d of job %s: %w", o.Rank, o.Job, ErrNoRank)
		}
		t := to{local: -1, req: o.Req, kind: ReplyGet}
		c.callSeq++
		c.rankData[c.callSeq] = &rankData{rank: o.Rank, ext: &t}
		c.up(UpCall{Kind: UpRankData, ID: c.callSeq, Src: o.Rank, Name: o.Job})
		return nil
	}
	if o.Rank < 0 || o.Rank >= c.cfg.size {
		return fmt.Errorf("rank data of rank %d, job of %d: %w", o.Rank, c.cfg.size, ErrNoRank)
	}
	t := to{local: -1, req: o.Req, kind: ReplyGet}
	if rs := c.byGlobal[o.Rank]; rs != nil {
		c.askRankData(rs, &rankData{rank: o.Rank, ext: &t})
		return nil
	}
	c.callSeq++
	c.rankData[c.callSeq] = &rankData{rank: o.Rank, ext: &t}
	c.up(UpCall{Kind: UpRankData, ID: c.callSeq, Src: o.Rank})
	return nil
}

// serveRankData serves another node's request for the data of a rank
// of this node.
func (c *Core) serveRankData(o ServeRankData) {
	rs := c.byGlobal[o.Rank]
	if rs == nil {
		c.answer(o.ID, false, "", fmt.Errorf("rank %d is not served on this node", o.Rank))
		return
	}
	if c.closed {
		// Every rank of this node ended and its front end closed (the
		// node stays to serve its placed keys until the job ends): no
		// one is left to answer an ask, which would wait for ever.
		c.answer(o.ID, false, "", fmt.Errorf("rank %d's node has ended its part of the job, and the data with it: %w", o.Rank, ErrNoRankData))
		return
	}
	c.askRankData(rs, &rankData{rank: o.Rank, peer: o.ID})
}

// askRankData asks the front end for local rank rs's data for d, unless
// rs ended without finalizing.
func (c *Core) askRankData(rs *rankState, d *rankData) {
	if rs.gone && !rs.finalized {
		c.doneRankData(d, RankDataDone{Err: fmt.Errorf("rank %d ended: %w", rs.global, ErrNoRankData)})
		return
	}
	c.callSeq++
	d.asked = true
	c.rankData[c.callSeq] = d
	c.rd.Asks = append(c.rd.Asks, Ask{ID: c.callSeq, Rank: rs.global})
}

// rankDataDone completes request o.ID, if it still waits.
func (c *Core) rankDataDone(o RankDataDone) {
	d := c.rankData[o.ID]
	if d == nil {
		return
	}
	delete(c.rankData, o.ID)
	if o.Err == nil && len(o.Val) > MaxRankDataBytes {
		o = RankDataDone{Err: fmt.Errorf("%w: rank %d's data is %d bytes, more than %d", ErrQuota, d.rank, len(o.Val), MaxRankDataBytes)}
	}
	c.doneRankData(d, o)
}

func (c *Core) doneRankData(d *rankData, o RankDataDone) {
	found := o.Found && o.Err == nil
	if d.ext != nil {
		c.reply(*d.ext, Reply{Found: found, Val: o.Val, Err: o.Err})
		return
	}
	c.answer(d.peer, found, o.Val, o.Err)
}

// failRankData fails the requests asked of the front end for rank
// global (every request with global -1) with err, in call order.
func (c *Core) failRankData(global int, err error) {
	for _, id := range slices.Sorted(maps.Keys(c.rankData)) {
		d := c.rankData[id]
		if global >= 0 && (!d.asked || d.rank != global) {
			continue
		}
		delete(c.rankData, id)
		c.doneRankData(d, RankDataDone{Err: err})
	}
}
