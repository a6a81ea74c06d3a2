//go:build linux

package netio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/pawelgaczynski/giouring"
	"github.com/valyala/bytebufferpool"
)

// The io_uring backend. One ring per Transport, shared by every goroutine
// that uses the transport; no goroutine owns it and none is locked to a
// thread. What the kernel does for the transport:
//
//   - listening sockets: one multishot accept each;
//   - connections: one multishot recv each, taking buffers from one
//     provided-buffer ring (uringBufs buffers of uringBufSize bytes, Go heap
//     memory the backend keeps referenced until the ring is gone); the reaper
//     decodes each completion's bytes into frames and recycles the buffer at
//     once;
//   - sends that would block: plain IORING_OP_SEND SQEs
//     (MSG_WAITALL|MSG_NOSIGNAL), at most one in flight per connection, so
//     the byte stream keeps its order; frames queued meanwhile accumulate
//     in one pooled buffer (bytebufferpool) and go out together when the
//     send in flight completes; a short send is resubmitted from where it
//     stopped.
//
// A Send on a connection with nothing queued and nothing in flight first
// gives the frame to the socket itself, with a non-blocking send(2) under
// the connection's send lock (uconn.send); only what the socket does not
// take goes to the ring. On loopback or an idle link that is nothing: the
// ring never sees the send, so no completion has to be reaped and nobody
// waiting on the ring is woken for it. (A SEND SQE costs the same system
// call, an io_uring_enter, plus the completion, the wake-up of the ring's
// pollers it causes, and the reaping.)
//
// Submitting: any goroutine, holding mu, fills SQEs and submits them with
// one non-blocking io_uring_enter before it unlocks (unlockSubmit).
//
// Reaping: whoever holds the lead token (a one-slot channel) is the reaper:
// it alone advances the CQ head (and handles completions under mu), and it
// alone waits for completions. Recv takes the token when nobody holds it
// and waits itself, so a frame for it is decoded and returned on its own
// goroutine: no hop to another goroutine. Other waiters (Send under flow
// control, Close, accept) wait on their channels for the reaper.
//
// The reaper waits parked in Go's poller on the ring's descriptor, which
// polls readable whenever the kernel posts a completion
// (sys.NetPollWatcher), never in io_uring_enter: a goroutine blocked in a
// system call keeps its thread asleep until the kernel wakes it, a context
// switch per message, while a parked goroutine leaves its thread free to
// run the other goroutines and is found by the scheduler's own poll of
// the network (see doc.go for the numbers). A waiter that must wake the
// reaper early (its context ended) kicks it with a read deadline.
//
// When nobody holds the token, completions still have to be handled (an
// accept, a send queued behind another): the ring's registered eventfd is
// then enabled, and the watcher goroutine, parked on it through Go's poller
// (no thread, no CPU), takes the token and reaps. While a goroutine holds
// the token the eventfd is disabled (IORING_CQ_EVENTFD_DISABLED), so a
// completion wakes only the reaper. release enables it again, drops the
// token and then looks at the CQ once more, reaping what came in after
// the holder's last reap, so none is stranded.
//
// Where recvs run: the kernel finishes a recv on the thread that
// submitted it (task work), waking that thread if it sleeps. A multishot
// recv armed by a thread that no longer runs the reaping thus costs one
// more wake-up per message. A recv whose completions keep being reaped on
// another thread is moved there (cancelled and armed again from it; see
// strangerReaps).
//
// User data of every SQE is kind<<56 | object id; objects live in maps the
// backend keeps, so a completion for something already gone is recognised
// and dropped.
const (
	uringEntries = 1024     // SQ entries; the CQ has twice as many
	uringBufs    = 128      // provided buffers (power of two)
	uringBufSize = 64 << 10 // bytes per provided buffer
	uringBgid    = 0        // the backend's only buffer group

	kindRecv   = 2 // a connection's multishot recv
	kindSend   = 3 // a connection's send
	kindAccept = 4 // a listener's multishot accept
	kindCancel = 5 // a cancellation on behalf of a connection or listener
	kindStop   = 6 // the cancel-everything of shutdown

	idMask = 1<<56 - 1
)

func userData(kind uint64, id uint64) uint64 { return kind<<56 | id&idMask }

type uringBackend struct {
	cfg *Config

	// lead is the reaper's token: a goroutine that has sent into it may
	// advance the CQ head and block in io_uring_enter, until it receives
	// from it again (release). close takes it for good.
	lead chan struct{}

	wake      int                 // the eventfd registered with the ring
	wakeFile  *os.File            // the eventfd, for the watcher's reads through the poller
	poll      *sys.NetPollWatcher // the ring's descriptor in Go's poller, for the token holder's waits
	cqFlags   *sys.NetCQFlags     // switches the eventfd's notifications; written by the token holder
	quit      chan struct{}       // closed by close: the watcher exits
	watcherWG sync.WaitGroup
	done      chan struct{} // closed when close has torn the ring down

	// mu guards the ring's SQ and CQ (the CQ also needs the token) and
	// every field below, and the fields of uconn and ulistener marked
	// "guarded by b.mu". Lock order: mu, then uconn.smu, then
	// frameQueue.mu / acceptQueue.mu.
	mu          sync.Mutex
	ring        *giouring.Ring
	br          *giouring.BufAndRing
	bufs        []byte // provided buffers (sys.NetBufMem), mapped until teardown
	wakeBuf     []byte // target of the watcher's eventfd reads
	conns       map[uint64]*uconn
	listeners   map[uint64]*ulistener
	nextID      uint64
	outstanding int  // SQEs whose last completion has not arrived
	unsubmitted int  // SQEs filled since the last io_uring_enter
	stopping    bool // close has begun: nothing new is attached
	tornDown    bool // the ring is gone
	cqes        []*giouring.CompletionQueueEvent
	sqFlags     uint32 // setup flags the ring got
}

// uringSetupFlags are tried in order; older kernels refuse the newer flags
// with EINVAL and get the next set. COOP_TASKRUN: the kernel does not
// interrupt a running thread to run the completion work it queues for it
// (the thread runs it at its next kernel entry; a sleeping one is woken).
// SINGLE_ISSUER and DEFER_TASKRUN are not used: any goroutine, on any
// thread, submits.
var uringSetupFlags = []uint32{giouring.SetupCoopTaskrun, 0}

func newUringBackend(cfg *Config) (*uringBackend, error) {
	b := &uringBackend{
		cfg:       cfg,
		lead:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		done:      make(chan struct{}),
		conns:     map[uint64]*uconn{},
		listeners: map[uint64]*ulistener{},
		cqes:      make([]*giouring.CompletionQueueEvent, 256),
		wakeBuf:   make([]byte, 8),
	}
	if err := b.setup(); err != nil {
		b.teardown()
		return nil, err
	}
	b.watcherWG.Add(1)
	go b.watch()
	return b, nil
}

func (b *uringBackend) setup() error {
	var err error
	b.wake, err = sys.NetEventFD()
	if err != nil {
		return err
	}
	// Non-blocking, so os registers it with the poller: a Read parks the
	// goroutine, not a thread.
	b.wakeFile = os.NewFile(uintptr(b.wake), "netio-wake")
	var params giouring.Params
	for _, flags := range uringSetupFlags {
		params = giouring.Params{}
		if err = sys.NetParamsSetFlags(&params, flags); err != nil {
			return err
		}
		ring := giouring.NewRing()
		if err = ring.QueueInitParams(uringEntries, &params); err == nil {
			b.ring, b.sqFlags = ring, flags
			break
		}
	}
	if err != nil {
		return fmt.Errorf("set up ring: %w", err)
	}
	b.cqFlags, err = sys.NetMapCQFlags(b.ring.RingFd(), &params)
	if err != nil {
		return err
	}
	b.br, err = b.ring.SetupBufRing(uringBufs, uringBgid, 0)
	if err != nil {
		b.br = nil
		return fmt.Errorf("register buffer ring: %w", err)
	}
	if b.bufs, err = sys.NetBufMem(uringBufs * uringBufSize); err != nil {
		return fmt.Errorf("provided buffers: %w", err)
	}
	mask := giouring.BufRingMask(uringBufs)
	for i := range uringBufs {
		b.br.BufRingAdd(sys.BufAddr(b.bufs[i*uringBufSize:]), uringBufSize, uint16(i), mask, i)
	}
	b.br.BufRingAdvance(uringBufs)
	if _, err := b.ring.RegisterEventFd(b.wake); err != nil {
		return fmt.Errorf("register eventfd with ring: %w", err)
	}
	b.poll, err = sys.NewNetPollWatcher(b.ring.RingFd(), "netio-ring")
	return err
}

// teardown releases the ring; outstanding work the kernel did not finish
// keeps its buffers alive for good.
func (b *uringBackend) teardown() {
	b.tornDown = true
	if b.poll != nil {
		b.poll.Close()
	}
	if b.cqFlags != nil {
		b.cqFlags.Close()
	}
	if b.ring != nil {
		if b.br != nil {
			// Unregistered, the buffer ring is ours again: unmap it,
			// or every backend made leaves a page mapped for good (a
			// daemon makes one per job).
			if err := b.ring.FreeBufRing(uringBgid); err == nil {
				if err := sys.NetBufRingFree(b.br, uringBufs); err != nil {
					b.cfg.Logger.Warn("netio: release buffer ring", "err", err)
				}
			}
			b.br = nil
		}
		b.ring.QueueExit()
	}
	if b.wakeFile != nil {
		b.wakeFile.Close()
	} else if b.wake > 0 {
		sys.NetCloseFD(b.wake)
	}
	// While the kernel may still own buffers (work it did not finish),
	// they stay mapped for good rather than let the address be reused.
	if b.bufs != nil && b.outstanding == 0 {
		if err := sys.NetBufMemFree(b.bufs); err != nil {
			b.cfg.Logger.Warn("netio: release provided buffers", "err", err)
		}
		b.bufs = nil
	}
}

// ---- submitting and reaping ----

// unlockSubmit submits the SQEs filled under mu and unlocks it.
func (b *uringBackend) unlockSubmit() {
	b.submitLocked()
	b.mu.Unlock()
}

func (b *uringBackend) submitLocked() {
	for b.unsubmitted > 0 && !b.tornDown {
		n, err := b.ring.Submit()
		if err != nil {
			if isTransientEnter(err) {
				continue
			}
			b.cfg.Logger.Error("netio: io_uring submit", "err", err)
			return
		}
		b.unsubmitted -= int(n)
		if b.unsubmitted < 0 {
			b.unsubmitted = 0
		}
	}
}

func isTransientEnter(err error) bool {
	for _, n := range []int32{sys.NetEINTR, sys.NetETIME, sys.NetEBUSY, sys.NetEAGAIN} {
		if sys.NetIsErrno(err, n) {
			return true
		}
	}
	return false
}

// sqe returns a zeroed SQE, submitting what is queued when the submission
// queue is full (GetSQE returns nil then). Called with mu held.
func (b *uringBackend) sqe() *giouring.SubmissionQueueEntry {
	for {
		if s := b.ring.GetSQE(); s != nil {
			// Zero it: the Prepare helpers leave some fields of the
			// slot's previous use in place.
			*s = giouring.SubmissionQueueEntry{}
			b.unsubmitted++
			return s
		}
		if _, err := b.ring.Submit(); err != nil && !isTransientEnter(err) {
			b.cfg.Logger.Error("netio: io_uring submit", "err", err)
			time.Sleep(time.Millisecond)
		}
		b.unsubmitted = 0
	}
}

// tryLead takes the lead token if it is free.
func (b *uringBackend) tryLead() bool {
	select {
	case b.lead <- struct{}{}:
		b.cqFlags.SetEventfd(false)
		return true
	default:
		return false
	}
}

// release gives the lead token back, and then makes sure no completion is
// left with nobody to reap it. A completion posted after the holder's last
// reap is stranded otherwise: while the eventfd was off it signalled
// nobody, and while it was on but the token still held, the watcher woke,
// failed to take the token and went back to its read. So once the token is
// free, release looks at the CQ again; if it holds anything and the token
// is still free, it takes it back and reaps. If another goroutine took the
// token meanwhile, that one does the same check when it releases.
//
// Ordering: the eventfd is enabled (an atomic exchange, a full barrier on
// the kernel's side and ours) before the token is dropped and the CQ tail
// is read; the kernel publishes the tail before it reads the flag (there
// is a full barrier in between, in its wake-up of CQ waiters). So a
// completion either sees the eventfd enabled and signals the watcher, or
// is posted before our tail read and seen by it.
//
// The second look is taken under mu: once the token is free, close may
// take it for good and tear the ring down.
func (b *uringBackend) release() {
	for {
		b.cqFlags.SetEventfd(true)
		<-b.lead
		b.mu.Lock()
		if b.tornDown || b.ring.CQReady() == 0 || !b.tryLead() {
			b.mu.Unlock()
			return
		}
		b.reapLocked()
		b.unlockSubmit()
	}
}

func (b *uringBackend) signalWatcher() {
	if err := sys.NetEventFDSignal(b.wake); err != nil {
		b.cfg.Logger.Error("netio: signal io_uring eventfd", "err", err)
	}
}

// reapLocked handles every completion in the CQ and returns how many there
// were. Called with mu and the lead token held.
func (b *uringBackend) reapLocked() int {
	if b.tornDown {
		return 0
	}
	total := 0
	for {
		// PeekBatchCQE fills the whole slice it is given, whatever is
		// ready: give it only as much as is ready.
		want := min(b.ring.CQReady(), uint32(len(b.cqes)))
		n := b.ring.PeekBatchCQE(b.cqes[:max(want, 1)])
		if n == 0 {
			return total
		}
		total += int(n)
		for _, cqe := range b.cqes[:n] {
			ud, res, flags := cqe.UserData, cqe.Res, cqe.Flags
			b.complete(ud, res, flags)
		}
		b.ring.CQAdvance(n)
	}
}

// reap handles what is in the CQ; the caller holds the lead token.
func (b *uringBackend) reap() int {
	// The token keeps the ring from being torn down (close takes it for
	// good first), so the CQ can be looked at before mu is taken.
	if b.ring.CQReady() == 0 {
		return 0
	}
	b.mu.Lock()
	n := b.reapLocked()
	b.unlockSubmit()
	return n
}

// waitCQ waits, parked in Go's poller on the ring's descriptor, until
// done returns true or a kick. done is called at once and again after
// every completion the kernel posts; it reaps. The caller holds the lead
// token.
func (b *uringBackend) waitCQ(done func(uintptr) bool) {
	err := b.poll.Wait(done)
	if err == nil {
		return
	}
	// Kicked, or the deadline of close: clear it for the next wait. A
	// kick that lands after this is seen by the next wait, which then
	// returns at once and looks again.
	b.poll.SetDeadline(time.Time{})
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		b.cfg.Logger.Error("netio: wait for io_uring completions", "err", err)
		time.Sleep(time.Millisecond)
	}
}

// kick wakes the token holder from waitCQ.
func (b *uringBackend) kick() { b.poll.Kick() }

// awaitRecv waits until c's receive queue is signalled, Close is called,
// ctx ends, or completions were reaped: as the reaper if nobody else is
// one, else on the channels. The caller looks again at what it waits for
// whenever awaitRecv returns nil.
func (b *uringBackend) awaitRecv(ctx context.Context, c *uconn) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	// The common cases first, without a select over four channels (it
	// locks them all): frames came meanwhile, or the token is free.
	if c.takeNotify() {
		return nil
	}
	if !b.tryLead() {
		select {
		case <-c.rq.notify:
			return nil
		case <-c.closeCalled:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case b.lead <- struct{}{}:
			b.cqFlags.SetEventfd(false)
		}
	}
	defer b.release()
	if ctx.Done() != nil {
		defer context.AfterFunc(ctx, b.kick)()
	}
	// The first call of recvReady reaps what came before the token did.
	b.waitCQ(c.reapReady)
	return nil
}

// recvReady reaps and reports whether c's Recv should look again. It is
// the function c's Recv waits with (reapReady, made once, so a wait does
// not allocate); the argument is the poller's descriptor, unused.
func (c *uconn) recvReady(uintptr) bool {
	c.b.reap()
	return c.takeNotify()
}

// takeNotify consumes the receive queue's notification and reports whether
// there was one or Close was called: Recv should look again.
func (c *uconn) takeNotify() bool {
	select {
	case <-c.rq.notify:
		return true
	default:
	}
	return c.closed.Load()
}

// watch is the watcher goroutine: it reaps when the eventfd says
// completions came while nobody held the lead token.
func (b *uringBackend) watch() {
	defer b.watcherWG.Done()
	for {
		if _, err := b.wakeFile.Read(b.wakeBuf); err != nil {
			select {
			case <-b.quit:
				return
			default:
			}
			b.cfg.Logger.Error("netio: read eventfd", "err", err)
			time.Sleep(time.Millisecond)
			continue
		}
		select {
		case <-b.quit:
			return
		default:
		}
		// If the token is busy, its holder looks at the CQ again after
		// it gives the token back (release), so nothing is lost.
		if b.tryLead() {
			b.reap()
			b.release()
		}
	}
}

// ---- completions (called with mu and the lead token held) ----

func (b *uringBackend) armRecv(c *uconn) {
	sqe := b.sqe()
	sqe.PrepareRecvMultishot(c.fd, 0, 0, 0)
	sqe.Flags |= giouring.SqeBufferSelect
	sqe.BufIG = uringBgid
	sqe.UserData = userData(kindRecv, c.id)
	c.recvArmed = true
	c.armTid, c.stranger, c.strangers = sys.NetGettid(), 0, 0
	c.ops++
	b.outstanding++
}

func (b *uringBackend) armAccept(l *ulistener) {
	sqe := b.sqe()
	sqe.PrepareMultishotAccept(l.fd, 0, 0, 0)
	sqe.OpcodeFlags = sys.NetAcceptFlags // PrepareAccept drops its flags argument
	sqe.UserData = userData(kindAccept, l.id)
	l.armed = true
	l.ops++
	b.outstanding++
}

func (b *uringBackend) cancel(target uint64, id uint64) {
	sqe := b.sqe()
	sqe.PrepareCancel64(target, 0)
	sqe.UserData = userData(kindCancel, id)
	b.outstanding++
}

func (b *uringBackend) complete(ud uint64, res int32, flags uint32) {
	more := flags&giouring.CQEFMore != 0
	if !more {
		b.outstanding--
	}
	id := ud & idMask
	switch ud >> 56 {
	case kindRecv:
		c := b.conns[id]
		if c == nil {
			b.recycleIfBuffer(flags)
			return
		}
		b.completeRecv(c, res, flags, more)
	case kindSend:
		if c := b.conns[id]; c != nil {
			b.completeSend(c, res)
		}
	case kindAccept:
		if l := b.listeners[id]; l != nil {
			b.completeAccept(l, res, more)
		}
	case kindCancel:
		if c := b.conns[id]; c != nil {
			c.ops--
			b.maybeFinishConn(c)
		} else if l := b.listeners[id]; l != nil {
			l.ops--
			b.maybeFinishListener(l)
		}
	case kindStop:
	}
}

func (b *uringBackend) recycleIfBuffer(flags uint32) {
	if flags&giouring.CQEFBuffer != 0 {
		b.recycle(uint16(flags >> giouring.CQEBufferShift))
	}
}

func (b *uringBackend) recycle(bid uint16) {
	b.br.BufRingAdd(sys.BufAddr(b.bufs[int(bid)*uringBufSize:]), uringBufSize, bid, giouring.BufRingMask(uringBufs), 0)
	b.br.BufRingAdvance(1)
}

func (b *uringBackend) completeRecv(c *uconn, res int32, flags uint32, more bool) {
	if res > 0 && flags&giouring.CQEFBuffer != 0 {
		bid := uint16(flags >> giouring.CQEBufferShift)
		data := b.bufs[int(bid)*uringBufSize : int(bid)*uringBufSize+int(res)]
		var err error
		if !c.recvDone {
			err = c.dec.Feed(data, c.emit)
		}
		b.recycle(bid)
		c.rq.signal()
		if err != nil {
			b.endRecv(c, fmt.Errorf("receive: %w", err))
		} else if !c.closing && c.recvArmed && !c.pausing && c.rq.overLimit(b.cfg.RecvQueue) {
			// The receiver is behind: stop reading until it catches up
			// (Recv calls resume).
			c.pausing = true
			b.cancel(userData(kindRecv, c.id), c.id)
			c.ops++
		} else if more && !c.closing && !c.pausing && !c.recvDone && b.strangerReaps(c) {
			// Move the recv to this thread: cancel it, and the final
			// completion arms it again (below).
			c.pausing = true
			b.cancel(userData(kindRecv, c.id), c.id)
			c.ops++
		}
	} else {
		b.recycleIfBuffer(flags)
		switch {
		case res == 0:
			if c.dec.Mid() {
				b.endRecv(c, fmt.Errorf("receive: %w", ErrTruncatedFrame))
			} else {
				b.endRecv(c, ErrPeerClosed)
			}
		case res == -sys.NetENOBUFS, res == -sys.NetECANCELED:
			// Out of buffers (re-armed below) or paused/closing.
		case res < 0:
			b.endRecv(c, fmt.Errorf("receive: %w", sys.NetErrno(res)))
		}
	}
	if more {
		return
	}
	c.recvArmed = false
	c.pausing = false
	c.ops--
	switch {
	case c.closing:
		b.maybeFinishConn(c)
	case c.recvDone:
	case c.rq.isPaused():
	default:
		b.armRecv(c)
	}
}

// A recv moves to another thread once that thread was found reaping its
// completions strangerMoves looks in a row, and at most once per
// moveEvery, so connections whose completions are reaped by changing
// threads (streams, with both Ps busy) do not spend their time moving. The
// thread is looked at (a gettid) on every tidEvery-th completion only: a
// ping-pong that stays on one thread pays for the system call once per
// tidEvery messages, and one that changed threads is noticed after about
// strangerMoves*tidEvery (8) messages.
//
// Moving soon matters more than it seems: Go hands goroutines between its
// threads often enough (sysmon retaking a P from a long system call, an
// idle thread woken for a ready goroutine) that with a 10 ms limit and 32
// messages to notice, a 4 KiB ping-pong spent much of its time with the
// recv on a sleeping thread — each message then woke that thread to run
// the recv, and the completion woke a third one in epoll: 0.44 context
// switches per round trip against 0.07 with this setting (13 against
// 9.5 us one way). A move costs a cancel and a new recv (two SQEs, three
// completions), so the 1 ms limit bounds it to a fraction of a percent of
// a CPU per connection; throughput did not change.
const (
	strangerMoves = 2
	tidEvery      = 4
	moveEvery     = time.Millisecond
)

// strangerReaps reports whether c's recv should move to the current
// thread. The kernel finishes a recv on the thread that submitted it (task
// work), waking that thread if it sleeps: a recv armed by a thread that no
// longer runs the reaping costs a wake-up of a sleeping thread, a context
// switch, per message. The thread that reaps is the one whose goroutines
// run when messages come, so the recv should be its.
func (b *uringBackend) strangerReaps(c *uconn) bool {
	c.reaps++
	if c.reaps%tidEvery != 0 {
		return false
	}
	tid := sys.NetGettid()
	switch tid {
	case c.armTid:
		c.strangers = 0
		return false
	case c.stranger:
		c.strangers++
	default:
		c.stranger, c.strangers = tid, 1
	}
	if c.strangers < strangerMoves {
		return false
	}
	now := time.Now()
	if now.Sub(c.moved) < moveEvery {
		return false
	}
	c.moved = now
	return true
}

// endRecv records that no more frames will come on c.
func (b *uringBackend) endRecv(c *uconn, err error) {
	if c.recvDone {
		return
	}
	c.recvDone = true
	c.rq.finish(err)
	if c.recvArmed && !c.closing {
		// A decoding error leaves the multishot recv armed: stop it.
		b.cancel(userData(kindRecv, c.id), c.id)
		c.ops++
	}
}

// flush starts a send of c's queued frames unless one is in flight.
// Called with mu held.
func (b *uringBackend) flush(c *uconn) {
	if c.inflight != nil {
		return // completeSend looks at the queue again
	}
	c.smu.Lock()
	p, off := c.pending, c.pendOff
	c.pending, c.pendOff = nil, 0
	if p == nil || len(p.B) == off || c.werr != nil {
		c.queued = false
		c.smu.Unlock()
		if p != nil {
			bytebufferpool.Put(p)
		}
		signal(c.drained)
		return
	}
	c.smu.Unlock()
	signal(c.space)
	c.inflight, c.off = p, off
	b.submitSend(c)
}

// maxSend bounds one send SQE (its length field is 32 bits).
const maxSend = 1 << 30

func (b *uringBackend) submitSend(c *uconn) {
	rest := c.inflight.B[c.off:]
	if len(rest) > maxSend {
		rest = rest[:maxSend]
	}
	sqe := b.sqe()
	sqe.PrepareSend(c.fd, sys.BufAddr(rest), uint32(len(rest)), sys.NetSendFlags)
	sqe.UserData = userData(kindSend, c.id)
	c.ops++
	b.outstanding++
}

func (b *uringBackend) completeSend(c *uconn, res int32) {
	c.ops--
	if res < 0 {
		err := ErrClosed
		if !c.closing {
			err = fmt.Errorf("send: %w", sys.NetErrno(res))
		}
		c.fail(err)
		bytebufferpool.Put(c.inflight)
		c.inflight = nil
		b.flush(c) // drops what is queued and wakes Close
		b.maybeFinishConn(c)
		return
	}
	c.off += int(res)
	if c.off < len(c.inflight.B) && !c.closing {
		b.submitSend(c)
		return
	}
	bytebufferpool.Put(c.inflight)
	c.inflight = nil
	if c.closing {
		b.maybeFinishConn(c)
		return
	}
	b.flush(c)
}

func (b *uringBackend) closeConn(c *uconn) {
	if c.id == 0 || c.closing || c.released {
		return
	}
	c.closing = true
	c.rq.finish(ErrClosed)
	c.fail(ErrClosed)
	if c.ops > 0 {
		// Cancel everything on the socket; the completions bring ops
		// to zero.
		sqe := b.sqe()
		sqe.PrepareCancelFd(c.fd, giouring.AsyncCancelAll)
		sqe.UserData = userData(kindCancel, c.id)
		c.ops++
		b.outstanding++
	}
	b.maybeFinishConn(c)
}

func (b *uringBackend) maybeFinishConn(c *uconn) {
	if c.closing && c.ops == 0 && c.id != 0 {
		delete(b.conns, c.id)
		b.finishConn(c, ErrClosed)
	}
}

// finishConn releases c once the kernel holds nothing of it.
func (b *uringBackend) finishConn(c *uconn, err error) {
	if c.released {
		return
	}
	c.released = true
	c.closing = true
	c.rq.finish(err)
	c.fail(err)
	if c.inflight != nil {
		bytebufferpool.Put(c.inflight)
		c.inflight = nil
	}
	c.smu.Lock()
	if c.pending != nil {
		bytebufferpool.Put(c.pending)
		c.pending, c.pendOff = nil, 0
	}
	c.queued = false
	c.smu.Unlock()
	signal(c.drained)
	if err := sys.NetCloseFD(c.fd); err != nil {
		b.cfg.Logger.Warn("netio: close socket", "err", err)
	}
	close(c.finished)
}

func (b *uringBackend) completeAccept(l *ulistener, res int32, more bool) {
	switch {
	case res >= 0:
		fd := int(res)
		c, err := b.newAccepted(fd)
		if err != nil {
			// That connection only (reset before it was taken, as
			// getpeername's ENOTCONN says): the listener goes on.
			sys.NetCloseFD(fd)
			l.q.push(acceptResult{err: fmt.Errorf("%w: %w", errConnGone, err)})
		} else {
			b.attachLocked(c)
			l.q.push(acceptResult{c: c})
		}
	case res == -sys.NetECANCELED:
	default:
		if !l.closing {
			l.q.push(acceptResult{err: fmt.Errorf("accept: %w", sys.NetErrno(res)), rearm: !more})
		}
	}
	if more {
		return
	}
	l.armed = false
	l.ops--
	if l.closing {
		b.maybeFinishListener(l)
	} else if res >= 0 || res == -sys.NetECANCELED {
		b.armAccept(l)
	}
	// After an error the listener's accept calls rearmAccept once it has
	// reported the error: errors such as EMFILE cannot spin.
}

func (b *uringBackend) newAccepted(fd int) (*uconn, error) {
	if err := sys.NetSetNoDelay(fd); err != nil {
		return nil, err
	}
	la, ra, err := sys.NetSockAddrs(fd)
	if err != nil {
		return nil, err
	}
	c := newUconn(b, fd, net.TCPAddrFromAddrPort(la), net.TCPAddrFromAddrPort(ra))
	c.dec.Sealed = true // before attachLocked arms its recv
	return c, nil
}

func (b *uringBackend) closeListener(l *ulistener) {
	if l.id == 0 || l.closing {
		return
	}
	l.closing = true
	if l.armed {
		b.cancel(userData(kindAccept, l.id), l.id)
		l.ops++
	}
	b.maybeFinishListener(l)
}

func (b *uringBackend) maybeFinishListener(l *ulistener) {
	if l.closing && l.ops == 0 && l.id != 0 {
		delete(b.listeners, l.id)
		b.finishListener(l)
	}
}

func (b *uringBackend) finishListener(l *ulistener) {
	if l.released {
		return
	}
	l.released = true
	l.closing = true
	if err := sys.NetCloseFD(l.fd); err != nil {
		b.cfg.Logger.Warn("netio: close listening socket", "err", err)
	}
	// Connections accepted but not yet taken by the listener's loop:
	// the loop is gone or going, so close them here.
	for _, r := range l.q.finish() {
		if r.c != nil {
			r.c.markClosed()
			b.closeConn(r.c)
		}
	}
	close(l.finished)
}

// attachLocked registers c and starts receiving on it (mu held).
func (b *uringBackend) attachLocked(c *uconn) {
	b.nextID++
	c.id = b.nextID
	b.conns[c.id] = c
	b.armRecv(c)
}

// ---- operations for connections and listeners, from any goroutine ----

// flushConn starts sending c's queued frames if nothing is in flight.
// If nobody is reaping, the caller takes the token for the moment: the
// kernel usually completes the send inside the submitting io_uring_enter,
// and reaping it here costs less than waking the watcher for it.
func (b *uringBackend) flushConn(c *uconn) {
	led := b.tryLead()
	b.mu.Lock()
	if c.id != 0 && !c.closing {
		b.flush(c)
	}
	b.submitLocked()
	if led {
		b.reapLocked()
		b.submitLocked()
	}
	b.mu.Unlock()
	if led {
		b.release()
	}
}

// resume re-arms c's recv once its receiver caught up.
func (b *uringBackend) resume(c *uconn) {
	b.mu.Lock()
	if c.id != 0 && !c.closing && !c.recvArmed && !c.recvDone {
		b.armRecv(c)
	}
	b.unlockSubmit()
}

func (b *uringBackend) closeConnAsync(c *uconn) {
	b.mu.Lock()
	b.closeConn(c)
	b.unlockSubmit()
}

func (b *uringBackend) rearmAccept(l *ulistener) {
	b.mu.Lock()
	if l.id != 0 && !l.closing && !l.armed && !b.tornDown {
		b.armAccept(l)
	}
	b.unlockSubmit()
}

func (b *uringBackend) closeListenerAsync(l *ulistener) {
	b.mu.Lock()
	b.closeListener(l)
	b.unlockSubmit()
}

// ---- the backend interface ----

func (b *uringBackend) listen(addr string) (rawListener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	defer ln.Close()
	fd, err := sys.NetDupConnFD(ln.(*net.TCPListener))
	if err != nil {
		return nil, err
	}
	l := &ulistener{b: b, fd: fd, laddr: ln.Addr(), finished: make(chan struct{})}
	l.q.init()
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		sys.NetCloseFD(fd)
		return nil, ErrClosed
	}
	b.nextID++
	l.id = b.nextID
	b.listeners[l.id] = l
	b.armAccept(l)
	b.unlockSubmit()
	return l, nil
}

func (b *uringBackend) dial(ctx context.Context, addr string) (rawConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	tc := nc.(*net.TCPConn)
	if err := tc.SetNoDelay(true); err != nil {
		return nil, fmt.Errorf("set TCP_NODELAY: %w", err)
	}
	fd, err := sys.NetDupConnFD(tc)
	if err != nil {
		return nil, err
	}
	c := newUconn(b, fd, tc.LocalAddr(), tc.RemoteAddr())
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		sys.NetCloseFD(fd)
		return nil, ErrClosed
	}
	b.attachLocked(c)
	b.unlockSubmit()
	return c, nil
}

// close cancels everything, waits up to 5 s for the kernel to let go,
// stops the watcher and tears the ring down.
func (b *uringBackend) close() error {
	b.mu.Lock()
	if b.stopping {
		b.mu.Unlock()
		<-b.done
		return nil
	}
	b.stopping = true
	for _, c := range b.conns {
		b.closeConn(c)
	}
	for _, l := range b.listeners {
		b.closeListener(l)
	}
	sqe := b.sqe()
	sqe.PrepareCancel64(0, int(giouring.AsyncCancelAny))
	sqe.UserData = userData(kindStop, 0)
	b.outstanding++
	b.unlockSubmit()

	// Take the token for good: a reaper blocked in io_uring_enter is
	// woken by the cancellations' completions and gives it up.
	b.lead <- struct{}{}
	b.cqFlags.SetEventfd(false)
	deadline := time.Now().Add(5 * time.Second)
	left := 0
	for {
		// The token is ours for good, and with it the poller wait; a
		// stale kick only makes the loop look again.
		b.poll.SetDeadline(deadline)
		err := b.poll.Wait(func(uintptr) bool {
			b.reap()
			b.mu.Lock()
			left = b.outstanding
			b.mu.Unlock()
			return left == 0
		})
		if err == nil || !time.Now().Before(deadline) {
			break
		}
	}
	if left > 0 {
		b.cfg.Logger.Error("netio: io_uring operations did not drain at shutdown", "outstanding", left)
	}
	close(b.quit)
	b.signalWatcher()
	b.watcherWG.Wait()

	b.mu.Lock()
	// Whatever did not drain in time is released now; its buffers are
	// kept alive by teardown.
	for _, c := range b.conns {
		delete(b.conns, c.id)
		b.finishConn(c, ErrClosed)
	}
	for _, l := range b.listeners {
		delete(b.listeners, l.id)
		b.finishListener(l)
	}
	b.teardown()
	b.mu.Unlock()
	close(b.done)
	return nil
}

// signal does a non-blocking send on a one-slot notification channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
