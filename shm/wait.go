package shm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/fastpmi/fastpmi/internal/sys"
)

// defaultSpins bounds busy-waiting before sleeping when spinning is
// allowed: about 5-20 µs of condition checks, longer than a hand-off
// between two running processes (0.2-0.5 µs) and shorter than a futex
// round trip on a busy machine.
const defaultSpins = 1 << 12

// pollInterval is the sleep between condition checks where futexes are
// unavailable (non-Linux builds, or a kernel that answers ENOSYS).
const pollInterval = 50 * time.Microsecond

// stormWakes and stormPause bound what a storm of wake-ups costs a
// sleeper: every futex word here lies in memory that every rank can
// write, and a rank that bumps one and calls FUTEX_WAKE in a loop (a
// runaway loop, a stray pointer) would otherwise have its sleeper — the
// agent on the doorbell, a rank on its wake word — wake and re-check with
// it, a CPU each. Wake-ups that find nothing to do are rare otherwise
// (one per signal for a condition not yet true: a response ring's release
// before its answer, an epoch before the one awaited), so after
// stormWakes of them in a row each further sleep is preceded by a pause
// of stormPause: the storm then costs the sleeper a check per pause, and
// delays what it waits for by at most that.
const (
	stormWakes = 16
	stormPause = time.Millisecond
)

// ctxSlice bounds one futex sleep: a thread asleep in the kernel cannot
// watch ctx.Done(), so it wakes this often to check it, and a wake-up
// lost to a stray store into a sleepers word (see wait) costs at most
// this. In-process sleepers watch ctx.Done() itself and need no bound.
const ctxSlice = 100 * time.Millisecond

// A Waiter decides how a party waits for a condition in shared memory:
// spin briefly, then sleep on a futex. The zero Waiter never spins.
type Waiter struct {
	spins  int  // condition checks before sleeping; 0 sleeps at once
	inProc bool // sleep on a Go channel, not the futex (see InProcessWaiter)
}

// onlineCPUs caches sys.OnlineCPUs for the process: the affinity mask does
// not change under a rank, and the probe is a system call.
var onlineCPUs = sync.OnceValue(func() int {
	n, err := sys.OnlineCPUs()
	if err != nil {
		return 1
	}
	return n
})

// NewWaiter returns the waiter for a node where parties processes wait on
// each other (local ranks + 1 for the agent): it spins only while every
// party can have a CPU of its own (parties <= online CPUs); otherwise it
// sleeps at once, because a spinning party would steal the CPU from the
// party it waits for (measured: 45 ms per round spinning with 16 ranks on 2
// cores, ~0.3 ms sleeping).
func NewWaiter(parties int) Waiter {
	if parties <= onlineCPUs() {
		return Waiter{spins: defaultSpins}
	}
	return Waiter{}
}

// SpinWaiter returns a waiter that checks its condition spins times
// before sleeping, whatever the CPU count (benchmarks, tests).
func SpinWaiter(spins int) Waiter { return Waiter{spins: max(spins, 0)} }

// InProcessWaiter returns the waiter for a segment whose parties are all
// goroutines of this process (the agent and virtual ranks): they sleep on
// Go channels instead of the futex, so a sleeping party holds no OS
// thread. A futex wait is a blocking system call, one thread each; with
// thousands of goroutine ranks per process the threads, and the
// scheduler's hand-offs of them, cost more than the work. Signals on such
// a segment skip the futex wake, so no other process may wait on it. Views
// of the same memory (Attach) may mix with it: in-process sleepers are
// found by the address of their word.
//
// An in-process sleep allocates nothing once each waiting handle (ring
// end, rank, agent) has made its channel (and timer, for finite
// timeouts), and a wait with a context (Consumer.WaitContext,
// Rank.WaitEpochContext) watches ctx.Done() directly, with no timer.
func InProcessWaiter() Waiter { return Waiter{inProc: true} }

// Spins reports how many times w checks its condition before sleeping.
func (w Waiter) Spins() int { return w.spins }

// An event is one futex-backed wake-up channel in shared memory: waiters
// sleep on word; signallers change state, then bump word and wake the
// waiters, but only when sleepers says someone may be asleep.
//
// The protocol is Dekker-style over two words, the state the waiter tests
// (a ring position, the epoch, ...) and sleepers. All accesses are
// sync/atomic operations, which are sequentially consistent, so:
//
//	waiter:    seen = word.Load(); sleepers.Add(1); if ready() {return}; FutexWait(word, seen)
//	signaller: state.Store(new);   if sleepers.Load() != 0 { word.Add(1); FutexWake(word) }
//
// In the single total order of these operations either the signaller's
// load of sleepers follows the waiter's increment, and the signaller bumps
// word after the waiter read seen, so FutexWait returns at once (the
// kernel compares word with seen under its lock) or is woken; or it
// precedes it, and then the state store precedes the waiter's ready()
// check, which sees the new state and does not sleep. No wake-up is lost,
// and a signaller pays only an atomic load while nobody sleeps.
//
// In-process sleepers (InProcessWaiter) use the same two words with a
// registration in place of the futex word's compare; see parkTable.
type event struct {
	word     *atomic.Uint32 // futex word; only ever incremented, by signallers
	sleepers *atomic.Uint32 // parties inside wait (incremented before the last check, decremented after waking)
	w        *Waiter        // the segment's policy: with InProcessWaiter nobody sleeps on the futex
}

// signal wakes every waiter that may be asleep on e. The caller has already
// stored the state the waiters test.
func (e event) signal() {
	if e.sleepers.Load() == 0 {
		return
	}
	e.word.Add(1)
	if e.w == nil || !e.w.inProc {
		// A failed wake can only mean futexes are unsupported, and then
		// waiters poll (see wait); there is nothing to report.
		_, _ = sys.FutexWake(futexAddr(e.word), math.MaxInt32)
	}
	// In-process sleepers of this word, if any: a view of the segment
	// with InProcessWaiter may share the memory with this one.
	wakeParked(e.word)
}

// wake wakes every waiter of e whatever sleepers says: for a signaller
// that must not trust sleepers, a word any rank can write (the agent's
// own Kick, which Close relies on).
func (e event) wake() {
	e.word.Add(1)
	if e.w == nil || !e.w.inProc {
		_, _ = sys.FutexWake(futexAddr(e.word), math.MaxInt32)
	}
	wakeParked(e.word)
}

// A parker is one waiting handle's wake-up channel (capacity 1): a ring
// end, a rank's epoch wait or the agent's doorbell wait, each used by one
// goroutine at a time. It is made on the handle's first in-process sleep
// and reused by every later one. Invariant: the channel is empty whenever
// its owner is outside wait (a signal sends one token, only to a parker
// that is registered, and the owner takes it before wait returns).
type parker struct {
	ch    chan struct{}
	timer *time.Timer // for waits with a finite timeout; made on the first, stopped when each ends
}

// In-process sleepers register their parker under the address of the
// word they sleep on, in a table of parkShards sharded by that address:
// no global lock, and views of the same memory meet in the same shard. A
// signal takes every parker registered for its word and sends each a
// token. The protocol is the futex one with the registration in place of
// the kernel's compare:
//
//	waiter:    park(word, p); sleepers.Add(1); if ready() {unpark; return}; <-p.ch (or ctx.Done(): unpark)
//	signaller: state.Store(new); if sleepers.Load() != 0 { ...; if shard.n.Load() != 0 { lock; send to word's parkers; unlock } }
//
// If the signaller's load of sleepers follows the waiter's increment, the
// registration (and the shard count it raised, both before the increment)
// precedes the signaller's look at the shard, which finds the parker and
// wakes it; otherwise the state store precedes the waiter's ready(), which
// sees it. Every sleep is a channel receive, or a select with ctx.Done():
// no timer unless the caller gave a finite timeout (then the parker's own,
// reset), no allocation after a parker's first sleep.
const parkShards = 256

// parkTable is the process's in-process sleepers. Lock order: one shard
// at a time; a parker's channel is only sent to (non-blocking) under its
// shard's lock.
var parkTable [parkShards]parkShard

// A parkShard holds the sleepers of the words that hash to it.
type parkShard struct {
	mu sync.Mutex
	// n counts the parkers registered in words. It is written under mu
	// and loaded without it by signallers, as the gate that spares them
	// the lock while nobody in this process sleeps here (see above).
	n atomic.Int32
	// words holds, in words[:len], one record per word with registered
	// parkers, by value so a lookup scans contiguous memory. Records in
	// words[len:cap] are retired ones, emptied, whose parkers slices keep
	// their capacity for the next word: sleeping allocates nothing once
	// the shard has seen its busiest moment. Guarded by mu.
	words []parkedWord
	_     [CacheLine - 40]byte
}

// A shard is one cache line long, so busy shards seldom share a line (the
// table itself is only word-aligned).
var _ = [1]struct{}{}[unsafe.Sizeof(parkShard{})-CacheLine]

// A parkedWord is the parkers asleep on one word.
type parkedWord struct {
	word    *atomic.Uint32
	parkers []*parker
}

// shardOf hashes word's address (Fibonacci hashing: the wake words of
// neighbouring ranks lie one control block apart, and the top bits of the
// product spread them).
func shardOf(word *atomic.Uint32) *parkShard {
	h := uint64(uintptr(unsafe.Pointer(word))) * 0x9e3779b97f4a7c15
	return &parkTable[h>>(64-8)]
}

var _ = [1]struct{}{}[parkShards-1<<8] // shardOf takes the top 8 bits

// findLocked returns the index of word's record, or -1.
func (sh *parkShard) findLocked(word *atomic.Uint32) int {
	for i := range sh.words {
		if sh.words[i].word == word {
			return i
		}
	}
	return -1
}

// addLocked makes a record for word, reusing a retired one if there is
// one, and returns its index.
func (sh *parkShard) addLocked(word *atomic.Uint32) int {
	n := len(sh.words)
	if n < cap(sh.words) {
		sh.words = sh.words[:n+1]
	} else {
		sh.words = append(sh.words, parkedWord{})
	}
	sh.words[n].word = word
	return n
}

// dropLocked retires record i: emptied, it moves just past the end.
func (sh *parkShard) dropLocked(i int) {
	last := len(sh.words) - 1
	sh.words[i], sh.words[last] = sh.words[last], sh.words[i]
	pw := &sh.words[last]
	clear(pw.parkers)
	pw.word, pw.parkers = nil, pw.parkers[:0]
	sh.words = sh.words[:last]
}

// park registers p as asleep on word.
func park(word *atomic.Uint32, p *parker) {
	sh := shardOf(word)
	sh.mu.Lock()
	i := sh.findLocked(word)
	if i < 0 {
		i = sh.addLocked(word)
	}
	pw := &sh.words[i]
	pw.parkers = append(pw.parkers, p)
	sh.n.Add(1)
	sh.mu.Unlock()
}

// unpark withdraws p from word's sleepers when its owner leaves wait
// without having received a token (the condition held after registering,
// or the context ended, or the timeout passed). If a signal took p first,
// its token is in the channel: unpark takes it, restoring the parker's
// invariant.
func unpark(word *atomic.Uint32, p *parker) {
	sh := shardOf(word)
	sh.mu.Lock()
	if i := sh.findLocked(word); i >= 0 {
		pw := &sh.words[i]
		for j, q := range pw.parkers {
			if q != p {
				continue
			}
			last := len(pw.parkers) - 1
			pw.parkers[j], pw.parkers[last] = pw.parkers[last], nil
			pw.parkers = pw.parkers[:last]
			sh.n.Add(-1)
			if last == 0 {
				sh.dropLocked(i)
			}
			sh.mu.Unlock()
			return
		}
	}
	sh.mu.Unlock()
	// The signal sent under the lock we just held, so the token is there;
	// a non-blocking receive keeps a broken invariant from hanging.
	select {
	case <-p.ch:
	default:
	}
}

// wakeParked wakes the in-process sleepers of word.
func wakeParked(word *atomic.Uint32) {
	sh := shardOf(word)
	if sh.n.Load() == 0 {
		return
	}
	sh.mu.Lock()
	if i := sh.findLocked(word); i >= 0 {
		pw := &sh.words[i]
		for _, p := range pw.parkers {
			select {
			case p.ch <- struct{}{}:
			default: // cannot happen: a registered parker's channel is empty
			}
		}
		sh.n.Add(-int32(len(pw.parkers)))
		sh.dropLocked(i)
	}
	sh.mu.Unlock()
}

// futexMissing is set once a futex call answered ErrNotSupported; waiters
// then poll. Store once, Load per sleep; it publishes nothing else.
var futexMissing atomic.Bool

// wait returns when ready() is true, ErrTimeout after timeout (negative:
// no bound), or ctx.Err() once ctx is done (context.Background(): never).
// ready must only load shared state (it is called again after every
// wake-up, spurious or not). p is the calling handle's parker, used only
// with InProcessWaiter.
func (w Waiter) wait(e event, ready func() bool, p *parker, ctx context.Context, timeout time.Duration) error {
	if ready() {
		return nil
	}
	for i := 0; i < w.spins; i++ {
		if ready() {
			return nil
		}
	}
	if w.inProc {
		return procWait(e, ready, p, ctx, timeout)
	}
	done := ctx.Done()
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	futile := 0 // wake-ups in a row that found ready() false (see stormWakes)
	for {
		if futile >= stormWakes {
			pause := stormPause
			if timeout >= 0 {
				pause = min(pause, max(time.Until(deadline), 0))
			}
			time.Sleep(pause)
		}
		seen := e.word.Load()
		e.sleepers.Add(1)
		if ready() {
			e.sleepers.Add(^uint32(0))
			return nil
		}
		d := time.Duration(-1)
		if timeout >= 0 {
			if d = time.Until(deadline); d <= 0 {
				e.sleepers.Add(^uint32(0))
				return ErrTimeout
			}
		}
		if done != nil {
			if err := ctx.Err(); err != nil {
				e.sleepers.Add(^uint32(0))
				return err
			}
			if dl, ok := ctx.Deadline(); ok {
				d = bound(d, max(time.Until(dl), 0))
			}
		}
		// Every sleep is a slice, even without a context or timeout: the
		// sleepers word that makes a signaller wake us lies in memory
		// every rank can write, and a stray 0 stored there while we
		// sleep would otherwise cost the wake-up for good. A slice costs
		// a check per ctxSlice, as libfastpmi's waits do.
		d = bound(d, ctxSlice)
		var err error
		polled := futexMissing.Load()
		if polled {
			time.Sleep(pollInterval) // the loop re-checks ready, the deadline and ctx
		} else {
			err = sys.FutexWait(futexAddr(e.word), seen, d)
		}
		e.sleepers.Add(^uint32(0))
		switch {
		case err == nil && polled:
		case err == nil:
			futile++ // woken, or the word moved: counted futile unless ready below
		case errors.Is(err, sys.ErrTimedOut):
			futile = 0
		case errors.Is(err, sys.ErrNotSupported):
			futexMissing.Store(true)
		default:
			return fmt.Errorf("wait for shared memory: %w", err)
		}
		if ready() {
			return nil
		}
	}
}

// bound returns the shorter of timeout d (negative: none) and limit.
func bound(d, limit time.Duration) time.Duration {
	if d < 0 {
		return limit
	}
	return min(d, limit)
}

// procWait is wait's sleep for InProcessWaiter (see parkTable). Only a
// finite timeout arms a timer (the parker's, reused); a context is watched
// through its Done channel.
func procWait(e event, ready func() bool, p *parker, ctx context.Context, timeout time.Duration) error {
	if p.ch == nil {
		p.ch = make(chan struct{}, 1)
	}
	done := ctx.Done()
	var expired <-chan time.Time
	if timeout >= 0 {
		// Reset of a stopped timer: since Go 1.23 its channel holds no
		// stale expiry.
		if p.timer == nil {
			p.timer = time.NewTimer(timeout)
		} else {
			p.timer.Reset(timeout)
		}
		defer p.timer.Stop()
		expired = p.timer.C
	}
	for {
		park(e.word, p)
		e.sleepers.Add(1)
		if ready() {
			e.sleepers.Add(^uint32(0))
			unpark(e.word, p)
			return nil
		}
		var err error
		if done == nil && expired == nil {
			<-p.ch
		} else {
			select {
			case <-p.ch:
			case <-done:
				err = ctx.Err()
			case <-expired:
				err = ErrTimeout
			}
		}
		e.sleepers.Add(^uint32(0))
		if err != nil {
			unpark(e.word, p)
		}
		// The condition wins over an ending context or timeout that raced
		// with it.
		if ready() {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// futexAddr is the address of an atomic word as the futex system call
// wants it. atomic.Uint32 is a plain uint32 in memory.
func futexAddr(w *atomic.Uint32) *uint32 { return (*uint32)(unsafe.Pointer(w)) }
