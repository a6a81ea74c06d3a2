package shm

import (
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
// a segment skip the futex wake, so no other process may wait on it.
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
	if procSleepers.Load() != 0 {
		procWake(e.word)
	}
}

// In-process sleepers (InProcessWaiter) wait on a channel per futex word,
// closed by the next signal of that word. procSleepers counts them, so a
// signaller in a process without any pays one atomic load. The protocol
// is the futex one with "the word moved" in place of the kernel's compare:
//
//	waiter:    procSleepers.Add(1); seen = word.Load(); sleepers.Add(1); ch = procChan(word);
//	           if ready() || word.Load() != seen {retry}; <-ch
//	signaller: state.Store(new); if sleepers.Load() != 0 { word.Add(1); ...; if procSleepers.Load() != 0 { close(procChan(word)) } }
//
// A signaller that sees the waiter in sleepers also sees it in
// procSleepers (incremented first); if it closed the word's channel before
// the waiter took it, it bumped the word before that, and the waiter's
// second load sees the bump.
var (
	procSleepers atomic.Int32
	procMu       sync.Mutex
	procChans    = map[*atomic.Uint32]chan struct{}{}
)

// procChan returns the channel the next signal of word closes.
func procChan(word *atomic.Uint32) chan struct{} {
	procMu.Lock()
	defer procMu.Unlock()
	ch := procChans[word]
	if ch == nil {
		ch = make(chan struct{})
		procChans[word] = ch
	}
	return ch
}

// procWake wakes the in-process sleepers of word.
func procWake(word *atomic.Uint32) {
	procMu.Lock()
	ch := procChans[word]
	delete(procChans, word)
	procMu.Unlock()
	if ch != nil {
		close(ch)
	}
}

// procSleep sleeps until word's next signal or for d (negative: no bound).
// The caller counts itself in procSleepers and sleepers, and took ch
// before its last check of the condition.
func procSleep(ch chan struct{}, d time.Duration) {
	if d < 0 {
		<-ch
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	}
}

// futexMissing is set once a futex call answered ErrNotSupported; waiters
// then poll. Store once, Load per sleep; it publishes nothing else.
var futexMissing atomic.Bool

// wait returns when ready() is true, or ErrTimeout after timeout (a
// negative timeout waits without bound). ready must only load shared state
// (it is called again after every wake-up, spurious or not).
func (w Waiter) wait(e event, ready func() bool, timeout time.Duration) error {
	if ready() {
		return nil
	}
	for i := 0; i < w.spins; i++ {
		if ready() {
			return nil
		}
	}
	var deadline time.Time
	if timeout >= 0 {
		deadline = time.Now().Add(timeout)
	}
	if w.inProc {
		procSleepers.Add(1)
		defer procSleepers.Add(-1)
	}
	for {
		seen := e.word.Load()
		e.sleepers.Add(1)
		var ch chan struct{}
		if w.inProc {
			ch = procChan(e.word)
		}
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
		var err error
		switch {
		case w.inProc:
			if e.word.Load() == seen {
				procSleep(ch, d)
			}
		case futexMissing.Load():
			time.Sleep(pollInterval) // the loop re-checks ready and the deadline
		default:
			err = sys.FutexWait(futexAddr(e.word), seen, d)
		}
		e.sleepers.Add(^uint32(0))
		switch {
		case err == nil, errors.Is(err, sys.ErrTimedOut):
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

// futexAddr is the address of an atomic word as the futex system call
// wants it. atomic.Uint32 is a plain uint32 in memory.
func futexAddr(w *atomic.Uint32) *uint32 { return (*uint32)(unsafe.Pointer(w)) }
