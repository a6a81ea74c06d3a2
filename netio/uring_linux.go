//go:build linux

package netio

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpmi/fastpmi/internal/sys"
	"github.com/pawelgaczynski/giouring"
	"github.com/valyala/bytebufferpool"
)

// The io_uring backend. One ring per Transport, owned by one goroutine (the
// owner) locked to its OS thread: the ring is set up SINGLE_ISSUER and
// DEFER_TASKRUN where the kernel allows, so only that thread may submit or
// reap. Everything the kernel does for the transport goes through it:
//
//   - listening sockets: one multishot accept each;
//   - connections: one multishot recv each, taking buffers from one
//     provided-buffer ring (uringBufs buffers of uringBufSize bytes, Go heap
//     memory the backend keeps referenced until the ring is gone); the owner
//     decodes each completion's bytes into frames and recycles the buffer at
//     once;
//   - sends: plain IORING_OP_SEND SQEs (MSG_WAITALL|MSG_NOSIGNAL), at most
//     one in flight per connection, so the byte stream keeps its order;
//     frames queued meanwhile accumulate in one pooled buffer
//     (bytebufferpool) and go out together when the send in flight
//     completes; a short send is resubmitted from where it stopped.
//
// The owner never blocks in io_uring_enter: a goroutine blocked in a system
// call keeps its P (scheduler slot) until sysmon takes it back, 20 µs or
// more later, and the goroutines the owner has just made runnable would
// wait that long (measured: 80 µs one way instead of 10). Instead one
// eventfd, registered with the ring (IORING_REGISTER_EVENTFD) and read
// through Go's poller, wakes it: the kernel signals it when completions (or
// the deferred work that produces them) appear, and other goroutines signal
// it after queueing a request (a mutex and a slice). The owner then submits
// and runs the deferred work in one non-blocking io_uring_enter
// (GETEVENTS, min_complete 0), reaps, and parks on the eventfd again when
// there is nothing left; it never polls. The awake flag suppresses the
// goroutines' eventfd writes while the owner is running anyway.
//
// User data of every SQE is kind<<56 | object id; objects live in maps the
// owner keeps, so a completion for something already gone is recognised
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

type reqOp int

const (
	reqAttach      reqOp = iota // start receiving on a new connection
	reqFlush                    // a connection has frames queued to send
	reqResume                   // a connection's receiver caught up: read again
	reqClose                    // close a connection
	reqListen                   // arm accept on a new listener
	reqArmAccept                // re-arm accept after an error was reported
	reqCloseListen              // close a listener
	reqStop                     // shut the backend down
)

type request struct {
	op reqOp
	c  *uconn
	l  *ulistener
}

type uringBackend struct {
	cfg  *Config
	done chan struct{} // closed when the owner has exited and torn down

	// Requests to the owner, guarded by mu.
	mu      sync.Mutex
	reqs    []request
	stopped bool // no more requests are taken

	// awake publishes "the owner will look at reqs before it next sleeps":
	// set by the owner when it wakes, cleared by it just before its last
	// look at reqs; whoever flips it from false to true writes the eventfd.
	// The mutex around reqs orders the owner's last look against a
	// requester's append.
	awake    atomic.Bool
	wake     int      // the eventfd
	wakeFile *os.File // the eventfd, for the owner's reads through the poller

	// Owner-only state: touched only by the owner goroutine.
	ring        *giouring.Ring
	br          *giouring.BufAndRing
	bufs        []byte // provided buffers; referenced until teardown
	wakeBuf     []byte // target of the owner's eventfd reads
	conns       map[uint64]*uconn
	listeners   map[uint64]*ulistener
	nextID      uint64
	outstanding int // SQEs whose last completion has not arrived
	stopping    bool
	cqes        []*giouring.CompletionQueueEvent
	spare       []request
	sqFlags     uint32 // setup flags the ring got
}

func newUringBackend(cfg *Config) (*uringBackend, error) {
	b := &uringBackend{
		cfg:       cfg,
		done:      make(chan struct{}),
		conns:     map[uint64]*uconn{},
		listeners: map[uint64]*ulistener{},
		cqes:      make([]*giouring.CompletionQueueEvent, 256),
		wakeBuf:   make([]byte, 8),
	}
	started := make(chan error, 1)
	go b.run(started)
	if err := <-started; err != nil {
		<-b.done
		return nil, err
	}
	return b, nil
}

// run is the owner goroutine.
func (b *uringBackend) run(started chan<- error) {
	defer close(b.done)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := b.setup(); err != nil {
		b.teardown()
		started <- err
		return
	}
	started <- nil
	b.loop()
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
}

func (b *uringBackend) setup() error {
	var err error
	b.wake, err = sys.NetEventFD()
	if err != nil {
		return err
	}
	// Non-blocking, so os registers it with the poller: a Read parks the
	// goroutine, not the thread's P.
	b.wakeFile = os.NewFile(uintptr(b.wake), "netio-wake")
	b.ring = giouring.NewRing()
	// Prefer the flags that fit one issuing thread; older kernels refuse
	// them with EINVAL and get a plain ring.
	for _, flags := range []uint32{
		giouring.SetupSingleIssuer | giouring.SetupDeferTaskrun | giouring.SetupCoopTaskrun,
		giouring.SetupCoopTaskrun,
		0,
	} {
		if err = b.ring.QueueInit(uringEntries, flags); err == nil {
			b.sqFlags = flags
			break
		}
	}
	if err != nil {
		b.ring = nil
		return fmt.Errorf("set up ring: %w", err)
	}
	b.br, err = b.ring.SetupBufRing(uringBufs, uringBgid, 0)
	if err != nil {
		b.br = nil
		return fmt.Errorf("register buffer ring: %w", err)
	}
	b.bufs = make([]byte, uringBufs*uringBufSize)
	mask := giouring.BufRingMask(uringBufs)
	for i := range uringBufs {
		b.br.BufRingAdd(sys.BufAddr(b.bufs[i*uringBufSize:]), uringBufSize, uint16(i), mask, i)
	}
	b.br.BufRingAdvance(uringBufs)
	if _, err := b.ring.RegisterEventFd(b.wake); err != nil {
		return fmt.Errorf("register eventfd with ring: %w", err)
	}
	return nil
}

// teardown releases the ring once nothing is outstanding (or the kernel
// has been told to cancel it all and the wait gave up).
func (b *uringBackend) teardown() {
	if b.ring != nil {
		if b.br != nil {
			b.ring.FreeBufRing(uringBgid)
		}
		b.ring.QueueExit()
	}
	if b.wakeFile != nil {
		b.wakeFile.Close()
	} else if b.wake > 0 {
		sys.NetCloseFD(b.wake)
	}
	if b.outstanding > 0 {
		// The kernel may still own buffers: keep them alive for good
		// rather than let the heap reuse them.
		leakedMu.Lock()
		leaked = append(leaked, b.bufs, b.wakeBuf)
		leakedMu.Unlock()
	}
}

var (
	leakedMu sync.Mutex
	leaked   [][]byte // buffers a ring that did not drain may still write
)

// submit hands r to the owner; false if the backend has stopped.
func (b *uringBackend) submit(r request) bool {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return false
	}
	b.reqs = append(b.reqs, r)
	if r.op == reqStop {
		b.stopped = true
	}
	b.mu.Unlock()
	if b.awake.CompareAndSwap(false, true) {
		if err := sys.NetEventFDSignal(b.wake); err != nil {
			b.cfg.Logger.Error("netio: wake io_uring owner", "err", err)
		}
	}
	return true
}

func (b *uringBackend) loop() {
	var stopDeadline time.Time
	for {
		b.awake.Store(true)
		b.runRequests()
		// Submit what is queued and run the completion work the kernel
		// deferred to this thread; min_complete 0, so it never blocks.
		if _, err := b.ring.SubmitAndGetEvents(); err != nil && !isTransientEnter(err) {
			b.cfg.Logger.Error("netio: io_uring_enter", "err", err)
		}
		n := b.reap()
		if b.stopping {
			if b.outstanding == 0 {
				return
			}
			if stopDeadline.IsZero() {
				stopDeadline = time.Now().Add(5 * time.Second)
			} else if time.Now().After(stopDeadline) {
				b.cfg.Logger.Error("netio: io_uring operations did not drain at shutdown", "outstanding", b.outstanding)
				return
			}
		}
		if n > 0 {
			continue // handling completions may have queued SQEs
		}
		b.awake.Store(false)
		b.mu.Lock()
		more := len(b.reqs) > 0
		b.mu.Unlock()
		if more {
			continue
		}
		// Park until the kernel or a goroutine signals the eventfd. A
		// signal that came after the last read makes this return at once:
		// no wake-up is lost.
		if b.stopping {
			b.wakeFile.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		}
		if _, err := b.wakeFile.Read(b.wakeBuf); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			b.cfg.Logger.Error("netio: read eventfd", "err", err)
			time.Sleep(time.Millisecond)
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

func (b *uringBackend) runRequests() {
	b.mu.Lock()
	reqs := b.reqs
	b.reqs = b.spare[:0]
	b.mu.Unlock()
	for i, r := range reqs {
		b.handle(r)
		reqs[i] = request{}
	}
	b.spare = reqs
}

func (b *uringBackend) handle(r request) {
	switch r.op {
	case reqAttach:
		if b.stopping {
			b.finishConn(r.c, ErrClosed)
			return
		}
		b.nextID++
		r.c.id = b.nextID
		b.conns[r.c.id] = r.c
		b.armRecv(r.c)
	case reqFlush:
		if r.c.id != 0 && !r.c.closing {
			b.flush(r.c)
		}
	case reqResume:
		if r.c.id != 0 && !r.c.closing && !r.c.recvArmed && !r.c.recvDone {
			b.armRecv(r.c)
		}
	case reqClose:
		b.closeConn(r.c)
	case reqListen:
		if b.stopping {
			b.finishListener(r.l)
			return
		}
		b.nextID++
		r.l.id = b.nextID
		b.listeners[r.l.id] = r.l
		b.armAccept(r.l)
	case reqArmAccept:
		if r.l.id != 0 && !r.l.closing && !r.l.armed {
			b.armAccept(r.l)
		}
	case reqCloseListen:
		b.closeListener(r.l)
	case reqStop:
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
	}
}

// sqe returns a zeroed SQE, submitting what is queued when the submission
// queue is full (GetSQE returns nil then).
func (b *uringBackend) sqe() *giouring.SubmissionQueueEntry {
	for {
		if s := b.ring.GetSQE(); s != nil {
			// Zero it: the Prepare helpers leave some fields of the
			// slot's previous use in place.
			*s = giouring.SubmissionQueueEntry{}
			return s
		}
		if _, err := b.ring.Submit(); err != nil && !isTransientEnter(err) {
			b.cfg.Logger.Error("netio: io_uring submit", "err", err)
			time.Sleep(time.Millisecond)
		}
	}
}

func (b *uringBackend) armRecv(c *uconn) {
	sqe := b.sqe()
	sqe.PrepareRecvMultishot(c.fd, 0, 0, 0)
	sqe.Flags |= giouring.SqeBufferSelect
	sqe.BufIG = uringBgid
	sqe.UserData = userData(kindRecv, c.id)
	c.recvArmed = true
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

// reap handles every completion in the CQ and returns how many there were.
func (b *uringBackend) reap() int {
	total := 0
	for {
		n := b.ring.PeekBatchCQE(b.cqes)
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
			// (Recv asks for reqResume).
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
func (b *uringBackend) flush(c *uconn) {
	if c.inflight != nil {
		return // completeSend looks at the queue again
	}
	c.smu.Lock()
	p := c.pending
	c.pending = nil
	if p == nil || len(p.B) == 0 || c.werr != nil {
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
	c.inflight, c.off = p, 0
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
		c.pending = nil
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
			sys.NetCloseFD(fd)
			l.q.push(acceptResult{err: err})
		} else {
			b.nextID++
			c.id = b.nextID
			b.conns[c.id] = c
			b.armRecv(c)
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
	// After an error the listener's accept asks for reqArmAccept once
	// it has reported the error: errors such as EMFILE cannot spin.
}

func (b *uringBackend) newAccepted(fd int) (*uconn, error) {
	if err := sys.NetSetNoDelay(fd); err != nil {
		return nil, err
	}
	la, ra, err := sys.NetSockAddrs(fd)
	if err != nil {
		return nil, err
	}
	return newUconn(b, fd, net.TCPAddrFromAddrPort(la), net.TCPAddrFromAddrPort(ra)), nil
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

// ---- the backend interface, called from any goroutine ----

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
	if !b.submit(request{op: reqListen, l: l}) {
		sys.NetCloseFD(fd)
		return nil, ErrClosed
	}
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
	if !b.submit(request{op: reqAttach, c: c}) {
		sys.NetCloseFD(fd)
		return nil, ErrClosed
	}
	return c, nil
}

func (b *uringBackend) close() error {
	b.submit(request{op: reqStop})
	<-b.done
	return nil
}

// signal does a non-blocking send on a one-slot notification channel.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
