package shm

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// A Sleeper lets many idle agents sleep on their doorbells with a few
// threads. An agent in Wait holds an OS thread in its futex wait for as
// long as it sleeps: a process with thousands of live jobs (a spawn
// storm's children, a daemon's jobs) held thousands of threads, each woken
// ten times a second to look at its segment (and Go ends a process that
// needs more than 10,000). An agent with nothing to do for a while parks
// instead (Agent.Park): it announces itself asleep exactly as Wait does and
// hands its doorbell word to the Sleeper, whose beds each wait on up to
// bedSize doorbells in one futex_waitv (Linux 5.16); the parked agent's
// goroutine waits on a channel, which holds no thread.
//
// A bed wakes when a rank or Kick rings one of its doorbells, when an
// agent joins (the bed's own word, ctl) and every parkCheck; it then hands
// back every agent whose doorbell moved or that has work pending. The
// periodic check bounds, as Wait's timeout does, what a stray store on an
// agent-sleepers word (which every rank can write) costs: a request
// delayed by at most parkCheck. A bed whose agents have all gone ends its
// goroutine, so an idle process keeps none.
//
// Lock order: Sleeper.mu only. A bed's goroutine takes it to read and
// change its agents, never while it sleeps.
type Sleeper struct {
	check  time.Duration // how often a bed looks at its agents unrung (parkCheck)
	mu     sync.Mutex
	beds   []*bed // guarded by mu: the beds whose goroutine runs
	closed bool   // guarded by mu: Close was called; Park fails
	wg     sync.WaitGroup
}

// bed is one futex_waitv's worth of parked agents, served by one goroutine
// (Sleeper.run).
type bed struct {
	// ctl is the bed's own word, the first of its wait: park and Close
	// bump it (and wake it) after changing in or closed, so a wait built
	// from the old set ends. The Add in bump pairs with the Load that
	// starts each round of run.
	ctl atomic.Uint32
	in  []*parked // guarded by Sleeper.mu
}

// parked is an agent's place in a bed; each Agent has one, reused.
type parked struct {
	a    *Agent
	val  uint32        // the doorbell value the agent sleeps on; set before park, read by the bed under Sleeper.mu
	err  error         // why the agent was handed back without a ring (the bed's wait failed, Close); set before woke
	woke chan struct{} // capacity 1: the bed sends once it dropped the agent
}

const (
	// bedSize is the agents one bed holds: futex_waitv takes
	// sys.FutexVecMax words, one of which is the bed's own.
	bedSize = sys.FutexVecMax - 1
	// parkCheck is how often a bed looks at its agents' ready marks
	// without a ring.
	parkCheck = 100 * time.Millisecond
)

// ErrSleeperClosed is Park's error once the Sleeper is closed.
var ErrSleeperClosed = errors.New("shm: sleeper closed")

// NewSleeper returns a Sleeper, or nil where one thread cannot wait on
// many futexes (no futex_waitv: Linux before 5.16, or a filter forbids
// it); agents then sleep with Wait.
func NewSleeper() *Sleeper {
	if !waitvWorks() {
		return nil
	}
	return &Sleeper{check: parkCheck}
}

// probeWord is the word waitvWorks waits on: Go memory that never moves.
var probeWord uint32 = 1

// waitvWorks probes futex_waitv once: a wait on a word that differs from
// the value given returns at once (EAGAIN) where the call exists.
var waitvWorks = sync.OnceValue(func() bool {
	var v sys.FutexVec
	v.Add(&probeWord, 0)
	_, err := v.Wait(0)
	return err == nil || errors.Is(err, sys.ErrTimedOut)
})

// Close hands back every parked agent (their Park returns
// ErrSleeperClosed) and waits for the beds' goroutines. Later Parks fail
// at once. Idempotent; a nil Sleeper is closed already.
func (s *Sleeper) Close() {
	if s == nil {
		return
	}
	s.mu.Lock()
	s.closed = true
	beds := append([]*bed(nil), s.beds...)
	s.mu.Unlock()
	for _, b := range beds {
		b.bump()
	}
	s.wg.Wait()
}

// park puts p in a bed with room, starting one if none has.
func (s *Sleeper) park(p *parked) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrSleeperClosed
	}
	var b *bed
	for _, c := range s.beds {
		if len(c.in) < bedSize {
			b = c
			break
		}
	}
	if b == nil {
		b = &bed{}
		s.beds = append(s.beds, b)
		s.wg.Add(1)
		go s.run(b)
	}
	b.in = append(b.in, p)
	s.mu.Unlock()
	b.bump()
	return nil
}

// bump ends the bed's current wait: its set or the Sleeper changed.
func (b *bed) bump() {
	b.ctl.Add(1)
	_, _ = sys.FutexWake(futexAddr(&b.ctl), 1)
}

// run is bed b's goroutine: it sleeps on b's words until something
// changes, hands back the agents that have work, and ends when b has no
// agent left or the Sleeper is closed.
func (s *Sleeper) run(b *bed) {
	defer s.wg.Done()
	var v sys.FutexVec
	var in []*parked
	for {
		ctl := b.ctl.Load()
		s.mu.Lock()
		if s.closed || len(b.in) == 0 {
			s.leaveLocked(b, ErrSleeperClosed)
			s.mu.Unlock()
			return
		}
		in = append(in[:0], b.in...)
		s.mu.Unlock()
		v.Reset()
		v.Add(futexAddr(&b.ctl), ctl)
		for _, p := range in {
			v.Add(futexAddr(p.a.doorbell.word), p.val)
		}
		clear(in) // the bed's set is b.in: no agent is kept by the scratch
		_, err := v.Wait(s.check)
		if err != nil && !errors.Is(err, sys.ErrTimedOut) {
			// These agents cannot sleep here: each goes back to
			// sleeping on its own (Park's error says so).
			s.mu.Lock()
			s.leaveLocked(b, fmt.Errorf("shm: park: %w", err))
			s.mu.Unlock()
			return
		}
		s.mu.Lock()
		keep := b.in[:0]
		for _, p := range b.in {
			if p.a.doorbell.word.Load() != p.val || p.a.pending() {
				p.err = nil
				p.woke <- struct{}{}
			} else {
				keep = append(keep, p)
			}
		}
		clear(b.in[len(keep):])
		b.in = keep
		s.mu.Unlock()
	}
}

// leaveLocked hands back every agent of b with err and removes b from the
// Sleeper, whose lock the caller holds.
func (s *Sleeper) leaveLocked(b *bed, err error) {
	for _, p := range b.in {
		p.err = err
		p.woke <- struct{}{}
	}
	b.in = nil
	for i, c := range s.beds {
		if c == b {
			s.beds = append(s.beds[:i], s.beds[i+1:]...)
			break
		}
	}
}

// Park is Wait for an agent with nothing to do for a while: it sleeps on
// s, holding no OS thread, until a rank rings the doorbell, Kick is called
// or a ready mark is found (s's periodic check). It returns an error,
// having slept at most until then, when the agent cannot sleep there: s
// is closed (ErrSleeperClosed) or its wait failed, or the segment's
// parties are goroutines of this process (InProcessWaiter: they wake the
// agent without the futex); the caller then sleeps with Wait.
func (a *Agent) Park(s *Sleeper) error {
	a.took = false
	if a.s.waiter.inProc {
		return errors.New("shm: park: the segment's parties sleep in process")
	}
	_, val, ready := a.SleepPrepare()
	defer a.SleepDone()
	if ready {
		return nil
	}
	if a.parked.woke == nil {
		a.parked = parked{a: a, woke: make(chan struct{}, 1)}
	}
	a.parked.val = val
	if err := s.park(&a.parked); err != nil {
		return err
	}
	<-a.parked.woke
	return a.parked.err
}
